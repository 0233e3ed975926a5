//! `statfs` and `fstatfs` of a /dev/shm file system: the free space a program saw before it
//! decided, with no call failing, to refuse (vLLM) or to put its shared memory elsewhere
//! (Ray's object store falls back to /tmp). glibc's `statvfs` and `fstatvfs` make these calls.
//!
//! Both are traced at their exit only, like the calls of `fd_calls.rs`: the answer is in the
//! caller's buffer by then, and the arguments still in the saved registers. The record carries
//! the answer in its last four arguments (see `Syscall::Statfs`).
use aya_ebpf::{helpers::bpf_probe_read_user, macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{Loss, Syscall, flags, statfs_args};

use super::{
    report,
    shm_check::{self, PathIs},
    tracepoint::{AT_FDCWD, args_at_exit, exit_ret},
};
use crate::{
    emit,
    kernel::{self, Current},
    maps::Pending,
    scope, tally,
};

/// `statfs(path, buf)`.
#[tracepoint]
pub fn sys_exit_statfs(ctx: TracePointContext) -> u32 {
    let _ = exit_statfs(&ctx, Syscall::Statfs);
    0
}

/// `fstatfs(fd, buf)`.
#[tracepoint]
pub fn sys_exit_fstatfs(ctx: TracePointContext) -> u32 {
    let _ = exit_statfs(&ctx, Syscall::Fstatfs);
    0
}

/// The head of `struct statfs` (UAPI, 64-bit: every field a `long`, on x86-64 and arm64 alike):
/// `f_type`, `f_bsize`, `f_blocks`, `f_bfree`, `f_bavail`.
type StatfsHead = [u64; 5];

#[inline(always)]
fn exit_statfs(ctx: &TracePointContext, call: Syscall) -> Option<()> {
    let task = Current::get();
    let off = kernel::offsets();
    let tgid = task.tgid(off);
    // The scope first. Not `fd_call_scope`: a program may look at /dev/shm's free space before
    // it has touched anything there (Ray's driver opens the directory, asks, and leaves).
    let scope_flags = scope::in_scope(tgid)?;
    let mut args = args_at_exit(task, 2, off);
    let (path_flags, fd, file) = if call == Syscall::Statfs {
        match shm_check::shm_path(AT_FDCWD, args[0]) {
            // "/dev/shm" itself is what such programs ask about; the directory flag is the
            // kernel's own business (an open's), not the record's.
            PathIs::Shm(path_flags, _) => {
                (path_flags & flags::RELATIVE_TO_SHM, -1, emit::no_file())
            }
            PathIs::Elsewhere => return None,
            // The call has read the path by now, so this is a page gone again.
            PathIs::Unread => {
                emit::count(Loss::PathRead);
                return None;
            }
        }
    } else {
        let fd = args[0] as i32;
        (flags::FILE, fd, shm_check::shm_fd(task, fd, off)?)
    };
    let ret = exit_ret(ctx);
    if ret == 0 {
        // SAFETY: a user pointer the call has just written; a bad one is an error, not a fault.
        let Ok(head) = (unsafe { bpf_probe_read_user(args[1] as *const StatfsHead) }) else {
            emit::count(Loss::UserRead);
            return None;
        };
        args[statfs_args::BLOCK_SIZE] = head[1];
        args[statfs_args::BLOCKS] = head[2];
        args[statfs_args::AVAILABLE] = head[4];
        args[statfs_args::MAGIC] = head[0];
        tally::looked(tgid);
    }
    let call = Pending {
        syscall: call,
        flags: scope_flags | path_flags,
        fd,
        args,
        file,
        dentry: 0,
    };
    report::report(&call, ret, tgid, off);
    Some(())
}
