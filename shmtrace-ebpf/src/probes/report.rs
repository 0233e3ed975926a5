//! Turning a finished call into a record: [`report`] decides, `emit_call` and `emit_path`
//! write.
use aya_ebpf::{cty::c_void, helpers::generated::bpf_probe_read_user_str};
use shmtrace_common::{
    EventKind, KernelOffsets, PATH_LEN, PathEvent, Syscall, SyscallEvent, flags,
};

use crate::{
    emit, kernel,
    maps::{CONFIG, Pending, SHM_DEVS},
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
    let config = CONFIG.load();
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
    let mut file = emit::no_file();
    let opens = pending.syscall.opens_a_path() || pending.syscall == Syscall::MemfdCreate;
    if opens && ret >= 0 {
        fd = ret as i32;
        if let Some(inode) = kernel::fd_inode(fd, off)
            && let Some(opened) = kernel::inode_file(inode, off)
        {
            file = opened;
            header_flags |= flags::FILE;
            // A /dev/shm path we had not seen a file system for (a container's, say):
            // from now on its descriptors are recognised too. Only a tmpfs: a `/dev/shm/x`
            // written in a chroot, or in a container with no /dev/shm mounted, is on a
            // disk's file system, and taking that for a /dev/shm made every file of the
            // host's root file system count as one.
            if pending.syscall != Syscall::MemfdCreate
                && SHM_DEVS.get_ptr(file.dev).is_none()
                && kernel::inode_on_tmpfs(inode, off)
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
            emit::count(shmtrace_common::Loss::PathRead);
        } else if len >= PATH_LEN as i64 {
            header_flags |= flags::PATH_TRUNCATED;
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
