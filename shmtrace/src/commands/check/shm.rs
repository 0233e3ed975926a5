//! The /dev/shm this process sees: whether something is mounted there, what, how big and how
//! full (bytes and inodes), with which options. Read with `statvfs` and /proc/self/mountinfo,
//! which need no privilege.
use std::{fs, os::unix::fs::MetadataExt, path::Path};

use nix::sys::{
    statfs::{TMPFS_MAGIC, statfs},
    statvfs::{FsFlags, statvfs},
};
use serde::Serialize;

use crate::kernel_ids;

pub const SHM: &str = "/dev/shm";

/// What is at /dev/shm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A tmpfs its container runtime made for it (mount source `shm`: Docker's and Podman's
    /// `--shm-size`, the pod's in Kubernetes).
    Runtime,
    /// Another tmpfs mounted there: in a container, the host's own shared in (`--ipc=host`),
    /// a Kubernetes emptyDir of medium Memory, or a `--tmpfs` mount; on the host, its own.
    Tmpfs,
    /// A file system other than tmpfs is mounted there.
    OtherFileSystem,
    /// Nothing is mounted there: it is a directory of the file system below it.
    NotMounted,
    /// There is no /dev/shm (`--ipc=none`).
    Missing,
}

/// The facts about /dev/shm.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Shm {
    pub path: &'static str,
    pub kind: Kind,
    /// The file system's type (`tmpfs`, or the one below when nothing is mounted).
    pub fs_type: Option<String>,
    /// The mount's source as mountinfo names it (`shm`, `tmpfs`, ...).
    pub source: Option<String>,
    /// The mount's options, then the file system's (`rw,nosuid,...`, `rw,size=65536k`).
    pub mount_options: Option<String>,
    pub super_options: Option<String>,
    /// The kernel's `dev_t` encoding, as trace records carry it.
    pub dev: Option<u32>,
    pub size_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    /// Free to an unprivileged writer.
    pub free_bytes: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub read_only: bool,
    /// Whether an ordinary user can create files there (the sticky, world-writable mode
    /// /dev/shm has everywhere), as `access(2)` answers for this process.
    pub writable: bool,
}

impl Shm {
    /// Whether files can be made there at all.
    pub fn usable(&self) -> bool {
        !matches!(self.kind, Kind::Missing) && !self.read_only && self.writable
    }
}

/// Reads /dev/shm as this process sees it.
pub fn read() -> Shm {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mount = top_mount_at(&mountinfo, SHM);
    let exists = fs::metadata(SHM).is_ok_and(|m| m.is_dir());
    let mut shm = Shm {
        path: SHM,
        kind: Kind::Missing,
        fs_type: None,
        source: None,
        mount_options: None,
        super_options: None,
        dev: None,
        size_bytes: None,
        used_bytes: None,
        free_bytes: None,
        inodes: None,
        inodes_free: None,
        read_only: false,
        writable: false,
    };
    if !exists {
        return shm;
    }
    let is_tmpfs = statfs(SHM).is_ok_and(|fs| fs.filesystem_type() == TMPFS_MAGIC);
    shm.kind = match &mount {
        None => Kind::NotMounted,
        Some(mount) if mount.fs_type == "tmpfs" && mount.source == "shm" => Kind::Runtime,
        Some(mount) if mount.fs_type == "tmpfs" || is_tmpfs => Kind::Tmpfs,
        Some(_) => Kind::OtherFileSystem,
    };
    let below = mount
        .is_none()
        .then(|| mount_below(&mountinfo, SHM))
        .flatten();
    if let Some(mount) = mount.or(below) {
        shm.fs_type = Some(mount.fs_type);
        shm.source = Some(mount.source);
        shm.mount_options = Some(mount.mount_options);
        shm.super_options = Some(mount.super_options);
    }
    shm.dev = fs::metadata(SHM)
        .ok()
        .map(|m| kernel_ids::kernel_dev_from_stat(m.dev()));
    if let Ok(vfs) = statvfs(SHM) {
        let unit = vfs.fragment_size();
        let size = vfs.blocks() * unit;
        shm.size_bytes = Some(size);
        shm.used_bytes = Some(size.saturating_sub(vfs.blocks_free() * unit));
        shm.free_bytes = Some(vfs.blocks_available() * unit);
        shm.inodes = Some(vfs.files());
        shm.inodes_free = Some(vfs.files_available());
        shm.read_only = vfs.flags().contains(FsFlags::ST_RDONLY);
    }
    shm.writable = nix::unistd::access(SHM, nix::unistd::AccessFlags::W_OK).is_ok();
    shm
}

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: String,
    pub mount_options: String,
    pub fs_type: String,
    pub source: String,
    pub super_options: String,
}

/// `36 35 98:0 / /dev/shm rw,nosuid - tmpfs shm rw,size=65536k`: the mount point is field 5,
/// its options field 6; after ` - ` come the type, the source and the super options.
/// Mount points escape spaces and the like as octal (`\040`).
fn parse_line(line: &str) -> Option<Mount> {
    let (head, tail) = line.split_once(" - ")?;
    let mut head = head.split(' ');
    let mount_point = unescape(head.nth(4)?);
    let mount_options = head.next()?.to_owned();
    let mut tail = tail.split(' ');
    Some(Mount {
        mount_point,
        mount_options,
        fs_type: tail.next()?.to_owned(),
        source: unescape(tail.next()?),
        super_options: tail.next().unwrap_or_default().to_owned(),
    })
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match octal {
            Some(digits) => {
                let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount on top at `path` (the last one listed there), if any.
pub fn top_mount_at(mountinfo: &str, path: &str) -> Option<Mount> {
    mountinfo
        .lines()
        .filter_map(parse_line)
        .rfind(|mount| mount.mount_point == path)
}

/// The mount `path` lives on when nothing is mounted at it: the one with the longest mount
/// point that is a parent of it.
fn mount_below(mountinfo: &str, path: &str) -> Option<Mount> {
    let path = Path::new(path);
    mountinfo
        .lines()
        .filter_map(parse_line)
        .filter(|mount| path.starts_with(&mount.mount_point))
        .fold(None, |best: Option<Mount>, mount| match best {
            Some(best) if best.mount_point.len() > mount.mount_point.len() => Some(best),
            _ => Some(mount),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From Docker containers on this project's machine: the runtime's own (`--shm-size 8m`),
    /// the host's (`--ipc=host`), a `--tmpfs` mount, and none (`--ipc=none`).
    const RUNTIME: &str = "\
79 77 0:44 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
93 79 0:48 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size=8192k
";
    const HOST: &str = "\
78 76 0:43 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
95 78 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683792k
";
    const NONE: &str = "\
79 77 0:44 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
";

    #[test]
    fn finds_the_mount_at_dev_shm_and_below_it() {
        let mount = top_mount_at(RUNTIME, SHM).unwrap();
        assert_eq!(mount.source, "shm");
        assert_eq!(mount.fs_type, "tmpfs");
        assert_eq!(mount.super_options, "rw,size=8192k");
        assert_eq!(mount.mount_options, "rw,nosuid,nodev,noexec,relatime");
        assert_eq!(top_mount_at(HOST, SHM).unwrap().source, "tmpfs");
        assert_eq!(top_mount_at(NONE, SHM), None);
        assert_eq!(mount_below(NONE, SHM).unwrap().mount_point, "/dev");
        // A tmpfs mounted over another: the last one listed is on top.
        let stacked = format!("{RUNTIME}120 93 0:60 / /dev/shm ro - tmpfs tmpfs rw,size=1k\n");
        assert_eq!(top_mount_at(&stacked, SHM).unwrap().mount_options, "ro");
    }

    #[test]
    fn reads_escaped_and_broken_lines() {
        let spaced = "40 1 0:50 / /mnt/a\\040b rw - tmpfs my\\011src rw\n";
        let mount = top_mount_at(spaced, "/mnt/a b").unwrap();
        assert_eq!(mount.source, "my\tsrc");
        assert_eq!(unescape("\\12x\\"), "\\12x\\");
        assert_eq!(top_mount_at("garbage\n - \n1 2 3\n", SHM), None);
    }

    #[test]
    fn reads_this_machines_dev_shm() {
        let shm = read();
        assert_ne!(shm.kind, Kind::Missing);
        assert!(shm.size_bytes.unwrap() > 0);
        assert!(shm.used_bytes.unwrap() <= shm.size_bytes.unwrap());
        assert!(shm.inodes.unwrap() >= shm.inodes_free.unwrap());
    }
}
