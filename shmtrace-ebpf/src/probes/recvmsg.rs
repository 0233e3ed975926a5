//! `recvmsg` that drops the descriptors sent to it.
//!
//! PyTorch passes each /dev/shm descriptor to the trainer over a socket (SCM_RIGHTS). When the
//! trainer is out of file descriptors the kernel does not fail the call: it drops the
//! descriptors and sets `MSG_CTRUNC` in `msg_flags`. That flag is the only trace of an fd-limit
//! failure, so followed processes' `recvmsg` calls are checked for it on return
//! (`recvmsg_exit.rs`, which `stash`'s `sys_exit` calls).
//!
//! In host-wide mode, a process nothing follows yet has its `recvmsg` checked on return for a
//! /dev/shm descriptor received (`flags::RECEIVES`): the trainer that gets its batches this
//! way may never open /dev/shm itself, and only followed processes' calls on descriptors are
//! looked at (`scope::fd_call_scope`).
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{Syscall, flags};

use super::{
    stash,
    tracepoint::{enter_args, ids},
};
use crate::scope;

enter_args! {
    /// `syscalls/sys_enter_recvmsg`:
    /// ```text
    /// field:int fd;                       offset:16; size:8; signed:0;
    /// field:struct user_msghdr * msg;     offset:24; size:8; signed:0;
    /// field:unsigned int flags;           offset:32; size:8; signed:0;
    /// ```
    RecvmsgArgs { fd, msg, flags }
}

#[tracepoint]
pub fn sys_enter_recvmsg(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = ids();
    let call_flags = if let Some(scope_flags) = scope::tracked(tgid) {
        scope_flags | flags::FD_LIMIT_ONLY
    } else if scope::receives_unfollowed(tgid) {
        flags::RECEIVES
    } else {
        return 0;
    };
    let args = RecvmsgArgs::read(&ctx);
    stash::stash(
        tid,
        Syscall::Recvmsg,
        call_flags,
        args.fd as i32,
        args.raw(),
    );
    0
}
