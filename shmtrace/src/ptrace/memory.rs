//! Reading and writing a traced process's memory: the paths and structs its calls point to,
//! and the stack space `inject` borrows. `process_vm_readv` copies without a stop or a call
//! per word; a read that crosses into an unmapped page is done again page by page, so a path
//! that ends just before one still reads.
use std::io;

const PAGE: u64 = 4096;

/// Copies `buf.len()` bytes at `addr` of process `pid`; how many could be read.
pub fn read(pid: i32, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
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

/// Reads a plain-data value at `addr`.
pub fn read_value<T: zerocopy::FromBytes>(pid: i32, addr: u64) -> io::Result<T> {
    let mut buf = vec![0u8; size_of::<T>()];
    if read(pid, addr, &mut buf)? != buf.len() {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    T::read_from_bytes(&buf).map_err(|_| io::Error::from_raw_os_error(libc::EFAULT))
}

/// A NUL-terminated string at `addr`, at most `max` bytes without the NUL: its bytes, and
/// whether it was cut short.
pub fn read_c_string(pid: i32, addr: u64, max: usize) -> io::Result<(Vec<u8>, bool)> {
    if addr == 0 {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < max {
        // Up to the end of this page, so that a read never reaches into the next one unless
        // the string does.
        let in_page = (PAGE - at % PAGE) as usize;
        let mut chunk = vec![0u8; in_page.min(max + 1 - out.len())];
        let n = read(pid, at, &mut chunk)?;
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

/// Writes `bytes` at `addr` of process `pid`.
pub fn write(pid: i32, addr: u64, bytes: &[u8]) -> io::Result<()> {
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

    #[test]
    fn reads_strings_up_to_a_page_end_and_cuts_long_ones() {
        let pid = std::process::id() as i32;
        let text = b"/dev/shm/torch_1\0rest";
        let (bytes, cut) = read_c_string(pid, text.as_ptr() as u64, 256).unwrap();
        assert_eq!(bytes, b"/dev/shm/torch_1");
        assert!(!cut);
        let (bytes, cut) = read_c_string(pid, text.as_ptr() as u64, 4).unwrap();
        assert_eq!(bytes, b"/dev");
        assert!(cut);
        assert!(read_c_string(pid, 0, 16).is_err());
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
            std::ptr::copy_nonoverlapping(b"shm1\0".as_ptr(), tail, 5);
            let (bytes, _) = read_c_string(pid, tail as u64, 256).unwrap();
            assert_eq!(bytes, b"shm1");
            // No NUL before the unmapped page: an error, not a guess.
            *tail.add(4) = b'x';
            assert!(read_c_string(pid, tail as u64, 256).is_err());
            libc::munmap(two.cast(), 4096);
        }
    }

    #[test]
    fn reads_values_and_writes_bytes() {
        let pid = std::process::id() as i32;
        let value: u64 = 0x1122_3344_5566_7788;
        assert_eq!(read_value::<u64>(pid, (&raw const value) as u64).unwrap(), value);
        let mut target = [0u8; 4];
        write(pid, target.as_mut_ptr() as u64, b"abcd").unwrap();
        assert_eq!(std::hint::black_box(target), *b"abcd");
    }
}
