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
use shmtrace_common::{EMBEDDED_FDS, FileRef, KernelOffsets, Loss, PATH_LEN};

use crate::maps::{self, OFFSETS, SCRATCH};

/// Bytes read at once from the start of an inode (the per-CPU `SCRATCH` buffer's size): one
/// read costs what one field's does, and `i_mode`, `i_sb`, `i_ino`, `i_size` and `i_blocks`
/// lie in the first 160 bytes of the kernels known.
const INODE_HEAD: u32 = PATH_LEN as u32;

/// The kernel's offsets, as the loader set them. Read field by field where used, never copied
/// whole: a copy of the struct (as `Global::load` makes) is a load and a spill of every field
/// in every program, used or not. The global's address is hidden from the compiler, which
/// would otherwise read the fields as the zeros the object was built with.
#[inline(always)]
pub fn offsets() -> &'static KernelOffsets {
    let global = &raw const OFFSETS as *const KernelOffsets;
    // SAFETY: `Global<T>` is a transparent wrapper of an initialised `T`, which the loader
    // overrides and the kernel then freezes.
    unsafe { &*core::hint::black_box(global) }
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
    Current::get().0
}

/// The current task's typed pointer ([`current_btf`]), taken once by a program that reads
/// several things from it: each take is a helper call.
#[derive(Clone, Copy)]
pub struct Current(*const u8);

impl Current {
    #[inline(always)]
    pub fn get() -> Current {
        // SAFETY: no preconditions.
        Current(unsafe { generated::bpf_get_current_task_btf() as *const u8 })
    }

    /// Its thread-group id: the pid users see.
    #[inline(always)]
    pub fn tgid(self, off: &KernelOffsets) -> u32 {
        // SAFETY: `task_struct.tgid`, a `pid_t`, of the typed current task.
        unsafe { field(self.0, off.task_tgid) }
    }
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
pub fn syscall_args(task: Current, off: &KernelOffsets) -> [u64; 6] {
    let regs = Regs::of(task);
    let mut args = [0u64; 6];
    let mut i = 0;
    while i < 6 {
        args[i] = regs.arg(i, off);
        i += 1;
    }
    args
}

/// The registers the current system call's arguments were saved in, as a typed pointer.
#[derive(Clone, Copy)]
pub struct Regs(*const u8);

impl Regs {
    #[inline(always)]
    pub fn of(task: Current) -> Regs {
        // SAFETY: the helper takes the typed pointer to the current task and returns the
        // typed pointer to its saved registers.
        Regs(unsafe { generated::bpf_task_pt_regs(task.0 as *mut _) } as *const u8)
    }

    /// Argument `n` (below 6).
    #[inline(always)]
    pub fn arg(self, n: usize, off: &KernelOffsets) -> u64 {
        // SAFETY: a register of `struct pt_regs`, at an offset resolved from its BTF.
        unsafe { field(self.0, off.regs_arg[n]) }
    }
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

/// A file the probes reached: through typed pointers from the current task, read with plain
/// loads, or at an address, read with `bpf_probe_read_kernel`.
#[derive(Clone, Copy)]
pub struct FileAt {
    /// Non-zero: `addr` is a `struct file *` the verifier knows the type of.
    typed: u64,
    addr: *const u8,
}

impl FileAt {
    const NONE: FileAt = FileAt {
        typed: 0,
        addr: core::ptr::null(),
    };

    fn typed(file: *const u8) -> FileAt {
        FileAt {
            typed: 1,
            addr: file,
        }
    }

    fn raw(file: u64) -> FileAt {
        FileAt {
            typed: 0,
            addr: file as *const u8,
        }
    }
}

/// The current task's file behind descriptor `fd`.
///
/// Until a process opens more than [`EMBEDDED_FDS`] files its descriptor table is the one its
/// `files_struct` holds, `fd_array`, and slot `fd` is a typed load: no helper call at all,
/// which is what lets every `open` on the host be judged by the file it made. The verifier
/// takes a typed load only at a constant offset, so the slot's address is built from one add
/// per bit of `fd` ([`embedded_slot`]), which gives each of the 64 descriptors a path of its
/// own. A grown table is read at its address: the verifier does not type what `fdtable.fd`
/// points to.
///
/// Which of the two it is goes through the stack, where the compiler cannot see it: it would
/// tell them apart later by `max_fds` again, a test that the verifier of Linux 6.1 cannot
/// always decide, and then follows a path where a raw address is loaded as a typed pointer.
/// Every field is written on every path: that verifier refuses to store an unwritten one.
#[inline(always)]
pub fn fd_file(task: Current, fd: i32, off: &KernelOffsets) -> Option<FileAt> {
    let file = core::hint::black_box(fd_file_by_table(task, fd, off).unwrap_or(FileAt::NONE));
    (!file.addr.is_null()).then_some(file)
}

#[inline(always)]
fn fd_file_by_table(task: Current, fd: i32, off: &KernelOffsets) -> Option<FileAt> {
    if fd < 0 {
        return None;
    }
    let fd = fd as u32;
    // SAFETY: typed pointers down to the descriptor table; `fd_array`'s slots are typed
    // `struct file *`, read at constant offsets within it.
    unsafe {
        let files = pointer_field(task.0, off.task_files)?;
        let fdt = pointer_field(files, off.files_fdt)?;
        let max_fds: u32 = field(fdt, off.fdtable_max_fds);
        if fd >= max_fds {
            return None;
        }
        if max_fds <= EMBEDDED_FDS {
            let file: *const u8 = field(embedded_slot(files, fd, off), 0);
            return (!file.is_null()).then(|| FileAt::typed(file));
        }
        let slots: u64 = field(fdt, off.fdtable_fd);
        read_ptr(slots, fd * 8).map(FileAt::raw)
    }
}

/// The address of `files_struct.fd_array[fd]`, for `fd` below [`EMBEDDED_FDS`], as a typed
/// pointer with a constant offset on each path: one add of `8 << k` for each bit `k` of `fd`.
/// The adds are read from `OFFSETS` (`fd_slot_steps`), which the verifier knows as constants
/// and the compiler does not: it would fold constants into `fd * 8`, a variable offset.
///
/// # Safety
/// `files` must be the typed pointer to a `files_struct`.
#[inline(always)]
unsafe fn embedded_slot(files: *const u8, fd: u32, off: &KernelOffsets) -> *const u8 {
    // SAFETY: offsets within `files_struct.fd_array`, as the caller promises.
    unsafe {
        let mut slot = files.add(off.files_fd_array as usize);
        let mut bit = 0;
        while bit < off.fd_slot_steps.len() {
            if fd & (1 << bit) != 0 {
                slot = slot.add(off.fd_slot_steps[bit] as usize);
            }
            bit += 1;
        }
        slot
    }
}

/// A file system's super block, as a file leads to it.
#[derive(Clone, Copy)]
pub struct Super {
    /// Its address.
    pub addr: u64,
    /// `s_magic`.
    pub magic: u64,
    /// `s_dev`.
    pub dev: u32,
}

impl FileAt {
    /// Whether it is a typed pointer: a file of a table that has not grown.
    #[inline(always)]
    pub fn is_typed(self) -> bool {
        self.typed != 0
    }
}

/// Words of a struct read at once at its address: one `bpf_probe_read_kernel` costs what one
/// field's does, so the fields the probes need of a struct are read together, and picked out
/// by their offsets (all of them within the first words of the struct on the kernels known;
/// a field beyond them is read alone).
struct Head<'a, const N: usize>(&'a [u64; N]);

impl<'a, const N: usize> Head<'a, N> {
    /// Reads the first `N` words at `base` into `room`.
    #[inline(always)]
    fn read(base: u64, room: &'a mut [u64; N]) -> Option<Head<'a, N>> {
        if base == 0 {
            return None;
        }
        // SAFETY: `room` holds N words; the helper tolerates any source address.
        let failed = unsafe {
            generated::bpf_probe_read_kernel(
                room.as_mut_ptr() as *mut c_void,
                (N * 8) as u32,
                base as *const c_void,
            )
        };
        if failed != 0 {
            maps::count(Loss::KernelRead);
            return None;
        }
        Some(Head(room))
    }

    /// The `size`-byte field at `offset` (2, 4 or 8 bytes, aligned to its size).
    #[inline(always)]
    fn field(&self, base: u64, offset: u32, size: u32) -> Option<u64> {
        let word = self.0.get((offset / 8) as usize).copied();
        let shift = (offset % 8) * 8;
        match word {
            Some(word) if offset.is_multiple_of(size) => {
                let mask = if size == 8 {
                    u64::MAX
                } else {
                    (1 << (size * 8)) - 1
                };
                Some((word >> shift) & mask)
            }
            // Beyond the head, or misaligned: alone.
            _ => match size {
                8 => read::<u64>(base, offset),
                4 => read::<u32>(base, offset).map(u64::from),
                _ => read::<u16>(base, offset).map(u64::from),
            },
        }
    }
}

/// What the probes read of a file reached at its address: its operations (which say what
/// kind of file it is, `shmem_file_operations` for a tmpfs's regular files) and its inode.
#[inline(always)]
pub fn raw_file_head(file: FileAt, off: &KernelOffsets) -> Option<(u64, u64)> {
    let base = file.addr as u64;
    let mut room = [0u64; 8];
    let head = Head::read(base, &mut room)?;
    let inode = head.field(base, off.file_inode, 8).filter(|p| *p != 0)?;
    Some((head.field(base, off.file_op, 8)?, inode))
}

/// An inode reached at its address: its type and permissions (`i_mode`), and its file
/// system's super block.
#[inline(always)]
pub fn raw_inode_super(inode: u64, off: &KernelOffsets) -> Option<(u16, Super)> {
    let mut room = [0u64; 8];
    let head = Head::read(inode, &mut room)?;
    let mode = head.field(inode, off.inode_mode, 2)? as u16;
    let sb = head.field(inode, off.inode_sb, 8).filter(|p| *p != 0)?;
    // The super block's device and magic lie further apart: room for them off the stack.
    // SAFETY: the per-CPU scratch buffer holds more than 16 words.
    let room = unsafe { &mut *(SCRATCH.get_ptr_mut(0)? as *mut [u64; 16]) };
    let sb_head = Head::read(sb, room)?;
    Some((
        mode,
        Super {
            addr: sb,
            magic: sb_head.field(sb, off.super_block_magic, 8)?,
            dev: sb_head.field(sb, off.super_block_dev, 4)? as u32,
        },
    ))
}

/// A typed file's operations (`f_op`) and its inode's type, as scalars.
#[inline(always)]
pub fn typed_file_kind(file: FileAt, off: &KernelOffsets) -> Option<(u64, u16)> {
    // SAFETY: typed pointers from the file to its inode's mode.
    unsafe {
        let f_op: *const u8 = field(file.addr, off.file_op);
        let inode = pointer_field(file.addr, off.file_inode)?;
        Some((f_op as u64, field(inode, off.inode_mode)))
    }
}

/// The super block of the file system `file` is on.
#[inline(always)]
pub fn file_super(file: FileAt, off: &KernelOffsets) -> Option<Super> {
    if file.typed != 0 {
        // SAFETY: typed pointers from the file down to its super block.
        unsafe {
            let inode = pointer_field(file.addr, off.file_inode)?;
            typed_super(pointer_field(inode, off.inode_sb)?, off)
        }
    } else {
        let (_, inode) = raw_file_head(file, off)?;
        raw_inode_super(inode, off).map(|(_, sb)| sb)
    }
}

/// # Safety
/// `sb` must be a typed `struct super_block *`.
#[inline(always)]
unsafe fn typed_super(sb: *const u8, off: &KernelOffsets) -> Option<Super> {
    // SAFETY: the caller's promise.
    unsafe {
        Some(Super {
            addr: sb as u64,
            magic: field(sb, off.super_block_magic),
            dev: field(sb, off.super_block_dev),
        })
    }
}

/// The mount (`struct vfsmount *`) and dentry by which `file` was reached.
#[inline(always)]
pub fn file_path(file: FileAt, off: &KernelOffsets) -> Option<(u64, u64)> {
    if file.typed != 0 {
        // SAFETY: `f_path`'s members of a typed file.
        unsafe {
            let mnt: *const u8 = field(file.addr, off.file_path_mnt);
            let dentry: *const u8 = field(file.addr, off.file_path_dentry);
            Some((mnt as u64, dentry as u64))
        }
    } else {
        let addr = file.addr as u64;
        Some((
            read_ptr(addr, off.file_path_mnt)?,
            read_ptr(addr, off.file_path_dentry)?,
        ))
    }
}

/// The number of `file`'s inode (0 if it cannot be read).
#[inline(always)]
pub fn file_ino(file: FileAt, off: &KernelOffsets) -> u64 {
    if file.typed == 0 {
        return read_ptr(file.addr as u64, off.file_inode).map_or(0, |inode| inode_ino(inode, off));
    }
    // SAFETY: typed pointers from the file to its inode's number.
    unsafe {
        match pointer_field(file.addr, off.file_inode) {
            Some(inode) => field(inode, off.inode_ino),
            None => 0,
        }
    }
}

/// What a record says of the file: its file system, and its inode's type, number, size and
/// allocation now.
#[inline(always)]
pub fn file_ref(file: FileAt, off: &KernelOffsets) -> Option<FileRef> {
    if file.typed == 0 {
        return inode_file(read_ptr(file.addr as u64, off.file_inode)?, off);
    }
    // SAFETY: typed pointers from the file down to its inode's fields.
    unsafe {
        let inode = pointer_field(file.addr, off.file_inode)?;
        let sb = pointer_field(inode, off.inode_sb)?;
        Some(FileRef {
            dev: field(sb, off.super_block_dev),
            mode: field::<u16>(inode, off.inode_mode) as u32,
            ino: field(inode, off.inode_ino),
            size: field(inode, off.inode_size),
            blocks: field(inode, off.inode_blocks),
        })
    }
}

/// The super block of the current task's working directory, and the mount it was reached by
/// (`struct vfsmount *`).
#[inline(always)]
pub fn cwd_super(off: &KernelOffsets) -> Option<(Super, u64)> {
    // SAFETY: typed pointers all the way down.
    unsafe {
        let fs = pointer_field(current_btf(), off.task_fs)?;
        let dentry = pointer_field(fs, off.fs_pwd_dentry)?;
        let mnt: *const u8 = field(fs, off.fs_pwd_mnt);
        let sb = pointer_field(dentry, off.dentry_sb)?;
        Some((typed_super(sb, off)?, mnt as u64))
    }
}

/// `dev_t` of the file system the inode lives on.
#[inline(always)]
pub fn inode_dev(inode: u64, off: &KernelOffsets) -> Option<u32> {
    let sb = read_ptr(inode, off.inode_sb)?;
    read::<u32>(sb, off.super_block_dev)
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

/// Mounts of a file system looked at ([`super_at_dev_shm`]): a tmpfs at /dev/shm has one in
/// its own namespace and, for a container's, one where its runtime made it on the host; a
/// file system with more is taken to be elsewhere.
const MOUNTS_CHECKED: usize = 4;
/// Mount points crossed on the way up from one name of a path to the next: one where a file
/// system is mounted on a directory, more where mounts are stacked on the same place.
const CROSSINGS: usize = 3;

/// Whether the file system whose super block is at `sb` is mounted at /dev/shm in some mount
/// namespace (the host's, a container's, whose runtime mounted it elsewhere on the host too,
/// or any other), or else at /dev/shm of the current task's chroot ([`TaskRoot`]). Many reads:
/// the probes make this judgement once per file system (`SHM_SUPERS`).
#[inline(always)]
pub fn super_at_dev_shm(sb: u64) -> bool {
    let Some(sb) = as_number(sb) else {
        return false;
    };
    dev_shm_of_its_namespace(sb) != 0 || dev_shm_of_its_chroot(sb) != 0
}

/// `address` as a number to the verifier, for a global function, which takes only numbers:
/// an address read with plain loads is a typed pointer to it. Copied through memory: one
/// helper call, made where a file system is judged, not on the hot path.
#[inline(always)]
fn as_number(address: u64) -> Option<u64> {
    let mut number = 0u64;
    // SAFETY: 8 bytes from a local into a local.
    let failed = unsafe {
        generated::bpf_probe_read_kernel(
            &mut number as *mut u64 as *mut c_void,
            8,
            &address as *const u64 as *const c_void,
        )
    };
    (failed == 0).then_some(number)
}

/// [`super_at_dev_shm`] for the mounts of its namespace, in a global BPF function: 1 or 0. The
/// verifier checks a global function once per program, as a function of any arguments, and
/// each call of it as one instruction that returns any number. Inlined or static, the walk was
/// checked again at every place a program may judge a file system, along every path there:
/// `sys_exit_openat` took 52,500 instructions to verify on 6.18, and the programs a second to
/// load.
///
/// One function for the namespace and one for the chroot, the walk inlined into each, not one
/// function for both: a frame above the walk, or the walk keeping whether it looks in a
/// chroot, took `sys_exit` or the open family's exits past the 512 bytes of combined stack
/// that 6.1's verifier counts, rounding each frame up to 32 bytes (`combined stack size of 4
/// calls is 544`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn dev_shm_of_its_namespace(sb: u64) -> u64 {
    super_mounts_at_dev_shm::<false>(sb, offsets()) as u64
}

/// As [`dev_shm_of_its_namespace`], for the current task's chroot.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn dev_shm_of_its_chroot(sb: u64) -> u64 {
    super_mounts_at_dev_shm::<true>(sb, offsets()) as u64
}

/// Whether one of the mounts of the file system whose super block is at `sb` is at /dev/shm:
/// of its namespace, or `IN_CHROOT`, of the current task's root directory when that is not
/// its namespace's. Its mounts are read one by one (`s_mounts`), each judged by
/// [`mount_at_dev_shm`].
#[inline(always)]
fn super_mounts_at_dev_shm<const IN_CHROOT: bool>(sb: u64, off: &KernelOffsets) -> bool {
    // Only the root's directory is kept across the walk: its mount too took the frame past
    // 96 bytes.
    let root_dir = if IN_CHROOT {
        match TaskRoot::current(off) {
            root if root.is_chroot(off) => root.dentry,
            _ => return false,
        }
    } else {
        0
    };
    let chained = off.mounts_chained != 0;
    let head = sb + off.super_block_mounts as u64;
    let Some(mut at) = read_ptr(head, 0) else {
        return false;
    };
    let mut i = 0;
    while i < MOUNTS_CHECKED {
        // A chain ends with NULL, a list where it began.
        if !chained && at == head {
            return false;
        }
        // Chained, `at` is the `struct mount`; listed, its `mnt_instance`.
        let mount = if chained {
            at
        } else {
            at - off.mount_next as u64
        };
        if mount_at_dev_shm::<IN_CHROOT>(mount, root_dir, off) {
            return true;
        }
        let next = if chained { off.mount_next } else { 0 };
        at = match read_ptr(at, next) {
            Some(next) => next,
            None => return false,
        };
        i += 1;
    }
    false
}

/// Whether the mount a file was reached by (`struct vfsmount *`, as in `file.f_path.mnt`) is
/// at /dev/shm in its mount namespace. (Not a chroot's: a directory bound at a chroot's
/// /dev/shm is not told apart from the rest of its file system.)
#[inline(always)]
pub fn vfsmount_at_dev_shm(vfsmount: u64) -> bool {
    vfsmount != 0 && as_number(vfsmount).is_some_and(|mount| mount_of_dev_shm(mount) != 0)
}

/// [`vfsmount_at_dev_shm`]'s walk, a global BPF function for the reason
/// [`dev_shm_of_its_namespace`] is one.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn mount_of_dev_shm(vfsmount: u64) -> u64 {
    let off = offsets();
    mount_at_dev_shm::<false>(vfsmount - off.mount_mnt as u64, 0, off) as u64
}

/// The root directory the current task sees: its chroot's, inside one (a build root, the
/// release check's old-distribution chroot, an HPC container run by `chroot`), where a tmpfs at
/// its `dev/shm` is the /dev/shm of every program in it, though it sits deeper from the
/// namespace's root.
#[derive(Clone, Copy)]
struct TaskRoot {
    dentry: u64,
    /// The `struct mount`.
    mount: u64,
}

impl TaskRoot {
    /// The current task's; one that cannot be read is no directory (0).
    #[inline(always)]
    fn current(off: &KernelOffsets) -> TaskRoot {
        // SAFETY: typed pointers from the task to its `fs_struct`'s fields.
        unsafe {
            let Some(fs) = pointer_field(current_btf(), off.task_fs) else {
                return TaskRoot {
                    dentry: 0,
                    mount: 0,
                };
            };
            let dentry: *const u8 = field(fs, off.fs_root_dentry);
            let vfsmount: *const u8 = field(fs, off.fs_root_mnt);
            TaskRoot {
                dentry: dentry as u64,
                mount: (vfsmount as u64).wrapping_sub(off.mount_mnt as u64),
            }
        }
    }

    /// Whether it is a directory, and not its namespace's root: the root directory of a mount
    /// that is its own parent.
    #[inline(always)]
    fn is_chroot(self, off: &KernelOffsets) -> bool {
        if self.dentry == 0 {
            return false;
        }
        let namespace_root = read_ptr(self.mount, off.mount_parent) == Some(self.mount)
            && read_ptr(self.mount, off.mount_mnt + off.vfsmount_root) == Some(self.dentry);
        !namespace_root
    }
}

/// Whether `mount` (a `struct mount`) is mounted at /dev/shm (or /run/shm) of its namespace,
/// or `IN_CHROOT`, of the task's root directory `root_dir`: its mount point
/// is named `shm`, in a directory named `dev` (or `run`), in that root directory, crossing
/// mount points on the way up (the host's /dev is a devtmpfs of its own, a container's a
/// tmpfs). A tmpfs at a chroot's /dev/shm is judged so by the first program in the chroot to
/// meet it; the verdict is kept until the next file system is made, so one met first from
/// outside the chroot (through its path on the host) is no /dev/shm until then.
///
/// Inlined into the global functions that walk mounts ([`dev_shm_of_its_namespace`] and the
/// others): a frame of its own below theirs took `sys_exit` past 6.1's
/// 512 bytes of combined stack.
#[inline(always)]
fn mount_at_dev_shm<const IN_CHROOT: bool>(mount: u64, root_dir: u64, off: &KernelOffsets) -> bool {
    let Some(parent) = read_ptr(mount, off.mount_parent) else {
        return false;
    };
    // A namespace's root is its own parent: mounted nowhere.
    if parent == mount {
        return false;
    }
    let Some(mut dentry) = read_ptr(mount, off.mount_mountpoint) else {
        return false;
    };
    let mut mnt = parent;
    // The names from the mount point up: `shm`, in `dev` (or `run`, its older home, where
    // /dev/shm is a link to /run/shm).
    let shm = u32::from_le_bytes(*b"shm\0");
    let dev = u32::from_le_bytes(*b"dev\0");
    let run = u32::from_le_bytes(*b"run\0");
    let mut i = 0;
    while i < 2 {
        match up_to_a_name(dentry, mnt, off) {
            Climbed::Name(at, its_mount) => {
                (dentry, mnt) = (at, its_mount);
            }
            Climbed::Root | Climbed::Unread => return false,
        }
        let Some(name) = read_ptr(dentry, off.dentry_name) else {
            return false;
        };
        let Some(name) = read::<u32>(name, 0) else {
            return false;
        };
        if !(if i == 0 {
            name == shm
        } else {
            name == dev || name == run
        }) {
            return false;
        }
        dentry = match read_ptr(dentry, off.dentry_parent) {
            Some(parent) => parent,
            None => return false,
        };
        i += 1;
    }
    if IN_CHROOT {
        // `dev` was a name in the task's root directory (the mount of the chroot's own /dev,
        // if it has one, was crossed already). By the directory alone, whichever mount it is
        // reached by: the same directory bound elsewhere has the same /dev/shm.
        dentry == root_dir
    } else {
        matches!(up_to_a_name(dentry, mnt, off), Climbed::Root)
    }
}

/// Where going up a path from a directory leads.
enum Climbed {
    /// A directory with a name in its mount (the dentry, the `struct mount`).
    Name(u64, u64),
    /// The root of the mount namespace.
    Root,
    /// Something could not be read, or the mounts were stacked too deep.
    Unread,
}

/// From directory `dentry` of mount `mnt` (a `struct mount`): while it is its mount's root,
/// steps to the mount point below it, in the mount beneath; stops at a directory with a name,
/// or at the namespace's root.
#[inline(always)]
fn up_to_a_name(mut dentry: u64, mut mnt: u64, off: &KernelOffsets) -> Climbed {
    let mut i = 0;
    while i < CROSSINGS {
        let Some(root) = read_ptr(mnt, off.mount_mnt + off.vfsmount_root) else {
            return Climbed::Unread;
        };
        if dentry != root {
            return Climbed::Name(dentry, mnt);
        }
        let Some(parent) = read_ptr(mnt, off.mount_parent) else {
            return Climbed::Unread;
        };
        if parent == mnt {
            return Climbed::Root;
        }
        let Some(mountpoint) = read_ptr(mnt, off.mount_mountpoint) else {
            return Climbed::Unread;
        };
        (dentry, mnt) = (mountpoint, parent);
        i += 1;
    }
    Climbed::Unread
}

/// Whether `dentry` is the root of its file system (its own parent).
#[inline(always)]
pub fn is_root(dentry: u64, off: &KernelOffsets) -> bool {
    read_ptr(dentry, off.dentry_parent) == Some(dentry)
}

/// Path components below its file system's root that [`dev_shm_name`] writes.
const NAME_DEPTH: usize = 4;

/// What a name in /dev/shm starts with.
const DEV_SHM: &[u8; 9] = b"/dev/shm/";
/// Put after [`DEV_SHM`] for a name deeper than [`NAME_DEPTH`] components, whose upper ones
/// are left out (`…/` in UTF-8): the model's own mark of a directory it cannot name.
const LEFT_OUT: &[u8; 4] = b"\xe2\x80\xa6/";

/// Writes the name of `dentry`, a file on a /dev/shm file system, as it is in that /dev/shm
/// into `out`, NUL-terminated: `/dev/shm/a/b/name`, its path below its file system's root
/// (at most [`NAME_DEPTH`] components, the lowest ones; a deeper name starts
/// `/dev/shm/…/`). The name of a /dev/shm file opened through another path: a relative one,
/// a container's /dev/shm from the host through `/proc/PID/root`, or where its runtime
/// mounted it. Whole, not relative, so userspace does not resolve it against a directory
/// again. `scratch` is room to build it in: a component is written where the last ended,
/// which the verifier must see stays in bounds. Returns whether the name is whole (not cut
/// short at [`PATH_LEN`] bytes, every component read).
#[inline(always)]
pub fn dev_shm_name(
    dentry: u64,
    scratch: &mut [u8; 2 * PATH_LEN],
    out: *mut u8,
    off: &KernelOffsets,
) -> bool {
    let mut chain = [0u64; NAME_DEPTH];
    let mut depth = 0;
    let mut at = dentry;
    let mut rooted = false;
    while depth < NAME_DEPTH {
        let Some(parent) = read_ptr(at, off.dentry_parent) else {
            break;
        };
        if parent == at {
            rooted = true;
            break;
        }
        chain[depth] = at;
        at = parent;
        depth += 1;
    }
    if depth == NAME_DEPTH && read_ptr(at, off.dentry_parent) == Some(at) {
        rooted = true;
    }
    let mut end = 0usize;
    while end < DEV_SHM.len() {
        scratch[end] = DEV_SHM[end];
        end += 1;
    }
    if !rooted {
        let mut i = 0;
        while i < LEFT_OUT.len() {
            scratch[DEV_SHM.len() + i] = LEFT_OUT[i];
            i += 1;
        }
        end += LEFT_OUT.len();
    }
    let mut whole = true;
    let mut i = NAME_DEPTH;
    while i > 0 {
        i -= 1;
        if i >= depth {
            continue;
        }
        if end >= PATH_LEN - 1 {
            whole = false;
            break;
        }
        let Some(name) = chain.get(i).and_then(|at| read_ptr(*at, off.dentry_name)) else {
            return false;
        };
        let at = end & (PATH_LEN - 1);
        // SAFETY: `at` is below PATH_LEN and the read at most PATH_LEN bytes: within
        // `scratch`; the helper tolerates any source address.
        let len = unsafe {
            generated::bpf_probe_read_kernel_str(
                scratch.as_mut_ptr().add(at) as *mut c_void,
                PATH_LEN as u32,
                name as *const c_void,
            )
        };
        if len <= 0 {
            return false;
        }
        // Where the NUL went: the next component, after a '/', goes there.
        end = at + len as usize - 1;
        if i > 0 {
            scratch[end & (2 * PATH_LEN - 1)] = b'/';
            end += 1;
        }
    }
    if end >= PATH_LEN - 1 {
        whole = false;
    }
    scratch[end & (2 * PATH_LEN - 1)] = 0;
    scratch[PATH_LEN - 1] = 0;
    // SAFETY: `out` has room for PATH_LEN bytes (the caller's promise); the helper copies
    // from the scratch buffer.
    let failed = unsafe {
        generated::bpf_probe_read_kernel(
            out as *mut c_void,
            PATH_LEN as u32,
            scratch.as_ptr() as *const c_void,
        )
    };
    failed == 0 && whole
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
