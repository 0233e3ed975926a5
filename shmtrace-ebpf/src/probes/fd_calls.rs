//! Calls on descriptors that refer to /dev/shm objects.
//!
//! A descriptor counts when its file is on a /dev/shm (`shm_check`), whoever opened it, so
//! descriptors received over a socket (PyTorch passes them with SCM_RIGHTS) count too.
//!
//! `close` is traced at its entry only, and reported as succeeding (why:
//! `Syscall::traced_at_entry_only`). The others are traced at their exit only.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{Syscall, flags};

use super::{
    report, shm_check,
    tracepoint::{args_at_exit, enter_args, exit_ret},
};
use crate::{
    emit,
    kernel::{self, Current, FileAt, Regs},
    maps::{Pending, config},
    scope,
};

/// `MAP_ANONYMOUS`.
const MAP_ANONYMOUS: u64 = 0x20;

enter_args! {
    /// `syscalls/sys_enter_close`:
    /// ```text
    /// field:unsigned int fd;  offset:16; size:8; signed:0;
    /// ```
    CloseArgs { fd }
}

/// `close(fd)`: reported at entry, with its file as it is then.
#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let _ = enter_close(&ctx);
    0
}

/// What every `close` on the host runs: the few loads that tell a /dev/shm file from another,
/// the record made in a function of its own (why: `open.rs`, `exit`).
#[inline(always)]
fn enter_close(ctx: &TracePointContext) -> Option<()> {
    // One helper call for the task, whose id and descriptor table are then plain loads.
    let task = Current::get();
    let off = kernel::offsets();
    let tgid = task.tgid(off);
    // The scope first: every process on the host runs this, and few hold /dev/shm.
    scope::fd_call_scope(tgid)?;
    // Before any kernel read: `--failed` drops every close, which cannot fail here.
    if config().failed_only != 0 {
        return None;
    }
    let fd = CloseArgs::read(ctx).fd as i32;
    let file = kernel::fd_file(task, fd, off)?;
    if shm_check::file_on_shm(file, off) {
        report_close(ctx, tgid, &file);
    }
    Some(())
}

/// Reports a `close` of `file`, the /dev/shm file judged (passed through the caller's stack:
/// the descriptor table is not walked again).
#[inline(never)]
fn report_close(ctx: &TracePointContext, tgid: u32, file: &FileAt) -> Option<()> {
    let off = kernel::offsets();
    let args = CloseArgs::read(ctx);
    let fd = args.fd as i32;
    let call = Pending {
        syscall: Syscall::Close,
        flags: scope::fd_call_scope(tgid)? | flags::FILE,
        fd,
        args: args.raw(),
        // Judged a /dev/shm file already: only what the record says of it.
        file: kernel::file_ref(*file, off)?,
        dentry: 0,
    };
    report::report(&call, 0, tgid, off);
    Some(())
}

// The calls below are traced at their exit only (see `Syscall::traced_at`): the descriptor is
// still open then, and the arguments still in the saved registers.

/// `ftruncate(fd, length)`.
#[tracepoint]
pub fn sys_exit_ftruncate(ctx: TracePointContext) -> u32 {
    let _ = exit_fd_call(&ctx, Syscall::Ftruncate);
    0
}

/// `fallocate(fd, mode, offset, len)`.
#[tracepoint]
pub fn sys_exit_fallocate(ctx: TracePointContext) -> u32 {
    let _ = exit_fd_call(&ctx, Syscall::Fallocate);
    0
}

/// `write(fd, buf, count)`.
#[tracepoint]
pub fn sys_exit_write(ctx: TracePointContext) -> u32 {
    let _ = exit_fd_call(&ctx, Syscall::Write);
    0
}

/// `mmap(addr, len, prot, flags, fd, off)`: a file mapping only.
#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    let _ = exit_fd_call(&ctx, Syscall::Mmap);
    0
}

/// The descriptor argument of a call on a descriptor, and how many arguments it has.
#[inline(always)]
fn shape(call: Syscall) -> (usize, usize) {
    match call {
        Syscall::Ftruncate => (0, 2),
        Syscall::Fallocate => (0, 4),
        Syscall::Mmap => (4, 6),
        _ => (0, 3),
    }
}

/// What every process on the host runs at the end of these calls: one array load for most,
/// and for a /dev/shm holder the few loads that tell its descriptor's file from a /dev/shm one;
/// the record made in a function of its own (why: `open.rs`, `exit`).
#[inline(always)]
fn exit_fd_call(ctx: &TracePointContext, call: Syscall) -> Option<()> {
    let task = Current::get();
    let off = kernel::offsets();
    let tgid = task.tgid(off);
    // The scope first: every process on the host runs this, and few hold /dev/shm.
    scope::fd_call_scope(tgid)?;
    let ret = exit_ret(ctx);
    // Before any kernel read: `--failed` drops most of these calls.
    if config().failed_only != 0 && ret >= 0 && call.is_data_path() {
        return None;
    }
    let regs = Regs::of(task);
    if call == Syscall::Mmap && regs.arg(3, off) & MAP_ANONYMOUS != 0 {
        return None;
    }
    let fd = regs.arg(shape(call).0, off) as i32;
    let file = kernel::fd_file(task, fd, off)?;
    if shm_check::file_on_shm(file, off) {
        report_fd_call(call, ret, tgid, &file);
    }
    Some(())
}

/// Reports a finished call on a /dev/shm descriptor, whose file `file` was judged.
#[inline(never)]
fn report_fd_call(call: Syscall, ret: i64, tgid: u32, file: &FileAt) -> Option<()> {
    let task = Current::get();
    let off = kernel::offsets();
    let (fd_arg, arg_count) = shape(call);
    let args = args_at_exit(task, arg_count, off);
    let fd = args[fd_arg] as i32;
    let call = Pending {
        syscall: call,
        flags: scope::fd_call_scope(tgid)? | flags::FILE,
        fd,
        args,
        // Judged a /dev/shm file already: only what the record says of it.
        file: kernel::file_ref(*file, off)?,
        dentry: 0,
    };
    report::report(&call, ret, tgid, off);
    Some(())
}

/// `munmap(addr, len)`, only for processes that mapped a /dev/shm object: userspace keeps their
/// mappings current, so that a SIGBUS address can be traced back to its file.
#[tracepoint]
pub fn sys_exit_munmap(ctx: TracePointContext) -> u32 {
    let _ = exit_munmap(&ctx);
    0
}

#[inline(always)]
fn exit_munmap(ctx: &TracePointContext) -> Option<()> {
    let task = Current::get();
    let off = kernel::offsets();
    let tgid = task.tgid(off);
    if scope::has_mappings(tgid) {
        report_munmap(ctx, tgid);
    }
    Some(())
}

#[inline(never)]
fn report_munmap(ctx: &TracePointContext, tgid: u32) -> Option<()> {
    let task = Current::get();
    let off = kernel::offsets();
    let scope_flags = scope::fd_call_scope(tgid)?;
    let call = Pending {
        syscall: Syscall::Munmap,
        flags: scope_flags,
        fd: -1,
        args: args_at_exit(task, 2, off),
        file: emit::no_file(),
        dentry: 0,
    };
    report::report(&call, exit_ret(ctx), tgid, off);
    Some(())
}
