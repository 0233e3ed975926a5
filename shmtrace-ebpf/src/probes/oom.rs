//! The OOM killer's choice. tmpfs pages count against a container's memory limit, so an OOM
//! kill can be the real cause behind a "/dev/shm" crash.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{EventKind, OomEvent};

use crate::{emit, kernel, maps::config, scope};

/// The start of `oom/mark_victim` (later fields, such as the victim's memory, came in later
/// kernels and are not read):
/// ```text
/// field:unsigned short common_type;         offset:0; size:2; signed:0;
/// field:unsigned char common_flags;         offset:2; size:1; signed:0;
/// field:unsigned char common_preempt_count; offset:3; size:1; signed:0;
/// field:int common_pid;                     offset:4; size:4; signed:1;
/// field:int pid;                            offset:8; size:4; signed:1;
/// ```
#[repr(C)]
#[derive(Clone, Copy)]
struct MarkVictimArgs {
    common_type: u16,
    common_flags: u8,
    common_preempt_count: u8,
    common_pid: i32,
    pid: i32,
}

#[tracepoint]
pub fn mark_victim(ctx: TracePointContext) -> u32 {
    let _ = try_mark_victim(&ctx);
    0
}

#[inline(always)]
fn try_mark_victim(ctx: &TracePointContext) -> Option<()> {
    // SAFETY: the record starts with these fields on every kernel that has the tracepoint.
    let victim = unsafe { ctx.read_at::<MarkVictimArgs>(0) }.ok()?.pid as u32;
    if config().all == 0 && !scope::is_target(victim) {
        return None;
    }
    let off = kernel::offsets();
    let event = OomEvent {
        header: emit::header(EventKind::Oom, 0, off),
        victim_pid: victim,
        _pad: 0,
    };
    emit::send(EventKind::Oom, &event, true);
    Some(())
}
