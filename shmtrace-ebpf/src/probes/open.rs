//! `openat`, `openat2` and `open` on /dev/shm paths.
//!
//! All are stashed as `[dfd, filename, flags, mode, resolve, usize]`, so userspace reads flags
//! and mode from the same place whichever call it was; `open`'s `dfd` is `AT_FDCWD`, as for
//! `openat` of the same path. `open` is x86-64's older call, which musl (Alpine's libc) makes
//! for `open()` and `shm_open()`; arm64 has only `openat`.
use aya_ebpf::{helpers::bpf_probe_read_user, macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{DIR_INODE_ARG, Loss, Syscall, flags};

use super::{
    shm_check::{self, PathIs},
    stash,
    tracepoint::{AT_FDCWD, enter_args, ids},
};
use crate::{emit, scope};

enter_args! {
    /// `syscalls/sys_enter_openat`:
    /// ```text
    /// field:int dfd;                  offset:16; size:8; signed:0;
    /// field:const char * filename;    offset:24; size:8; signed:0;
    /// field:int flags;                offset:32; size:8; signed:0;
    /// field:umode_t mode;             offset:40; size:8; signed:0;
    /// ```
    OpenatArgs { dfd, filename, flags, mode }
}

enter_args! {
    /// `syscalls/sys_enter_openat2`:
    /// ```text
    /// field:int dfd;                  offset:16; size:8; signed:0;
    /// field:const char * filename;    offset:24; size:8; signed:0;
    /// field:struct open_how * how;    offset:32; size:8; signed:0;
    /// field:size_t usize;             offset:40; size:8; signed:0;
    /// ```
    Openat2Args { dfd, filename, how, usize }
}

enter_args! {
    /// `syscalls/sys_enter_open` (x86-64):
    /// ```text
    /// field:const char * filename;    offset:16; size:8; signed:0;
    /// field:int flags;                offset:24; size:8; signed:0;
    /// field:umode_t mode;             offset:32; size:8; signed:0;
    /// ```
    OpenArgs { filename, flags, mode }
}

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
    let _ = enter(&ctx, Syscall::Openat);
    0
}

#[tracepoint]
pub fn sys_enter_openat2(ctx: TracePointContext) -> u32 {
    let _ = enter(&ctx, Syscall::Openat2);
    0
}

#[tracepoint]
pub fn sys_enter_open(ctx: TracePointContext) -> u32 {
    let _ = enter(&ctx, Syscall::Open);
    0
}

/// Stashes an in-scope process's open of a /dev/shm path (or, for a followed process, any
/// open, for the descriptor limit). openat2's flags and mode, from its `struct open_how`, and
/// open's, go where openat has them.
#[inline(always)]
fn enter(ctx: &TracePointContext, call: Syscall) -> Option<()> {
    let (tgid, tid) = ids();
    // The scope first: every process on the host runs this, and few are traced.
    let scope_flags = scope::in_scope(tgid)?;
    let (mut args, how) = if call == Syscall::Openat {
        let a = OpenatArgs::read(ctx);
        ([a.dfd, a.filename, a.flags, a.mode, 0, 0], None)
    } else if call == Syscall::Open {
        let a = OpenArgs::read(ctx);
        let at_cwd = AT_FDCWD as i64 as u64;
        ([at_cwd, a.filename, a.flags, a.mode, 0, 0], None)
    } else {
        let a = Openat2Args::read(ctx);
        ([a.dfd, a.filename, 0, 0, 0, a.usize], Some(a.how))
    };
    let dfd = args[0] as i32;
    let path_flags = match shm_check::shm_path(dfd, args[1]) {
        PathIs::Shm(path_flags, dir_ino) => {
            if path_flags & flags::DIR_INODE != 0 {
                args[DIR_INODE_ARG] = dir_ino;
            }
            path_flags
        }
        // Elsewhere, a followed process's open matters only if it runs out of descriptors.
        PathIs::Elsewhere => {
            scope::tracked(tgid)?;
            flags::FD_LIMIT_ONLY
        }
        PathIs::Unread => flags::PATH_AT_EXIT,
    };
    if let Some(how) = how {
        // SAFETY: a user pointer; a bad one is an error, not a fault.
        let Ok(how) = (unsafe { bpf_probe_read_user(how as *const OpenHow) }) else {
            emit::count(Loss::UserRead);
            return None;
        };
        args[2] = how.flags;
        args[3] = how.mode;
        args[4] = how.resolve;
    }
    stash::stash(tid, call, scope_flags | path_flags, -1, args);
    Some(())
}
