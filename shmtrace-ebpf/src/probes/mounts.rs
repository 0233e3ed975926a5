//! A file system made, anywhere: the device numbers' verdicts given before it are no longer
//! trusted, as it may have taken over the number of one unmounted (`shmtrace_common::supers`).
//! `mount` makes one (or binds, moves, remounts: no matter), and so does `fsconfig` of the newer
//! mount API (`FSCONFIG_CMD_CREATE`). Both are rare, so that these programs cost nothing that
//! counts.
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::supers::GENERATION;

use super::tracepoint::exit_ret;
use crate::maps::SHM_SUPERS;

/// `mount(source, target, type, flags, data)`.
#[tracepoint]
pub fn sys_exit_mount(ctx: TracePointContext) -> u32 {
    made(&ctx);
    0
}

/// `fsconfig(fd, cmd, key, value, aux)`.
#[tracepoint]
pub fn sys_exit_fsconfig(ctx: TracePointContext) -> u32 {
    made(&ctx);
    0
}

#[inline(always)]
fn made(ctx: &TracePointContext) {
    if exit_ret(ctx) != 0 {
        return;
    }
    if let Some(generation) = SHM_SUPERS.get_ptr_mut(GENERATION) {
        // SAFETY: a live, 8-byte aligned array element, changed by other CPUs too.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(generation, 1) };
    }
}
