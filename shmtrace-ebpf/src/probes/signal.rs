//! Fatal signals for traced tasks, above all SIGBUS from touching a /dev/shm page that the full
//! tmpfs could not back.
//!
//! The target is matched by pid or by its container's mount namespace: a process that ran
//! before shmtrace started and made no traced call since is in no pid map, and a SIGKILL sent
//! to it from outside must still be reported with its sender.
//!
//! ```text
//! tp_btf/signal_generate(int sig, struct kernel_siginfo *info, struct task_struct *task,
//!                        int group, int result)
//! ```
use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use shmtrace_common::{EventKind, SignalEvent, flags};

use super::tracepoint::ids;
use crate::{emit, kernel, maps::config, scope, tally};

const SIGKILL: i32 = 9;
const SIGBUS: i32 = 7;
const SIGSEGV: i32 = 11;
/// `si_code` of a SIGBUS for an access the file cannot back: past its end, or a page a full
/// tmpfs could not allocate.
const BUS_ADRERR: i32 = 2;

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
    let target_pid = kernel::task_tgid(target, off)?;
    if signo == SIGKILL && ids().0 != target_pid {
        tally::killed(target_pid);
    }
    // Host-wide mode reports every SIGBUS: it is the /dev/shm failure mode.
    let host_wide = config().all != 0 && signo == SIGBUS;
    let current = kernel::current_task();
    let mut header_flags = 0;
    if !host_wide && !scope::task_followed(target_pid, target) {
        // A fault in a process not yet attributed to a container (its own signal, so the
        // header's namespace, the sender's, is the target's): held like its calls.
        if target != current || !scope::held(kernel::task_mntns(target, off)) {
            return None;
        }
        header_flags = flags::HELD;
    }
    let (errno, code, addr) = kernel::siginfo_fault(info);
    if scope::has_mappings(target_pid) {
        header_flags |= flags::TARGET_MAPS_SHM;
        if signo == SIGBUS && code == BUS_ADRERR {
            tally::sigbus(target_pid, off);
        }
    }

    let event = SignalEvent {
        header: emit::header(EventKind::Signal, header_flags, off),
        signo,
        code,
        errno,
        result,
        addr,
        target_pid,
        target_tid: kernel::task_pid(target, off).unwrap_or(0),
        target_comm: kernel::task_comm(target, off).unwrap_or([0; 16]),
    };
    emit::send(EventKind::Signal, &event, true);
    Some(())
}
