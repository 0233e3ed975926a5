//! System V shared memory, reported for traced processes.
//!
//! ```text
//! syscalls/sys_enter_shmget: key_t key @16; size_t size @24; int shmflg @32
//! syscalls/sys_enter_shmat:  int shmid @16; char *shmaddr @24; int shmflg @32
//! syscalls/sys_enter_shmdt:  char *shmaddr @16
//! syscalls/sys_enter_shmctl: int shmid @16; int cmd @24; struct shmid_ds *buf @32
//! ```
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::Syscall;

use super::syscall;
use crate::{kernel, scope};

#[inline(always)]
fn enter<const N: usize>(ctx: &TracePointContext, call: Syscall) {
    let (tgid, tid) = syscall::ids();
    let off = kernel::offsets();
    if let Some(flags) = scope::in_scope(tgid, kernel::current_task(), &off) {
        syscall::stash(tid, call, flags, -1, syscall::args::<N>(ctx));
    }
}

#[tracepoint]
pub fn sys_enter_shmget(ctx: TracePointContext) -> u32 {
    enter::<3>(&ctx, Syscall::Shmget);
    0
}

#[tracepoint]
pub fn sys_exit_shmget(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_shmat(ctx: TracePointContext) -> u32 {
    enter::<3>(&ctx, Syscall::Shmat);
    0
}

#[tracepoint]
pub fn sys_exit_shmat(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_shmdt(ctx: TracePointContext) -> u32 {
    enter::<1>(&ctx, Syscall::Shmdt);
    0
}

#[tracepoint]
pub fn sys_exit_shmdt(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_shmctl(ctx: TracePointContext) -> u32 {
    enter::<3>(&ctx, Syscall::Shmctl);
    0
}

#[tracepoint]
pub fn sys_exit_shmctl(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}
