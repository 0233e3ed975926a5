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
    Exit(ExitStatus),
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
    pub fn is_failure(&self) -> bool {
        match &self.body {
            Body::Call(call) => call.failed(),
            Body::Signal(_) | Body::Oom { .. } => true,
            Body::Exit(status) => !status.success(),
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
}

impl Call {
    /// The errno, when the call failed.
    pub fn errno(&self) -> Option<i32> {
        (self.ret < 0 && self.ret >= -4095).then(|| (-self.ret) as i32)
    }

    /// An error, or a `recvmsg` that dropped the descriptors sent to it.
    pub fn failed(&self) -> bool {
        self.errno().is_some() || self.dropped_descriptors()
    }

    /// A `recvmsg` whose `MSG_CTRUNC` says passed descriptors were dropped: the receiver has
    /// no room for them (its file descriptor limit).
    pub fn dropped_descriptors(&self) -> bool {
        self.syscall == Syscall::Recvmsg && self.args[3] & libc::MSG_CTRUNC as u64 != 0
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
        format!("{}:{}", self.dev >> 20, self.dev & 0xfffff)
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exec {
    pub filename: String,
    pub argv: Vec<String>,
    pub argv_truncated: bool,
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

    /// The shell's `$?` for this status.
    pub fn shell_status(self) -> i32 {
        match self {
            ExitStatus::Code(code) => code,
            ExitStatus::Signal { signo, .. } => 128 + signo,
        }
    }
}
