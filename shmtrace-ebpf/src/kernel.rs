//! Reading kernel structs.
//!
//! aya's Rust eBPF has no CO-RE, so every field is read at an offset userspace resolved from the
//! running kernel's BTF (`OFFSETS`). What hangs off the current task is read with plain loads
//! through its typed pointer ([`field`]); anything else with `bpf_probe_read_kernel`, where a
//! failed read yields `None` and is counted (`Loss::KernelRead`). A NULL pointer is not a
//! failure.
use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_get_current_task, generated},
};
use shmtrace_common::{FileRef, KernelOffsets, Loss, PATH_LEN};

use crate::maps::{self, OFFSETS, SCRATCH};

/// Bytes read at once from the start of an inode (the per-CPU `SCRATCH` buffer's size): one
/// read costs what one field's does, and `i_mode`, `i_sb`, `i_ino`, `i_size` and `i_blocks`
/// lie in the first 160 bytes of the kernels known.
const INODE_HEAD: u32 = PATH_LEN as u32;

#[inline(always)]
pub fn offsets() -> KernelOffsets {
    OFFSETS.load()
}

#[inline(always)]
fn read<T: Default>(base: u64, offset: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    // Read into a zeroed value, never a `MaybeUninit`: aya's `bpf_probe_read_kernel` leaves the
    // payload of its error undefined, and LLVM may then compute with that payload on the error
    // path (a select it resolves later). Verifiers before 6.18 refuse a read of such a
    // register (`R1 !read_ok`, 6.1 and 6.12); a defined zero gives them nothing to refuse.
    let mut value = T::default();
    // SAFETY: `value` is a `T` on the stack, `size_of::<T>()` bytes; the helper tolerates any
    // source address and zeroes the destination when it fails.
    let failed = unsafe {
        generated::bpf_probe_read_kernel(
            &mut value as *mut T as *mut c_void,
            core::mem::size_of::<T>() as u32,
            (base + offset as u64) as *const c_void,
        )
    };
    if failed != 0 {
        maps::count(Loss::KernelRead);
        return None;
    }
    Some(value)
}

#[inline(always)]
fn read_ptr(base: u64, offset: u32) -> Option<u64> {
    read::<u64>(base, offset).filter(|p| *p != 0)
}

#[inline(always)]
pub fn current_task() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_get_current_task() }
}

#[inline(always)]
pub fn task_pid(task: u64, off: &KernelOffsets) -> Option<u32> {
    read::<u32>(task, off.task_pid)
}

#[inline(always)]
pub fn task_tgid(task: u64, off: &KernelOffsets) -> Option<u32> {
    read::<u32>(task, off.task_tgid)
}

/// The thread-group id of the task's parent (its real one, not a tracer).
#[inline(always)]
pub fn task_real_parent_tgid(task: u64, off: &KernelOffsets) -> Option<u32> {
    task_tgid(read::<u64>(task, off.task_real_parent)?, off)
}

#[inline(always)]
pub fn task_exit_code(task: u64, off: &KernelOffsets) -> Option<i32> {
    read::<i32>(task, off.task_exit_code)
}

/// Whether the task is in the middle of exec.
#[inline(always)]
pub fn task_in_execve(task: u64, off: &KernelOffsets) -> bool {
    let bit = off.task_in_execve_bit;
    if bit == u32::MAX {
        return false;
    }
    read::<u8>(task, bit / 8)
        .map(|byte| byte & (1 << (bit % 8)) != 0)
        .unwrap_or(false)
}

/// The task's name, read from `task_struct.comm`.
#[inline(always)]
pub fn task_comm(task: u64, off: &KernelOffsets) -> Option<[u8; 16]> {
    read::<[u8; 16]>(task, off.task_comm)
}

/// The inode number of the task's mount namespace, as `/proc/PID/ns/mnt` shows it.
#[inline(always)]
pub fn task_mntns(task: u64, off: &KernelOffsets) -> Option<u32> {
    let nsproxy = read_ptr(task, off.task_nsproxy)?;
    let mnt_ns = read_ptr(nsproxy, off.nsproxy_mnt_ns)?;
    read::<u32>(mnt_ns, off.mnt_ns_inum)
}

/// The current task as the kernel's typed pointer. Fields reached from it are read with plain
/// loads ([`field`]) instead of a helper call each: the verifier checks every load against the
/// kernel's BTF (the offsets, read-only globals, are constants to it), and turns it into a read
/// that yields zero instead of faulting.
#[inline(always)]
fn current_btf() -> *const u8 {
    // SAFETY: no preconditions.
    unsafe { generated::bpf_get_current_task_btf() as *const u8 }
}

/// The field at `offset` of a struct reached from [`current_btf`] through typed pointers only.
/// A pointer to a pointer is not typed: what it points to needs [`read`].
///
/// # Safety
/// `base` must be such a typed pointer, and the field of type `T`.
#[inline(always)]
unsafe fn field<T>(base: *const u8, offset: u32) -> T {
    // SAFETY: see above; the verifier rejects the program otherwise.
    unsafe { core::ptr::read_volatile(base.add(offset as usize) as *const T) }
}

/// The arguments of the current thread's system call, from the registers saved when it entered
/// the kernel. A `sys_exit_*` tracepoint runs before anything (ptrace, a signal) can change
/// them, so they are the arguments the call ran with.
#[inline(always)]
pub fn syscall_args(off: &KernelOffsets) -> [u64; 6] {
    // SAFETY: the helper takes the typed pointer to the current task and returns the typed
    // pointer to its saved registers.
    let regs = unsafe { generated::bpf_task_pt_regs(current_btf() as *mut _) } as *const u8;
    let mut args = [0u64; 6];
    let mut i = 0;
    while i < 6 {
        // SAFETY: a register of `struct pt_regs`, at an offset resolved from its BTF.
        args[i] = unsafe { field(regs, off.regs_arg[i]) };
        i += 1;
    }
    args
}

/// The current task's name, as [`task_comm`] reads any task's; `bpf_get_current_comm` would
/// copy it a byte at a time.
#[inline(always)]
pub fn current_comm(off: &KernelOffsets) -> [u8; 16] {
    // SAFETY: `task_struct.comm` is a 16-byte array in the typed current task.
    unsafe { field(current_btf(), off.task_comm) }
}

/// The pointer field at `offset` of a typed struct, unless NULL.
///
/// # Safety
/// As for [`field`].
#[inline(always)]
unsafe fn pointer_field(base: *const u8, offset: u32) -> Option<*const u8> {
    // SAFETY: the caller's promise.
    let pointer: *const u8 = unsafe { field(base, offset) };
    (!pointer.is_null()).then_some(pointer)
}

/// The current task's mount namespace, as [`task_mntns`] reads any task's.
#[inline(always)]
pub fn current_mntns(off: &KernelOffsets) -> Option<u32> {
    // SAFETY: typed pointers all the way down.
    unsafe {
        let nsproxy = pointer_field(current_btf(), off.task_nsproxy)?;
        let mnt_ns = pointer_field(nsproxy, off.nsproxy_mnt_ns)?;
        Some(field(mnt_ns, off.mnt_ns_inum))
    }
}

/// Whether the current task is its process's last thread to exit, in `sched_process_exit`:
/// `do_exit` counts it out of `signal_struct.live` before that tracepoint. Whichever thread
/// goes last, the leader or not (a leader may leave first with `pthread_exit`, and is replaced
/// when another thread execs), its exit is the process's.
#[inline(always)]
pub fn current_group_dead(off: &KernelOffsets) -> Option<bool> {
    // SAFETY: typed pointers all the way down; `live.counter` is an `int`.
    unsafe {
        let signal = pointer_field(current_btf(), off.task_signal)?;
        Some(field::<i32>(signal, off.signal_live) == 0)
    }
}

/// `struct inode *` behind the current task's descriptor `fd`.
#[inline(always)]
pub fn fd_inode(fd: i32, off: &KernelOffsets) -> Option<u64> {
    if fd < 0 {
        return None;
    }
    // SAFETY: typed pointers down to the descriptor array, whose elements are read below.
    let (max_fds, fd_array) = unsafe {
        let files = pointer_field(current_btf(), off.task_files)?;
        let fdt = pointer_field(files, off.files_fdt)?;
        (
            field::<u32>(fdt, off.fdtable_max_fds),
            field::<u64>(fdt, off.fdtable_fd),
        )
    };
    if fd as u32 >= max_fds || fd_array == 0 {
        return None;
    }
    let file = read_ptr(fd_array, (fd as u32) * 8)?;
    read_ptr(file, off.file_inode)
}

/// `dev_t` of the file system the inode lives on.
#[inline(always)]
pub fn inode_dev(inode: u64, off: &KernelOffsets) -> Option<u32> {
    let sb = read_ptr(inode, off.inode_sb)?;
    read::<u32>(sb, off.super_block_dev)
}

/// Whether the inode's file system is a tmpfs: only a tmpfs is ever a /dev/shm.
#[inline(always)]
pub fn inode_on_tmpfs(inode: u64, off: &KernelOffsets) -> bool {
    /// `TMPFS_MAGIC` of linux/magic.h.
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    read_ptr(inode, off.inode_sb)
        .and_then(|sb| read::<u64>(sb, off.super_block_magic))
        .is_some_and(|magic| magic == TMPFS_MAGIC)
}

/// Number of the inode (0 if it cannot be read).
#[inline(always)]
pub fn inode_ino(inode: u64, off: &KernelOffsets) -> u64 {
    read::<u64>(inode, off.inode_ino).unwrap_or(0)
}

/// Size and allocation of the inode now.
#[inline(always)]
pub fn inode_size(inode: u64, off: &KernelOffsets) -> (i64, u64) {
    (
        read::<i64>(inode, off.inode_size).unwrap_or(-1),
        read::<u64>(inode, off.inode_blocks).unwrap_or(0),
    )
}

/// What a record says of the file: its file system, and the inode's type, number, size and
/// allocation now.
#[inline(always)]
pub fn inode_file(inode: u64, off: &KernelOffsets) -> Option<FileRef> {
    if let Some(file) = inode_file_at_once(inode, off) {
        return Some(file);
    }
    let dev = inode_dev(inode, off)?;
    let (size, blocks) = inode_size(inode, off);
    Some(FileRef {
        dev,
        mode: read::<u16>(inode, off.inode_mode).unwrap_or(0) as u32,
        ino: read::<u64>(inode, off.inode_ino).unwrap_or(0),
        size,
        blocks,
    })
}

/// [`inode_file`] from one read of the inode's first [`INODE_HEAD`] bytes (its super block
/// pointer among them), and one of the super block's device; `None` when a field lies beyond
/// them or is not aligned to its size (then each is read alone).
#[inline(always)]
fn inode_file_at_once(inode: u64, off: &KernelOffsets) -> Option<FileRef> {
    let word =
        |offset: u32| (offset.is_multiple_of(8) && offset + 8 <= INODE_HEAD).then_some(offset / 8);
    let ino = word(off.inode_ino)?;
    let size = word(off.inode_size)?;
    let blocks = word(off.inode_blocks)?;
    let sb = word(off.inode_sb)?;
    // `i_mode` is 16 bits: within one word.
    let mode = word(off.inode_mode & !7)?;
    let mode_shift = (off.inode_mode % 8) * 8;
    if mode_shift > 48 || inode == 0 {
        return None;
    }
    let buf = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: a per-CPU buffer of INODE_HEAD bytes; the helper writes at most that many, and
    // tolerates any source address.
    let failed = unsafe {
        generated::bpf_probe_read_kernel(buf as *mut c_void, INODE_HEAD, inode as *const c_void)
    };
    if failed != 0 {
        return None;
    }
    // SAFETY: the buffer was just filled; it holds INODE_HEAD / 8 words.
    let words = unsafe { &*(buf as *const [u64; (INODE_HEAD / 8) as usize]) };
    let at = |index: u32| words.get(index as usize).copied();
    let sb = at(sb).filter(|sb| *sb != 0)?;
    Some(FileRef {
        dev: read::<u32>(sb, off.super_block_dev)?,
        mode: ((at(mode)? >> mode_shift) & 0xffff) as u32,
        ino: at(ino)?,
        size: at(size)? as i64,
        blocks: at(blocks)?,
    })
}

/// `dev_t` of the file system holding the task's current directory.
#[inline(always)]
pub fn cwd_dev(off: &KernelOffsets) -> Option<u32> {
    // SAFETY: typed pointers all the way down.
    unsafe {
        let fs = pointer_field(current_btf(), off.task_fs)?;
        let dentry = pointer_field(fs, off.fs_pwd_dentry)?;
        let sb = pointer_field(dentry, off.dentry_sb)?;
        Some(field(sb, off.super_block_dev))
    }
}

/// User addresses of the task's command line (`mm_struct.arg_start..arg_end`).
#[inline(always)]
pub fn task_args(task: u64, off: &KernelOffsets) -> Option<(u64, u64)> {
    let mm = read_ptr(task, off.task_mm)?;
    Some((
        read::<u64>(mm, off.mm_arg_start)?,
        read::<u64>(mm, off.mm_arg_end)?,
    ))
}

/// `linux_binprm.filename`, a kernel string pointer.
#[inline(always)]
pub fn binprm_filename(bprm: u64, off: &KernelOffsets) -> Option<u64> {
    read_ptr(bprm, off.binprm_filename)
}

/// Fault fields of a `struct kernel_siginfo *`: (`si_errno`, `si_code`, `si_addr`).
///
/// The layout is the UAPI siginfo layout (`si_signo`, `si_errno`, `si_code`, then the union at
/// 16 on 64-bit), fixed by the ABI, so it needs no BTF. Small values are the kernel's
/// `SEND_SIG_NOINFO`/`SEND_SIG_PRIV` markers, not pointers. The address is only meaningful
/// for faults (positive codes below `SI_KERNEL`); for `kill`/`tgkill` the union holds a pid.
#[inline(always)]
pub fn siginfo_fault(info: u64) -> (i32, i32, u64) {
    if info < 4096 {
        return (0, 0, 0);
    }
    let code = read::<i32>(info, 8).unwrap_or(0);
    let addr = if code > 0 && code < 0x80 {
        read::<u64>(info, 16).unwrap_or(0)
    } else {
        0
    };
    (read::<i32>(info, 4).unwrap_or(0), code, addr)
}
