//! Which processes are traced.
//!
//! A process is traced when it is in `TARGETS` (a traced command or pid, followed through fork),
//! when its container matches (mount namespace or cgroup v2 id), or, for /dev/shm calls, in
//! host-wide mode. `TARGETS` is read and written here only, behind the `FOLLOWED` bitmap: a
//! process whose bit is clear is not in it, which one array load tells. Tracing a command or
//! pids, everything else returns after that load; following containers, after one or two map
//! lookups more.
//!
//! While a followed container is not running, processes outside shmtrace's own mount
//! namespace are reported too, flagged `HELD` and not followed: userspace keeps those records
//! until it learns the container's namespace, then keeps the container's and drops the rest.
//! Without this, a container's first processes would run before userspace (polling its
//! runtime) had put the container's namespace in `TARGET_MNTNS`.
use core::intrinsics::{AtomicOrdering, atomic_and, atomic_or};

use aya_ebpf::helpers::bpf_get_current_cgroup_id;
use shmtrace_common::{
    KernelOffsets, flags,
    targets::{MAPPED, TRACKED, followed_bit},
};

use crate::{
    kernel,
    maps::{
        FOLLOWED, HOLD_NOW, HOLD_OUTSIDE, HOLD_OWN, TARGET_CGROUPS, TARGET_MNTNS, TARGETS, config,
    },
};

/// `BPF_NOEXIST`: insert only if absent.
const NOEXIST: u64 = 1;

/// `tgid`'s word of `FOLLOWED`, and its bit there; `None` for an id beyond the bitmap, which the
/// kernel never gives.
#[inline(always)]
fn followed_word(tgid: u32) -> Option<(*mut u64, u64)> {
    let (index, bit) = followed_bit(tgid);
    Some((FOLLOWED.get_ptr_mut(index)?, bit))
}

/// Whether the process may be in `TARGETS`: `false` means it is not.
#[inline(always)]
fn may_be_target(tgid: u32) -> bool {
    // A volatile load: LLVM's BPF backend has no atomic load for this CPU version, and an
    // aligned 8-byte load is one instruction, which no concurrent atomic update can tear.
    // SAFETY: a live, 8-byte aligned array element.
    followed_word(tgid).is_none_or(|(word, bit)| unsafe { word.read_volatile() } & bit != 0)
}

/// Whether the process is in `TARGETS`.
#[inline(always)]
pub fn is_target(tgid: u32) -> bool {
    may_be_target(tgid) && TARGETS.get_ptr(tgid).is_some()
}

/// The process's `TARGETS` bits, if it is there.
#[inline(always)]
pub fn target_bits(tgid: u32) -> Option<u32> {
    if !may_be_target(tgid) {
        return None;
    }
    // SAFETY: a pointer to a live map value.
    TARGETS.get_ptr(tgid).map(|bits| unsafe { *bits })
}

/// Puts the process in `TARGETS` with `bits` (`flags` as for a map update). Its bit is set
/// first: a reader between the two finds it absent from `TARGETS`, as before.
#[inline(always)]
pub fn add_target(tgid: u32, bits: u32, flags: u64) {
    if let Some((word, bit)) = followed_word(tgid) {
        // SAFETY: as in `may_be_target`.
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(word, bit) };
    }
    let _ = TARGETS.insert(tgid, bits, flags);
}

/// Takes the process out of `TARGETS`, at its exit. Its id cannot name another process before
/// this returns, so clearing its bit cannot hide one.
#[inline(always)]
pub fn remove_target(tgid: u32) {
    let _ = TARGETS.remove(tgid);
    if let Some((word, bit)) = followed_word(tgid) {
        // SAFETY: as in `may_be_target`.
        unsafe { atomic_and::<u64, u64, { AtomicOrdering::Relaxed }>(word, !bit) };
    }
}

/// Whether the current process is followed (targets, or its container). Returns the header
/// flags to use, and records a container match in `TARGETS` so later checks are one lookup.
/// A held process (flags `HELD`) is reported but must not be put in `TARGETS`.
#[inline(always)]
pub fn tracked(tgid: u32) -> Option<u16> {
    let config = config();
    if tgid == config.self_tgid {
        return None;
    }
    if is_target(tgid) {
        return Some(0);
    }
    if config.match_containers == 0 {
        return None;
    }
    let mntns = kernel::current_mntns(kernel::offsets());
    if mntns_followed(mntns) || current_cgroup_followed() {
        add_target(tgid, TRACKED, NOEXIST);
        return Some(flags::CONTAINER_MATCH);
    }
    if held(mntns) {
        return Some(flags::HELD);
    }
    None
}

/// Whether `task` (any task, not only the current one) is followed: in `TARGETS`, or in a
/// followed container's mount namespace. A process that was running before shmtrace started
/// and has made no traced call since is in no map yet, but its container is.
#[inline(always)]
pub fn task_followed(target_pid: u32, task: u64) -> bool {
    if is_target(target_pid) {
        return true;
    }
    config().match_containers != 0 && mntns_followed(kernel::task_mntns(task, kernel::offsets()))
}

/// Whether a process in mount namespace `mntns`, followed by nothing, is to be reported as held.
#[inline(always)]
pub fn held(mntns: Option<u32>) -> bool {
    let Some(mntns) = mntns else {
        return false;
    };
    // SAFETY: a pointer to a live map value.
    let outside = HOLD_OUTSIDE
        .get_ptr(HOLD_NOW)
        .map(|v| unsafe { *v })
        .unwrap_or(0);
    outside != 0 && mntns != 0 && mntns != outside
}

/// A followed container's first process is exiting (the container stops or restarts): its
/// namespace stops matching now, as its number may soon name an unrelated namespace (its
/// processes already followed stay followed, by pid), and records of unknown namespaces are
/// held from now on, until userspace has seen the container again.
#[inline(always)]
pub fn container_ending(tgid: u32, task: u64, off: &KernelOffsets) {
    let Some(mntns) = kernel::task_mntns(task, off) else {
        return;
    };
    // SAFETY: pointers to live map values.
    let first = TARGET_MNTNS.get_ptr(mntns).map(|v| unsafe { *v });
    if first != Some(tgid) {
        return;
    }
    let _ = TARGET_MNTNS.remove(mntns);
    let own = HOLD_OUTSIDE
        .get_ptr(HOLD_OWN)
        // SAFETY: a pointer to a live map value.
        .map(|v| unsafe { *v })
        .unwrap_or(0);
    if let Some(now) = HOLD_OUTSIDE.get_ptr_mut(HOLD_NOW) {
        // SAFETY: a pointer to a live map value.
        unsafe { *now = own };
    }
}

/// Whether the current process's /dev/shm calls are reported: followed, or host-wide mode.
#[inline(always)]
pub fn in_scope(tgid: u32) -> Option<u16> {
    scope_of(tgid).map(|(flags, _)| flags)
}

/// As [`in_scope`], and whether the process is followed ([`tracked`]) rather than only in
/// scope host-wide.
#[inline(always)]
pub fn scope_of(tgid: u32) -> Option<(u16, bool)> {
    if let Some(flags) = tracked(tgid) {
        return Some((flags, true));
    }
    let config = config();
    if config.all != 0 && tgid != config.self_tgid {
        return Some((0, false));
    }
    None
}

/// In host-wide mode a process that touched /dev/shm becomes followed, so that its forks, exits
/// and signals are reported too.
#[inline(always)]
pub fn follow(tgid: u32) {
    add_target(tgid, TRACKED, NOEXIST);
}

/// Marks the process as holding /dev/shm mappings.
#[inline(always)]
pub fn mark_mapped(tgid: u32) {
    let bits = if may_be_target(tgid) {
        TARGETS.get_ptr_mut(tgid)
    } else {
        None
    };
    match bits {
        // SAFETY: a pointer to a live map value.
        Some(bits) => unsafe { *bits |= MAPPED },
        None => add_target(tgid, TRACKED | MAPPED, 0),
    }
}

#[inline(always)]
pub fn has_mappings(tgid: u32) -> bool {
    target_bits(tgid).is_some_and(|bits| bits & MAPPED != 0)
}

/// Whether the current process's calls on a descriptor (or a mapping) are looked at: those
/// of `in_scope`, except that in host-wide mode only a followed process's are. In host-wide
/// mode a process is followed from its first /dev/shm call on (`follow`), and a process that
/// gets a /dev/shm descriptor without one is followed too: through fork (`inherit`), by
/// receiving it (`recvmsg.rs`), or by holding it when shmtrace starts (userspace puts it in
/// `TARGETS`). Every other process on the host, one that holds no /dev/shm descriptor or
/// mapping, returns here after one array load, before any kernel read.
#[inline(always)]
pub fn fd_call_scope(tgid: u32) -> Option<u16> {
    let config = config();
    if config.all != 0 && config.match_containers == 0 {
        return (tgid != config.self_tgid && may_be_target(tgid)).then_some(0);
    }
    in_scope(tgid)
}

/// Whether the current process is one that host-wide mode does not follow yet: its `recvmsg`
/// is then checked for a /dev/shm descriptor (`flags::RECEIVES`).
#[inline(always)]
pub fn receives_unfollowed(tgid: u32) -> bool {
    let config = config();
    config.all != 0 && tgid != config.self_tgid && !may_be_target(tgid)
}

#[inline(always)]
fn mntns_followed(mntns: Option<u32>) -> bool {
    mntns.is_some_and(|mntns| TARGET_MNTNS.get_ptr(mntns).is_some())
}

#[inline(always)]
fn current_cgroup_followed() -> bool {
    // SAFETY: no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    TARGET_CGROUPS.get_ptr(cgroup).is_some()
}
