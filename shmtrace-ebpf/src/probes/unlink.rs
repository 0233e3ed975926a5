//! Removing /dev/shm names.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{DIR_INODE_ARG, Syscall, flags};

use super::{
    shm_check::{self, PathIs},
    stash,
    tracepoint::{AT_FDCWD, enter_args, ids},
};
use crate::scope;

enter_args! {
    /// `syscalls/sys_enter_unlink`:
    /// ```text
    /// field:const char * pathname;    offset:16; size:8; signed:0;
    /// ```
    UnlinkArgs { pathname }
}

enter_args! {
    /// `syscalls/sys_enter_unlinkat`:
    /// ```text
    /// field:int dfd;                  offset:16; size:8; signed:0;
    /// field:const char * pathname;    offset:24; size:8; signed:0;
    /// field:int flag;                 offset:32; size:8; signed:0;
    /// ```
    UnlinkatArgs { dfd, pathname, flag }
}

#[tracepoint]
pub fn sys_enter_unlink(ctx: TracePointContext) -> u32 {
    let _ = enter(&ctx, Syscall::Unlink);
    0
}

#[tracepoint]
pub fn sys_enter_unlinkat(ctx: TracePointContext) -> u32 {
    let _ = enter(&ctx, Syscall::Unlinkat);
    0
}

#[inline(always)]
fn enter(ctx: &TracePointContext, call: Syscall) -> Option<()> {
    let (tgid, tid) = ids();
    // The scope first: every process on the host runs this, and few are traced.
    let scope_flags = scope::in_scope(tgid)?;
    let (dfd, path, mut args) = if call == Syscall::Unlink {
        let a = UnlinkArgs::read(ctx);
        (AT_FDCWD, a.pathname, a.raw())
    } else {
        let a = UnlinkatArgs::read(ctx);
        (a.dfd as i32, a.pathname, a.raw())
    };
    let path_flags = match shm_check::shm_path(dfd, path) {
        PathIs::Shm(path_flags, dir_ino) => {
            if path_flags & flags::DIR_INODE != 0 {
                args[DIR_INODE_ARG] = dir_ino;
            }
            path_flags
        }
        PathIs::Elsewhere => return None,
        PathIs::Unread => flags::PATH_AT_EXIT,
    };
    stash::stash(tid, call, scope_flags | path_flags, -1, args);
    Some(())
}
