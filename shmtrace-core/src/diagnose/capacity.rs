//! How full /dev/shm was when something failed: the measurement, and the floor that what the
//! traced processes held puts under it when the measurement came too late (`failure` adds the
//! floor the kernel's refusal proves).
use serde::{Deserialize, Serialize};

use crate::model::ShmUsage;

/// Size and use of one /dev/shm file system, measured with statfs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// `dev_t` of the file system.
    pub dev: u32,
    pub size: u64,
    pub used: u64,
    /// When it was measured (`CLOCK_BOOTTIME` ns).
    pub ts_ns: u64,
}

/// /dev/shm is measured when userspace reads the failure, which may be after the process
/// freed what it held (a program that gets ENOSPC from sem_open unlinks its files at once, and
/// the measurement then reads 0 bytes used): it was at least as full as the traced objects'
/// allocated pages made it at that moment.
pub(super) fn at_least_held(mut capacity: Capacity, usage: Option<&ShmUsage>) -> Capacity {
    if let Some(usage) = usage {
        capacity.used = capacity.used.max(usage.allocated.min(capacity.size));
    }
    capacity
}
