//! The raw /dev/shm system calls that both `shmtrace demo`'s workload and the end-to-end tests'
//! `shm-exerciser` make: a private /dev/shm, a shared-memory object created the way PyTorch
//! creates one, and a shared mapping of it.
//!
//! Every call goes through libc directly, so the traced syscalls are exactly the ones named.
//! Only the hidden `__demo-workload` subcommand and the test binary use this crate; the tracer's
//! own paths never call it.
use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use nix::{
    mount::{MsFlags, mount},
    sched::{CloneFlags, unshare},
};

/// The flags PyTorch's `THManagedMapAllocator` opens a new /dev/shm object with.
pub const PYTORCH_CREATE: libc::c_int =
    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;

/// Moves the calling process into a private mount namespace (plus `extra` namespaces, e.g. a
/// private IPC namespace) and mounts a tmpfs of `size` (a tmpfs `size=` option such as `1m`)
/// on /dev/shm, named `source` in /proc/mounts. Needs root. Everything disappears with the
/// namespace when the process and its children exit.
pub fn private_shm(source: &str, size: &str, extra: CloneFlags) -> io::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS | extra).map_err(|e| context(e, "unshare"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| context(e, "making mounts private"))?;
    mount(
        Some(source),
        "/dev/shm",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={size},mode=1777").as_str()),
    )
    .map_err(|e| context(e, "mounting a tmpfs on /dev/shm"))
}

fn context(errno: nix::errno::Errno, what: &str) -> io::Error {
    let error = io::Error::from(errno);
    io::Error::new(error.kind(), format!("{what}: {error}"))
}

/// `open(path, flags, 0600)`, as one plain open(2).
pub fn open(path: &str, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c_path = CString::new(path)?;
    // SAFETY: plain open(2) of a NUL-terminated path.
    let fd = unsafe { libc::open(c_path.as_ptr(), flags, 0o600) };
    if fd < 0 {
        let error = io::Error::last_os_error();
        return Err(io::Error::new(
            error.kind(),
            format!("open {path}: {error}"),
        ));
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A shared read-write mapping of the first `len` bytes of `fd`. It stays mapped until the
/// process exits: the workloads hold their batches, as the programs they play do.
pub fn map_shared(fd: &OwnedFd, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a new mapping at an address the kernel picks, of a descriptor we own; it aliases
    // no Rust object.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        let error = io::Error::last_os_error();
        return Err(io::Error::new(error.kind(), format!("mmap: {error}")));
    }
    Ok(addr.cast())
}
