//! Reading and writing a traced process's memory: the paths and structs its calls point to,
//! and the stack space `inject` borrows.
//!
//! `process_vm_readv` copies without a file, but container runtimes' default seccomp profiles
//! (Docker's, Podman's) refuse it and `process_vm_writev` without CAP_SYS_PTRACE; then the
//! process's `/proc/PID/mem`, which its tracer may read and write, is used instead, opened once
//! per program it runs. A read that crosses into an unmapped page is done again page by page,
//! so a path that ends just before one still reads.
use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::FileExt,
    sync::atomic::{AtomicBool, Ordering},
};

const PAGE: u64 = 4096;

/// Set once `process_vm_readv` was refused: every later access goes through /proc.
static VM_CALLS_REFUSED: AtomicBool = AtomicBool::new(false);

/// The memory of one traced process (any of its threads' ids reaches it).
pub struct Mem {
    pid: i32,
    /// `/proc/PID/mem`, once needed.
    file: Option<File>,
}

impl Default for Mem {
    /// Of no process yet: [`Mem::reset`] names it.
    fn default() -> Mem {
        Mem::new(0)
    }
}

impl Clone for Mem {
    /// A copy reopens the file: a forked child has a memory of its own.
    fn clone(&self) -> Mem {
        Mem::new(self.pid)
    }
}

impl Mem {
    pub fn new(pid: i32) -> Mem {
        Mem { pid, file: None }
    }

    /// The process ran a new program (a file open on its old memory reads nothing), or it
    /// is a new process now known by `pid`.
    pub fn reset(&mut self, pid: i32) {
        self.pid = pid;
        self.file = None;
    }

    fn file(&mut self) -> io::Result<&File> {
        if self.file.is_none() {
            self.file = Some(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(format!("/proc/{}/mem", self.pid))?,
            );
        }
        Ok(self.file.as_ref().expect("just opened"))
    }

    /// Copies up to `buf.len()` bytes at `addr`; how many could be read.
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
        if !VM_CALLS_REFUSED.load(Ordering::Relaxed) {
            match vm_read(self.pid, addr, buf) {
                Err(error) if refused(&error) => VM_CALLS_REFUSED.store(true, Ordering::Relaxed),
                done => return done,
            }
        }
        self.file()?.read_at(buf, addr)
    }

    /// Writes all of `bytes` at `addr`.
    pub fn write(&mut self, addr: u64, bytes: &[u8]) -> io::Result<()> {
        if !VM_CALLS_REFUSED.load(Ordering::Relaxed) {
            match vm_write(self.pid, addr, bytes) {
                Err(error) if refused(&error) => VM_CALLS_REFUSED.store(true, Ordering::Relaxed),
                done => return done,
            }
        }
        self.file()?.write_all_at(bytes, addr)
    }

    /// Reads a plain-data value at `addr`.
    pub fn read_value<T: zerocopy::FromBytes>(&mut self, addr: u64) -> io::Result<T> {
        let mut buf = vec![0u8; size_of::<T>()];
        if self.read(addr, &mut buf)? != buf.len() {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        T::read_from_bytes(&buf).map_err(|_| io::Error::from_raw_os_error(libc::EFAULT))
    }

    /// A NUL-terminated string at `addr`, at most `max` bytes without the NUL: its bytes, and
    /// whether it was cut short.
    pub fn read_c_string(&mut self, addr: u64, max: usize) -> io::Result<(Vec<u8>, bool)> {
        if addr == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        let mut out = Vec::new();
        let mut at = addr;
        while out.len() < max {
            // Up to the end of this page, so that a read never reaches into the next one
            // unless the string does.
            let in_page = (PAGE - at % PAGE) as usize;
            let mut chunk = vec![0u8; in_page.min(max + 1 - out.len())];
            let n = self.read(at, &mut chunk)?;
            if n == 0 {
                return Err(io::Error::from_raw_os_error(libc::EFAULT));
            }
            if let Some(end) = chunk[..n].iter().position(|b| *b == 0) {
                out.extend_from_slice(&chunk[..end]);
                return Ok((out, false));
            }
            out.extend_from_slice(&chunk[..n]);
            at += n as u64;
        }
        out.truncate(max);
        Ok((out, true))
    }
}

/// A seccomp profile's refusal (EPERM), or a kernel without the calls (ENOSYS).
fn refused(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EPERM | libc::ENOSYS))
}

fn vm_read(pid: i32, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`; the remote address is
    // only read through the kernel, which checks it.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn vm_write(pid: i32, addr: u64, bytes: &[u8]) -> io::Result<()> {
    let local = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: the kernel reads `bytes.len()` bytes from `bytes` and checks the remote range.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_strings(mem: &mut Mem) {
        let text = b"/dev/shm/torch_1\0rest";
        let (bytes, cut) = mem.read_c_string(text.as_ptr() as u64, 256).unwrap();
        assert_eq!(bytes, b"/dev/shm/torch_1");
        assert!(!cut);
        let (bytes, cut) = mem.read_c_string(text.as_ptr() as u64, 4).unwrap();
        assert_eq!(bytes, b"/dev");
        assert!(cut);
        assert!(mem.read_c_string(0, 16).is_err());
        // A string that ends at the last byte of a mapping, the next page unmapped.
        // SAFETY: mapping two fresh pages, unmapping the second, reading the first.
        unsafe {
            let two = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert!(!two.is_null());
            libc::munmap(two.add(4096).cast(), 4096);
            let tail = two.add(4096 - 5);
            std::ptr::copy_nonoverlapping(c"shm1".as_ptr().cast(), tail, 5);
            let (bytes, _) = mem.read_c_string(tail as u64, 256).unwrap();
            assert_eq!(bytes, b"shm1");
            // No NUL before the unmapped page: an error, not a guess.
            *tail.add(4) = b'x';
            assert!(mem.read_c_string(tail as u64, 256).is_err());
            libc::munmap(two.cast(), 4096);
        }
        let value: u64 = 0x1122_3344_5566_7788;
        assert_eq!(
            mem.read_value::<u64>((&raw const value) as u64).unwrap(),
            value
        );
        let mut target = [0u8; 4];
        mem.write(target.as_mut_ptr() as u64, b"abcd").unwrap();
        assert_eq!(std::hint::black_box(target), *b"abcd");
    }

    #[test]
    fn reads_and_writes_through_the_calls_and_through_proc() {
        let pid = std::process::id() as i32;
        check_strings(&mut Mem::new(pid));
        // As under a seccomp profile that refuses the calls.
        VM_CALLS_REFUSED.store(true, Ordering::Relaxed);
        let mut mem = Mem::new(pid);
        check_strings(&mut mem);
        assert!(mem.file.is_some(), "went through /proc/PID/mem");
        VM_CALLS_REFUSED.store(false, Ordering::Relaxed);
    }
}
