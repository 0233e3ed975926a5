//! What every syscall probe shares: the tracepoint record layout, pairing `sys_enter_*` with
//! `sys_exit_*`, and turning a finished call into a record.
//!
//! Most calls are traced at both ends. Each `sys_enter_<call>` program (one per call, in the
//! other files of `probes/`) decides whether the call concerns /dev/shm and a traced process,
//! and stashes it in `INFLIGHT`; one program, [`sys_exit`], attached to those calls'
//! `sys_exit_<call>` tracepoints, takes the stashed call back and emits its record.
//!
//! The calls on an open descriptor that stays open (`fd_calls.rs`: `ftruncate`, `fallocate`,
//! `write`, `mmap`, `munmap`) are traced at their exit only, with arguments read from the
//! registers saved at entry ([`args_at_exit`]): nothing at entry needs seeing before the call
//! runs, and an entry tracepoint costs every process on the host on every such call.
use core::intrinsics::{AtomicOrdering, atomic_and, atomic_or};

use aya_ebpf::{
    EbpfContext,
    cty::c_void,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{self, bpf_probe_read_user_str},
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use shmtrace_common::{
    EventKind, FileRef, KernelOffsets, Loss, PATH_LEN, PathEvent, Syscall, SyscallEvent, flags,
};

use crate::{
    emit, kernel,
    maps::{CONFIG, INFLIGHT, Pending, SHM_DEVS, STASHED},
    scope, tally,
};
use shmtrace_common::targets::followed_bit;

/// Every syscall tracepoint record starts with the same fields:
/// ```text
/// field:unsigned short common_type;         offset:0; size:2; signed:0;
/// field:unsigned char common_flags;         offset:2; size:1; signed:0;
/// field:unsigned char common_preempt_count; offset:3; size:1; signed:0;
/// field:int common_pid;                     offset:4; size:4; signed:1;
/// field:int __syscall_nr;                   offset:8; size:4; signed:1;
/// ```
/// The arguments (`sys_enter_*`) or the return value (`sys_exit_*`) follow from offset 16, each
/// in 8 bytes whatever its C type. This reads the 8-byte word `slot` of them.
///
/// A plain load: the verifier lets a tracepoint program read its record directly, at a constant
/// offset. `read_at` would copy it through `bpf_probe_read`, a helper call that every process
/// on the host would pay on every traced call, before the scope check could turn it away.
#[inline(always)]
pub fn record_word(ctx: &TracePointContext, slot: usize) -> u64 {
    // SAFETY: every syscall tracepoint record holds the words its format lists; callers read
    // only those.
    unsafe { *(ctx.as_ptr() as *const u64).add(2 + slot) }
}

/// Defines the arguments of a `sys_enter_*` record, one 8-byte slot each, named as in the
/// tracepoint's format. `read` loads them (see [`record_word`]); `raw()` gives them in order,
/// as records carry them.
macro_rules! enter_args {
    ($(#[$doc:meta])* $name:ident { $($field:ident),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name {
            $(pub $field: u64,)+
        }

        impl $name {
            #[inline(always)]
            #[allow(unused_assignments, reason = "the slot after the last is not read")]
            pub fn read(ctx: &aya_ebpf::programs::TracePointContext) -> $name {
                let mut slot = 0;
                $(
                    let $field = $crate::probes::syscall::record_word(ctx, slot);
                    slot += 1;
                )+
                $name { $($field,)+ }
            }

            #[inline(always)]
            #[allow(unused_assignments, dead_code, reason = "not every call stashes them raw")]
            pub fn raw(&self) -> [u64; 6] {
                let mut out = [0u64; 6];
                let mut i = 0;
                $(
                    out[i] = self.$field;
                    i += 1;
                )+
                // The unused slots are zeroed word by word, and the whole read back opaquely:
                // zeros the compiler can see become a call to the byte-at-a-time `memset` BPF
                // programs get.
                while i < 6 {
                    // SAFETY: `i` is in bounds.
                    unsafe { core::ptr::write_volatile(&mut out[i], 0) };
                    i += 1;
                }
                // SAFETY: a read of a local.
                unsafe { core::ptr::read_volatile(&out) }
            }
        }
    };
}
pub(crate) use enter_args;

/// `AT_FDCWD`.
pub const AT_FDCWD: i32 = -100;
const SHM_PREFIX: &[u8; 9] = b"/dev/shm/";
/// Bytes `bpf_probe_read_user_str` returns for "/dev/shm" and "/dev/shm/", with the NUL.
const SHM_DIR_LEN: i64 = 9;

/// The current thread's ids: (tgid, tid).
#[inline(always)]
pub fn ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

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
        syscall: syscall as u16,
        flags,
        fd,
        args,
        file: emit::no_file(),
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

/// The file behind `fd` as it is now, if it is on a /dev/shm. Its file system is checked
/// before the rest of its inode is read: most descriptors of a process that holds /dev/shm
/// files are elsewhere (its logs, sockets), and reading the inode's head costs more than the
/// check.
#[inline(always)]
pub fn shm_fd(fd: i32, off: &KernelOffsets) -> Option<FileRef> {
    let inode = kernel::fd_inode(fd, off)?;
    SHM_DEVS.get_ptr(kernel::inode_dev(inode, off)?)?;
    kernel::inode_file(inode, off)
}

/// What a path argument says about a call.
pub enum PathIs {
    /// In /dev/shm, with the header flags to record.
    Shm(u16),
    /// Somewhere else.
    Elsewhere,
    /// Not readable now: a page the program has not touched yet, which a probe cannot fault
    /// in. Judged again at `sys_exit` ([`flags::PATH_AT_EXIT`]), when the call has read it.
    Unread,
}

/// Bytes of a path read to judge it: "/dev/shm/" and one more, and the NUL. A longer path
/// is cut short there, which says all that is needed (`len` is then `PREFIX_READ`).
const PREFIX_READ: u32 = SHM_PREFIX.len() as u32 + 2;

/// Reads the first bytes of the path at `path` into `buf`, as `bpf_probe_read_user_str` of
/// `PREFIX_READ` bytes would: returns its length with the NUL, or `PREFIX_READ` if it is
/// longer, or a negative error. A fixed-size read costs less than the string helper, which
/// is left for a path that ends near the end of its page, where 16 bytes cannot be read.
#[inline(always)]
fn path_prefix(path: u64, buf: &mut [u8; 16]) -> i64 {
    // SAFETY: a user pointer, read into a buffer of the size given; a bad one is an error.
    let failed = unsafe {
        generated::bpf_probe_read_user(buf.as_mut_ptr() as *mut c_void, 16, path as *const c_void)
    };
    if failed != 0 {
        // SAFETY: as above; the helper stops at PREFIX_READ bytes, within the buffer.
        return unsafe {
            bpf_probe_read_user_str(
                buf.as_mut_ptr() as *mut c_void,
                PREFIX_READ,
                path as *const c_void,
            )
        };
    }
    let mut i = 0;
    while i < PREFIX_READ as usize {
        if buf[i] == 0 {
            return i as i64 + 1;
        }
        i += 1;
    }
    PREFIX_READ as i64
}

/// Whether a path argument names something in /dev/shm: an absolute `/dev/shm/...` path, or a
/// relative one resolved from a directory (`dfd`, or the working directory) on a /dev/shm file
/// system. Only the path's first bytes are read, and the kernel's offsets only for a relative
/// path: every open on the host passes here in host-wide mode.
#[inline(always)]
pub fn shm_path(dfd: i32, path: u64) -> PathIs {
    let mut buf = [0u8; 16];
    let len = path_prefix(path, &mut buf);
    if len <= 0 {
        // NULL is the caller's mistake (the call fails with EFAULT).
        return if path == 0 {
            PathIs::Elsewhere
        } else {
            PathIs::Unread
        };
    }
    if buf[0] == b'/' {
        // "/dev/shm" itself: only its file system matters (for names relative to it later).
        let mut i = 0;
        while i < SHM_PREFIX.len() - 1 {
            if buf[i] != SHM_PREFIX[i] {
                return PathIs::Elsewhere;
            }
            i += 1;
        }
        if len == SHM_DIR_LEN || (len == SHM_DIR_LEN + 1 && buf[8] == b'/') {
            return PathIs::Shm(flags::SHM_DIRECTORY);
        }
        if buf[8] != b'/' {
            return PathIs::Elsewhere;
        }
        return PathIs::Shm(0);
    }
    let off = kernel::offsets();
    let dir_dev = if dfd == AT_FDCWD {
        kernel::cwd_dev(&off)
    } else {
        kernel::fd_inode(dfd, &off).and_then(|inode| kernel::inode_dev(inode, &off))
    };
    match dir_dev {
        Some(dev) if SHM_DEVS.get_ptr(dev).is_some() => PathIs::Shm(flags::RELATIVE_TO_SHM),
        _ => PathIs::Elsewhere,
    }
}

const EMFILE: i64 = 24;
const ENFILE: i64 = 23;
/// `MSG_CTRUNC`: control data (here: passed descriptors) did not fit and was dropped.
const MSG_CTRUNC: u32 = 0x8;
/// Offset of `msg_flags` in `struct user_msghdr` (UAPI, 64-bit).
const MSGHDR_FLAGS: u64 = 48;

/// `msg_flags` of a successful `recvmsg` that set `MSG_CTRUNC`.
#[inline(always)]
fn dropped_descriptors(pending: &Pending, ret: i64) -> Option<u32> {
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
/// unreadable header, more descriptors or messages than it looks at), it says yes: following
/// a process that needs it not costs that process a little, missing one loses its calls.
#[inline(always)]
fn received_shm_descriptor(pending: &Pending, ret: i64) -> bool {
    if ret < 0 {
        return false;
    }
    let msg = pending.args[1];
    // SAFETY: user pointers; a bad one is an error, not a fault.
    let Ok(control) = (unsafe { bpf_probe_read_user((msg + MSGHDR_CONTROL) as *const [u64; 2]) })
    else {
        return true;
    };
    let (mut at, end) = (control[0], control[0].wrapping_add(control[1]));
    if control[1] < CMSG_HEADER {
        return false;
    }
    let off = kernel::offsets();
    let mut i = 0;
    while i < CMSGS_CHECKED {
        if at.wrapping_add(CMSG_HEADER) > end {
            return false;
        }
        // SAFETY: as above.
        let Ok(header) = (unsafe { bpf_probe_read_user(at as *const CmsgHeader) }) else {
            return true;
        };
        if header.len < CMSG_HEADER {
            return false;
        }
        if header.level == SOL_SOCKET && header.kind == SCM_RIGHTS {
            let count = (header.len - CMSG_HEADER) / 4;
            if count > RECEIVED_CHECKED {
                return true;
            }
            // SAFETY: as above; the kernel wrote `count` descriptors after the header.
            let Ok(fds) = (unsafe { bpf_probe_read_user((at + CMSG_HEADER) as *const [i32; 4]) })
            else {
                return true;
            };
            let mut j = 0;
            while j < RECEIVED_CHECKED as usize {
                if (j as u64) < count && shm_fd(fds[j], &off).is_some() {
                    return true;
                }
                j += 1;
            }
            return false;
        }
        // The next message starts at the next 8-byte boundary (`CMSG_ALIGN`).
        at = at.wrapping_add((header.len + 7) & !7);
        i += 1;
    }
    true
}

/// A failed call, or one reported only because it failed (a `recvmsg` that dropped
/// descriptors), wakes the reader at once.
#[inline(always)]
fn urgent(pending: &Pending, ret: i64) -> bool {
    ret < 0 || pending.flags & flags::FD_LIMIT_ONLY != 0
}

/// Calls whose success userspace does not need in failures-only mode.
#[inline(always)]
pub fn is_data_path(call: u16) -> bool {
    call == Syscall::Write as u16
        || call == Syscall::Ftruncate as u16
        || call == Syscall::Fallocate as u16
        || call == Syscall::Close as u16
        || call == Syscall::Munmap as u16
        || call == Syscall::Shmdt as u16
        || call == Syscall::Shmctl as u16
}

/// `open`, `openat` and `openat2`, stashed alike (`[dfd, path, flags, mode, ...]`): as
/// [`Syscall::opens_a_path`], by number.
#[inline(always)]
fn opens_a_path(call: u16) -> bool {
    call == Syscall::Openat as u16
        || call == Syscall::Openat2 as u16
        || call == Syscall::Open as u16
}

/// The argument holding the path, for calls that name one.
#[inline(always)]
fn path_arg(call: u16) -> Option<usize> {
    if opens_a_path(call) || call == Syscall::Unlinkat as u16 {
        Some(1)
    } else if call == Syscall::Unlink as u16
        || call == Syscall::MemfdCreate as u16
        || call == Syscall::Statfs as u16
    {
        Some(0)
    } else {
        None
    }
}

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
    // SAFETY: a pointer to a live map value, which only this thread's programs use.
    let mut pending = unsafe {
        if (*slot).syscall == Pending::RETURNED {
            return;
        }
        let pending = *slot;
        (*slot).syscall = Pending::RETURNED;
        pending
    };
    let ret = exit_ret(ctx);

    if pending.flags & flags::PATH_AT_EXIT != 0 && !judge_at_exit(&mut pending, tgid) {
        return;
    }
    if pending.flags & flags::SHM_DIRECTORY != 0 {
        learn_directory(ret, &kernel::offsets());
        return;
    }
    if pending.flags & flags::RECEIVES != 0 {
        if received_shm_descriptor(&pending, ret) {
            scope::follow(tgid);
        }
        return;
    }
    if pending.flags & flags::FD_LIMIT_ONLY != 0 {
        if pending.syscall == Syscall::Recvmsg as u16 {
            match dropped_descriptors(&pending, ret) {
                Some(msg_flags) => pending.args[3] = msg_flags as u64,
                None => return,
            }
        } else if ret != -EMFILE && ret != -ENFILE {
            return;
        }
    }
    report(&pending, ret, tgid, &kernel::offsets());
}

/// Emits a finished call's record, unless `--failed` drops it; in host-wide mode the process
/// becomes followed.
#[inline(always)]
pub fn report(pending: &Pending, ret: i64, tgid: u32, off: &KernelOffsets) {
    let config = CONFIG.load();
    if config.failed_only != 0 && ret >= 0 && is_data_path(pending.syscall) {
        return;
    }
    if ret < 0 || pending.flags & flags::FD_LIMIT_ONLY != 0 {
        tally::failure(pending.syscall, ret, tgid, off);
    }
    if config.all != 0 {
        scope::follow(tgid);
    }
    // A held process is not followed (yet): marking it would put it in `TARGETS`.
    if pending.syscall == Syscall::Mmap as u16 && ret >= 0 && pending.flags & flags::HELD == 0 {
        scope::mark_mapped(tgid);
    }
    match path_arg(pending.syscall) {
        Some(index) => emit_path(pending, ret, index, off),
        None => emit_call(pending, ret, off),
    }
}

/// What the current call returned, in a `sys_exit_*` program. Its records are all alike:
/// ```text
/// field:long ret; offset:16; size:8; signed:1;
/// ```
#[inline(always)]
pub fn exit_ret(ctx: &TracePointContext) -> i64 {
    record_word(ctx, 0) as i64
}

/// The current call's first `count` arguments, read at its exit; the other slots are zero, as
/// in a `sys_enter_*` record of a call with fewer arguments.
#[inline(always)]
pub fn args_at_exit(count: usize, off: &KernelOffsets) -> [u64; 6] {
    let mut args = kernel::syscall_args(off);
    let mut i = count;
    while i < 6 {
        // SAFETY: `i` is in bounds.
        unsafe { core::ptr::write_volatile(&mut args[i], 0) };
        i += 1;
    }
    // Written and read back opaquely: zeros the compiler can see become a call to BPF's
    // byte-at-a-time `memset`.
    // SAFETY: a read of a local.
    unsafe { core::ptr::read_volatile(&args) }
}

/// Reads the path of a call whose path was unreadable at `sys_enter`, and decides as
/// `sys_enter` would have: whether to report it, and with which flags.
#[inline(always)]
fn judge_at_exit(pending: &mut Pending, tgid: u32) -> bool {
    let Some(index) = path_arg(pending.syscall) else {
        return false;
    };
    let path = if index == 0 {
        pending.args[0]
    } else {
        pending.args[1]
    };
    let dfd = if index == 0 {
        AT_FDCWD
    } else {
        pending.args[0] as i32
    };
    let kept = pending.flags & !flags::PATH_AT_EXIT;
    match shm_path(dfd, path) {
        PathIs::Shm(path_flags) => {
            pending.flags = kept | path_flags;
            true
        }
        // As at sys_enter: an open elsewhere matters only to a followed process, and only if it
        // runs out of descriptors.
        PathIs::Elsewhere => {
            if opens_a_path(pending.syscall) && scope::tracked(tgid).is_some() {
                pending.flags = kept | flags::FD_LIMIT_ONLY;
                true
            } else {
                false
            }
        }
        PathIs::Unread => {
            emit::count(Loss::PathRead);
            false
        }
    }
}

/// Records the file system of a newly opened /dev/shm directory descriptor.
#[inline(always)]
fn learn_directory(ret: i64, off: &KernelOffsets) {
    if ret < 0 {
        return;
    }
    if let Some(inode) = kernel::fd_inode(ret as i32, off)
        && let Some(dev) = kernel::inode_dev(inode, off)
    {
        let _ = SHM_DEVS.insert(dev, 1, 0);
    }
}

#[inline(always)]
fn emit_call(pending: &Pending, ret: i64, off: &KernelOffsets) {
    let event = SyscallEvent {
        header: emit::header(EventKind::Syscall, pending.flags, off),
        syscall: pending.syscall,
        _pad: 0,
        fd: pending.fd,
        ret,
        args: pending.args,
        file: pending.file,
    };
    emit::send(EventKind::Syscall, &event, urgent(pending, ret));
}

#[inline(always)]
fn emit_path(pending: &Pending, ret: i64, path_index: usize, off: &KernelOffsets) {
    let Some(mut entry) = emit::reserve::<PathEvent>(EventKind::Path) else {
        return;
    };
    let mut header_flags = pending.flags;
    let mut fd = pending.fd;
    let mut file = emit::no_file();
    let opens = opens_a_path(pending.syscall) || pending.syscall == Syscall::MemfdCreate as u16;
    if opens && ret >= 0 {
        fd = ret as i32;
        if let Some(inode) = kernel::fd_inode(fd, off)
            && let Some(opened) = kernel::inode_file(inode, off)
        {
            file = opened;
            header_flags |= flags::FILE;
            // A /dev/shm path we had not seen a file system for (a container's, say):
            // from now on its descriptors are recognised too.
            if pending.syscall != Syscall::MemfdCreate as u16
                && SHM_DEVS.get_ptr(file.dev).is_none()
            {
                let _ = SHM_DEVS.insert(file.dev, 1, 0);
            }
        }
    }
    let event = entry.as_mut_ptr();
    let path_ptr = if path_index == 0 {
        pending.args[0]
    } else {
        pending.args[1]
    };
    // SAFETY: `event` points to reserved ring buffer memory of the right size; the path is
    // read straight into it (too big for the stack), the rest is written whole.
    unsafe {
        let path = &raw mut (*event).path;
        let len = bpf_probe_read_user_str(
            path as *mut c_void,
            PATH_LEN as u32,
            path_ptr as *const c_void,
        );
        if len <= 0 {
            (path as *mut u8).write(0);
            emit::count(Loss::PathRead);
        } else if len >= PATH_LEN as i64 {
            header_flags |= flags::PATH_TRUNCATED;
        }
        (&raw mut (*event).call).write(SyscallEvent {
            header: emit::header(EventKind::Path, header_flags, off),
            syscall: pending.syscall,
            _pad: 0,
            fd,
            ret,
            args: pending.args,
            file,
        });
    }
    emit::submit(entry, urgent(pending, ret));
}
