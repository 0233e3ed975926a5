//! Bits of the `TARGETS` map's values (per traced process), written by userspace and the
//! probes alike; and the `FOLLOWED` bitmap in front of it.

/// Lifecycle events of this process are reported (it is followed).
pub const TRACKED: u32 = 1 << 0;
/// The process has mapped a /dev/shm object, so its `munmap`s matter.
pub const MAPPED: u32 = 1 << 1;

/// Thread-group ids the `FOLLOWED` bitmap covers: the kernel's `PID_MAX_LIMIT` on 64-bit,
/// above any `kernel.pid_max`.
pub const PID_LIMIT: u32 = 1 << 22;
/// `FOLLOWED`'s 64-bit words, one bit per thread-group id.
pub const FOLLOWED_WORDS: u32 = PID_LIMIT / 64;

/// The word of `FOLLOWED` that holds `tgid`'s bit, and the bit.
pub const fn followed_bit(tgid: u32) -> (u32, u64) {
    (tgid / 64, 1 << (tgid % 64))
}
