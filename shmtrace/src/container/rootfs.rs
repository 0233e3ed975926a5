//! Opening a path inside a container's root without letting the container redirect us.
//!
//! `/proc/PID/root/dev/shm` looks like the container's /dev/shm, but the kernel resolves an
//! absolute symlink met on the way against *our* root: a container whose /dev/shm is a symlink
//! to `/` would have shmtrace measure the host's root file system, and a symlink to
//! `/proc/1/root/...` (a magic link) would escape in the same way. So the path is resolved with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` from a descriptor of the container's root:
//! `..` and absolute symlinks stay inside it, and magic links are refused.
use std::os::fd::OwnedFd;

use nix::{
    errno::Errno,
    fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2},
    sys::stat::Mode,
};

/// The container root of `pid`, as an `O_PATH` descriptor.
///
/// `/proc/PID/root` is itself a magic link, and following it is the point: the kernel hands us
/// the process's root. The path up to it is ours, not the container's.
pub fn open_root(pid: u32) -> Result<OwnedFd, Errno> {
    open(
        format!("/proc/{pid}/root").as_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Opens `path` (as the container sees it) inside the root `root`, as an `O_PATH` descriptor.
/// Fails with `ELOOP` on a magic link, and never leaves the root.
pub fn open_in_root(root: &OwnedFd, path: &str) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root, path, how)
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::MetadataExt, path::Path};

    use nix::sys::stat::fstat;

    use super::*;

    /// A crafted root whose `dev/shm` points at `/`, outside it through `..`, and at a magic
    /// link: every route must stay inside the root or fail.
    #[test]
    fn symlinks_cannot_leave_the_root() {
        let root = std::env::temp_dir().join(format!("shmtrace-rootfs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("dev")).unwrap();
        fs::create_dir_all(root.join("inside")).unwrap();
        fs::write(root.join("inside/marker"), b"inside").unwrap();
        let dir = open(
            root.as_path(),
            OFlag::O_PATH | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        let ino_of = |path: &str| fstat(open_in_root(&dir, path).unwrap()).unwrap().st_ino;
        let root_ino = fs::metadata(&root).unwrap().ino();

        std::os::unix::fs::symlink("/", root.join("dev/shm")).unwrap();
        assert_eq!(ino_of("/dev/shm"), root_ino, "`/` is the container's root");
        fs::remove_file(root.join("dev/shm")).unwrap();

        std::os::unix::fs::symlink("../../../../../../..", root.join("dev/shm")).unwrap();
        assert_eq!(ino_of("dev/shm"), root_ino, "`..` stops at the root");
        fs::remove_file(root.join("dev/shm")).unwrap();

        // A path that exists on the host but not in the root is simply not there.
        std::os::unix::fs::symlink("/etc/passwd", root.join("dev/shm")).unwrap();
        assert!(Path::new("/etc/passwd").exists());
        assert_eq!(open_in_root(&dir, "/dev/shm").unwrap_err(), Errno::ENOENT);
        fs::remove_file(root.join("dev/shm")).unwrap();

        std::os::unix::fs::symlink("/proc/self/root", root.join("dev/shm")).unwrap();
        fs::create_dir_all(root.join("proc")).unwrap();
        // Inside the root, /proc is an empty directory: no escape that way either.
        assert_eq!(open_in_root(&dir, "/dev/shm").unwrap_err(), Errno::ENOENT);
        fs::remove_file(root.join("dev/shm")).unwrap();

        // The host's /proc bind-mounted in: the magic link is refused.
        std::os::unix::fs::symlink("/proc/self/root/etc", root.join("dev/shm")).unwrap();
        let proc_root = open("/", OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        assert_eq!(
            open_in_root(&proc_root, "/proc/self/root/etc").unwrap_err(),
            Errno::ELOOP
        );

        assert_eq!(
            ino_of("/inside/marker"),
            fs::metadata(root.join("inside/marker")).unwrap().ino()
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
