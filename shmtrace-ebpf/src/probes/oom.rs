//! The OOM killer's choice. tmpfs pages count against a container's memory limit, so an OOM
//! kill can be the real cause behind a "/dev/shm" crash.
//!
//! ```text
//! oom/mark_victim: int pid @8   (the first field since the tracepoint exists)
//! ```
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{EventKind, OomEvent};

use crate::{
    emit, kernel,
    maps::{CONFIG, TARGETS},
};

#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    let _ = try_mark_victim(&ctx);
    0
}

#[inline(always)]
fn try_mark_victim(ctx: &TracePointContext) -> Option<()> {
    // SAFETY: `pid` is at offset 8 of the record.
    let victim = unsafe { ctx.read_at::<i32>(8) }.ok()? as u32;
    if CONFIG.load().all == 0 && TARGETS.get_ptr(victim).is_none() {
        return None;
    }
    let off = kernel::offsets();
    let mut entry = emit::reserve::<OomEvent>(EventKind::Oom)?;
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points to reserved ring buffer memory of the right size.
    unsafe {
        emit::fill_header(
            &raw mut (*event).header,
            EventKind::Oom,
            0,
            kernel::current_task(),
            &off,
        );
        (&raw mut (*event).victim_pid).write(victim);
        (&raw mut (*event)._pad).write(0);
    }
    emit::submit(entry, true);
    Some(())
}
