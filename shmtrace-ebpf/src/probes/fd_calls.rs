//! Calls on descriptors that refer to /dev/shm objects.
//!
//! A descriptor counts when its inode's file system is a known /dev/shm (`SHM_DEVS`), so
//! descriptors received over a socket (PyTorch passes them with SCM_RIGHTS) count too.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::{FileRef, Syscall, flags};

use super::syscall::{self, enter_args};
use crate::{kernel, scope};

/// `MAP_ANONYMOUS`.
const MAP_ANONYMOUS: u64 = 0x20;

enter_args! {
    /// `syscalls/sys_enter_ftruncate`:
    /// ```text
    /// field:unsigned int fd;  offset:16; size:8; signed:0;
    /// field:off_t length;     offset:24; size:8; signed:0;
    /// ```
    FtruncateArgs { fd, length }
}

enter_args! {
    /// `syscalls/sys_enter_fallocate`:
    /// ```text
    /// field:int fd;           offset:16; size:8; signed:0;
    /// field:int mode;         offset:24; size:8; signed:0;
    /// field:loff_t offset;    offset:32; size:8; signed:0;
    /// field:loff_t len;       offset:40; size:8; signed:0;
    /// ```
    FallocateArgs { fd, mode, offset, len }
}

enter_args! {
    /// `syscalls/sys_enter_write`:
    /// ```text
    /// field:unsigned int fd;      offset:16; size:8; signed:0;
    /// field:const char * buf;     offset:24; size:8; signed:0;
    /// field:size_t count;         offset:32; size:8; signed:0;
    /// ```
    WriteArgs { fd, buf, count }
}

enter_args! {
    /// `syscalls/sys_enter_close`:
    /// ```text
    /// field:unsigned int fd;  offset:16; size:8; signed:0;
    /// ```
    CloseArgs { fd }
}

enter_args! {
    /// `syscalls/sys_enter_mmap`:
    /// ```text
    /// field:unsigned long addr;   offset:16; size:8; signed:0;
    /// field:unsigned long len;    offset:24; size:8; signed:0;
    /// field:unsigned long prot;   offset:32; size:8; signed:0;
    /// field:unsigned long flags;  offset:40; size:8; signed:0;
    /// field:unsigned long fd;     offset:48; size:8; signed:0;
    /// field:unsigned long off;    offset:56; size:8; signed:0;
    /// ```
    MmapArgs { addr, len, prot, flags, fd, off }
}

enter_args! {
    /// `syscalls/sys_enter_munmap`:
    /// ```text
    /// field:unsigned long addr;   offset:16; size:8; signed:0;
    /// field:size_t len;           offset:24; size:8; signed:0;
    /// ```
    MunmapArgs { addr, len }
}

/// Stashes a call on descriptor `fd` if it refers to a /dev/shm object of an in-scope process.
#[inline(always)]
fn enter_fd_call(call: Syscall, fd: u64, args: [u64; 6]) -> Option<()> {
    let (tgid, tid) = syscall::ids();
    let off = kernel::offsets();
    let task = kernel::current_task();
    let scope_flags = scope::in_scope(tgid, task, &off)?;
    let fd = fd as i32;
    let (inode, dev) = syscall::shm_fd(task, fd, &off)?;
    // The rest of the inode is read when the call returns, as the call left it; but a closed
    // descriptor's inode may be gone by then.
    let file = if call == Syscall::Close {
        kernel::inode_ref(inode, dev, &off)
    } else {
        FileRef {
            dev,
            ..FileRef::default()
        }
    };
    syscall::stash_with_file(tid, call, scope_flags | flags::FILE, fd, args, inode, file);
    Some(())
}

#[tracepoint]
pub fn sys_enter_ftruncate(ctx: TracePointContext) -> u32 {
    if let Some(args) = FtruncateArgs::read(&ctx) {
        enter_fd_call(Syscall::Ftruncate, args.fd, args.raw());
    }
    0
}

#[tracepoint]
pub fn sys_enter_fallocate(ctx: TracePointContext) -> u32 {
    if let Some(args) = FallocateArgs::read(&ctx) {
        enter_fd_call(Syscall::Fallocate, args.fd, args.raw());
    }
    0
}

#[tracepoint]
pub fn sys_enter_write(ctx: TracePointContext) -> u32 {
    if let Some(args) = WriteArgs::read(&ctx) {
        enter_fd_call(Syscall::Write, args.fd, args.raw());
    }
    0
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    if let Some(args) = CloseArgs::read(&ctx) {
        enter_fd_call(Syscall::Close, args.fd, args.raw());
    }
    0
}

#[tracepoint]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    if let Some(args) = MmapArgs::read(&ctx)
        && args.flags & MAP_ANONYMOUS == 0
    {
        enter_fd_call(Syscall::Mmap, args.fd, args.raw());
    }
    0
}

/// Only for processes that mapped a /dev/shm object: userspace keeps their mappings current, so
/// that a SIGBUS address can be traced back to its file.
#[tracepoint]
pub fn sys_enter_munmap(ctx: TracePointContext) -> u32 {
    let _ = enter_munmap(&ctx);
    0
}

#[inline(always)]
fn enter_munmap(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = syscall::ids();
    if !scope::has_mappings(tgid) {
        return None;
    }
    let off = kernel::offsets();
    let scope_flags = scope::in_scope(tgid, kernel::current_task(), &off)?;
    let args = MunmapArgs::read(ctx)?;
    syscall::stash(tid, Syscall::Munmap, scope_flags, -1, args.raw());
    Some(())
}
