//! Fatal signals for traced tasks, above all SIGBUS from touching a /dev/shm page that the full
//! tmpfs could not back.
//!
//! ```text
//! tp_btf/signal_generate(int sig, struct kernel_siginfo *info, struct task_struct *task,
//!                        int group, int result)
//! ```
use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use shmtrace_common::{EventKind, SignalEvent};

use crate::{emit, kernel, maps::CONFIG, maps::TARGETS};

const SIGKILL: i32 = 9;
const SIGBUS: i32 = 7;
const SIGSEGV: i32 = 11;

#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate(ctx: RawTracePointContext) -> i32 {
    let _ = try_signal_generate(&ctx);
    0
}

#[inline(always)]
fn try_signal_generate(ctx: &RawTracePointContext) -> Option<()> {
    let signo: i32 = ctx.arg(0);
    if signo != SIGBUS && signo != SIGSEGV && signo != SIGKILL {
        return None;
    }
    let info: u64 = ctx.arg(1);
    let target: u64 = ctx.arg(2);
    let result: i32 = ctx.arg(4);
    let off = kernel::offsets();
    let target_pid = kernel::task_tgid(target, &off)?;
    // Host-wide mode reports every SIGBUS: it is the /dev/shm failure mode.
    let host_wide = CONFIG.load().all != 0 && signo == SIGBUS;
    if !host_wide && TARGETS.get_ptr(target_pid).is_none() {
        return None;
    }
    let (errno, code, addr) = kernel::siginfo_fault(info);
    let event = SignalEvent {
        header: emit::header(EventKind::Signal, 0, kernel::current_task(), &off),
        signo,
        code,
        errno,
        result,
        addr,
        target_pid,
        target_tid: kernel::task_pid(target, &off).unwrap_or(0),
        target_comm: kernel::task_comm(target, &off).unwrap_or([0; 16]),
    };
    emit::send(EventKind::Signal, &event, true);
    Some(())
}
