//! Process lifecycle of traced processes: fork (followed), exec, exit, rename.
//!
//! ```text
//! raw_tp/sched_process_fork(struct task_struct *parent, struct task_struct *child)
//! raw_tp/sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
//! raw_tp/sched_process_exit(struct task_struct *p, ...)
//! raw_tp/task_rename(struct task_struct *task, const char *comm)
//! ```
use aya_ebpf::{
    cty::c_void,
    helpers::generated::{bpf_probe_read_kernel_str, bpf_probe_read_user},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use shmtrace_common::{
    ARGS_LEN, EventKind, ExecEvent, ExitEvent, ForkEvent, Loss, PATH_LEN, RenameEvent,
    flags as header_flags, targets::TRACKED,
};

use super::{stash, tracepoint::ids};
use crate::{emit, kernel, maps::config, scope, tally};

#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> i32 {
    let _ = try_fork(&ctx);
    0
}

#[inline(always)]
fn try_fork(ctx: &RawTracePointContext) -> Option<()> {
    let child: u64 = ctx.arg(1);
    let off = kernel::offsets();
    let child_pid = kernel::task_pid(child, off)?;
    if child_pid != kernel::task_tgid(child, off)? {
        return None; // a new thread, already covered by its process
    }
    let (tgid, _) = ids();
    let flags = scope::tracked(tgid)?;
    if flags & header_flags::HELD == 0 {
        inherit(tgid, child_pid);
    }
    let event = ForkEvent {
        header: emit::header(EventKind::Fork, flags, off),
        child_pid,
        _pad: 0,
    };
    emit::send(EventKind::Fork, &event, false);
    Some(())
}

/// A followed parent's child is followed too.
#[inline(always)]
fn inherit(tgid: u32, child_pid: u32) {
    // The child inherits the parent's descriptors and mappings, hence its bits.
    let bits = scope::target_bits(tgid).unwrap_or(TRACKED);
    scope::add_target(child_pid, bits, 0);
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec(ctx: RawTracePointContext) -> i32 {
    let _ = try_exec(&ctx);
    0
}

#[inline(always)]
fn try_exec(ctx: &RawTracePointContext) -> Option<()> {
    let bprm: u64 = ctx.arg(2);
    let (tgid, _) = ids();
    let off = kernel::offsets();
    let task = kernel::current_task();
    let mut flags = scope::tracked(tgid)?;
    if flags & header_flags::HELD == 0 {
        // The old mappings are gone with the old program.
        scope::add_target(tgid, TRACKED, 0);
    }

    let mut entry = emit::reserve::<ExecEvent>(EventKind::Exec)?;
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points to reserved ring buffer memory of the right size; the helpers
    // write at most the sizes given.
    unsafe {
        let filename = &raw mut (*event).filename;
        let copied = match kernel::binprm_filename(bprm, off) {
            Some(name) => bpf_probe_read_kernel_str(
                filename as *mut c_void,
                PATH_LEN as u32,
                name as *const c_void,
            ),
            None => -1,
        };
        if copied <= 0 {
            (filename as *mut u8).write(0);
            emit::count(Loss::KernelRead);
        } else if copied >= PATH_LEN as i64 {
            flags |= header_flags::PATH_TRUNCATED;
        }

        let mut args_len: u32 = 0;
        if let Some((start, end)) = kernel::task_args(task, off) {
            let mut len = end.saturating_sub(start);
            if len > ARGS_LEN as u64 {
                len = ARGS_LEN as u64;
                flags |= header_flags::ARGS_TRUNCATED;
            }
            let args = &raw mut (*event).args;
            if len > 0 {
                if bpf_probe_read_user(args as *mut c_void, len as u32, start as *const c_void) == 0
                {
                    args_len = len as u32;
                } else {
                    emit::count(Loss::UserRead);
                }
            }
        }
        (&raw mut (*event).args_len).write(args_len);
        (&raw mut (*event)._pad).write(0);
        (&raw mut (*event).header).write(emit::header(EventKind::Exec, flags, off));
    }
    // Urgent: a sandbox mounts its own /dev/shm and then execs the program, which may fail and
    // be gone within milliseconds; userspace measures that /dev/shm at the exec, while the
    // program lives. An exec is rare enough for the wakeup's cost.
    emit::submit(entry, true);
    Some(())
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(ctx: RawTracePointContext) -> i32 {
    let _ = try_exit(&ctx);
    0
}

#[inline(always)]
fn try_exit(ctx: &RawTracePointContext) -> Option<()> {
    let task: u64 = ctx.arg(0);
    let off = kernel::offsets();
    let (tgid, tid) = ids();
    stash::forget_thread(tid);
    if !kernel::current_group_dead(off).unwrap_or(tgid == tid) {
        return None; // other threads live on: the process ends with the last
    }
    let exit_code = kernel::task_exit_code(task, off).unwrap_or(0);
    // Before the scope check: a process that failed is counted even if nothing follows it
    // any longer, and its mark must not outlive it.
    let died = tally::ended(tgid, task, exit_code, off);
    // Host-wide, a death is reported even of a process nothing followed (a shell whose child
    // failed): every death the kernel counts then has its record, and who died is known.
    let mut flags = match scope::tracked(tgid) {
        Some(flags) => {
            scope::remove_target(tgid);
            if flags & header_flags::HELD == 0 {
                scope::container_ending(tgid, task, off);
            }
            flags
        }
        None if died && config().all != 0 => 0,
        None => return None,
    };
    if died {
        flags |= header_flags::SHM_DEATH;
    }
    let event = ExitEvent {
        header: emit::header(EventKind::Exit, flags, off),
        exit_code,
        _pad: 0,
    };
    emit::send(EventKind::Exit, &event, true);
    Some(())
}

#[raw_tracepoint(tracepoint = "task_rename")]
pub fn task_rename(ctx: RawTracePointContext) -> i32 {
    let _ = try_rename(&ctx);
    0
}

#[inline(always)]
fn try_rename(ctx: &RawTracePointContext) -> Option<()> {
    let target: u64 = ctx.arg(0);
    let comm: u64 = ctx.arg(1);
    let off = kernel::offsets();
    if kernel::task_in_execve(target, off) {
        return None; // exec names the task after the program; the exec event says so
    }
    let target_pid = kernel::task_tgid(target, off)?;
    let (tgid, _) = ids();
    let flags = if target_pid == tgid {
        scope::tracked(tgid)?
    } else {
        if !scope::is_target(target_pid) {
            return None;
        }
        0
    };
    let mut new_comm = [0u8; 16];
    // SAFETY: a 16-byte local buffer; the helper writes at most 16 bytes.
    if unsafe {
        bpf_probe_read_kernel_str(
            new_comm.as_mut_ptr() as *mut c_void,
            16,
            comm as *const c_void,
        )
    } <= 0
    {
        emit::count(Loss::KernelRead);
    }
    let event = RenameEvent {
        header: emit::header(EventKind::Rename, flags, off),
        target_pid,
        target_tid: kernel::task_pid(target, off).unwrap_or(0),
        new_comm,
    };
    emit::send(EventKind::Rename, &event, false);
    Some(())
}
