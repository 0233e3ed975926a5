//! A container's /dev/shm: how big it is and how full, measured through the container's root.
//!
//! Capacity and usage come from `fstatfs` of the container's /dev/shm, opened safely inside its
//! root (see `rootfs`). The tmpfs `size=` option comes from the container's
//! `/proc/PID/mountinfo`. The device number tells whether the container shares the host's
//! /dev/shm (`--ipc=host`) or another container's (pods).
use std::{fs, os::unix::fs::MetadataExt};

use nix::{
    errno::Errno,
    sys::{
        stat::fstat,
        statfs::{TMPFS_MAGIC, fstatfs},
    },
};

use super::rootfs;
use crate::kernel_ids;
use shmtrace_core::{
    capacity::{Capacity, FileCount},
    clock::boot_ns,
};

/// A container's /dev/shm: its capacity when it could be measured, and what its runtime and
/// mount options say about it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShmInfo {
    /// What `fstatfs` said of it, and when (`None` when it could not be measured).
    pub measured: Option<Capacity>,
    /// The tmpfs `size=` mount option, in bytes, from the container's mountinfo.
    pub size_option: Option<u64>,
    /// What the runtime was asked for (Docker's `HostConfig.ShmSize`).
    pub configured_bytes: Option<u64>,
    /// Whether /dev/shm is a tmpfs. `false` means the container's /dev/shm is a directory or a
    /// symlink on some other file system (its root), and the numbers are that file system's.
    pub is_tmpfs: bool,
    pub source: ShmSource,
}

impl ShmInfo {
    /// The measurement, when it has a size limit (an unbounded tmpfs has no capacity to run out
    /// of, so nothing to diagnose against).
    pub fn capacity(&self) -> Option<Capacity> {
        self.measured.filter(Capacity::is_bounded)
    }

    /// Capacity in bytes: measured when possible, else what the runtime was told
    /// (`configured_bytes`). `None` for an unbounded tmpfs (`size=0`) or when unknown.
    pub fn size_bytes(&self) -> Option<u64> {
        match self.measured {
            Some(measured) => measured.is_bounded().then_some(measured.size),
            None => self.configured_bytes,
        }
    }

    /// Bytes in use when measured.
    pub fn used_bytes(&self) -> Option<u64> {
        self.measured.map(|measured| measured.used)
    }

    /// Device of the file system (kernel `dev_t` encoding, as the probes report it), when
    /// measured.
    pub fn dev(&self) -> Option<u32> {
        self.measured.map(|measured| measured.dev)
    }
}

/// How a [`ShmInfo`] was obtained.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ShmSource {
    /// `fstatfs` of /dev/shm resolved inside `/proc/PID/root`, at that moment.
    Measured { pid: u32 },
    /// Only the runtime's configuration (the container is not running).
    Configured,
    /// Nothing could be measured; why.
    Unavailable { reason: String },
    #[default]
    Unknown,
}

/// Why /dev/shm could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error(
        "cannot open the root of process {pid} (/proc/{pid}/root): {errno}; the process may \
         have exited, or shmtrace lacks CAP_SYS_PTRACE (run it as root)"
    )]
    Root { pid: u32, errno: Errno },
    #[error(
        "the container of process {pid} has no /dev/shm (run with --ipc=none, or it was removed)"
    )]
    Missing { pid: u32 },
    #[error(
        "refused to follow a magic link at /dev/shm in the container of process {pid}: its \
         /dev/shm points outside the container (this is what a hostile container would do)"
    )]
    MagicLink { pid: u32 },
    #[error("cannot measure /dev/shm of process {pid}: {what} failed: {errno}")]
    Sys {
        pid: u32,
        what: &'static str,
        errno: Errno,
    },
    #[error(
        "process {pid} changed mount namespace while /dev/shm was measured (it exited and its \
         pid was reused?); measure again"
    )]
    Raced { pid: u32 },
}

/// Measures the /dev/shm of the container that process `pid` belongs to, now.
pub fn measure_shm(pid: u32) -> Result<ShmInfo, ShmError> {
    let mntns_before = kernel_ids::mount_namespace(pid);
    let root = rootfs::open_root(pid).map_err(|errno| ShmError::Root { pid, errno })?;
    let shm = rootfs::open_in_root(&root, "/dev/shm").map_err(|errno| match errno {
        Errno::ENOENT | Errno::ENOTDIR => ShmError::Missing { pid },
        Errno::ELOOP | Errno::EXDEV => ShmError::MagicLink { pid },
        errno => ShmError::Sys {
            pid,
            what: "openat2",
            errno,
        },
    })?;
    let stats = fstatfs(&shm).map_err(|errno| ShmError::Sys {
        pid,
        what: "fstatfs",
        errno,
    })?;
    let stat = fstat(&shm).map_err(|errno| ShmError::Sys {
        pid,
        what: "fstat",
        errno,
    })?;
    // A pid reused by another process between the two reads would give someone else's numbers.
    if kernel_ids::mount_namespace(pid) != mntns_before {
        return Err(ShmError::Raced { pid });
    }
    let ts_ns = boot_ns().map_err(|error| ShmError::Sys {
        pid,
        what: "clock_gettime(CLOCK_BOOTTIME)",
        errno: Errno::from_raw(error.raw_os_error().unwrap_or(0)),
    })?;
    // tmpfs reports page-sized blocks in f_bsize (and f_frsize alike).
    let block = stats.block_size() as u64;
    let total = stats.blocks() * block;
    let free = stats.blocks_free() * block;
    Ok(ShmInfo {
        measured: Some(Capacity {
            dev: kernel_ids::kernel_dev_from_stat(stat.st_dev),
            size: total,
            used: total.saturating_sub(free),
            ts_ns,
            files: Some(FileCount {
                limit: stats.files(),
                free: stats.files_free(),
            }),
        }),
        size_option: size_option(pid),
        configured_bytes: None,
        is_tmpfs: stats.filesystem_type() == TMPFS_MAGIC,
        source: ShmSource::Measured { pid },
    })
}

/// A file at the top of a container's /dev/shm, as `stat` showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmFile {
    /// Its name as the directory holds it: any bytes (escape before display).
    pub name: std::ffi::OsString,
    pub ino: u64,
    /// Memory it holds: `st_blocks * 512`, not its size.
    pub bytes: u64,
    pub size: u64,
}

/// The device of the /dev/shm of `pid`'s container, and its regular files (not those in
/// directories below it, nor what symbolic links point to), opened safely inside its root.
pub fn list_shm_files(pid: u32) -> Result<(u32, Vec<ShmFile>), ShmError> {
    let root = rootfs::open_root(pid).map_err(|errno| ShmError::Root { pid, errno })?;
    let shm = rootfs::open_in_root(&root, "/dev/shm").map_err(|errno| match errno {
        Errno::ENOENT | Errno::ENOTDIR => ShmError::Missing { pid },
        Errno::ELOOP | Errno::EXDEV => ShmError::MagicLink { pid },
        errno => ShmError::Sys {
            pid,
            what: "openat2",
            errno,
        },
    })?;
    let stat = fstat(&shm).map_err(|errno| ShmError::Sys {
        pid,
        what: "fstat",
        errno,
    })?;
    // Read through our own descriptor of it, so that no path of the container is followed.
    use std::os::fd::AsRawFd;
    let dir = format!("/proc/self/fd/{}", shm.as_raw_fd());
    let entries = fs::read_dir(&dir).map_err(|error| ShmError::Sys {
        pid,
        what: "readdir",
        errno: Errno::from_raw(error.raw_os_error().unwrap_or(0)),
    })?;
    // Bounded: a container may fill its /dev/shm with millions of empty files.
    const MAX_ENTRIES: usize = 1 << 16;
    let files = entries
        .take(MAX_ENTRIES)
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let meta = fs::symlink_metadata(entry.path()).ok()?;
            meta.file_type().is_file().then(|| ShmFile {
                name: entry.file_name(),
                ino: meta.ino(),
                bytes: meta.blocks().saturating_mul(512),
                size: meta.size(),
            })
        })
        .collect();
    Ok((kernel_ids::kernel_dev_from_stat(stat.st_dev), files))
}

/// The device of the host's /dev/shm: that of pid 1's root when shmtrace runs in a container
/// with the host's pid namespace, else our own.
pub fn host_shm_dev() -> Option<u32> {
    let from_init = rootfs::open_root(1)
        .ok()
        .and_then(|root| rootfs::open_in_root(&root, "/dev/shm").ok())
        .and_then(|fd| fstat(&fd).ok())
        .map(|stat| kernel_ids::kernel_dev_from_stat(stat.st_dev));
    from_init.or_else(|| {
        fs::metadata("/dev/shm")
            .ok()
            .map(|m| kernel_ids::kernel_dev_from_stat(m.dev()))
    })
}

/// The `size=` option of the tmpfs mounted at /dev/shm in `pid`'s mount namespace.
fn size_option(pid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    size_option_from_mountinfo(&text)
}

/// The `size=` option of the last tmpfs mounted at /dev/shm (the one on top), in bytes.
pub(super) fn size_option_from_mountinfo(text: &str) -> Option<u64> {
    text.lines()
        .filter_map(|line| {
            // `36 35 98:0 / /dev/shm rw,nosuid - tmpfs shm rw,size=65536k`: the mount point is
            // field 5; after ` - ` come the type, the source and the super options.
            let mount_point = line.split(' ').nth(4)?;
            let (_, tail) = line.split_once(" - ")?;
            let mut tail = tail.split(' ');
            let fs_type = tail.next()?;
            let _source = tail.next()?;
            let options = tail.next()?;
            (mount_point == "/dev/shm" && fs_type == "tmpfs").then_some(options)
        })
        .next_back()
        .and_then(|options| {
            options
                .split(',')
                .find_map(|option| option.strip_prefix("size="))
                .and_then(parse_tmpfs_size)
        })
}

/// `65536k`, `1m`, `2g`, `4096`: tmpfs sizes as mountinfo shows them.
fn parse_tmpfs_size(text: &str) -> Option<u64> {
    shmtrace_core::units::parse(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_size_option_of_the_top_shm_mount() {
        // From a Docker container started with --shm-size 1m on this project's CI host.
        let mountinfo = "\
1270 1199 0:126 / / rw,relatime master:365 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/X
1271 1270 0:128 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1272 1270 0:129 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
1278 1272 0:125 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=1024k
";
        assert_eq!(size_option_from_mountinfo(mountinfo), Some(1 << 20));
        let stacked =
            format!("{mountinfo}1300 1278 0:140 / /dev/shm rw - tmpfs tmpfs rw,size=2g\n");
        assert_eq!(size_option_from_mountinfo(&stacked), Some(2 << 30));
        // --ipc=host: the host's /dev/shm bind-mounted, with the host's options.
        let host = "1278 1272 0:26 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw,inode64\n";
        assert_eq!(size_option_from_mountinfo(host), None);
        assert_eq!(size_option_from_mountinfo("garbage\n"), None);
    }

    #[test]
    fn parses_tmpfs_sizes() {
        assert_eq!(parse_tmpfs_size("65536k"), Some(64 << 20));
        assert_eq!(parse_tmpfs_size("1m"), Some(1 << 20));
        assert_eq!(parse_tmpfs_size("4096"), Some(4096));
        assert_eq!(parse_tmpfs_size("k"), None);
        assert_eq!(parse_tmpfs_size("99999999999999999999g"), None);
    }

    #[test]
    fn measures_our_own_shm() {
        let info = measure_shm(std::process::id()).expect("our own /dev/shm");
        assert!(info.is_tmpfs);
        assert!(info.size_bytes().unwrap() > 0);
        assert!(info.used_bytes().unwrap() <= info.size_bytes().unwrap());
        assert_eq!(info.dev(), host_shm_dev());
    }
}
