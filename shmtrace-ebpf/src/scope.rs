//! Which processes are traced.
//!
//! A process is traced when it is in `TARGETS` (a traced command or pid, followed through fork),
//! when its container matches (mount namespace or cgroup v2 id), or, for /dev/shm calls, in
//! host-wide mode. Everything else returns after one or two map lookups.
use aya_ebpf::helpers::bpf_get_current_cgroup_id;
use shmtrace_common::{
    KernelOffsets, flags,
    targets::{MAPPED, TRACKED},
};

use crate::{
    kernel,
    maps::{CONFIG, TARGET_CGROUPS, TARGET_MNTNS, TARGETS},
};

/// `BPF_NOEXIST`: insert only if absent.
const NOEXIST: u64 = 1;

/// Whether the current process is followed (targets, or its container). Returns the header
/// flags to use, and records a container match in `TARGETS` so later checks are one lookup.
#[inline(always)]
pub fn tracked(tgid: u32, task: u64, off: &KernelOffsets) -> Option<u16> {
    let config = CONFIG.load();
    if tgid == config.self_tgid {
        return None;
    }
    if TARGETS.get_ptr(tgid).is_some() {
        return Some(0);
    }
    if config.match_containers != 0 && container_matches(task, off) {
        let _ = TARGETS.insert(tgid, TRACKED, NOEXIST);
        return Some(flags::CONTAINER_MATCH);
    }
    None
}

/// Whether the current process's /dev/shm calls are reported: followed, or host-wide mode.
#[inline(always)]
pub fn in_scope(tgid: u32, task: u64, off: &KernelOffsets) -> Option<u16> {
    if let Some(flags) = tracked(tgid, task, off) {
        return Some(flags);
    }
    let config = CONFIG.load();
    if config.all != 0 && tgid != config.self_tgid {
        return Some(0);
    }
    None
}

/// In host-wide mode a process that touched /dev/shm becomes followed, so that its forks, exits
/// and signals are reported too.
#[inline(always)]
pub fn follow(tgid: u32) {
    let _ = TARGETS.insert(tgid, TRACKED, NOEXIST);
}

/// Marks the process as holding /dev/shm mappings.
#[inline(always)]
pub fn mark_mapped(tgid: u32) {
    match TARGETS.get_ptr_mut(tgid) {
        // SAFETY: a pointer to a live map value.
        Some(bits) => unsafe { *bits |= MAPPED },
        None => {
            let _ = TARGETS.insert(tgid, TRACKED | MAPPED, 0);
        }
    }
}

#[inline(always)]
pub fn has_mappings(tgid: u32) -> bool {
    // SAFETY: a pointer to a live map value.
    TARGETS
        .get_ptr(tgid)
        .map(|bits| unsafe { *bits } & MAPPED != 0)
        .unwrap_or(false)
}

#[inline(always)]
fn container_matches(task: u64, off: &KernelOffsets) -> bool {
    if kernel::task_mntns(task, off).is_some_and(|mntns| TARGET_MNTNS.get_ptr(mntns).is_some()) {
        return true;
    }
    // SAFETY: no preconditions.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    TARGET_CGROUPS.get_ptr(cgroup).is_some()
}
