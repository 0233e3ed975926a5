//! Bits of the `TARGETS` map's values (per traced process), written by userspace and the
//! probes alike.

/// Lifecycle events of this process are reported (it is followed).
pub const TRACKED: u32 = 1 << 0;
/// The process has mapped a /dev/shm object, so its `munmap`s matter.
pub const MAPPED: u32 = 1 << 1;
