//! Which container a process is in, read from /proc as the daemon meets it: the cgroup names
//! the container's runtime and id.
use crate::container::{PathClass, Runtime, parse_proc_cgroup};

/// The container a process is in, by its cgroup (`/proc/PID/cgroup`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub runtime: Runtime,
    pub id: String,
}

pub fn member_of(pid: u32) -> Option<Member> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    match parse_proc_cgroup(&text) {
        PathClass::Container(found) => Some(Member {
            runtime: found.runtime,
            id: found.id,
        }),
        _ => None,
    }
}

/// When process `pid` is gone already (`dd` writes and exits in a millisecond), the container
/// of any process still in its mount namespace `mntns`. One pass over /proc, once per
/// namespace no survey claimed yet; none for a process that is there (in no container).
pub fn member_in(pid: u32, mntns: u32) -> Option<Member> {
    if std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return None;
    }
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| crate::kernel_ids::mount_namespace(*pid) == Some(mntns))
        .find_map(member_of)
}

/// Whether any process is in mount namespace `mntns` now. None is: the namespace is gone,
/// and with it a /dev/shm of its own (a container that started and ended between two
/// surveys). One pass over /proc, once per namespace that no survey claimed.
pub fn anyone_in(mntns: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        // Unreadable: assume it is there (forgetting a live /dev/shm would be worse).
        return true;
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| crate::kernel_ids::mount_namespace(pid) == Some(mntns))
}
