//! Load-time settings handed to the eBPF programs as read-only globals.

/// What the probes report. Set once by the loader; the programs never change it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Non-zero: every process on the host is in scope (`--all`).
    pub all: u32,
    /// Non-zero: processes are also matched by mount namespace or cgroup id (containers).
    pub match_containers: u32,
    /// Non-zero: drop successful data-path calls in the kernel (`--failed`).
    pub failed_only: u32,
    /// shmtrace's own process, never traced.
    pub self_tgid: u32,
    /// Wake the reader for an ordinary record only once this many bytes wait in the ring
    /// buffer (failures always wake it; it also reads on a timer).
    pub wakeup_bytes: u32,
}

/// Byte offsets of the kernel struct fields the programs read.
///
/// aya's Rust eBPF has no CO-RE relocations, so these are resolved from the running kernel's BTF
/// at start-up and never compiled in. Each name is `struct_field`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_comm: u32,
    pub task_exit_code: u32,
    /// `task_struct.real_parent`: whose child the process is, for a death that follows a
    /// child's.
    pub task_real_parent: u32,
    pub task_signal: u32,
    /// `signal_struct.live.counter`: the process's threads not yet exiting.
    pub signal_live: u32,
    pub task_nsproxy: u32,
    pub task_files: u32,
    pub task_fs: u32,
    pub task_mm: u32,
    pub nsproxy_mnt_ns: u32,
    /// `mnt_namespace.ns.inum`: the number `/proc/PID/ns/mnt` shows.
    pub mnt_ns_inum: u32,
    pub files_fdt: u32,
    /// `files_struct.fd_array`: the descriptor table's slots while it has not grown
    /// (`fdtable.max_fds` is then [`EMBEDDED_FDS`]), read with typed loads.
    pub files_fd_array: u32,
    pub fdtable_max_fds: u32,
    pub fdtable_fd: u32,
    pub file_inode: u32,
    /// `file.f_op`: what kind of file it is (`shmem_file_operations` for a tmpfs's regular
    /// files).
    pub file_op: u32,
    /// `file.f_path.mnt` and `file.f_path.dentry`: where the file was reached.
    pub file_path_mnt: u32,
    pub file_path_dentry: u32,
    pub inode_mode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub inode_size: u32,
    pub inode_blocks: u32,
    pub super_block_dev: u32,
    /// `super_block.s_magic`: `TMPFS_MAGIC` for a tmpfs, the only file system taken for a
    /// /dev/shm by its device number alone (another needs its mount at /dev/shm).
    pub super_block_magic: u32,
    /// `super_block.s_mounts`: the file system's mounts, a `list_head` of
    /// `mount.mnt_instance` before Linux 6.18 and a chain of `mount.mnt_next_for_sb` since
    /// ([`KernelOffsets::mounts_chained`]).
    pub super_block_mounts: u32,
    /// `mount.mnt_instance`, or `mount.mnt_next_for_sb` where mounts are chained.
    pub mount_next: u32,
    /// Non-zero where `super_block.s_mounts` is a chain (6.18 and later).
    pub mounts_chained: u32,
    /// `mount.mnt`: the `struct vfsmount` a `struct mount` holds, which is what files point
    /// to.
    pub mount_mnt: u32,
    pub mount_parent: u32,
    pub mount_mountpoint: u32,
    pub vfsmount_root: u32,
    pub dentry_parent: u32,
    /// `dentry.d_name.name`.
    pub dentry_name: u32,
    /// `fs_struct.pwd.dentry`: the current directory, for relative paths.
    pub fs_pwd_dentry: u32,
    pub fs_pwd_mnt: u32,
    /// `fs_struct.root`: the root directory a task sees (a chroot's, inside one), where a
    /// mount's path is judged from.
    pub fs_root_dentry: u32,
    pub fs_root_mnt: u32,
    pub dentry_sb: u32,
    pub mm_arg_start: u32,
    pub mm_arg_end: u32,
    /// `linux_binprm.filename`: the path exec was given.
    pub binprm_filename: u32,
    /// Bit offset of the `task_struct.in_execve` bitfield, or `u32::MAX` when this kernel has
    /// none: exec renames the task, and that rename is not news.
    pub task_in_execve_bit: u32,
    /// `pt_regs` offsets of the registers a system call's arguments arrive in, in argument
    /// order, as saved at entry: the calls traced at exit only read their arguments there.
    pub regs_arg: [u32; 6],
    /// `8 << k` for bit `k` of a descriptor number: the typed read of slot `fd` of
    /// `fd_array` adds these for the bits `fd` has, so that each of its 64 paths has a
    /// constant offset, which the verifier requires of a typed load. As constants the
    /// compiler would fold the adds into one `fd * 8`, a variable offset the verifier refuses.
    pub fd_slot_steps: [u32; 6],
}

/// `NR_OPEN_DEFAULT` on 64-bit: the slots of the descriptor table a `files_struct` holds
/// itself, used until the process opens more.
pub const EMBEDDED_FDS: u32 = 64;

#[cfg(feature = "aya")]
mod user {
    // SAFETY: `#[repr(C)]`, made only of `u32`, with no padding.
    unsafe impl aya::Pod for super::Config {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::KernelOffsets {}
}
