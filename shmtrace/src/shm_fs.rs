//! Measuring a process's /dev/shm: its size and how much of it is used, right now.
//!
//! The path is resolved inside the process's own root with `openat2(RESOLVE_IN_ROOT)`, so a
//! container that made its /dev/shm a symlink (to `/`, say) cannot send shmtrace to measure a
//! host file system instead.
use std::os::fd::AsFd;

use nix::{
    fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2},
    sys::{stat::Mode, statfs::fstatfs},
};

use crate::{diagnose::Capacity, proc_scan};

/// statfs of `pid`'s /dev/shm, at boot time `ts_ns`. `None` if the process is gone or has no
/// /dev/shm.
pub fn measure(pid: u32, ts_ns: u64) -> Option<Capacity> {
    let root = open(
        format!("/proc/{pid}/root").as_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let shm = openat2(root.as_fd(), "dev/shm", how).ok()?;
    let stat = nix::sys::stat::fstat(shm.as_fd()).ok()?;
    let fs = fstatfs(shm.as_fd()).ok()?;
    let block = fs.block_size() as u64;
    let size = fs.blocks() * block;
    Some(Capacity {
        dev: proc_scan::kernel_dev_from_stat(stat.st_dev),
        size,
        used: size.saturating_sub(fs.blocks_free() * block),
        ts_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_our_own_dev_shm() {
        let capacity = measure(std::process::id(), 0).expect("this process has a /dev/shm");
        assert!(capacity.size > 0);
        assert!(capacity.used <= capacity.size);
        let meta = std::fs::metadata("/dev/shm").unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(capacity.dev, proc_scan::kernel_dev_from_stat(meta.dev()));
    }
}
