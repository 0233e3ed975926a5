//! Calls on descriptors that refer to /dev/shm objects.
//!
//! A descriptor counts when its inode's file system is a known /dev/shm (`SHM_DEVS`), so
//! descriptors received over a socket (PyTorch passes them with SCM_RIGHTS) count too.
//!
//! `close` is traced at its entry only, and reported as succeeding (why:
//! `Syscall::traced_at_entry_only`). The others are traced at their exit only.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{Syscall, flags};

use super::{
    report, shm_check,
    tracepoint::{args_at_exit, enter_args, exit_ret, ids},
};
use crate::{
    emit, kernel,
    maps::{CONFIG, Pending},
    scope,
};

/// `MAP_ANONYMOUS`.
const MAP_ANONYMOUS: u64 = 0x20;

enter_args! {
    /// `syscalls/sys_enter_close`:
    /// ```text
    /// field:unsigned int fd;  offset:16; size:8; signed:0;
    /// ```
    CloseArgs { fd }
}

/// `close(fd)`: reported at entry, with its file as it is then.
#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let _ = enter_close(&ctx);
    0
}

#[inline(always)]
fn enter_close(ctx: &TracePointContext) -> Option<()> {
    let (tgid, _) = ids();
    // The scope first: every process on the host runs this, and few hold /dev/shm.
    let scope_flags = scope::fd_call_scope(tgid)?;
    // Before any kernel read: `--failed` drops every close, which cannot fail here.
    if CONFIG.load().failed_only != 0 {
        return None;
    }
    let args = CloseArgs::read(ctx);
    let off = kernel::offsets();
    let fd = args.fd as i32;
    let call = Pending {
        syscall: Syscall::Close,
        flags: scope_flags | flags::FILE,
        fd,
        args: args.raw(),
        file: shm_check::shm_fd(fd, &off)?,
    };
    report::report(&call, 0, tgid, &off);
    Some(())
}

// The calls below are traced at their exit only (see `Syscall::traced_at`): the descriptor is still
// open then, and the arguments still in the saved registers.

/// `ftruncate(fd, length)`.
#[tracepoint]
pub fn sys_exit_ftruncate(ctx: TracePointContext) -> u32 {
    let _ = exit_fd_call(&ctx, Syscall::Ftruncate, 0, 2);
    0
}

/// `fallocate(fd, mode, offset, len)`.
#[tracepoint]
pub fn sys_exit_fallocate(ctx: TracePointContext) -> u32 {
    let _ = exit_fd_call(&ctx, Syscall::Fallocate, 0, 4);
    0
}

/// `write(fd, buf, count)`.
#[tracepoint]
pub fn sys_exit_write(ctx: TracePointContext) -> u32 {
    let _ = exit_fd_call(&ctx, Syscall::Write, 0, 3);
    0
}

/// `mmap(addr, len, prot, flags, fd, off)`: a file mapping only.
#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    let _ = exit_fd_call(&ctx, Syscall::Mmap, 4, 6);
    0
}

/// Reports a finished call on descriptor argument `fd_arg` (of `arg_count`) if it refers to a
/// /dev/shm object of an in-scope process.
#[inline(always)]
fn exit_fd_call(
    ctx: &TracePointContext,
    call: Syscall,
    fd_arg: usize,
    arg_count: usize,
) -> Option<()> {
    let (tgid, _) = ids();
    // The scope first: every process on the host runs this, and few hold /dev/shm.
    let scope_flags = scope::fd_call_scope(tgid)?;
    let ret = exit_ret(ctx);
    // Before any kernel read: `--failed` drops most of these calls.
    if CONFIG.load().failed_only != 0 && ret >= 0 && call.is_data_path() {
        return None;
    }
    let off = kernel::offsets();
    let args = args_at_exit(arg_count, &off);
    if call == Syscall::Mmap && args[3] & MAP_ANONYMOUS != 0 {
        return None;
    }
    let fd = args[fd_arg] as i32;
    let call = Pending {
        syscall: call,
        flags: scope_flags | flags::FILE,
        fd,
        args,
        file: shm_check::shm_fd(fd, &off)?,
    };
    report::report(&call, ret, tgid, &off);
    Some(())
}

/// `munmap(addr, len)`, only for processes that mapped a /dev/shm object: userspace keeps their
/// mappings current, so that a SIGBUS address can be traced back to its file.
#[tracepoint]
pub fn sys_exit_munmap(ctx: TracePointContext) -> u32 {
    let _ = exit_munmap(&ctx);
    0
}

#[inline(always)]
fn exit_munmap(ctx: &TracePointContext) -> Option<()> {
    let (tgid, _) = ids();
    if !scope::has_mappings(tgid) {
        return None;
    }
    let scope_flags = scope::fd_call_scope(tgid)?;
    let off = kernel::offsets();
    let call = Pending {
        syscall: Syscall::Munmap,
        flags: scope_flags,
        fd: -1,
        args: args_at_exit(2, &off),
        file: emit::no_file(),
    };
    report::report(&call, exit_ret(ctx), tgid, &off);
    Some(())
}
