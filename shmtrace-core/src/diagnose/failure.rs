//! What went wrong, classified: each failed call, fault or OOM kill becomes a [`Failure`] with
//! a [`Cause`]. The syscall's return value decides, never a program's error text (PyTorch 2.10
//! and 2.11 print a stale errno).
use serde::Serialize;

use crate::event::{Body, Call, Event, Syscall, names};
use crate::model::{Annotation, ShmUsage};

use crate::capacity::Capacity;

/// Why it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Killed by the OOM killer: the memory limit, which /dev/shm pages count against.
    OomKill,
    /// There is no /dev/shm to create in (`docker run --ipc=none`, an image or sandbox
    /// without one): ENOENT creating a file in it.
    NoShm,
    /// /dev/shm is mounted read-only: EROFS.
    ReadOnly,
    /// /dev/shm is full of files of processes that are gone; without them the size would
    /// have been enough.
    Leftovers,
    /// /dev/shm is full: ENOSPC, or SIGBUS touching a page the tmpfs could not provide.
    ShmFull,
    /// mmap ENOMEM on a /dev/shm object: too many mappings (vm.max_map_count).
    MapLimit,
    /// EMFILE/ENFILE: out of file descriptors.
    FdLimit,
    /// A System V limit: shmmax, shmall, shmmni.
    SysvLimit,
    /// A fatal signal unrelated to /dev/shm (a crash).
    Crash,
    /// Another error.
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FailureKind {
    /// A system call that returned an error.
    Call {
        syscall: &'static str,
        errno: String,
        path: Option<String>,
        /// Bytes the call asked for (fallocate/ftruncate length, write count, mmap length,
        /// shmget size).
        request: u64,
    },
    /// A fault signal (SIGBUS, SIGSEGV), with the file its address falls in.
    Fault {
        signal: String,
        code: String,
        addr: u64,
        path: Option<String>,
        offset: Option<u64>,
        file_size: Option<i64>,
    },
    OomKill,
    /// No call failed: the program looked at /dev/shm's free space (`statvfs`, `fstatvfs`)
    /// and then, by its own rule, refused or put its shared memory elsewhere.
    SpaceCheck {
        /// What it did: `Ray's 200.0 MiB object store went to /tmp/ray instead of /dev/shm`.
        decided: String,
        /// The path it asked about, when it named one (a descriptor of /dev/shm names none).
        path: Option<String>,
        /// The process that looked (Ray's driver looks for its raylet).
        looked_by: u32,
        size: u64,
        free: u64,
        /// The /dev/shm size it needs, when its rule is known.
        need: Option<u64>,
        /// How `need` follows from the rule.
        need_basis: Option<String>,
    },
}

/// One failure, with the state of /dev/shm at that moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub cause: Cause,
    #[serde(flatten)]
    pub kind: FailureKind,
    /// The /dev/shm file system concerned (`dev_t`), when known.
    #[serde(skip)]
    pub dev: Option<u32>,
    /// The traced objects on that file system at the failure.
    #[serde(skip)]
    pub usage: Option<ShmUsage>,
    /// Its size and use as last measured.
    #[serde(skip)]
    pub capacity: Option<Capacity>,
    /// DataLoader workers holding objects on it at the failure.
    #[serde(skip)]
    pub workers_allocating: u32,
    /// What the failing call asked for beyond what its object already counts for in
    /// `usage` (a fallocate after an ftruncate of the same size asks for nothing new).
    #[serde(skip)]
    pub unmet: u64,
    /// Pages the traced objects on that file system held at the failure, counting a mapped
    /// object by its size (pages written through a mapping show in no system call).
    #[serde(skip)]
    pub held: u64,
    /// Other live processes sharing an object on that file system with the failing one (a
    /// PostgreSQL leader and its parallel workers map one segment): they may ask at once.
    #[serde(skip)]
    pub peers: u32,
    /// Files on the same /dev/shm that processes now gone left behind, largest first.
    #[serde(skip)]
    pub leftovers: Vec<Leftover>,
    /// Files on it with pages that no traced process made or holds, as the machine showed
    /// them at the failure, with who holds them.
    #[serde(skip)]
    pub others: Vec<crate::model::HeldFile>,
}

/// A /dev/shm file still named and holding memory, whose creator is gone and which no traced
/// process has open or mapped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Leftover {
    pub path: String,
    pub bytes: u64,
    pub creator_pid: u32,
    pub creator_comm: String,
    /// How its creator ended: `killed by SIGKILL`, `exited with status 1`.
    pub creator_ending: String,
}

impl Failure {
    /// One line: `fallocate of 96.0 MiB on /dev/shm/torch_1_2_0 returned ENOSPC`.
    pub fn headline(&self) -> String {
        self.kind.headline()
    }
}

impl FailureKind {
    /// One line, as [`Failure::headline`]; also the label of a failure in the report pictures.
    pub fn headline(&self) -> String {
        use crate::size::human;
        match self {
            FailureKind::Call {
                syscall,
                errno,
                path,
                request,
            } => {
                let size = if *request > 0 {
                    format!(" of {}", human(*request))
                } else {
                    String::new()
                };
                let on = path
                    .as_ref()
                    .map(|p| format!(" on {p}"))
                    .unwrap_or_default();
                if *syscall == "recvmsg" {
                    format!("recvmsg dropped the descriptors sent to it ({errno})")
                } else {
                    format!("{syscall}{size}{on} returned {errno}")
                }
            }
            FailureKind::Fault {
                signal,
                code,
                addr,
                path,
                offset,
                file_size,
            } => match (path, offset) {
                (Some(path), Some(offset)) => {
                    let of = file_size
                        .filter(|s| *s >= 0)
                        .map(|s| format!(" of {}", human(s as u64)))
                        .unwrap_or_default();
                    format!(
                        "{signal} ({code}) writing {path} at offset {}{of} (address {addr:#x})",
                        human(*offset)
                    )
                }
                _ => {
                    format!("{signal} ({code}) at address {addr:#x}, outside any /dev/shm mapping")
                }
            },
            FailureKind::OomKill => "chosen by the OOM killer".to_owned(),
            FailureKind::SpaceCheck {
                decided,
                path,
                looked_by,
                size,
                free,
                ..
            } => format!(
                "{decided}: pid {looked_by} saw {} free of {} on {}",
                human(*free),
                human(*size),
                path.as_deref().unwrap_or("/dev/shm")
            ),
        }
    }
}

/// Classifies an event as a failure, if it is one. `None` for successes and for events that
/// only repeat a failure already seen (the re-raised SIGBUS of a worker's handler).
pub fn classify(
    event: &Event,
    note: &Annotation,
) -> Option<(u32, Cause, FailureKind, Option<u32>)> {
    match &event.body {
        Body::Call(call) if call.dropped_descriptors() => Some((
            event.pid,
            Cause::FdLimit,
            FailureKind::Call {
                syscall: call.syscall.name(),
                errno: names::msg_flags(call.args[3]),
                path: None,
                request: 0,
            },
            None,
        )),
        Body::Call(call) => {
            let errno = call.errno()?;
            if call.expected_error().is_some() {
                return None;
            }
            let cause = call_cause(call, errno);
            let kind = FailureKind::Call {
                syscall: call.syscall.name(),
                errno: names::errno_name(errno),
                path: note
                    .object_path
                    .as_deref()
                    .map(str::to_owned)
                    .or_else(|| call.display_path()),
                request: request_bytes(call),
            };
            Some((event.pid, cause, kind, call.file.map(|f| f.inode.dev)))
        }
        Body::Signal(signal) => {
            let fault = signal.signo == libc::SIGBUS || signal.signo == libc::SIGSEGV;
            // Only the fault itself: kill/tgkill (a handler re-raising it) carry no address.
            if !fault || signal.addr == 0 {
                return None;
            }
            let site = note.fault.as_ref();
            let cause = if signal.signo == libc::SIGBUS && site.is_some() {
                Cause::ShmFull
            } else {
                Cause::Crash
            };
            let kind = FailureKind::Fault {
                signal: names::signal_name(signal.signo),
                code: names::si_code_name(signal.signo, signal.code),
                addr: signal.addr,
                path: site.map(|s| s.path.clone()),
                offset: site.map(|s| s.file_offset),
                file_size: site.map(|s| s.file_size),
            };
            Some((signal.target_pid, cause, kind, site.map(|s| s.inode.dev)))
        }
        Body::Oom { victim_pid } => Some((*victim_pid, Cause::OomKill, FailureKind::OomKill, None)),
        _ => None,
    }
}

fn call_cause(call: &Call, errno: i32) -> Cause {
    let in_shm = call
        .display_path()
        .is_some_and(|p| p.starts_with("/dev/shm/"));
    match (call.syscall, errno) {
        (Syscall::Shmget | Syscall::Shmat | Syscall::Shmctl, _) => Cause::SysvLimit,
        // Creating a file in a directory that does not exist: expected_error() already set
        // aside the opens that did not ask to create.
        (open, libc::ENOENT) if open.opens_a_path() && in_shm => Cause::NoShm,
        (_, libc::EROFS) => Cause::ReadOnly,
        (_, libc::ENOSPC) => Cause::ShmFull,
        (Syscall::Mmap, libc::ENOMEM) => Cause::MapLimit,
        (_, libc::EMFILE | libc::ENFILE) => Cause::FdLimit,
        _ => Cause::Other,
    }
}

fn request_bytes(call: &Call) -> u64 {
    let a = &call.args;
    match call.syscall {
        Syscall::Ftruncate => a[1],
        Syscall::Fallocate => a[3],
        Syscall::Write => a[2],
        Syscall::Mmap => a[1],
        Syscall::Shmget => a[1],
        _ => 0,
    }
}

/// The kernel's answer bounds it too. ENOSPC from a write or fallocate of `n` bytes means
/// fewer pages were free than the call needed, and `n` bytes span at most
/// `ceil((n - 1) / page) + 1` pages (the offset is not known); a SIGBUS inside a /dev/shm file
/// means not one page was free. Pages dirtied through a mapping show in no system call, so
/// this is what keeps a diagnosis from saying 43% used at ENOSPC when the use was measured
/// after the processes freed their memory.
pub(super) fn at_least_refused(
    mut capacity: Capacity,
    cause: Cause,
    kind: &FailureKind,
) -> Capacity {
    const PAGE: u64 = 4096; // tmpfs allocates pages; larger pages only make this bound weaker
    if cause != Cause::ShmFull {
        return capacity;
    }
    let free_below = match kind {
        FailureKind::Call {
            syscall: "write" | "fallocate",
            request,
            ..
        } => ((*request).max(1) - 1).div_ceil(PAGE) + 1,
        FailureKind::Fault {
            offset: Some(offset),
            file_size: Some(size),
            ..
        } if (*offset as i64) < *size => 1,
        _ => return capacity,
    };
    let floor = capacity.size.saturating_sub((free_below - 1) * PAGE);
    capacity.used = capacity.used.max(floor);
    capacity
}
