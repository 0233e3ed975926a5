//! What /proc and the host's cgroup tree add to a container a runtime described: its mount
//! namespace, its cgroup v2 id (where that identifies it), its measured /dev/shm.
use std::{fs, os::unix::fs::MetadataExt, path::Path};

use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, statfs};

use super::{
    Container, IpcMode,
    shm::{self, ShmSource},
};
use crate::kernel_ids;

/// Facts about the host, read once per lookup.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostFacts {
    /// Device of the host's /dev/shm: a container with the same one uses the host's.
    pub shm_dev: Option<u32>,
    /// `/sys/fs/cgroup` is cgroup2 itself (not the hybrid layout, where cgroup2 sits at
    /// `/sys/fs/cgroup/unified` and every task's cgroup id is 1).
    pub pure_cgroup_v2: bool,
}

impl HostFacts {
    pub fn read() -> HostFacts {
        HostFacts {
            shm_dev: shm::host_shm_dev(),
            pure_cgroup_v2: statfs("/sys/fs/cgroup")
                .map(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
                .unwrap_or(false),
        }
    }
}

/// Fills in what /proc knows about a running container, and measures its /dev/shm.
pub fn enrich(container: &mut Container, host: &HostFacts) {
    let configured = container.shm.configured_bytes;
    let Some(pid) = container.pid.filter(|_| container.state.is_running()) else {
        if matches!(container.ipc, IpcMode::Host | IpcMode::Container(_)) {
            container.shm.configured_bytes = None;
        }
        container.shm.measured = None;
        container.shm.source = ShmSource::Configured;
        return;
    };
    container.mntns = kernel_ids::mount_namespace(pid);
    container.cgroup_id = host.pure_cgroup_v2.then(|| cgroup_v2_id(pid)).flatten();
    match shm::measure_shm(pid) {
        Ok(mut measured) => {
            measured.configured_bytes = configured;
            container.shm = measured;
        }
        Err(error) => {
            container.shm.measured = None;
            container.shm.source = ShmSource::Unavailable {
                reason: error.to_string(),
            };
        }
    }
    // The device tells the truth whatever the configuration says: a container whose /dev/shm
    // is the host's competes with the whole host for it.
    if container.shm.dev().is_some() && container.shm.dev() == host.shm_dev {
        container.ipc = IpcMode::Host;
    }
    // Docker still reports its default ShmSize for a container that uses another's /dev/shm:
    // that number describes nothing real, so it must not be shown as the limit.
    if matches!(container.ipc, IpcMode::Host | IpcMode::Container(_)) {
        container.shm.configured_bytes = None;
    }
}

/// The cgroup v2 id of `pid`'s cgroup: the inode number of its directory in the cgroup2 tree,
/// which is what `bpf_get_current_cgroup_id()` returns.
pub fn cgroup_v2_id(pid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|line| line.strip_prefix("0::"))?;
    let relative = path.trim_start_matches('/');
    fs::metadata(Path::new("/sys/fs/cgroup").join(relative))
        .ok()
        .map(|m| m.ino())
}
