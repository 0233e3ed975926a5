//! Failures, SIGBUS and deaths counted in the kernel, by mount namespace (`TALLIES`): the
//! daemon adds what was counted here and never reached it as a record, so its figures stay
//! exact when the ring buffer drops records. Only failures and the exits of processes that
//! failed come here, never the calls that succeed, so the hash update costs no one else.
//!
//! A death is counted by the rule `flags::SHM_DEATH` states. The processes it needs to know
//! about are marked in `FAILED` when they fail (or look at the free space), and looked up at
//! every exit.
use core::intrinsics::{AtomicOrdering, atomic_or, atomic_xadd};

use shmtrace_common::{KernelOffsets, Loss, TallyKey};

use crate::{
    emit, kernel,
    maps::{FAILED, TALLIES},
};

/// `BPF_NOEXIST`: insert only if absent.
const NOEXIST: u64 = 1;

/// Bits of `FAILED` (64-bit: the BPF CPU version has no 32-bit atomic or).
mod failed {
    /// A call of its own on /dev/shm failed with ENOSPC, or it took a SIGBUS there.
    pub const OWN: u64 = 1 << 0;
    /// A child of its did, and has ended.
    pub const CHILD: u64 = 1 << 1;
    /// It looked at a /dev/shm's free space (`statfs`): a program may refuse by what it saw,
    /// with no call failing.
    pub const LOOKED: u64 = 1 << 2;
    /// Another process sent it SIGKILL: if it dies of that, it was stopped on purpose.
    pub const KILLED: u64 = 1 << 3;
}

const ENOSPC: i64 = 28;
const SIGHUP: i32 = 1;
const SIGINT: i32 = 2;
const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

/// A failed call of the current task: `ret` is its `-errno`, or 0 for a `recvmsg` that
/// dropped descriptors.
#[inline(always)]
pub fn failure(syscall: u16, ret: i64, tgid: u32, off: &KernelOffsets) {
    let errno = if ret < 0 { (-ret) as u16 } else { 0 };
    count(syscall, errno, off);
    if ret == -ENOSPC {
        mark(tgid, failed::OWN);
    }
}

/// A SIGBUS the kernel raised in `target` (the current task caused or sent it, and the
/// record's header names the same namespace).
#[inline(always)]
pub fn sigbus(target: u32, off: &KernelOffsets) {
    count(TallyKey::SIGBUS, 0, off);
    mark(target, failed::OWN);
}

/// The current process looked at a /dev/shm's free space.
#[inline(always)]
pub fn looked(tgid: u32) {
    mark(tgid, failed::LOOKED);
}

/// Another process sends `target` SIGKILL: if it dies of that, it was stopped on purpose.
#[inline(always)]
pub fn killed(target: u32) {
    if let Some(bits) = FAILED.get_ptr_mut(target) {
        // SAFETY: a pointer to a live map value; other CPUs change it atomically too.
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(bits, failed::KILLED) };
    }
}

/// The current process (`tgid`, its last task `task`) is ending with `exit_code`. Returns
/// whether that is a death of a full /dev/shm, which is then counted. Its parent is marked
/// when it failed, or refused after a look and died: the parent's own unsuccessful end
/// follows from it. Every process comes here, and most return after one lookup.
#[inline(always)]
pub fn ended(tgid: u32, task: u64, exit_code: i32, off: &KernelOffsets) -> bool {
    // SAFETY: a pointer to a live map value, read before it is removed.
    let Some(bits) = FAILED.get_ptr(tgid).map(|bits| unsafe { *bits }) else {
        return false;
    };
    let _ = FAILED.remove(tgid);
    let signal = exit_code & 0x7f;
    let stopped = matches!(signal, SIGHUP | SIGINT | SIGTERM)
        || (signal == SIGKILL && bits & failed::KILLED != 0);
    let own = bits & failed::OWN != 0;
    let died = exit_code != 0 && (own || !stopped);
    if died {
        count(TallyKey::DEATH, 0, off);
    }
    if (own || (died && bits & failed::LOOKED != 0))
        && let Some(parent) = kernel::task_real_parent_tgid(task, off)
    {
        mark(parent, failed::CHILD);
    }
    died
}

#[inline(always)]
fn mark(tgid: u32, bit: u64) {
    if let Some(bits) = FAILED.get_ptr_mut(tgid) {
        // SAFETY: as in `killed`.
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(bits, bit) };
        return;
    }
    if FAILED.insert(tgid, bit, NOEXIST).is_ok() {
        return;
    }
    match FAILED.get_ptr_mut(tgid) {
        // Another CPU inserted it meanwhile.
        Some(bits) => {
            // SAFETY: as in `killed`.
            unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(bits, bit) };
        }
        None => emit::count(Loss::Tally),
    }
}

#[inline(always)]
fn count(what: u16, errno: u16, off: &KernelOffsets) {
    let key = TallyKey {
        mntns: kernel::current_mntns(off).unwrap_or(0),
        what,
        errno,
    };
    if add_one(&key) {
        return;
    }
    // The first of its kind: inserted at 1, unless another CPU inserted it meanwhile.
    if TALLIES.insert(key, 1, NOEXIST).is_ok() || add_one(&key) {
        return;
    }
    emit::count(Loss::Tally);
}

#[inline(always)]
fn add_one(key: &TallyKey) -> bool {
    match TALLIES.get_ptr_mut(key) {
        Some(count) => {
            // SAFETY: a pointer to a live map value; other CPUs add to it atomically too.
            unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(count, 1) };
            true
        }
        None => false,
    }
}
