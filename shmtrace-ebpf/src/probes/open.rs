//! `openat` and `openat2` on /dev/shm paths.
//!
//! ```text
//! syscalls/sys_enter_openat:  int dfd @16; const char *filename @24; int flags @32; umode_t mode @40
//! syscalls/sys_enter_openat2: int dfd @16; const char *filename @24; struct open_how *how @32;
//!                             size_t usize @40
//! ```
//! Both are stashed as `[dfd, filename, flags, mode, resolve, usize]`, so userspace reads flags
//! and mode from the same place whichever call it was.
use aya_ebpf::{helpers::bpf_probe_read_user, macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{Syscall, flags};

use super::syscall::{self, arg};
use crate::{kernel, scope};

/// `struct open_how` (UAPI).
#[repr(C)]
#[derive(Clone, Copy)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

#[tracepoint]
pub fn sys_enter_openat(ctx: TracePointContext) -> u32 {
    enter(&ctx, Syscall::Openat);
    0
}

#[tracepoint]
pub fn sys_exit_openat(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_enter_openat2(ctx: TracePointContext) -> u32 {
    enter(&ctx, Syscall::Openat2);
    0
}

#[tracepoint]
pub fn sys_exit_openat2(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}

#[inline(always)]
fn enter(ctx: &TracePointContext, call: Syscall) -> Option<()> {
    let (tgid, tid) = syscall::ids();
    let off = kernel::offsets();
    let task = kernel::current_task();
    let scope_flags = scope::in_scope(tgid, task, &off)?;
    let dfd = arg(ctx, 0) as i32;
    let filename = arg(ctx, 1);
    let path_flags = match syscall::shm_path(task, dfd, filename, &off) {
        Some(path_flags) => path_flags,
        // Elsewhere, a followed process's open matters only if it runs out of descriptors.
        None => {
            scope::tracked(tgid, task, &off)?;
            flags::FD_LIMIT_ONLY
        }
    };
    let args = if call == Syscall::Openat2 {
        // SAFETY: a user pointer; a bad one is an error, not a fault.
        let how = unsafe { bpf_probe_read_user(arg(ctx, 2) as *const OpenHow) }.ok()?;
        [
            dfd as u64,
            filename,
            how.flags,
            how.mode,
            how.resolve,
            arg(ctx, 3),
        ]
    } else {
        [dfd as u64, filename, arg(ctx, 2), arg(ctx, 3), 0, 0]
    };
    syscall::stash(tid, call, scope_flags | path_flags, -1, args);
    Some(())
}
