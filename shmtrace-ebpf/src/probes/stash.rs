//! Pairing `sys_enter_*` with `sys_exit_*`: a call seen at its entry waits in `INFLIGHT` for
//! its exit, where [`sys_exit`] takes it back and has it reported.
//!
//! Each `sys_enter_<call>` program of a call traced at both ends (in the other files of
//! `probes/`) decides whether the call concerns /dev/shm and a traced process, and stashes it
//! ([`stash`]); one program, [`sys_exit`], attached to those calls' `sys_exit_<call>`
//! tracepoints, takes it back with the call's return value.
use core::intrinsics::{AtomicOrdering, atomic_and, atomic_or};

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{DIR_INODE_ARG, Loss, Syscall, flags, targets::followed_bit};

use super::{
    recvmsg_exit, report,
    shm_check::{self, PathIs},
    tracepoint::{AT_FDCWD, exit_ret, ids},
};
use crate::{
    emit, kernel,
    maps::{INFLIGHT, Pending, STASHED},
    scope,
};

/// `tid`'s word of `STASHED`, and its bit there.
#[inline(always)]
fn stashed_word(tid: u32) -> Option<(*mut u64, u64)> {
    let (index, bit) = followed_bit(tid);
    Some((STASHED.get_ptr_mut(index)?, bit))
}

/// Takes the thread's "stashed" mark: whether a call of its waits in `INFLIGHT`.
#[inline(always)]
fn take_stashed(tid: u32) -> bool {
    let Some((word, bit)) = stashed_word(tid) else {
        return false;
    };
    // A volatile load, as for `FOLLOWED` (scope.rs); the bit is cleared only when set, so the
    // common case stays one load.
    // SAFETY: a live, 8-byte aligned array element.
    if unsafe { word.read_volatile() } & bit == 0 {
        return false;
    }
    // SAFETY: as above; other threads' bits in the word change concurrently, hence atomic.
    unsafe { atomic_and::<u64, u64, { AtomicOrdering::Relaxed }>(word, !bit) };
    true
}

/// Remembers the call until its `sys_exit`.
#[inline(always)]
pub fn stash(tid: u32, syscall: Syscall, flags: u16, fd: i32, args: [u64; 6]) {
    let pending = Pending {
        syscall,
        flags,
        fd,
        args,
        file: emit::no_file(),
        dentry: 0,
    };
    if let Some(slot) = INFLIGHT.get_ptr_mut(tid) {
        // SAFETY: a pointer to a live map value; only this thread's programs use its slot, one
        // at a time.
        unsafe { *slot = pending };
    } else if INFLIGHT.insert(tid, pending, 0).is_err() {
        emit::count(Loss::Pending);
        return;
    }
    if let Some((word, bit)) = stashed_word(tid) {
        // SAFETY: as in `take_stashed`.
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(word, bit) };
    }
}

/// Frees an exiting thread's slot. Every thread on the host passes here: the lookup takes no
/// lock, a removal takes the bucket's even when there is nothing to remove.
#[inline(always)]
pub fn forget_thread(tid: u32) {
    if INFLIGHT.get_ptr(tid).is_some() {
        let _ = INFLIGHT.remove(tid);
    }
}

const EMFILE: i64 = 24;
const ENFILE: i64 = 23;

/// The exit program of every call traced at both ends, attached to its `sys_exit_<call>`
/// tracepoint: emits the call stashed at `sys_enter`, if any.
#[tracepoint]
pub fn sys_exit(ctx: TracePointContext) -> u32 {
    on_exit(&ctx);
    0
}

#[inline(always)]
fn on_exit(ctx: &TracePointContext) {
    let (tgid, tid) = ids();
    if !take_stashed(tid) {
        return;
    }
    let Some(slot) = INFLIGHT.get_ptr_mut(tid) else {
        return;
    };
    let ret = exit_ret(ctx);
    // SAFETY: a pointer to a live map value, which only this thread's programs use; the bit
    // says the call in it has not returned before. Used in place, not copied: a copy on this
    // frame, under the judgement's, took the stack past 6.1's 512 bytes.
    let pending = unsafe { &mut *slot };
    if to_report(pending, ret, tgid) {
        report_exit(pending, ret, tgid);
    }
}

/// Whether the call stashed in `pending` is reported now that it returned `ret`, and with
/// which flags and arguments (set in `pending`). A function of its own, as is the report: the
/// record the report builds on its frame is not under the judgement's.
#[inline(never)]
fn to_report(pending: &mut Pending, ret: i64, tgid: u32) -> bool {
    if pending.flags & flags::PATH_AT_EXIT != 0 && !judge_at_exit(pending) {
        return false;
    }
    // "/dev/shm" itself: no object.
    if pending.flags & flags::SHM_DIRECTORY != 0 {
        return false;
    }
    if pending.flags & flags::RECEIVES != 0 {
        if recvmsg_exit::received_shm_descriptor(pending, ret) {
            scope::follow(tgid);
        }
        return false;
    }
    if pending.flags & flags::FD_LIMIT_ONLY != 0 {
        if pending.syscall == Syscall::Recvmsg {
            match recvmsg_exit::dropped_descriptors(pending, ret) {
                Some(msg_flags) => pending.args[3] = msg_flags as u64,
                None => return false,
            }
        } else if ret != -EMFILE && ret != -ENFILE {
            return false;
        }
    }
    true
}

#[inline(never)]
fn report_exit(pending: &Pending, ret: i64, tgid: u32) {
    report::report(pending, ret, tgid, kernel::offsets());
}

/// Reads the path of a call whose path was unreadable at `sys_enter`, and decides as
/// `sys_enter` would have: whether to report it, and with which flags.
#[inline(always)]
fn judge_at_exit(pending: &mut Pending) -> bool {
    let Some(index) = pending.syscall.path_arg() else {
        return false;
    };
    let (dfd, path) = if index == 0 {
        (AT_FDCWD, pending.args[0])
    } else {
        (pending.args[0] as i32, pending.args[1])
    };
    let kept = pending.flags & !flags::PATH_AT_EXIT;
    match shm_check::shm_path(dfd, path) {
        PathIs::Shm(path_flags, dir_ino) => {
            if path_flags & flags::DIR_INODE != 0 {
                pending.args[DIR_INODE_ARG] = dir_ino;
            }
            pending.flags = kept | path_flags;
            true
        }
        PathIs::Elsewhere => false,
        PathIs::Unread => {
            emit::count(Loss::PathRead);
            false
        }
    }
}
