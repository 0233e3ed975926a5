//! What a `recvmsg` left in its message, read at its exit (`stash`'s `sys_exit`): descriptors
//! dropped (`MSG_CTRUNC`) for a followed process, or a /dev/shm descriptor received
//! (`SCM_RIGHTS`) for one nothing follows yet. Its entry program is `recvmsg.rs`'s.
use aya_ebpf::helpers::bpf_probe_read_user;
use shmtrace_common::Loss;

use super::shm_check;
use crate::{emit, maps::Pending};

/// `MSG_CTRUNC`: control data (here: passed descriptors) did not fit and was dropped.
const MSG_CTRUNC: u32 = 0x8;
/// Offset of `msg_flags` in `struct user_msghdr` (UAPI, 64-bit).
const MSGHDR_FLAGS: u64 = 48;

/// `msg_flags` of a successful `recvmsg` that set `MSG_CTRUNC`.
#[inline(always)]
pub fn dropped_descriptors(pending: &Pending, ret: i64) -> Option<u32> {
    if ret < 0 {
        return None;
    }
    // SAFETY: a user pointer; a bad one is an error, not a fault.
    let msg_flags: u32 =
        match unsafe { bpf_probe_read_user((pending.args[1] + MSGHDR_FLAGS) as *const u32) } {
            Ok(flags) => flags,
            Err(_) => {
                emit::count(Loss::UserRead);
                return None;
            }
        };
    (msg_flags & MSG_CTRUNC != 0).then_some(msg_flags)
}

/// Offset of `msg_control` in `struct user_msghdr` (UAPI, 64-bit); `msg_controllen` follows.
const MSGHDR_CONTROL: u64 = 32;
/// `SOL_SOCKET` and `SCM_RIGHTS` (UAPI).
const SOL_SOCKET: i32 = 1;
const SCM_RIGHTS: i32 = 1;
/// `struct cmsghdr`'s size: `cmsg_len` (8 bytes), `cmsg_level`, `cmsg_type`.
const CMSG_HEADER: u64 = 16;
/// Descriptors of a message looked at; a message with more is taken to hold a /dev/shm one.
const RECEIVED_CHECKED: u64 = 4;
/// Control messages looked at before giving up, taking the process to have received one.
const CMSGS_CHECKED: usize = 2;

/// `struct cmsghdr`'s head (UAPI).
#[repr(C)]
#[derive(Clone, Copy)]
struct CmsgHeader {
    len: u64,
    level: i32,
    kind: i32,
}

/// Whether a successful `recvmsg` passed the process a descriptor on a /dev/shm file system:
/// its control data (`msg_control`, `msg_controllen` as the call left them) is walked for an
/// `SCM_RIGHTS` message, whose first descriptors are looked up. Where it cannot tell (an
/// unreadable header, more descriptors or messages than it looks at, a tmpfs not judged yet),
/// it says yes: following
/// a process that needs it not costs that process a little, missing one loses its calls.
#[inline(always)]
pub fn received_shm_descriptor(pending: &Pending, ret: i64) -> bool {
    if ret < 0 {
        return false;
    }
    let msg = pending.args[1];
    // SAFETY: user pointers; a bad one is an error, not a fault.
    let Ok(control) = (unsafe { bpf_probe_read_user((msg + MSGHDR_CONTROL) as *const [u64; 2]) })
    else {
        return true;
    };
    let (at, end) = (control[0], control[0].wrapping_add(control[1]));
    if control[1] < CMSG_HEADER {
        return false;
    }
    // The `SCM_RIGHTS` message first, then its descriptors: one check of each descriptor in
    // the program, not one for each message looked at (the verifier checks every copy).
    let Some((at, count)) = rights_message(at, end) else {
        return true;
    };
    if count == 0 {
        return false;
    }
    if count > RECEIVED_CHECKED {
        return true;
    }
    // SAFETY: as above; the kernel wrote `count` descriptors after the header.
    let Ok(fds) = (unsafe { bpf_probe_read_user((at + CMSG_HEADER) as *const [i32; 4]) }) else {
        return true;
    };
    let mut j = 0;
    while j < RECEIVED_CHECKED as usize {
        if (j as u64) < count && shm_check::fd_may_be_on_shm(fds[j]) != 0 {
            return true;
        }
        j += 1;
    }
    false
}

/// The `SCM_RIGHTS` message of the control data from `at` to `end`: its address and how many
/// descriptors it holds; `Some((_, 0))` when there is none; `None` when it cannot tell (an
/// unreadable header, more messages than are looked at).
#[inline(always)]
fn rights_message(mut at: u64, end: u64) -> Option<(u64, u64)> {
    let mut i = 0;
    while i < CMSGS_CHECKED {
        if at.wrapping_add(CMSG_HEADER) > end {
            return Some((at, 0));
        }
        // SAFETY: as above.
        let header = unsafe { bpf_probe_read_user(at as *const CmsgHeader) }.ok()?;
        if header.len < CMSG_HEADER {
            return Some((at, 0));
        }
        if header.level == SOL_SOCKET && header.kind == SCM_RIGHTS {
            return Some((at, (header.len - CMSG_HEADER) / 4));
        }
        // The next message starts at the next 8-byte boundary (`CMSG_ALIGN`).
        at = at.wrapping_add((header.len + 7) & !7);
        i += 1;
    }
    None
}
