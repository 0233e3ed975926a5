//! Calls on descriptors that refer to /dev/shm objects.
//!
//! ```text
//! syscalls/sys_enter_ftruncate: unsigned int fd @16; off_t length @24
//! syscalls/sys_enter_fallocate: int fd @16; int mode @24; loff_t offset @32; loff_t len @40
//! syscalls/sys_enter_write:     unsigned int fd @16; const char *buf @24; size_t count @32
//! syscalls/sys_enter_close:     unsigned int fd @16
//! syscalls/sys_enter_mmap:      unsigned long addr @16, len @24, prot @32, flags @40, fd @48,
//!                               off @56
//! syscalls/sys_enter_munmap:    unsigned long addr @16; size_t len @24
//! ```
//! A descriptor counts when its inode's file system is a known /dev/shm (`SHM_DEVS`), so
//! descriptors received over a socket (PyTorch passes them with SCM_RIGHTS) count too.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{Syscall, flags};

use super::syscall::{self, arg};
use crate::{kernel, scope};

/// `MAP_ANONYMOUS`.
const MAP_ANONYMOUS: u64 = 0x20;

#[inline(always)]
fn enter_fd_call<const N: usize>(
    ctx: &TracePointContext,
    call: Syscall,
    fd_arg: usize,
) -> Option<()> {
    let (tgid, tid) = syscall::ids();
    let off = kernel::offsets();
    let task = kernel::current_task();
    let scope_flags = scope::in_scope(tgid, task, &off)?;
    let fd = arg(ctx, fd_arg) as i32;
    let (inode, file) = syscall::shm_fd(task, fd, &off)?;
    syscall::stash_with_file(
        tid,
        call,
        scope_flags | flags::FILE,
        fd,
        syscall::args::<N>(ctx),
        inode,
        file,
    );
    Some(())
}

#[tracepoint]
pub fn sys_enter_ftruncate(ctx: TracePointContext) -> u32 {
    enter_fd_call::<2>(&ctx, Syscall::Ftruncate, 0);
    0
}

#[tracepoint]
pub fn sys_exit_ftruncate(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_fallocate(ctx: TracePointContext) -> u32 {
    enter_fd_call::<4>(&ctx, Syscall::Fallocate, 0);
    0
}

#[tracepoint]
pub fn sys_exit_fallocate(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_write(ctx: TracePointContext) -> u32 {
    enter_fd_call::<3>(&ctx, Syscall::Write, 0);
    0
}

#[tracepoint]
pub fn sys_exit_write(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    enter_fd_call::<1>(&ctx, Syscall::Close, 0);
    0
}

#[tracepoint]
pub fn sys_exit_close(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    if arg(&ctx, 3) & MAP_ANONYMOUS == 0 {
        enter_fd_call::<6>(&ctx, Syscall::Mmap, 4);
    }
    0
}

#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

/// Only for processes that mapped a /dev/shm object: userspace keeps their mappings current, so
/// that a SIGBUS address can be traced back to its file.
#[tracepoint]
pub fn sys_enter_munmap(ctx: TracePointContext) -> u32 {
    let _ = enter_munmap(&ctx);
    0
}

#[inline(always)]
fn enter_munmap(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = syscall::ids();
    if !scope::has_mappings(tgid) {
        return None;
    }
    let off = kernel::offsets();
    let scope_flags = scope::in_scope(tgid, kernel::current_task(), &off)?;
    syscall::stash(
        tid,
        Syscall::Munmap,
        scope_flags,
        -1,
        syscall::args::<2>(ctx),
    );
    Some(())
}

#[tracepoint]
pub fn sys_exit_munmap(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}
