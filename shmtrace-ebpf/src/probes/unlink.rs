//! Removing /dev/shm names.
//!
//! ```text
//! syscalls/sys_enter_unlink:   const char *pathname @16
//! syscalls/sys_enter_unlinkat: int dfd @16; const char *pathname @24; int flag @32
//! ```
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::Syscall;

use super::syscall::{self, AT_FDCWD, arg};
use crate::{kernel, scope};

#[tracepoint]
pub fn sys_enter_unlink(ctx: TracePointContext) -> u32 {
    enter(&ctx, Syscall::Unlink);
    0
}

#[tracepoint]
pub fn sys_exit_unlink(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_unlinkat(ctx: TracePointContext) -> u32 {
    enter(&ctx, Syscall::Unlinkat);
    0
}

#[tracepoint]
pub fn sys_exit_unlinkat(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[inline(always)]
fn enter(ctx: &TracePointContext, call: Syscall) -> Option<()> {
    let (tgid, tid) = syscall::ids();
    let off = kernel::offsets();
    let task = kernel::current_task();
    let scope_flags = scope::in_scope(tgid, task, &off)?;
    let (dfd, path, args) = if call == Syscall::Unlinkat {
        (arg(ctx, 0) as i32, arg(ctx, 1), syscall::args::<3>(ctx))
    } else {
        (AT_FDCWD, arg(ctx, 0), syscall::args::<1>(ctx))
    };
    let path_flags = syscall::shm_path(task, dfd, path, &off)?;
    syscall::stash(tid, call, scope_flags | path_flags, -1, args);
    Some(())
}
