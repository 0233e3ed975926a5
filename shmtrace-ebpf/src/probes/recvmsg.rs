//! `recvmsg` that drops the descriptors sent to it.
//!
//! ```text
//! syscalls/sys_enter_recvmsg: int fd @16; struct user_msghdr *msg @24; unsigned int flags @32
//! ```
//! PyTorch passes each /dev/shm descriptor to the trainer over a socket (SCM_RIGHTS). When the
//! trainer is out of file descriptors the kernel does not fail the call: it drops the
//! descriptors and sets `MSG_CTRUNC` in `msg_flags`. That flag is the only trace of an fd-limit
//! failure, so followed processes' `recvmsg` calls are checked for it on return.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{Syscall, flags};

use super::syscall;
use crate::{kernel, scope};

#[tracepoint]
pub fn sys_enter_recvmsg(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = syscall::ids();
    let off = kernel::offsets();
    if let Some(scope_flags) = scope::tracked(tgid, kernel::current_task(), &off) {
        let args = syscall::args::<3>(&ctx);
        syscall::stash(
            tid,
            Syscall::Recvmsg,
            scope_flags | flags::FD_LIMIT_ONLY,
            args[0] as i32,
            args,
        );
    }
    0
}

#[tracepoint]
pub fn sys_exit_recvmsg(ctx: TracePointContext) -> u32 {
    syscall::on_exit(&ctx);
    0
}
