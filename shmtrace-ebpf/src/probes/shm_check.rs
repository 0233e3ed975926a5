//! Whether a call concerns /dev/shm: by its path argument, or by the file behind a
//! descriptor.
use aya_ebpf::{
    cty::c_void,
    helpers::generated::{self, bpf_probe_read_user_str},
};
use shmtrace_common::{FileRef, KernelOffsets, flags};

use super::tracepoint::AT_FDCWD;
use crate::{kernel, maps::SHM_DEVS};

const SHM_PREFIX: &[u8; 9] = b"/dev/shm/";
/// Bytes `bpf_probe_read_user_str` returns for "/dev/shm" and "/dev/shm/", with the NUL.
const SHM_DIR_LEN: i64 = 9;

/// The file behind `fd` as it is now, if it is on a /dev/shm. Its file system is checked
/// before the rest of its inode is read: most descriptors of a process that holds /dev/shm
/// files are elsewhere (its logs, sockets), and reading the inode's head costs more than the
/// check.
#[inline(always)]
pub fn shm_fd(fd: i32, off: &KernelOffsets) -> Option<FileRef> {
    let inode = kernel::fd_inode(fd, off)?;
    SHM_DEVS.get_ptr(kernel::inode_dev(inode, off)?)?;
    kernel::inode_file(inode, off)
}

/// What a path argument says about a call.
pub enum PathIs {
    /// In /dev/shm, with the header flags to record, and for a name relative to a directory
    /// descriptor, that directory's inode number (with [`flags::DIR_INODE`]; 0 otherwise).
    Shm(u16, u64),
    /// Somewhere else.
    Elsewhere,
    /// Not readable now: a page the program has not touched yet, which a probe cannot fault
    /// in. Judged again at `sys_exit` ([`flags::PATH_AT_EXIT`]), when the call has read it.
    Unread,
}

/// Bytes of a path read to judge it: "/dev/shm/" and one more, and the NUL. A longer path
/// is cut short there, which says all that is needed (`len` is then `PREFIX_READ`).
const PREFIX_READ: u32 = SHM_PREFIX.len() as u32 + 2;

/// Reads the first bytes of the path at `path` into `buf`, as `bpf_probe_read_user_str` of
/// `PREFIX_READ` bytes would: returns its length with the NUL, or `PREFIX_READ` if it is
/// longer, or a negative error. A fixed-size read costs less than the string helper, which
/// is left for a path that ends near the end of its page, where 16 bytes cannot be read.
#[inline(always)]
fn path_prefix(path: u64, buf: &mut [u8; 16]) -> i64 {
    // SAFETY: a user pointer, read into a buffer of the size given; a bad one is an error.
    let failed = unsafe {
        generated::bpf_probe_read_user(buf.as_mut_ptr() as *mut c_void, 16, path as *const c_void)
    };
    if failed != 0 {
        // SAFETY: as above; the helper stops at PREFIX_READ bytes, within the buffer.
        return unsafe {
            bpf_probe_read_user_str(
                buf.as_mut_ptr() as *mut c_void,
                PREFIX_READ,
                path as *const c_void,
            )
        };
    }
    let mut i = 0;
    while i < PREFIX_READ as usize {
        if buf[i] == 0 {
            return i as i64 + 1;
        }
        i += 1;
    }
    PREFIX_READ as i64
}

/// Whether a path argument names something in /dev/shm: an absolute `/dev/shm/...` path, or a
/// relative one resolved from a directory (`dfd`, or the working directory) on a /dev/shm file
/// system. Only the path's first bytes are read, and the kernel's offsets only for a relative
/// path: every open on the host passes here in host-wide mode.
#[inline(always)]
pub fn shm_path(dfd: i32, path: u64) -> PathIs {
    let mut buf = [0u8; 16];
    let len = path_prefix(path, &mut buf);
    if len <= 0 {
        // NULL is the caller's mistake (the call fails with EFAULT).
        return if path == 0 {
            PathIs::Elsewhere
        } else {
            PathIs::Unread
        };
    }
    if buf[0] == b'/' {
        // "/dev/shm" itself: only its file system matters (for names relative to it later).
        let mut i = 0;
        while i < SHM_PREFIX.len() - 1 {
            if buf[i] != SHM_PREFIX[i] {
                return PathIs::Elsewhere;
            }
            i += 1;
        }
        if len == SHM_DIR_LEN || (len == SHM_DIR_LEN + 1 && buf[8] == b'/') {
            return PathIs::Shm(flags::SHM_DIRECTORY, 0);
        }
        if buf[8] != b'/' {
            return PathIs::Elsewhere;
        }
        return PathIs::Shm(0, 0);
    }
    let off = kernel::offsets();
    // The directory's inode number names it to userspace, which learned it when the
    // directory was opened: a descriptor moved since with an untraced call (GNU fts's
    // `fcntl(F_DUPFD_CLOEXEC)` in `find`, `du`, `rm -r`) still names its directory.
    let (dir_dev, dir_ino) = if dfd == AT_FDCWD {
        (kernel::cwd_dev(&off), 0)
    } else {
        match kernel::fd_inode(dfd, &off) {
            Some(inode) => (
                kernel::inode_dev(inode, &off),
                kernel::inode_ino(inode, &off),
            ),
            None => (None, 0),
        }
    };
    match dir_dev {
        Some(dev) if SHM_DEVS.get_ptr(dev).is_some() => {
            let dir = if dir_ino == 0 { 0 } else { flags::DIR_INODE };
            PathIs::Shm(flags::RELATIVE_TO_SHM | dir, dir_ino)
        }
        _ => PathIs::Elsewhere,
    }
}

/// Records the file system of a newly opened /dev/shm directory descriptor, if it is a tmpfs:
/// a /dev/shm that is a plain directory (in a chroot, or a bind of a disk's) would make its
/// whole file system count as one.
#[inline(always)]
pub fn learn_directory(ret: i64, off: &KernelOffsets) {
    if ret < 0 {
        return;
    }
    if let Some(inode) = kernel::fd_inode(ret as i32, off)
        && kernel::inode_on_tmpfs(inode, off)
        && let Some(dev) = kernel::inode_dev(inode, off)
    {
        let _ = SHM_DEVS.insert(dev, 1, 0);
    }
}
