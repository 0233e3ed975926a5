//! Maps and globals shared with userspace. Names here are the names the loader looks up.
use aya_ebpf::{
    Global,
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use shmtrace_common::{
    Config, FileRef, KernelOffsets, Loss, PATH_LEN, Syscall, TallyKey, supers,
    tally::TALLIES_ENTRIES, targets::FOLLOWED_WORDS,
};

#[unsafe(no_mangle)]
pub static CONFIG: Global<Config> = Global::new(Config {
    all: 0,
    match_containers: 0,
    failed_only: 0,
    self_tgid: 0,
    wakeup_bytes: 0,
});

/// The settings, as the loader set them; read field by field, as `kernel::offsets` explains.
#[inline(always)]
pub fn config() -> &'static Config {
    let global = &raw const CONFIG as *const Config;
    // SAFETY: `Global<T>` is a transparent wrapper of an initialised `T`, which the loader
    // overrides and the kernel then freezes.
    unsafe { &*core::hint::black_box(global) }
}

#[unsafe(no_mangle)]
pub static OFFSETS: Global<KernelOffsets> = Global::new(KernelOffsets {
    task_pid: 0,
    task_tgid: 0,
    task_comm: 0,
    task_exit_code: 0,
    task_real_parent: 0,
    task_signal: 0,
    signal_live: 0,
    task_nsproxy: 0,
    task_files: 0,
    task_fs: 0,
    task_mm: 0,
    nsproxy_mnt_ns: 0,
    mnt_ns_inum: 0,
    files_fdt: 0,
    files_fd_array: 0,
    fdtable_max_fds: 0,
    fdtable_fd: 0,
    file_inode: 0,
    file_op: 0,
    file_path_mnt: 0,
    file_path_dentry: 0,
    inode_mode: 0,
    inode_ino: 0,
    inode_sb: 0,
    inode_size: 0,
    inode_blocks: 0,
    super_block_dev: 0,
    super_block_magic: 0,
    super_block_mounts: 0,
    mount_next: 0,
    mounts_chained: 0,
    mount_mnt: 0,
    mount_parent: 0,
    mount_mountpoint: 0,
    vfsmount_root: 0,
    dentry_parent: 0,
    dentry_name: 0,
    fs_pwd_dentry: 0,
    fs_pwd_mnt: 0,
    fs_root_dentry: 0,
    fs_root_mnt: 0,
    dentry_sb: 0,
    mm_arg_start: 0,
    mm_arg_end: 0,
    binprm_filename: 0,
    task_in_execve_bit: u32::MAX,
    regs_arg: [0; 6],
    fd_slot_steps: [0; 6],
});

/// Records for userspace. The loader sets the size (`--buffer-size`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

/// Losses per CPU, indexed by `Loss::index`: records dropped because `EVENTS` was full (by
/// kind), and reads that failed.
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(Loss::COUNT, 0);

/// Counts one loss in [`LOST`].
#[inline(always)]
pub fn count(loss: Loss) {
    if let Some(counter) = LOST.get_ptr_mut(loss.index()) {
        // SAFETY: a per-CPU slot, so no other program writes it concurrently.
        unsafe { *counter += 1 };
    }
}

/// Failures and SIGBUS by mount namespace, counted whether or not their records fit in
/// `EVENTS` (`tally`). A full map is counted (`Loss::Tally`).
#[map]
pub static TALLIES: HashMap<TallyKey, u64> = HashMap::with_max_entries(TALLIES_ENTRIES, 0);

/// Processes (thread-group ids) that failed on a full /dev/shm, or whose child did, with
/// `tally::failed` bits: at their exit, whether it is a death to count (`tally::ended`).
/// Written only at such failures, and emptied at every exit. A full map is counted
/// (`Loss::Tally`).
#[map]
pub static FAILED: HashMap<u32, u64> = HashMap::with_max_entries(16_384, 0);

/// Traced processes (thread-group ids), with `shmtrace_common::targets` bits. Reached through
/// `scope`, which keeps `FOLLOWED` in step.
#[map]
pub static TARGETS: HashMap<u32, u32> = HashMap::with_max_entries(65536, 0);

/// One bit per thread-group id, set while the process is in `TARGETS` (and, briefly, around
/// its insertion and removal): a clear bit rules a process out with one array load, which the
/// verifier inlines, where `TARGETS` takes a hash lookup that every process on the host pays on
/// every traced call. Set and cleared with atomic operations, by the probes and by userspace
/// through a shared mapping (hence `BPF_F_MMAPABLE`). 512 KiB.
#[map]
pub static FOLLOWED: Array<u64> = Array::with_max_entries(FOLLOWED_WORDS, BPF_F_MMAPABLE);
/// `BPF_F_MMAPABLE` (UAPI).
const BPF_F_MMAPABLE: u32 = 1 << 10;

/// One bit per thread id, set while the thread's call waits in `INFLIGHT` for its `sys_exit`:
/// the exit program of every call traced at both ends tells "nothing stashed" with one array
/// load, where an `INFLIGHT` lookup is a hash lookup that every process on the host would pay
/// on every such call in host-wide mode. Thread ids are below `PID_LIMIT` like process ids.
/// 512 KiB.
#[map]
pub static STASHED: Array<u64> = Array::with_max_entries(FOLLOWED_WORDS, 0);

/// Mount namespaces (inode numbers) of traced containers, with the host pid of each one's
/// first process (0 if unknown).
#[map]
pub static TARGET_MNTNS: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Slot [`HOLD_NOW`]: while non-zero, the mount namespace shmtrace runs in: processes outside
/// it and outside every followed container are reported with `flags::HELD`, for userspace to
/// attribute. Set while a followed container is not running (`--wait`, a restart), so that its
/// first processes are seen before userspace has learned its namespace. Slot [`HOLD_OWN`]:
/// shmtrace's mount namespace, always, for the probes to start holding themselves the moment a
/// followed container's first process exits (a `docker restart` is quicker than userspace).
#[map]
pub static HOLD_OUTSIDE: Array<u32> = Array::with_max_entries(2, 0);
pub const HOLD_NOW: u32 = 0;
pub const HOLD_OWN: u32 = 1;

/// cgroup v2 ids of traced containers.
#[map]
pub static TARGET_CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(1024, 0);

/// Which tmpfs file systems are a /dev/shm, two bits per device number
/// (`shmtrace_common::supers`): filled by userspace from the mount tables (the host's and
/// every container's /dev/shm), judged by the probes for a tmpfs they meet unknown
/// (`shm_check`), and forgotten by userspace once unmounted. An array, so that a look-up is a
/// load the verifier inlines, where a hash map's is a helper call that every open on the host
/// would pay; 512 KiB. Mapped by userspace, which updates it with atomic operations as the
/// probes do (hence `BPF_F_MMAPABLE`).
#[map]
pub static SHM_SUPERS: Array<u64> = Array::with_max_entries(supers::ENTRIES, BPF_F_MMAPABLE);

/// The operations (`file.f_op`) of a tmpfs's regular files (slot 0) and directories (slot 1),
/// learned from the first of each the probes judge. A file of a grown descriptor table, read
/// at its address, whose operations are neither is on no tmpfs: its inode and super block need
/// not be read (`shm_check::file_on_shm`). Kernel addresses, which never leave the kernel.
#[map]
pub static TMPFS_FILE_OPS: Array<u64> = Array::with_max_entries(2, 0);

/// `dev_t`s of the file systems mounted at /dev/shm that are not a tmpfs (a bind mount of a
/// directory): a file on one is on /dev/shm if the mount it was reached by is there. Filled
/// by userspace, which also sets `supers::ELSEWHERE` while it is not empty.
#[map]
pub static SHM_ELSEWHERE: HashMap<u32, u32> = HashMap::with_max_entries(256, 0);

/// A call seen at `sys_enter`, waiting for its `sys_exit`, by thread id. A thread's slot is
/// written in place call after call, and read only while the thread's `STASHED` bit says it
/// holds a call that has not returned; it is not removed after each call: an insert and a
/// removal per call cost the traced call more than the rest of the map work together. The
/// slot goes when its thread exits (`sched_process_exit`). A call always reaches its
/// `sys_exit` (a thread killed in it returns through it too), so nothing else leaks; a full
/// map is counted (`Loss::Pending`).
#[map]
pub static INFLIGHT: HashMap<u32, Pending> = HashMap::with_max_entries(16384, 0);

/// Per-CPU: the inode number of the directory a failed open's name was relative to, from the
/// frame that judges the path (`probes/open.rs`, `failed`) to the one that reports it. Returned
/// beside the path's flags instead, it took the open family's exit programs from about 55,000
/// instructions verified to 76,000: read from here it is one value to the verifier, not one a
/// judgement.
#[map]
pub static FAILED_OPEN_DIR: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU room, too big for the 512-byte stack, for the head of an inode being read
/// (`kernel::inode_file`), or a name being put together (`kernel::dev_shm_name`).
#[map]
pub static SCRATCH: PerCpuArray<[u8; 2 * PATH_LEN]> = PerCpuArray::with_max_entries(1, 0);

/// What `sys_enter` learned about a call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pending {
    pub syscall: Syscall,
    pub flags: u16,
    pub fd: i32,
    pub args: [u64; 6],
    /// Valid when `flags` has `FILE`: the descriptor's file, as read when the call was made
    /// (`close`, traced at entry only) or returned (the calls traced at exit only).
    pub file: FileRef,
    /// An opened file's dentry (0 for other calls): its name below its file system's root is
    /// recorded when the path it was opened by does not start with /dev/shm/.
    pub dentry: u64,
}
