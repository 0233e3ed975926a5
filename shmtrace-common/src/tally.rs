//! Failures, SIGBUS and deaths counted in the kernel (the `TALLIES` map), by mount namespace: what the
//! daemon's metrics count stays exact when the records themselves are dropped, for it adds
//! what the kernel counted and no record brought.

/// What a count is of: a failed call (its `Syscall` and errno), a SIGBUS, or a death.
///
/// `mntns` is the calling task's mount namespace, as in the record's header. A `recvmsg` that
/// dropped the descriptors sent to it has errno 0 (it returned no error).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TallyKey {
    pub mntns: u32,
    /// A `Syscall`, or [`TallyKey::SIGBUS`].
    pub what: u16,
    pub errno: u16,
}

impl TallyKey {
    /// `what` of a SIGBUS sent to a traced process (the record's `signo`).
    pub const SIGBUS: u16 = u16::MAX;
    /// `what` of a death of a full /dev/shm (`flags::SHM_DEATH`).
    pub const DEATH: u16 = u16::MAX - 1;
}

/// Entries of `TALLIES`: distinct (namespace, call, errno) at once. The daemon deletes a
/// namespace's when its container has ended.
pub const TALLIES_ENTRIES: u32 = 16_384;

#[cfg(feature = "aya")]
mod user {
    // SAFETY: `#[repr(C)]`, a `u32` and two `u16`s, with no padding.
    unsafe impl aya::Pod for super::TallyKey {}
}
