//! How full /dev/shm was when something failed: the measurement, and the bounds the failure
//! itself proves when the measurement came too late.
use serde::{Deserialize, Serialize};

use super::{Cause, FailureKind};
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

/// The kernel's answer bounds it too. ENOSPC from a write or fallocate of `n` bytes means
/// fewer pages were free than the call needed, and `n` bytes span at most
/// `ceil((n - 1) / page) + 1` pages (the offset is not known); a SIGBUS inside a /dev/shm file
/// means not one page was free. Pages dirtied through a mapping show in no system call, so
/// this is what keeps a diagnosis from saying 43% used at ENOSPC when the use was measured
/// after the processes freed their memory.
pub(super) fn at_least_refused(
    mut capacity: Capacity,
    cause: Cause,
    kind: &FailureKind,
) -> Capacity {
    const PAGE: u64 = 4096; // tmpfs allocates pages; larger pages only make this bound weaker
    if cause != Cause::ShmFull {
        return capacity;
    }
    let free_below = match kind {
        FailureKind::Call {
            syscall: "write" | "fallocate",
            request,
            ..
        } => ((*request).max(1) - 1).div_ceil(PAGE) + 1,
        FailureKind::Fault {
            offset: Some(offset),
            file_size: Some(size),
            ..
        } if (*offset as i64) < *size => 1,
        _ => return capacity,
    };
    let floor = capacity.size.saturating_sub((free_below - 1) * PAGE);
    capacity.used = capacity.used.max(floor);
    capacity
}
