//! Records the probes write into the ring buffer.
//!
//! Every record starts with a [`Header`]; `Header::kind` says which struct follows. Userspace
//! validates the kind and the record length before reading a body.
//!
//! These structs are also the body of trace files, so their layout is an ABI: with the `user`
//! feature they derive zerocopy's `IntoBytes` (which only compiles for structs without
//! padding), `layout.rs` asserts every size and offset, and [`crate::LAYOUT_HASH`] changes
//! whenever one of them does.

/// `TASK_COMM_LEN`.
pub const COMM_LEN: usize = 16;
/// Longest path kept from a traced call; longer paths set [`flags::PATH_TRUNCATED`].
pub const PATH_LEN: usize = 256;
/// Bytes of a new program's command line kept at exec.
pub const ARGS_LEN: usize = 256;

/// What follows the header.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// [`SyscallEvent`]: a call on a /dev/shm file descriptor, or a System V call.
    Syscall = 1,
    /// [`PathEvent`]: a call that names a /dev/shm path (`openat`, `unlink`, `memfd_create`).
    Path = 2,
    /// [`SignalEvent`]: a signal generated for a traced task.
    Signal = 3,
    /// [`ForkEvent`]: a traced process created a process.
    Fork = 4,
    /// [`ExecEvent`]: a traced process ran a new program.
    Exec = 5,
    /// [`ExitEvent`]: a traced process's thread-group leader exited.
    Exit = 6,
    /// [`RenameEvent`]: a traced task changed its name (`prctl(PR_SET_NAME)`).
    Rename = 7,
    /// [`OomEvent`]: the OOM killer chose a victim.
    Oom = 8,
}

impl EventKind {
    pub const ALL: [EventKind; 8] = [
        EventKind::Syscall,
        EventKind::Path,
        EventKind::Signal,
        EventKind::Fork,
        EventKind::Exec,
        EventKind::Exit,
        EventKind::Rename,
        EventKind::Oom,
    ];
}

impl TryFrom<u16> for EventKind {
    type Error = u16;
    fn try_from(value: u16) -> Result<Self, u16> {
        Ok(match value {
            1 => EventKind::Syscall,
            2 => EventKind::Path,
            3 => EventKind::Signal,
            4 => EventKind::Fork,
            5 => EventKind::Exec,
            6 => EventKind::Exit,
            7 => EventKind::Rename,
            8 => EventKind::Oom,
            other => return Err(other),
        })
    }
}

/// The open family, as a pattern: `open`, `openat` and `openat2`, whose records all hold
/// `[dirfd, path, flags, mode, ...]` and which return the new descriptor
/// ([`Syscall::opens_a_path`]). A pattern rather than a list, so that a `match` naming it stays
/// exhaustive: a call added to the family is added here, and the compiler then finds every
/// `match` that has not said what to do with it.
#[macro_export]
macro_rules! open_family {
    () => {
        $crate::Syscall::Openat | $crate::Syscall::Openat2 | $crate::Syscall::Open
    };
}

/// The traced system calls.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Syscall {
    Openat = 1,
    Openat2 = 2,
    Ftruncate = 3,
    Fallocate = 4,
    Write = 5,
    Mmap = 6,
    Munmap = 7,
    Close = 8,
    Unlink = 9,
    Unlinkat = 10,
    MemfdCreate = 11,
    Shmget = 12,
    Shmat = 13,
    Shmdt = 14,
    Shmctl = 15,
    /// Reported only when it dropped descriptors passed to it (`MSG_CTRUNC`): the receiver is
    /// out of file descriptors.
    Recvmsg = 16,
    /// `statfs(path, buf)` of a path on a /dev/shm file system, and `fstatfs(fd, buf)` of a
    /// descriptor of one: what the program saw of its free space. A successful call's record
    /// carries the answer in its last four arguments ([`statfs_args`]); the first two are the
    /// call's own.
    Statfs = 17,
    Fstatfs = 18,
    /// `open(path, flags, mode)`, x86-64's older call, which musl (Alpine's libc) makes where
    /// glibc makes `openat`. Recorded as `openat(AT_FDCWD, path, flags, mode)` is: its args are
    /// `[AT_FDCWD, path, flags, mode, 0, 0]`.
    Open = 19,
}

/// Where a `statfs` or `fstatfs` record carries the call's answer, in
/// [`SyscallEvent::args`]: fields of `struct statfs`.
pub mod statfs_args {
    /// `f_bsize`: the unit of the block counts.
    pub const BLOCK_SIZE: usize = 2;
    /// `f_blocks`: the file system's size, in blocks.
    pub const BLOCKS: usize = 3;
    /// `f_bavail`: blocks free to an unprivileged writer.
    pub const AVAILABLE: usize = 4;
    /// `f_type`: the file system's magic number (`TMPFS_MAGIC` for a tmpfs).
    pub const MAGIC: usize = 5;
}

/// Where the probes see a call ([`Syscall::traced_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TracedAt {
    /// A `sys_enter_<name>` program stashes the call, the shared `sys_exit` program reports
    /// it: what the call needs seen is there at entry only (the path of an `unlink`, whose
    /// file is gone by its exit; the time a System V call or a `memfd_create` was made).
    BothEnds,
    /// Its own `sys_exit_<name>` program only, with its arguments read from the registers
    /// saved at entry: a call about which nothing needs seeing before it runs. An open is
    /// judged by the file it made, a call on a descriptor that stays open by the descriptor's
    /// file, a `statfs` by its path, which the call has read by then. An entry tracepoint
    /// would cost every process on the host on each of these calls.
    Exit,
    /// Its `sys_enter_<name>` program only, reported as succeeding: a `close` of a /dev/shm
    /// descriptor. The descriptor is released at entry whatever the call then returns (only
    /// a file system's flush can fail it, and tmpfs has none), and its file is gone by the
    /// exit. An exit tracepoint would cost every process on the host on every `close`, and a
    /// stash and a lookup per traced call.
    Entry,
}

impl Syscall {
    pub const ALL: [Syscall; 19] = [
        Syscall::Openat,
        Syscall::Openat2,
        Syscall::Ftruncate,
        Syscall::Fallocate,
        Syscall::Write,
        Syscall::Mmap,
        Syscall::Munmap,
        Syscall::Close,
        Syscall::Unlink,
        Syscall::Unlinkat,
        Syscall::MemfdCreate,
        Syscall::Shmget,
        Syscall::Shmat,
        Syscall::Shmdt,
        Syscall::Shmctl,
        Syscall::Recvmsg,
        Syscall::Statfs,
        Syscall::Fstatfs,
        Syscall::Open,
    ];

    /// Where the probes see the call: its tracepoints, its program, its record.
    pub const fn traced_at(self) -> TracedAt {
        match self {
            Syscall::Ftruncate
            | Syscall::Fallocate
            | Syscall::Write
            | Syscall::Mmap
            | Syscall::Munmap
            | Syscall::Statfs
            | Syscall::Fstatfs
            | Syscall::Openat
            | Syscall::Openat2
            | Syscall::Open => TracedAt::Exit,
            Syscall::Close => TracedAt::Entry,
            Syscall::Unlink
            | Syscall::Unlinkat
            | Syscall::MemfdCreate
            | Syscall::Shmget
            | Syscall::Shmat
            | Syscall::Shmdt
            | Syscall::Shmctl
            | Syscall::Recvmsg => TracedAt::BothEnds,
        }
    }

    /// [`TracedAt::Exit`].
    pub const fn traced_at_exit_only(self) -> bool {
        matches!(self.traced_at(), TracedAt::Exit)
    }

    /// [`TracedAt::Entry`].
    pub const fn traced_at_entry_only(self) -> bool {
        matches!(self.traced_at(), TracedAt::Entry)
    }

    /// The kernel's name, as in `/sys/kernel/tracing/events/syscalls/sys_enter_<name>`.
    pub const fn name(self) -> &'static str {
        match self {
            Syscall::Openat => "openat",
            Syscall::Openat2 => "openat2",
            Syscall::Ftruncate => "ftruncate",
            Syscall::Fallocate => "fallocate",
            Syscall::Write => "write",
            Syscall::Mmap => "mmap",
            Syscall::Munmap => "munmap",
            Syscall::Close => "close",
            Syscall::Unlink => "unlink",
            Syscall::Unlinkat => "unlinkat",
            Syscall::MemfdCreate => "memfd_create",
            Syscall::Shmget => "shmget",
            Syscall::Shmat => "shmat",
            Syscall::Shmdt => "shmdt",
            Syscall::Shmctl => "shmctl",
            Syscall::Recvmsg => "recvmsg",
            Syscall::Statfs => "statfs",
            Syscall::Fstatfs => "fstatfs",
            Syscall::Open => "open",
        }
    }

    /// Whether the call opens a path (`open`, `openat`, `openat2`): the open family, whose
    /// records all hold `[dirfd, path, flags, mode, ...]` (`open`'s `dirfd` is `AT_FDCWD`,
    /// `openat2`'s `struct open_how` is unpacked into 2..=4) and return the new descriptor.
    pub const fn opens_a_path(self) -> bool {
        match self {
            open_family!() => true,
            Syscall::Ftruncate
            | Syscall::Fallocate
            | Syscall::Write
            | Syscall::Mmap
            | Syscall::Munmap
            | Syscall::Close
            | Syscall::Unlink
            | Syscall::Unlinkat
            | Syscall::MemfdCreate
            | Syscall::Shmget
            | Syscall::Shmat
            | Syscall::Shmdt
            | Syscall::Shmctl
            | Syscall::Recvmsg
            | Syscall::Statfs
            | Syscall::Fstatfs => false,
        }
    }

    /// Which of the record's arguments is a path, for the calls that name one: a record of
    /// such a call is a [`PathEvent`], whose `path` is read from that argument.
    /// `memfd_create`'s "path" is the name it gives the file.
    pub const fn path_arg(self) -> Option<usize> {
        match self {
            open_family!() | Syscall::Unlinkat => Some(1),
            Syscall::Unlink | Syscall::MemfdCreate | Syscall::Statfs => Some(0),
            Syscall::Ftruncate
            | Syscall::Fallocate
            | Syscall::Write
            | Syscall::Mmap
            | Syscall::Munmap
            | Syscall::Close
            | Syscall::Shmget
            | Syscall::Shmat
            | Syscall::Shmdt
            | Syscall::Shmctl
            | Syscall::Recvmsg
            | Syscall::Fstatfs => None,
        }
    }

    /// Which of the record's arguments is the directory descriptor its path is relative to
    /// (`AT_FDCWD` for the working directory), for the calls that take one; [`Self::path_arg`]
    /// follows it. `open`'s record has `AT_FDCWD` there, as the probes and the ptrace source
    /// put `open(path, ...)` in `openat`'s shape.
    pub const fn dirfd_arg(self) -> Option<usize> {
        // A path in the second argument is relative to the first: `*at` calls' shape.
        match self.path_arg() {
            Some(1) => Some(0),
            _ => None,
        }
    }

    /// Whether the call is on the data path: a use of what a process holds (writing,
    /// sizing, releasing), whose success says nothing new about why /dev/shm ran out. The
    /// probes drop these when they succeed in failures-only mode (`--failed`); calls that
    /// create, open, map or look are kept, since the diagnosis needs them to name what
    /// failed.
    pub const fn is_data_path(self) -> bool {
        match self {
            Syscall::Write
            | Syscall::Ftruncate
            | Syscall::Fallocate
            | Syscall::Close
            | Syscall::Munmap
            | Syscall::Shmdt
            | Syscall::Shmctl => true,
            Syscall::Openat
            | Syscall::Openat2
            | Syscall::Open
            | Syscall::Mmap
            | Syscall::Unlink
            | Syscall::Unlinkat
            | Syscall::MemfdCreate
            | Syscall::Shmget
            | Syscall::Shmat
            | Syscall::Recvmsg
            | Syscall::Statfs
            | Syscall::Fstatfs => false,
        }
    }
}

impl TryFrom<u16> for Syscall {
    type Error = u16;
    fn try_from(value: u16) -> Result<Self, u16> {
        for call in Syscall::ALL {
            if call as u16 == value {
                return Ok(call);
            }
        }
        Err(value)
    }
}

/// Bits of [`Header::flags`].
pub mod flags {
    /// The path did not fit in [`super::PATH_LEN`] bytes.
    pub const PATH_TRUNCATED: u16 = 1 << 0;
    /// [`super::SyscallEvent::file`] holds the inode the descriptor referred to.
    pub const FILE: u16 = 1 << 1;
    /// The path was relative to a directory on a /dev/shm file system. (A file opened by
    /// another path, a relative one or a container's /dev/shm through `/proc/PID/root`, is
    /// named whole instead, `/dev/shm/a/b`, as the probes read it from the file itself.)
    pub const RELATIVE_TO_SHM: u16 = 1 << 2;
    /// The command line did not fit in [`super::ARGS_LEN`] bytes.
    pub const ARGS_TRUNCATED: u16 = 1 << 3;
    /// The process was matched through its container (mount namespace or cgroup).
    pub const CONTAINER_MATCH: u16 = 1 << 4;
    /// In the kernel only: the call opened the /dev/shm directory itself, whose file system
    /// is learned and nothing is reported.
    pub const SHM_DIRECTORY: u16 = 1 << 5;
    /// In the kernel only: a call outside /dev/shm, reported only if it fails for want of file
    /// descriptors (EMFILE, ENFILE) or, for `recvmsg`, drops the descriptors sent to it.
    pub const FD_LIMIT_ONLY: u16 = 1 << 6;
    /// In the kernel only: the path could not be read at `sys_enter` (a probe cannot fault in
    /// a page not yet touched), so it is read and judged at `sys_exit`, after the call itself
    /// has brought the page in.
    pub const PATH_AT_EXIT: u16 = 1 << 7;
    /// The process was outside every followed container's mount namespace, while shmtrace
    /// waited for a container to start (`--wait`, a restart): userspace holds the record until
    /// it learns whether its namespace is the container's, so that the container's first
    /// processes are not missed.
    pub const HELD: u16 = 1 << 8;
    /// In the kernel only: a `recvmsg` of a process nothing follows yet, in host-wide mode:
    /// if it received a /dev/shm descriptor (SCM_RIGHTS, as PyTorch passes them), the process
    /// becomes followed, so that its calls on that descriptor are seen. Nothing is reported.
    pub const RECEIVES: u16 = 1 << 9;
    /// A signal's target has mapped a /dev/shm file (itself, or a parent before the fork), as
    /// the probes knew it: a SIGBUS the kernel raised in it is counted in `TALLIES`.
    pub const TARGET_MAPS_SHM: u16 = 1 << 10;
    /// An exit the probes count as a death of a full /dev/shm (`TallyKey::DEATH`): the process
    /// ended unsuccessfully after a call of its own on /dev/shm failed with ENOSPC or it took
    /// a SIGBUS in a /dev/shm mapping; or after a child of its did so, or after it looked at a
    /// /dev/shm's free space, and then not ended by SIGTERM, SIGINT or SIGHUP, nor by another
    /// process's SIGKILL (it was stopped on purpose).
    pub const SHM_DEATH: u16 = 1 << 11;
    /// The path was relative to a directory descriptor on a /dev/shm, whose inode number is
    /// in `args[`[`super::DIR_INODE_ARG`]`]`: userspace names the directory by it, even when
    /// the descriptor was moved with a call the probes do not trace (GNU fts's `fcntl`).
    pub const DIR_INODE: u16 = 1 << 12;
}

/// Where a record with [`flags::DIR_INODE`] holds its directory's inode number: a slot the
/// open family and `unlinkat` leave unused (openat2's `usize`, which nothing reads, gives way).
pub const DIR_INODE_ARG: usize = 5;

/// Who did what, and when. Starts every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct Header {
    /// An [`EventKind`].
    pub kind: u16,
    /// Bits from [`flags`].
    pub flags: u16,
    pub cpu: u32,
    /// `CLOCK_BOOTTIME`, nanoseconds.
    pub ts_ns: u64,
    /// Thread-group id (the pid users see), in the initial pid namespace.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Mount namespace inode number of the current task.
    pub mntns: u32,
    pub _pad: u32,
    /// cgroup v2 id of the current task (1 on hosts without a cgroup v2 hierarchy in use).
    pub cgroup_id: u64,
    /// Name of the current thread, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

/// The inode a file descriptor referred to, read when the call was made (or, for `openat`,
/// when it returned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct FileRef {
    /// The file system's `dev_t`, in the kernel's encoding (`major << 20 | minor`).
    pub dev: u32,
    /// `i_mode`: type and permission bits.
    pub mode: u32,
    pub ino: u64,
    /// `i_size` when the call returned.
    pub size: i64,
    /// `i_blocks` (512-byte units) when the call returned: the memory the object holds.
    pub blocks: u64,
}

/// A system call on a /dev/shm descriptor, or a System V shared memory call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct SyscallEvent {
    pub header: Header,
    /// A [`Syscall`].
    pub syscall: u16,
    pub _pad: u16,
    /// The descriptor the call acted on or returned, -1 when there is none.
    pub fd: i32,
    /// The raw return value: `-errno` on failure.
    pub ret: i64,
    /// The raw arguments, in the order of the call's prototype.
    pub args: [u64; 6],
    /// Valid when `header.flags` has [`flags::FILE`].
    pub file: FileRef,
}

/// A system call that names a path: `openat`, `openat2`, `unlink`, `unlinkat`, `memfd_create`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct PathEvent {
    pub call: SyscallEvent,
    /// NUL-terminated unless [`flags::PATH_TRUNCATED`] is set.
    pub path: [u8; PATH_LEN],
}

/// A signal generated for a traced task (`signal:signal_generate`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct SignalEvent {
    /// The sender: for a fault, the faulting task itself.
    pub header: Header,
    pub signo: i32,
    /// `si_code`, e.g. `BUS_ADRERR`.
    pub code: i32,
    pub errno: i32,
    /// The tracepoint's result: 0 delivered, 1 ignored, 2 already pending, ...
    pub result: i32,
    /// `si_addr` for faults (SIGBUS, SIGSEGV), 0 otherwise.
    pub addr: u64,
    pub target_pid: u32,
    pub target_tid: u32,
    pub target_comm: [u8; COMM_LEN],
}

/// A traced process created a new process (not a thread).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct ForkEvent {
    pub header: Header,
    pub child_pid: u32,
    pub _pad: u32,
}

/// A traced process ran a new program.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct ExecEvent {
    pub header: Header,
    /// Bytes of `args` in use: NUL-separated arguments.
    pub args_len: u32,
    pub _pad: u32,
    pub filename: [u8; PATH_LEN],
    pub args: [u8; ARGS_LEN],
}

/// A traced process's thread-group leader exited.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct ExitEvent {
    pub header: Header,
    /// `task_struct.exit_code`, encoded like a wait status: `status << 8`, or the signal number
    /// (with 0x80 when it dumped core).
    pub exit_code: i32,
    pub _pad: u32,
}

/// A traced task changed its name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct RenameEvent {
    pub header: Header,
    pub target_pid: u32,
    pub target_tid: u32,
    pub new_comm: [u8; COMM_LEN],
}

/// The OOM killer chose a traced process (`oom:mark_victim`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "user",
    derive(
        zerocopy::FromBytes,
        zerocopy::IntoBytes,
        zerocopy::KnownLayout,
        zerocopy::Immutable
    )
)]
pub struct OomEvent {
    pub header: Header,
    pub victim_pid: u32,
    pub _pad: u32,
}
