//! The memory limit of the cgroup this process runs in, and what it already counts: tmpfs
//! pages are charged to the cgroup of whoever touched them, so a /dev/shm bigger than what
//! the limit leaves has the OOM killer end the writer before ENOSPC would.
//!
//! cgroup v2 (`memory.max`, `memory.current`, `memory.stat`) and v1 (`memory.limit_in_bytes`,
//! `memory.usage_in_bytes`, `memory.stat`), found through /proc/self/cgroup and the cgroup
//! file system's mount in /proc/self/mountinfo: inside a container the mount's root is the
//! container's own cgroup, so the path /proc/self/cgroup names is taken relative to it.
use std::{
    fs,
    path::{Path, PathBuf},
};

use serde::Serialize;

/// Above this, a v1 limit means none (the kernel's `PAGE_COUNTER_MAX` in bytes, rounded down).
const V1_UNLIMITED: u64 = 1 << 62;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Version {
    #[serde(rename = "v1")]
    V1,
    #[serde(rename = "v2")]
    V2,
}

/// What the memory controller says of this process's cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Memory {
    pub cgroup: Version,
    /// As /proc/self/cgroup names it.
    pub path: String,
    /// The lowest limit of the cgroup and its ancestors that can be read; `None`: no limit.
    pub limit_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    /// Pages of tmpfs (and System V shared memory) charged to it: /dev/shm files among them.
    pub shmem_bytes: Option<u64>,
    /// File cache other than tmpfs, which the kernel reclaims before it kills.
    pub reclaimable_bytes: Option<u64>,
    /// How often the OOM killer ended a process here (`memory.events` `oom_kill`, or v1's
    /// `memory.oom_control`).
    pub oom_kills: Option<u64>,
}

impl Memory {
    /// Bytes of memory still free under the limit for pages that cannot be reclaimed, such as
    /// those of /dev/shm: the limit less what is in use, reclaimable cache aside.
    pub fn room_bytes(&self) -> Option<u64> {
        let limit = self.limit_bytes?;
        let pinned = self
            .usage_bytes?
            .saturating_sub(self.reclaimable_bytes.unwrap_or(0));
        Some(limit.saturating_sub(pinned))
    }
}

/// Reads it, or `None` when no memory controller can be found (a platform that hides it).
pub fn read() -> Option<Memory> {
    let cgroup = fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    read_from(&cgroup, &mountinfo, Path::new("/"))
}

/// [`read`] with the files given, and the file system under `root` (tests).
fn read_from(cgroup: &str, mountinfo: &str, root: &Path) -> Option<Memory> {
    let (version, path) = memory_cgroup(cgroup)?;
    let (mount_point, mount_root) = cgroup_mount(mountinfo, version)?;
    let relative = Path::new(&path)
        .strip_prefix(&mount_root)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mount = root.join(mount_point.trim_start_matches('/'));
    // A path the mount does not hold (another cgroup namespace) is read at the mount's root.
    let dir = Some(mount.join(&relative))
        .filter(|dir| dir.is_dir())
        .unwrap_or_else(|| mount.clone());
    Some(match version {
        Version::V2 => read_v2(&dir, &mount, path),
        Version::V1 => read_v1(&dir, path),
    })
}

/// The memory cgroup's version and path in /proc/self/cgroup: v1's `N:memory:/path` (or
/// `N:...,memory,...:/path`) when there is one, else v2's `0::/path`.
fn memory_cgroup(text: &str) -> Option<(Version, String)> {
    let mut v2 = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((Version::V1, path.to_owned()));
        }
        if controllers.is_empty() {
            v2 = Some((Version::V2, path.to_owned()));
        }
    }
    v2
}

/// Where the cgroup file system of `version` is mounted, and the cgroup at its root.
fn cgroup_mount(mountinfo: &str, version: Version) -> Option<(String, String)> {
    mountinfo.lines().find_map(|line| {
        let (head, tail) = line.split_once(" - ")?;
        let head: Vec<&str> = head.split(' ').collect();
        let mut tail = tail.split(' ');
        let fs_type = tail.next()?;
        let _source = tail.next()?;
        let options = tail.next().unwrap_or_default();
        let wanted = match version {
            Version::V2 => fs_type == "cgroup2",
            Version::V1 => fs_type == "cgroup" && options.split(',').any(|o| o == "memory"),
        };
        if !wanted {
            return None;
        }
        Some((head.get(4)?.to_string(), head.get(3)?.to_string()))
    })
}

fn number(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines (memory.stat, memory.events).
fn field(path: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

fn read_v2(dir: &Path, mount: &Path, path: String) -> Memory {
    // The effective limit is the lowest on the way up to the mount's root.
    let mut limit: Option<u64> = None;
    let mut at: PathBuf = dir.to_path_buf();
    loop {
        if let Ok(text) = fs::read_to_string(at.join("memory.max"))
            && let Ok(value) = text.trim().parse::<u64>()
        {
            limit = Some(limit.map_or(value, |l| l.min(value)));
        }
        if at == mount || !at.pop() || !at.starts_with(mount) {
            break;
        }
    }
    let stat = dir.join("memory.stat");
    let file = field(&stat, "file");
    let shmem = field(&stat, "shmem");
    Memory {
        cgroup: Version::V2,
        path,
        limit_bytes: limit,
        usage_bytes: number(&dir.join("memory.current")),
        shmem_bytes: shmem,
        reclaimable_bytes: file.map(|file| file.saturating_sub(shmem.unwrap_or(0))),
        oom_kills: field(&dir.join("memory.events"), "oom_kill"),
    }
}

fn read_v1(dir: &Path, path: String) -> Memory {
    let stat = dir.join("memory.stat");
    // hierarchical_memory_limit already takes the ancestors' into account.
    let limit = field(&stat, "hierarchical_memory_limit")
        .or_else(|| number(&dir.join("memory.limit_in_bytes")))
        .filter(|limit| *limit < V1_UNLIMITED);
    let cache = field(&stat, "total_cache").or_else(|| field(&stat, "cache"));
    let shmem = field(&stat, "total_shmem").or_else(|| field(&stat, "shmem"));
    Memory {
        cgroup: Version::V1,
        path,
        limit_bytes: limit,
        usage_bytes: number(&dir.join("memory.usage_in_bytes")),
        shmem_bytes: shmem,
        reclaimable_bytes: cache.map(|cache| cache.saturating_sub(shmem.unwrap_or(0))),
        oom_kills: field(&dir.join("memory.oom_control"), "oom_kill"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(name), text).unwrap();
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("check-memory-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// A Docker container on cgroup v1 (this machine): the memory hierarchy's root is the
    /// container's cgroup, and /proc/self/cgroup names its path on the host.
    #[test]
    fn reads_v1_through_the_mounts_root() {
        let root = scratch("v1");
        let memory = root.join("sys/fs/cgroup/memory");
        write(&memory, "memory.limit_in_bytes", "268435456\n");
        write(&memory, "memory.usage_in_bytes", "1355776\n");
        write(
            &memory,
            "memory.stat",
            "cache 4096\nrss 118784\nshmem 0\nhierarchical_memory_limit 268435456\n\
             total_cache 8392704\ntotal_shmem 8388608\n",
        );
        write(
            &memory,
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        );
        let cgroup = "4:memory:/docker/f546\n8:pids:/docker/f546\n0::/docker/f546\n";
        let mountinfo =
            "86 82 0:32 /docker/f546 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n";
        let read = read_from(cgroup, mountinfo, &root).unwrap();
        assert_eq!(read.cgroup, Version::V1);
        assert_eq!(read.limit_bytes, Some(256 << 20));
        assert_eq!(read.shmem_bytes, Some(8 << 20));
        assert_eq!(read.reclaimable_bytes, Some(4096));
        assert_eq!(read.oom_kills, Some(2));
        assert_eq!(read.room_bytes(), Some((256 << 20) - 1_355_776 + 4096));
        // No limit: v1 writes a huge number.
        write(
            &memory,
            "memory.stat",
            "hierarchical_memory_limit 9223372036854771712\n",
        );
        assert_eq!(
            read_from(cgroup, mountinfo, &root).unwrap().limit_bytes,
            None
        );
        fs::remove_dir_all(&root).unwrap();
    }

    /// cgroup v2 on the host: the lowest limit on the way up counts.
    #[test]
    fn reads_v2_and_takes_the_lowest_limit_up_the_tree() {
        let root = scratch("v2");
        let mount = root.join("sys/fs/cgroup");
        let pod = mount.join("kubepods/pod1");
        let container = pod.join("c1");
        write(&mount, "memory.stat", "");
        write(&pod, "memory.max", "536870912\n");
        write(&container, "memory.max", "max\n");
        write(&container, "memory.current", "104857600\n");
        write(
            &container,
            "memory.stat",
            "anon 10\nfile 73400320\nshmem 67108864\n",
        );
        write(
            &container,
            "memory.events",
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        );
        let cgroup = "0::/kubepods/pod1/c1\n";
        let mountinfo = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let read = read_from(cgroup, mountinfo, &root).unwrap();
        assert_eq!(read.cgroup, Version::V2);
        assert_eq!(read.limit_bytes, Some(512 << 20));
        assert_eq!(read.shmem_bytes, Some(64 << 20));
        assert_eq!(read.reclaimable_bytes, Some(6 << 20));
        assert_eq!(read.oom_kills, Some(1));
        assert_eq!(
            read.room_bytes(),
            Some((512 << 20) - (100 << 20) + (6 << 20))
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn no_memory_controller_is_none() {
        assert_eq!(memory_cgroup("1:cpu:/\n2:pids:/x\n"), None);
        assert_eq!(memory_cgroup("garbage"), None);
        assert_eq!(read_from("0::/\n", "", Path::new("/nonexistent")), None);
    }
}
