//! What /proc says about processes that existed before shmtrace started: their /dev/shm
//! descriptors and mappings, their children, and which file systems are mounted on /dev/shm.
use std::{collections::HashSet, fs, os::unix::fs::MetadataExt, path::Path};

use crate::kernel_ids::{kernel_dev, kernel_dev_from_stat, mount_namespace};
use shmtrace_core::{
    event::{InodeId, escape},
    model::{ProcSnapshot, SnapshotFd, SnapshotMapping},
};

const DELETED: &str = " (deleted)";

/// `0:26` to a kernel `dev_t`.
fn parse_majmin(text: &str) -> Option<u32> {
    let (major, minor) = text.split_once(':')?;
    Some(kernel_dev(major.parse().ok()?, minor.parse().ok()?))
}

pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `pid` and all its descendants, from the parent links in /proc.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let Ok(all) = procfs::process::all_processes() else {
        return vec![pid];
    };
    let links: Vec<(u32, u32)> = all
        .filter_map(Result::ok)
        .filter_map(|p| p.stat().ok())
        .map(|s| (s.pid as u32, s.ppid as u32))
        .collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            links
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

/// A file system mounted at /dev/shm (or at /run/shm, its older name, where /dev/shm is a
/// link to it) in some mount namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShmMount {
    /// Its `dev_t`, in the kernel's encoding.
    pub dev: u32,
    /// Whether it is a tmpfs, not a bind mount of a directory of another file system.
    pub tmpfs: bool,
}

/// One process of each mount namespace on the host (the host's own, and each container's).
fn one_per_mount_namespace() -> Vec<u32> {
    let mut namespaces = HashSet::new();
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.filter_map(Result::ok)
        .map(|process| process.pid() as u32)
        .filter(|pid| mount_namespace(*pid).is_some_and(|ns| namespaces.insert(ns)))
        .collect()
}

/// Every file system mounted at /dev/shm, in every mount namespace on the host.
pub fn shm_mounts() -> HashSet<ShmMount> {
    one_per_mount_namespace()
        .into_iter()
        .flat_map(shm_mounts_of)
        .collect()
}

/// The file systems mounted at /dev/shm in `pid`'s mount namespace.
pub fn shm_mounts_of(pid: u32) -> Vec<ShmMount> {
    let Ok(process) = procfs::process::Process::new(pid as i32) else {
        return Vec::new();
    };
    let Ok(mounts) = process.mountinfo() else {
        return Vec::new();
    };
    mounts
        .into_iter()
        .filter(|m| {
            m.mount_point == Path::new("/dev/shm") || m.mount_point == Path::new("/run/shm")
        })
        .filter_map(|m| {
            Some(ShmMount {
                dev: parse_majmin(&m.majmin)?,
                tmpfs: m.fs_type == "tmpfs",
            })
        })
        .collect()
}

/// Processes that hold a descriptor or a mapping on one of the file systems `devs` (those
/// mounted on /dev/shm), but `except`. Host-wide tracing follows them from its start, as it
/// follows a process from its first /dev/shm call: the probes look only at followed
/// processes' calls on descriptors.
pub fn shm_holders(devs: &HashSet<u32>, except: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != except && (holds_shm_fd(*pid, devs) || maps_shm(*pid, devs)))
        .collect()
}

fn holds_shm_fd(pid: u32, devs: &HashSet<u32>) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        // Sockets, pipes and anonymous inodes link to names like "socket:[N]": only a path
        // can be a /dev/shm file, and stat through the link is what costs.
        fs::read_link(fd.path()).is_ok_and(|target| target.is_absolute())
            && fs::metadata(fd.path())
                .is_ok_and(|meta| devs.contains(&kernel_dev_from_stat(meta.dev())))
    })
}

fn maps_shm(pid: u32, devs: &HashSet<u32>) -> bool {
    let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    // "start-end perms offset major:minor inode path"
    maps.lines().any(|line| {
        line.split_whitespace()
            .nth(3)
            .and_then(parse_hex_majmin)
            .is_some_and(|dev| devs.contains(&dev))
    })
}

/// `00:1a` (hexadecimal, as /proc/PID/maps writes it) to a kernel `dev_t`.
fn parse_hex_majmin(text: &str) -> Option<u32> {
    let (major, minor) = text.split_once(':')?;
    Some(kernel_dev(
        u64::from_str_radix(major, 16).ok()?,
        u64::from_str_radix(minor, 16).ok()?,
    ))
}

/// When a process started (`CLOCK_BOOTTIME` ns, as the probes stamp records), from
/// /proc/PID/stat, to the clock tick.
pub fn start_ns(pid: u32) -> Option<u64> {
    let stat = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?;
    let ticks = procfs::ticks_per_second();
    Some(stat.starttime.saturating_mul(1_000_000_000) / ticks)
}

/// Everything about `pid` that matters to the model, or `None` if it is gone.
pub fn snapshot(pid: u32) -> Option<ProcSnapshot> {
    let process = procfs::process::Process::new(pid as i32).ok()?;
    let stat = process.stat().ok()?;
    let mntns = mount_namespace(pid).unwrap_or(0);
    let mut snapshot = ProcSnapshot {
        pid,
        ppid: Some(stat.ppid as u32).filter(|p| *p != 0),
        comm: escape::text(&stat.comm),
        exe: process
            .exe()
            .ok()
            .map(|p| escape::bytes(p.as_os_str().as_encoded_bytes())),
        argv: process
            .cmdline()
            .unwrap_or_default()
            .iter()
            .map(|a| escape::text(a))
            .collect(),
        mntns,
        nspid: container_pid(pid),
        fds: Vec::new(),
        mappings: Vec::new(),
    };
    if let Ok(fds) = process.fd() {
        for fd in fds.filter_map(Result::ok) {
            let procfs::process::FDTarget::Path(target) = &fd.target else {
                continue;
            };
            let Some((path, deleted)) = shm_path(target) else {
                continue;
            };
            // stat through the magic link: the inode itself, even when unlinked.
            let Ok(meta) = fs::metadata(format!("/proc/{pid}/fd/{}", fd.fd)) else {
                continue;
            };
            snapshot.fds.push(SnapshotFd {
                fd: fd.fd,
                inode: InodeId {
                    dev: kernel_dev_from_stat(meta.dev()),
                    ino: meta.ino(),
                },
                path,
                deleted,
                cloexec: fd_cloexec(pid, fd.fd),
                size: meta.size() as i64,
            });
        }
    }
    if let Ok(maps) = process.maps() {
        for map in maps {
            let procfs::process::MMapPath::Path(target) = &map.pathname else {
                continue;
            };
            let Some((path, deleted)) = shm_path(target) else {
                continue;
            };
            snapshot.mappings.push(SnapshotMapping {
                start: map.address.0,
                len: map.address.1 - map.address.0,
                offset: map.offset,
                inode: InodeId {
                    dev: kernel_dev(map.dev.0 as u64, map.dev.1 as u64),
                    ino: map.inode,
                },
                path,
                deleted,
            });
        }
    }
    Some(snapshot)
}

/// /proc files as arbitrary bytes, through the parsers shmtrace reads them with (fuzzing):
/// procfs's for stat, status, maps and mountinfo, and this module's own.
#[cfg(fuzzing)]
pub fn fuzz_proc_files(data: &[u8]) {
    use procfs::FromRead;
    if kernel_shaped_stat(data) {
        let _ = procfs::process::Stat::from_read(data);
    }
    let _ = procfs::process::Status::from_read(data);
    let _ = procfs::process::MemoryMaps::from_read(data);
    let _ = procfs::process::MountInfos::from_read(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_majmin(text);
        let _ = shm_path(Path::new(text));
    }
}

/// Whether `data` has the shape the kernel gives every /proc/PID/stat line: `PID (COMM) S ...`.
/// procfs-core 0.18's `Stat` parser slices the line without checking it (the fuzzer found a
/// panic on a line ending in `)`), which is safe for what the kernel writes, whatever a
/// process names itself, since the kernel puts the name between the pid and the state, but
/// not for arbitrary bytes.
#[cfg(fuzzing)]
fn kernel_shaped_stat(data: &[u8]) -> bool {
    let line = String::from_utf8_lossy(data);
    let line = line.trim().as_bytes();
    let (Some(open), Some(close)) = (
        line.iter().position(|b| *b == b'('),
        line.iter().rposition(|b| *b == b')'),
    ) else {
        return false;
    };
    open >= 2
        && close > open
        && line[..open - 1].iter().all(u8::is_ascii_digit)
        && line[open - 1] == b' '
        && line.get(close + 1) == Some(&b' ')
        && line.len() > close + 2
}

/// `pid` as its own pid namespace numbers it (the last `NSpid` of /proc/PID/status), when
/// it differs from the host's: the pid a container's logs print (PostgreSQL's, say).
pub fn container_pid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let innermost: u32 = line.split_whitespace().last()?.parse().ok()?;
    (innermost != pid).then_some(innermost)
}

/// A /dev/shm path from /proc, escaped, with its ` (deleted)` marker split off.
fn shm_path(target: &Path) -> Option<(String, bool)> {
    let text = escape::bytes(target.as_os_str().as_encoded_bytes());
    if !text.starts_with("/dev/shm/") {
        return None;
    }
    match text.strip_suffix(DELETED) {
        Some(path) => Some((path.to_owned(), true)),
        None => Some((text, false)),
    }
}

/// Whether descriptor `fd` of `pid` has `O_CLOEXEC`, from /proc/PID/fdinfo.
fn fd_cloexec(pid: u32, fd: i32) -> bool {
    let Ok(info) = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else {
        return false;
    };
    info.lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .and_then(|flags| u64::from_str_radix(flags.trim(), 8).ok())
        .map(|flags| flags & libc::O_CLOEXEC as u64 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_devices_like_the_kernel() {
        assert_eq!(kernel_dev(0, 26), 26);
        assert_eq!(kernel_dev(8, 1), (8 << 20) | 1);
        assert_eq!(parse_majmin("0:26"), Some(26));
        assert_eq!(kernel_dev_from_stat(libc::makedev(8, 1)), (8 << 20) | 1);
    }

    #[test]
    fn sees_its_own_shm_descriptor_and_mapping() {
        use std::os::fd::AsRawFd;
        let name = format!("/dev/shm/shmtrace-proc-scan-{}", std::process::id());
        let file = fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&name)
            .expect("create a /dev/shm file");
        file.set_len(8192).unwrap();
        // SAFETY: a fresh shared mapping of a file we own, unmapped below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        fs::remove_file(&name).unwrap();

        let snap = snapshot(std::process::id()).expect("our own snapshot");
        let fd = snap
            .fds
            .iter()
            .find(|fd| fd.fd == file.as_raw_fd())
            .expect("the descriptor");
        assert_eq!(fd.path, name);
        assert!(fd.deleted);
        assert!(fd.cloexec, "std opens with O_CLOEXEC");
        let mapping = snap
            .mappings
            .iter()
            .find(|m| m.start == addr as u64)
            .expect("the mapping");
        assert_eq!(mapping.inode, fd.inode);
        assert_eq!(mapping.len, 8192);
        assert!(
            shm_mounts_of(std::process::id())
                .iter()
                .any(|mount| mount.dev == fd.inode.dev)
        );
        // SAFETY: unmapping what we mapped.
        unsafe { libc::munmap(addr, 8192) };
    }
}
