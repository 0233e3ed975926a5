//! The raw `bpf(2)` system call, as the floors make it: they share no code with shmtrace
//! (`floor`, `floor_ring`).
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use anyhow::Result;

/// `bpf(command, attr)`, `attr` being the zero-padded prefix of `union bpf_attr` the command
/// reads; the descriptor it returns.
pub fn bpf<T>(command: libc::c_long, attr: &mut T) -> Result<OwnedFd> {
    // SAFETY: `attr` is a valid, zero-padded attribute of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}
