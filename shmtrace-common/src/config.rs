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
    pub fdtable_max_fds: u32,
    pub fdtable_fd: u32,
    pub file_inode: u32,
    pub inode_mode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub inode_size: u32,
    pub inode_blocks: u32,
    pub super_block_dev: u32,
    /// `super_block.s_magic`: which kind of file system (`TMPFS_MAGIC`), so that only a tmpfs
    /// is ever taken for a /dev/shm.
    pub super_block_magic: u32,
    /// `fs_struct.pwd.dentry`: the current directory, for relative paths.
    pub fs_pwd_dentry: u32,
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
}

#[cfg(feature = "aya")]
mod user {
    // SAFETY: `#[repr(C)]`, made only of `u32`, with no padding.
    unsafe impl aya::Pod for super::Config {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::KernelOffsets {}
}
