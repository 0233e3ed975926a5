//! Decoded events: what the probes saw, in Rust types.
//!
//! `decode` turns raw ring buffer records into [`Event`]s, validating every length and enum
//! value. Strings from traced processes (names, paths, command lines) are escaped here, once,
//! so nothing downstream can print a hostile name raw.
mod decode;
pub mod escape;
mod lost;
pub mod names;

pub use decode::{decode, timestamp};
pub use lost::LostCounts;
pub use shmtrace_common::Syscall;

/// One thing a traced process did, or had done to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// `CLOCK_BOOTTIME` nanoseconds.
    pub ts_ns: u64,
    pub cpu: u32,
    /// Thread-group id (the process), in the host's pid namespace.
    pub pid: u32,
    pub tid: u32,
    /// Name of the acting thread, escaped.
    pub comm: String,
    /// Mount namespace inode number: identifies the container.
    pub mntns: u32,
    /// cgroup v2 id (1 on hybrid cgroup v1 hosts).
    pub cgroup_id: u64,
    /// The process was matched through its container rather than by pid.
    pub container_match: bool,
    pub body: Body,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Call(Call),
    Signal(Signal),
    Fork {
        child_pid: u32,
    },
    Exec(Exec),
    Exit(Exit),
    /// A task renamed itself (or was renamed): DataLoader workers become `pt_data_worker`.
    Rename {
        pid: u32,
        tid: u32,
        comm: String,
    },
    /// The OOM killer chose `victim_pid` (a thread id).
    Oom {
        victim_pid: u32,
    },
}

impl Event {
    /// A failed call, a fatal signal, an unsuccessful exit or an OOM kill: what `--failed`
    /// keeps, and what makes shmtrace measure /dev/shm before diagnosing it.
    ///
    /// Not failures: an error the program asked for (see [`Call::expected_error`]), and a
    /// signal one process sends another (a parent ending its children); the receiver's death
    /// is judged on its own.
    ///
    /// Judged from the event alone. The model has the last word on a call: an existence check
    /// that finds a name someone else removed is a failure (`World::is_failure` before the
    /// event is applied, `Annotation::is_failure` after). Without the model, ask
    /// [`Call::may_be_failure`].
    pub fn is_failure(&self) -> bool {
        match &self.body {
            Body::Call(call) => call.failed() && call.expected_error().is_none(),
            Body::Signal(signal) => {
                signal.addr != 0
                    || !(signal.sent_by_other(self.pid)
                        || (signal.signo == libc::SIGKILL && signal.target_pid != self.pid))
            }
            Body::Oom { .. } => true,
            Body::Exit(exit) => !exit.status.success(),
            Body::Fork { .. } | Body::Exec(_) | Body::Rename { .. } => false,
        }
    }
}

/// A system call on /dev/shm (or System V shared memory) and its result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub syscall: Syscall,
    /// The descriptor acted on, or returned by `openat`/`memfd_create`.
    pub fd: Option<i32>,
    /// Raw return value; negative values are `-errno`.
    pub ret: i64,
    /// Raw arguments in prototype order (`openat2`'s `open_how` unpacked into 2..=4).
    pub args: [u64; 6],
    /// The inode the descriptor referred to.
    pub file: Option<FileRef>,
    /// The path argument, escaped; relative paths are relative to a /dev/shm directory.
    pub path: Option<String>,
    pub path_truncated: bool,
    pub relative_to_shm: bool,
    /// For a path relative to a directory descriptor on a /dev/shm: the directory's inode
    /// number, as the probes read it behind the descriptor (absent in older traces).
    pub dir_ino: Option<u64>,
}

impl Call {
    /// A successful `unlink(path)`, for the tests that build event streams.
    #[cfg(test)]
    pub(crate) fn unlink(path: &str) -> Call {
        Call {
            syscall: Syscall::Unlink,
            fd: None,
            ret: 0,
            args: [0; 6],
            file: None,
            path: Some(path.to_owned()),
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        }
    }

    /// The errno, when the call failed.
    pub fn errno(&self) -> Option<i32> {
        (self.ret < 0 && self.ret >= -4095).then(|| (-self.ret) as i32)
    }

    /// An error, or a `recvmsg` that dropped the descriptors sent to it.
    pub fn failed(&self) -> bool {
        self.errno().is_some() || self.dropped_descriptors()
    }

    /// Why an error is part of the program's normal work rather than a failure, if it is:
    /// programs probe what the kernel supports, check whether a name exists, and retry
    /// with another name when one is taken. Judged from the call alone, so live and replayed
    /// traces agree.
    pub fn expected_error(&self) -> Option<&'static str> {
        let errno = self.errno()?;
        let flags = self.args[2];
        let creates = flags & libc::O_CREAT as u64 != 0;
        match (self.syscall, errno) {
            // Libraries ask for huge pages first and take ordinary ones when refused; one
            // that does not fall back is diagnosed for it (the pool, vm.nr_hugepages).
            _ if self.asks_for_huge_pages() => {
                Some("a huge-page request (programs fall back to ordinary pages)")
            }
            // Chromium calls memfd_create("", invalid flags) to learn what the kernel
            // supports; EINVAL only ever means bad flags or a bad name, never a lack of room.
            (Syscall::MemfdCreate, libc::EINVAL) => Some("a feature probe"),
            (open, libc::ENOENT) if open.opens_a_path() && !creates => Some("an existence check"),
            (open, libc::EEXIST) if open.opens_a_path() => {
                Some("a name already taken (programs retry with another)")
            }
            (Syscall::Unlink | Syscall::Unlinkat, libc::ENOENT) => Some("already removed"),
            // Asking a file's file system about a file that is gone (Open MPI checks each
            // segment's file system this way as it ends): a look, changing nothing.
            (Syscall::Statfs | Syscall::Fstatfs, libc::ENOENT) => Some("an existence check"),
            (Syscall::Shmget, libc::ENOENT) => Some("an existence check"),
            (Syscall::Shmget, libc::EEXIST) => Some("a key already taken"),
            _ => None,
        }
    }

    /// Whether the model may judge this call a failure: every error but those it never does.
    /// The errors [`Call::expected_error`] sets aside are the model's to take back only when
    /// they meet a name someone else removed: an ENOENT opening or unlinking a name. For what
    /// must act before the model has seen the call (reading a failing process's /proc at
    /// once), so that it misses none of the model's failures.
    pub fn may_be_failure(&self) -> bool {
        self.failed()
            && (self.expected_error().is_none()
                || (self.errno() == Some(libc::ENOENT)
                    && (self.syscall.opens_a_path()
                        || matches!(self.syscall, Syscall::Unlink | Syscall::Unlinkat))))
    }

    /// A `shmget` with `SHM_HUGETLB` or an `mmap` with `MAP_HUGETLB`: refused, it says
    /// nothing of /dev/shm or of System V limits, only of the huge page pool.
    pub fn asks_for_huge_pages(&self) -> bool {
        match self.syscall {
            Syscall::Shmget => self.args[2] & libc::SHM_HUGETLB as u64 != 0,
            Syscall::Mmap => self.args[3] & libc::MAP_HUGETLB as u64 != 0,
            _ => false,
        }
    }

    /// A `recvmsg` whose `MSG_CTRUNC` says passed descriptors were dropped: the receiver has
    /// no room for them (its file descriptor limit).
    pub fn dropped_descriptors(&self) -> bool {
        self.syscall == Syscall::Recvmsg && self.args[3] & libc::MSG_CTRUNC as u64 != 0
    }

    /// What a successful `statfs` or `fstatfs` of a /dev/shm file system answered.
    pub fn space_seen(&self) -> Option<SpaceSeen> {
        if !matches!(self.syscall, Syscall::Statfs | Syscall::Fstatfs) || self.ret != 0 {
            return None;
        }
        use shmtrace_common::statfs_args::{AVAILABLE, BLOCK_SIZE, BLOCKS, MAGIC};
        let block = self.args[BLOCK_SIZE];
        Some(SpaceSeen {
            size: self.args[BLOCKS].saturating_mul(block),
            free: self.args[AVAILABLE].saturating_mul(block),
            tmpfs: self.args[MAGIC] == TMPFS_MAGIC,
        })
    }

    /// The path as the user would write it: relative names get their /dev/shm directory.
    pub fn display_path(&self) -> Option<String> {
        let path = self.path.as_ref()?;
        if self.relative_to_shm && !path.starts_with('/') {
            Some(format!("/dev/shm/{path}"))
        } else {
            Some(path.clone())
        }
    }
}

/// `TMPFS_MAGIC` (linux/magic.h): `f_type` of a tmpfs.
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// What a program saw of a /dev/shm file system's space, asking with `statfs`: the figures
/// it decides from, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpaceSeen {
    pub size: u64,
    /// Free to an unprivileged writer (`f_bavail`), as `statvfs` users compute it.
    pub free: u64,
    /// Whether it is a tmpfs; /dev/shm that is a plain directory (`--ipc=none`) is not.
    pub tmpfs: bool,
}

/// An inode: which /dev/shm object a descriptor refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeId {
    /// `dev_t` in the kernel's encoding.
    pub dev: u32,
    pub ino: u64,
}

impl InodeId {
    /// `major:minor`, as /proc/PID/maps and mountinfo print it.
    pub fn dev_string(&self) -> String {
        // As `KernelDev`'s `Display` writes it, without `fmt`: every JSON event has one.
        let dev = shmtrace_common::KernelDev(self.dev);
        let mut text = String::with_capacity(12);
        text.push_str(itoa::Buffer::new().format(dev.major()));
        text.push(':');
        text.push_str(itoa::Buffer::new().format(dev.minor()));
        text
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileRef {
    pub inode: InodeId,
    pub mode: u32,
    /// `i_size` after the call.
    pub size: i64,
    /// Bytes of memory the object holds (`i_blocks * 512`) after the call.
    pub allocated: u64,
}

impl FileRef {
    /// A device node, FIFO or socket: none holds /dev/shm memory, so a call on one is no
    /// /dev/shm call. Probes that judged a file system by its device number reported one when
    /// the number had just been a /dev/shm's: a container's /dev, whose /dev/null a program
    /// writes its error to right after /dev/shm refused it (issue 37). Traces recorded by them
    /// still hold such calls. A mode the probes could not read (0) is not one.
    pub fn is_special(&self) -> bool {
        !matches!(self.mode & libc::S_IFMT, 0 | libc::S_IFREG | libc::S_IFDIR)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signal {
    pub signo: i32,
    /// `si_code`.
    pub code: i32,
    pub errno: i32,
    /// Whether it was delivered (0), ignored (1), already pending (2), ...
    pub result: i32,
    /// Fault address for SIGBUS/SIGSEGV.
    pub addr: u64,
    pub target_pid: u32,
    pub target_tid: u32,
    pub target_comm: String,
    /// The target had mapped /dev/shm, as the probes knew it (`flags::TARGET_MAPS_SHM`).
    pub target_maps_shm: bool,
}

impl Signal {
    /// Sent on purpose by another process with kill(2), tgkill(2) or sigqueue(3), as a parent
    /// ends its children at shutdown; not raised by the kernel (a fault, the OOM killer).
    pub fn sent_by_other(&self, sender_pid: u32) -> bool {
        const SI_USER: i32 = 0;
        const SI_QUEUE: i32 = -1;
        const SI_TKILL: i32 = -6;
        sender_pid != self.target_pid && matches!(self.code, SI_USER | SI_QUEUE | SI_TKILL)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exec {
    pub filename: String,
    pub argv: Vec<String>,
    pub argv_truncated: bool,
}

/// A process's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    pub status: ExitStatus,
    /// The probes counted it as a death of a full /dev/shm (`flags::SHM_DEATH` says when).
    pub shm_death: bool,
}

impl From<ExitStatus> for Exit {
    /// An end the probes did not count as a death of a full /dev/shm.
    fn from(status: ExitStatus) -> Exit {
        Exit {
            status,
            shm_death: false,
        }
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal { signo: i32, core_dumped: bool },
}

impl ExitStatus {
    /// From `task_struct.exit_code`, which is encoded like a wait status.
    pub fn from_raw(raw: i32) -> ExitStatus {
        let signo = raw & 0x7f;
        if signo == 0 {
            ExitStatus::Code((raw >> 8) & 0xff)
        } else {
            ExitStatus::Signal {
                signo,
                core_dumped: raw & 0x80 != 0,
            }
        }
    }

    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }

    /// `exited with status 1`, `killed by SIGBUS`.
    pub fn describe(self) -> String {
        match self {
            ExitStatus::Code(code) => format!("exited with status {code}"),
            ExitStatus::Signal { signo, .. } => format!("killed by {}", names::signal_name(signo)),
        }
    }

    /// The shell's `$?` for this status.
    pub fn shell_status(self) -> i32 {
        match self {
            ExitStatus::Code(code) => code,
            ExitStatus::Signal { signo, .. } => 128 + signo,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(syscall: Syscall, ret: i64, flags: u64) -> Call {
        Call {
            syscall,
            fd: None,
            ret,
            args: [0, 0, flags, 0, 0, 0],
            file: None,
            path: Some("/dev/shm/sem.x".into()),
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        }
    }

    #[test]
    fn a_device_reads_as_the_kernel_dev_type_prints_it() {
        for dev in [0, 27, 1 << 20, (259 << 20) | 3, u32::MAX] {
            let inode = InodeId { dev, ino: 1 };
            assert_eq!(
                inode.dev_string(),
                shmtrace_common::KernelDev(dev).to_string()
            );
        }
    }

    #[test]
    fn probes_checks_and_taken_names_are_expected_errors() {
        let einval = -i64::from(libc::EINVAL);
        let enoent = -i64::from(libc::ENOENT);
        let eexist = -i64::from(libc::EEXIST);
        let enospc = -i64::from(libc::ENOSPC);
        let creat = libc::O_CREAT as u64;
        assert_eq!(
            call(Syscall::MemfdCreate, einval, 0).expected_error(),
            Some("a feature probe")
        );
        assert_eq!(
            call(Syscall::Openat, enoent, 0).expected_error(),
            Some("an existence check")
        );
        // Creating in a /dev/shm that is not there is a failure.
        assert_eq!(call(Syscall::Openat, enoent, creat).expected_error(), None);
        assert!(
            call(Syscall::Openat, eexist, creat)
                .expected_error()
                .is_some()
        );
        assert!(call(Syscall::Unlink, enoent, 0).expected_error().is_some());
        assert_eq!(
            call(Syscall::Statfs, enoent, 0).expected_error(),
            Some("an existence check")
        );
        assert_eq!(call(Syscall::Fallocate, enospc, 0).expected_error(), None);
        assert_eq!(call(Syscall::Openat, 3, creat).expected_error(), None);
    }

    #[test]
    fn a_kill_from_another_process_is_no_failure_but_a_fault_is() {
        let signal = |signo, code, addr| Event {
            ts_ns: 1,
            cpu: 0,
            pid: 10,
            tid: 10,
            comm: "parent".into(),
            mntns: 0,
            cgroup_id: 0,
            container_match: false,
            body: Body::Signal(Signal {
                signo,
                code,
                errno: 0,
                result: 0,
                addr,
                target_pid: 11,
                target_tid: 11,
                target_comm: "child".into(),
                target_maps_shm: false,
            }),
        };
        assert!(!signal(libc::SIGKILL, 0, 0).is_failure());
        assert!(!signal(libc::SIGKILL, 0x80, 0).is_failure());
        assert!(signal(libc::SIGBUS, 2, 0x7f00_0000).is_failure());
    }
}
