//! `memfd_create`: anonymous shared memory, reported for traced processes.
//!
//! ```text
//! syscalls/sys_enter_memfd_create: const char *uname @16; unsigned int flags @24
//! ```
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::Syscall;

use super::syscall;
use crate::{kernel, scope};

#[tracepoint]
pub fn sys_enter_memfd_create(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = syscall::ids();
    let off = kernel::offsets();
    if let Some(flags) = scope::in_scope(tgid, kernel::current_task(), &off) {
        syscall::stash(
            tid,
            Syscall::MemfdCreate,
            flags,
            -1,
            syscall::args::<2>(&ctx),
        );
    }
    0
}

#[tracepoint]
pub fn sys_exit_memfd_create(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}
