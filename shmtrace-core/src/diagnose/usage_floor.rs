//! How full /dev/shm was when something failed: the floor that what the traced processes held
//! puts under a measurement that came too late (`failure` adds the floor the kernel's refusal
//! proves).
use crate::{capacity::Capacity, model::ShmUsage};

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
