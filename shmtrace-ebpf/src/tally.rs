//! Failures and SIGBUS counted in the kernel, by mount namespace (`TALLIES`): the daemon adds
//! what was counted here and never reached it as a record, so its figures stay exact when the
//! ring buffer drops records. Only failures come here, never the calls that succeed, so the
//! hash update costs no one else.
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use shmtrace_common::{KernelOffsets, Loss, TallyKey};

use crate::{emit, kernel, maps::TALLIES};

/// `BPF_NOEXIST`: insert only if absent.
const NOEXIST: u64 = 1;

/// A failed call of the current task: `ret` is its `-errno`, or 0 for a `recvmsg` that
/// dropped descriptors.
#[inline(always)]
pub fn failure(syscall: u16, ret: i64, off: &KernelOffsets) {
    let errno = if ret < 0 { (-ret) as u16 } else { 0 };
    count(syscall, errno, off);
}

/// A SIGBUS the current task caused or sent (the record's header names the same namespace).
#[inline(always)]
pub fn sigbus(off: &KernelOffsets) {
    count(TallyKey::SIGBUS, 0, off);
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
