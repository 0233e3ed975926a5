//! Turning a finished call into a record: [`report`] decides, `emit_call` and `emit_path`
//! write.
use aya_ebpf::{cty::c_void, helpers::generated::bpf_probe_read_user_str};
use shmtrace_common::{
    EventKind, KernelOffsets, Loss, PATH_LEN, PathEvent, Syscall, SyscallEvent, flags,
};

use crate::{
    emit, kernel,
    maps::{Pending, SCRATCH, config},
    scope, tally,
};

/// A failed call, or one reported only because it failed (a `recvmsg` that dropped
/// descriptors), wakes the reader at once.
#[inline(always)]
fn urgent(pending: &Pending, ret: i64) -> bool {
    ret < 0 || pending.flags & flags::FD_LIMIT_ONLY != 0
}

/// Emits a finished call's record, unless `--failed` drops it; in host-wide mode the process
/// becomes followed.
#[inline(always)]
pub fn report(pending: &Pending, ret: i64, tgid: u32, off: &KernelOffsets) {
    let config = config();
    if config.failed_only != 0 && ret >= 0 && pending.syscall.is_data_path() {
        return;
    }
    if ret < 0 || pending.flags & flags::FD_LIMIT_ONLY != 0 {
        tally::failure(pending.syscall as u16, ret, tgid, off);
    }
    if config.all != 0 {
        scope::follow(tgid);
    }
    // A held process is not followed (yet): marking it would put it in `TARGETS`.
    if pending.syscall == Syscall::Mmap && ret >= 0 && pending.flags & flags::HELD == 0 {
        scope::mark_mapped(tgid);
    }
    match pending.syscall.path_arg() {
        Some(index) => emit_path(pending, ret, index, off),
        None => emit_call(pending, ret, off),
    }
}

#[inline(always)]
fn emit_call(pending: &Pending, ret: i64, off: &KernelOffsets) {
    let event = SyscallEvent {
        header: emit::header(EventKind::Syscall, pending.flags, off),
        syscall: pending.syscall as u16,
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
    let mut file = pending.file;
    // memfd_create's file, for the record: not a /dev/shm one.
    if pending.syscall == Syscall::MemfdCreate
        && ret >= 0
        && let Some(made) = kernel::fd_file(kernel::Current::get(), ret as i32, off)
        && let Some(made) = kernel::file_ref(made, off)
    {
        fd = ret as i32;
        file = made;
        header_flags |= flags::FILE;
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
        if len >= PATH_LEN as i64 {
            header_flags |= flags::PATH_TRUNCATED;
        }
        let read = len > 0;
        if pending.dentry != 0 && !(read && starts_with_shm(&*path)) {
            // A /dev/shm file opened by another path (a relative one, or a container's
            // /dev/shm through /proc/PID/root): named whole as it is in that /dev/shm.
            header_flags &= !flags::PATH_TRUNCATED;
            let whole = SCRATCH.get_ptr_mut(0).is_some_and(|scratch| {
                kernel::dev_shm_name(pending.dentry, &mut *scratch, path as *mut u8, off)
            });
            if !whole {
                header_flags |= flags::PATH_TRUNCATED;
            }
        } else if !read {
            (path as *mut u8).write(0);
            emit::count(Loss::PathRead);
        }
        (&raw mut (*event).call).write(SyscallEvent {
            header: emit::header(EventKind::Path, header_flags, off),
            syscall: pending.syscall as u16,
            _pad: 0,
            fd,
            ret,
            args: pending.args,
            file,
        });
    }
    emit::submit(entry, urgent(pending, ret));
}

/// Whether a path read into a record starts with "/dev/shm/".
#[inline(always)]
fn starts_with_shm(path: &[u8; PATH_LEN]) -> bool {
    let prefix = b"/dev/shm/";
    let mut i = 0;
    while i < prefix.len() {
        if path[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}
