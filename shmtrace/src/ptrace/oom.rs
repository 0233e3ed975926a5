//! What the OOM killer did, as far as an unprivileged tracer can tell: the cgroup's own count
//! of its kills (`memory.events`' `oom_kill`, v1's `memory.oom_control`) going up with a
//! traced process's death by SIGKILL.
use crate::container::{cgroup_v2_id, memory};

/// The count, as last read.
pub struct OomKills {
    last: u64,
}

impl OomKills {
    /// `None` where the count cannot be read.
    pub fn open() -> Option<OomKills> {
        Some(OomKills {
            last: memory::read()?.oom_kills?,
        })
    }

    /// Whether the count went up since last asked.
    pub fn rose(&mut self) -> bool {
        let Some(now) = memory::read().and_then(|m| m.oom_kills) else {
            return false;
        };
        let rose = now > self.last;
        self.last = now;
        rose
    }
}

/// The cgroup id records carry: this process's cgroup v2 directory's, on a host whose
/// cgroups are all v2; else 1, as the probes write where no v2 hierarchy is in use.
pub fn cgroup_id() -> u64 {
    let pure_v2 = nix::sys::statfs::statfs("/sys/fs/cgroup")
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
    if !pure_v2 {
        return 1;
    }
    cgroup_v2_id(std::process::id()).unwrap_or(1)
}
