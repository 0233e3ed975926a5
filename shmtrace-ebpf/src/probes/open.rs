//! `openat`, `openat2` and `open`, judged at their exit by the file they made.
//!
//! Every process on the host opens files, and host-wide every open passes here, so a
//! successful one is judged without reading its path: the new descriptor's file is on a
//! /dev/shm or not (`shm_check`), which the descriptor table and the file's super block say
//! with typed loads (`kernel::fd_file`). Only a /dev/shm file's call reads its arguments and
//! its name. A failed open made no file, so its path is read, but only for the errors that
//! matter here: no room (ENOSPC), no descriptor (EMFILE, ENFILE), a read-only or forbidden
//! /dev/shm (EROFS, EACCES), and ENOENT when the call meant to create (a /dev/shm that is not
//! there) or the process is followed (a name another process removed).
//!
//! All are reported as `[dfd, filename, flags, mode, resolve, usize]`, so userspace reads
//! flags and mode from the same place whichever call it was; `open`'s `dfd` is `AT_FDCWD`, as
//! for `openat` of the same path. `open` is x86-64's older call, which musl (Alpine's libc)
//! makes for `open()` and `shm_open()`; arm64 has only `openat`. Opens made by io_uring
//! (`IORING_OP_OPENAT`) make none of these calls and are not seen.
use aya_ebpf::{helpers::bpf_probe_read_user, macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{DIR_INODE_ARG, KernelOffsets, Loss, Syscall, flags};

use super::{
    report,
    shm_check::{self, PathIs},
    tracepoint::{AT_FDCWD, args_at_exit, exit_ret},
};
use crate::{
    emit,
    kernel::{self, Current, FileAt},
    maps::{FAILED_OPEN_DIR, Pending, config},
    scope,
};

/// `struct open_how` (UAPI).
#[repr(C)]
#[derive(Clone, Copy)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat(dfd, filename, flags, mode)`.
#[tracepoint]
pub fn sys_exit_openat(ctx: TracePointContext) -> u32 {
    let _ = exit(&ctx, Syscall::Openat);
    0
}

/// `openat2(dfd, filename, how, usize)`.
#[tracepoint]
pub fn sys_exit_openat2(ctx: TracePointContext) -> u32 {
    let _ = exit(&ctx, Syscall::Openat2);
    0
}

/// `open(filename, flags, mode)`, x86-64 only.
#[tracepoint]
pub fn sys_exit_open(ctx: TracePointContext) -> u32 {
    let _ = exit(&ctx, Syscall::Open);
    0
}

/// Judges the open that returned: what every open on the host runs, kept to the few loads
/// that tell a /dev/shm file from another. What follows a /dev/shm file or a failure is
/// called, not inlined: a short program stays in the processor's caches between opens,
/// and the cost of a run was measured to follow the code it runs through more than its
/// instructions (docs/BENCHMARKS.md, the bystanders).
#[inline(always)]
fn exit(ctx: &TracePointContext, call: Syscall) -> Option<()> {
    let ret = exit_ret(ctx);
    if ret < 0 {
        // Judged and reported in two frames, each called from here: one frame holding the
        // path's judgement (and the mount walk it may call) and the record would take the
        // three past the verifier's 512 bytes of stack.
        if let Some(path_flags) = failed(call, ret) {
            report_failed(call, ret, path_flags);
        }
        return None;
    }
    // One helper call for the task, whose id and descriptor table are then plain loads.
    let task = Current::get();
    let off = kernel::offsets();
    let tgid = task.tgid(off);
    // Host-wide, every process is in scope, and the file decides first; otherwise few
    // processes are traced, and the scope does.
    if config().all == 0 {
        scope::in_scope(tgid)?;
    }
    let file = kernel::fd_file(task, ret as i32, off)?;
    if shm_check::file_on_shm(file, off) {
        opened(call, ret, tgid, &file);
    }
    Some(())
}

/// A successful open of a /dev/shm file: reported, unless it is /dev/shm itself. `file` is the
/// one judged, passed through the caller's stack: the descriptor table is not walked again.
#[inline(never)]
fn opened(call: Syscall, fd: i64, tgid: u32, file: &FileAt) -> Option<()> {
    let task = Current::get();
    let off = kernel::offsets();
    let file = *file;
    let scope_flags = scope::in_scope(tgid)?;
    let (_, dentry) = kernel::file_path(file, off)?;
    // /dev/shm itself (a runtime listing it, Ray asking its free space through it): no
    // object, nothing to report.
    if kernel::is_root(dentry, off) {
        return None;
    }
    let pending = Pending {
        syscall: call,
        flags: scope_flags | flags::FILE,
        fd: fd as i32,
        args: open_args(task, call, off)?,
        file: kernel::file_ref(file, off)?,
        dentry,
    };
    report::report(&pending, fd, tgid, off);
    Some(())
}

const ENOENT: i64 = 2;
const EACCES: i64 = 13;
const ENFILE: i64 = 23;
const EMFILE: i64 = 24;
const ENOSPC: i64 = 28;
const EROFS: i64 = 30;
/// `O_CREAT`, the same on x86-64 and arm64.
const O_CREAT: u64 = 0o100;

/// A failed open: whether it is reported (the path's flags), if its error matters here and its
/// path names something in /dev/shm; or, for a followed process out of descriptors, wherever
/// it was. With [`flags::DIR_INODE`], its directory's inode number is left in
/// `FAILED_OPEN_DIR`.
#[inline(never)]
fn failed(call: Syscall, ret: i64) -> Option<u16> {
    let errno = -ret;
    let out_of_fds = errno == EMFILE || errno == ENFILE;
    if !(out_of_fds || errno == ENOSPC || errno == EROFS || errno == EACCES || errno == ENOENT) {
        return None;
    }
    let task = Current::get();
    let off = kernel::offsets();
    let tgid = task.tgid(off);
    let (_, followed) = scope::scope_of(tgid)?;
    let args = open_args(task, call, off)?;
    if errno == ENOENT && args[2] & O_CREAT == 0 && !followed {
        return None;
    }
    match shm_check::shm_path(args[0] as i32, args[1]) {
        PathIs::Shm(path_flags, dir_ino) if path_flags & flags::SHM_DIRECTORY == 0 => {
            match FAILED_OPEN_DIR.get_ptr_mut(0) {
                // SAFETY: this CPU's element, which nothing else uses until `report_failed`.
                Some(kept) if path_flags & flags::DIR_INODE != 0 => unsafe { *kept = dir_ino },
                _ => return Some(path_flags & !flags::DIR_INODE),
            }
            Some(path_flags)
        }
        // Elsewhere, or /dev/shm itself: it matters only to a followed process out of
        // descriptors.
        PathIs::Shm(..) | PathIs::Elsewhere if out_of_fds && followed => Some(flags::FD_LIMIT_ONLY),
        PathIs::Shm(..) | PathIs::Elsewhere => None,
        PathIs::Unread => {
            emit::count(Loss::PathRead);
            None
        }
    }
}

/// Reports a failed open [`failed`] judged reported.
#[inline(never)]
fn report_failed(call: Syscall, ret: i64, path_flags: u16) -> Option<()> {
    let task = Current::get();
    let off = kernel::offsets();
    let tgid = task.tgid(off);
    let (scope_flags, _) = scope::scope_of(tgid)?;
    let mut args = open_args(task, call, off)?;
    if path_flags & flags::DIR_INODE != 0 {
        // SAFETY: this CPU's element, which `failed` wrote.
        args[DIR_INODE_ARG] = FAILED_OPEN_DIR
            .get_ptr(0)
            .map_or(0, |kept| unsafe { *kept });
    }
    let pending = Pending {
        syscall: call,
        flags: scope_flags | path_flags,
        fd: -1,
        args,
        file: emit::no_file(),
        dentry: 0,
    };
    report::report(&pending, ret, tgid, off);
    Some(())
}

/// The call's arguments as records carry them, read at its exit: openat2's flags and mode,
/// from its `struct open_how`, and open's, go where openat has them.
#[inline(always)]
fn open_args(task: Current, call: Syscall, off: &KernelOffsets) -> Option<[u64; 6]> {
    let mut args = args_at_exit(task, 4, off);
    match call {
        Syscall::Open => {
            args[3] = args[2];
            args[2] = args[1];
            args[1] = args[0];
            args[0] = AT_FDCWD as i64 as u64;
        }
        Syscall::Openat2 => {
            // SAFETY: a user pointer; a bad one is an error, not a fault.
            let Ok(how) = (unsafe { bpf_probe_read_user(args[2] as *const OpenHow) }) else {
                emit::count(Loss::UserRead);
                return None;
            };
            args[5] = args[3];
            args[2] = how.flags;
            args[3] = how.mode;
            args[4] = how.resolve;
        }
        _ => {}
    }
    Some(args)
}
