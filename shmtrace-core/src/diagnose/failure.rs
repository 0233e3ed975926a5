//! What went wrong, classified: each failed call, fault or OOM kill becomes a [`Failure`] with
//! a [`Cause`]. The syscall's return value decides, never a program's error text (PyTorch 2.10
//! and 2.11 print a stale errno).
use std::collections::HashMap;

use serde::Serialize;

use crate::event::{Body, Call, Event, Syscall, names};
use crate::model::{Annotation, ShmUsage};

use crate::capacity::Capacity;

/// Why it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Killed by the OOM killer: the memory limit, which /dev/shm pages count against.
    OomKill,
    /// There is no /dev/shm to create in (`docker run --ipc=none`, an image or sandbox
    /// without one): ENOENT creating a file in it.
    NoShm,
    /// /dev/shm is mounted read-only: EROFS.
    ReadOnly,
    /// Creating a file under /dev/shm failed because a directory on its path does not exist
    /// (`/dev/shm/app/x` without `/dev/shm/app`): /dev/shm itself is there.
    NoDirectory,
    /// A name the program attaches to was removed by another process while its owner still
    /// held it: ENOENT opening it.
    NameRemoved,
    /// /dev/shm is full of files of processes that are gone; without them the size would
    /// have been enough.
    Leftovers,
    /// /dev/shm holds as many files as it may (`nr_inodes`): ENOSPC creating one, however
    /// much room the files leave.
    InodesFull,
    /// /dev/shm is full: ENOSPC, or SIGBUS touching a page the tmpfs could not provide.
    ShmFull,
    /// mmap ENOMEM on a /dev/shm object: too many mappings (vm.max_map_count).
    MapLimit,
    /// EMFILE/ENFILE: out of file descriptors.
    FdLimit,
    /// Huge pages asked for (`SHM_HUGETLB`, `MAP_HUGETLB`) and none left in the pool
    /// (`vm.nr_hugepages`).
    HugePages,
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
    /// For an open of a name someone else removed: that removal.
    #[serde(skip)]
    pub removal: Option<crate::model::Removal>,
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
        use crate::units::human;
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
            // A refused huge-page request is held as a failure until the fallback that makes
            // it a probe (the diagnoser withdraws it then).
            if note.expected_error(call).is_some() && !call.asks_for_huge_pages() {
                return None;
            }
            let cause = match &note.name_removed {
                Some(_) => Cause::NameRemoved,
                None => call_cause(call, errno),
            };
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
    let path = call.display_path();
    let in_shm = path.as_deref().and_then(|p| p.strip_prefix("/dev/shm/"));
    let opens = call.syscall.opens_a_path();
    match (call.syscall, errno) {
        _ if call.asks_for_huge_pages() => Cause::HugePages,
        (Syscall::Shmget | Syscall::Shmat | Syscall::Shmctl, _) => Cause::SysvLimit,
        // Creating a file in a directory that does not exist: expected_error() already set
        // aside the opens that did not ask to create. In /dev/shm itself, /dev/shm is
        // missing; deeper, only the program's own directory is.
        (_, libc::ENOENT) if opens && in_shm.is_some_and(|name| name.contains('/')) => {
            Cause::NoDirectory
        }
        (_, libc::ENOENT) if opens && in_shm.is_some() => Cause::NoShm,
        (_, libc::EROFS) => Cause::ReadOnly,
        // Creating a file takes an inode and no page: a tmpfs refuses it only for want of
        // inodes (`nr_inodes`).
        (_, libc::ENOSPC) if opens && call.args[2] & libc::O_CREAT as u64 != 0 => Cause::InodesFull,
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

/// Failures alike, counted as one: the same call failing the same way on names of one kind
/// (`/dev/shm/torch_*`), or the same fault. A worker that fails each batch the same way shows
/// one line, not a thousand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureRun<'a> {
    /// The first of them (the decisive one, when the run comes first).
    pub first: &'a Failure,
    pub count: usize,
    pub last_ts_ns: u64,
    /// Their paths as one: the path when all are the same, else what they share and `*`.
    pub pattern: Option<String>,
}

/// `failures` in runs of like ones, each run where its first failure stands.
pub fn runs(failures: &[Failure]) -> Vec<FailureRun<'_>> {
    let mut runs: Vec<(FailureRun<'_>, Vec<&str>)> = Vec::new();
    // Each key's run, found at once: a process with thousands of unlike failures (a node
    // agent's diagnosis of a long-lived process at shutdown) made a scan of the runs for each
    // failure quadratic, minutes of CPU.
    let mut run_of: HashMap<RunKey<'_>, usize> = HashMap::new();
    for failure in failures {
        let key = run_key(failure);
        let path = failure.kind.path();
        match key.and_then(|key| run_of.get(&key).copied()) {
            Some(at) => {
                let (run, paths) = &mut runs[at];
                run.count += 1;
                run.last_ts_ns = run.last_ts_ns.max(failure.ts_ns);
                paths.extend(path);
            }
            None => {
                if let Some(key) = key {
                    run_of.insert(key, runs.len());
                }
                runs.push((
                    FailureRun {
                        first: failure,
                        count: 1,
                        last_ts_ns: failure.ts_ns,
                        pattern: None,
                    },
                    path.into_iter().collect(),
                ));
            }
        }
    }
    runs.into_iter()
        .map(|(mut run, paths)| {
            run.pattern = common_pattern(&paths);
            run
        })
        .collect()
}

/// What makes failures alike.
type RunKey<'a> = (&'static str, &'a str, Cause, Option<&'a str>);

/// `None` for a kind never run together (an OOM kill, a look).
fn run_key(failure: &Failure) -> Option<RunKey<'_>> {
    match &failure.kind {
        FailureKind::Call {
            syscall,
            errno,
            path,
            ..
        } => Some((syscall, errno, failure.cause, path.as_deref().map(stem))),
        FailureKind::Fault { signal, path, .. } => {
            Some(("fault", signal, failure.cause, path.as_deref().map(stem)))
        }
        FailureKind::OomKill | FailureKind::SpaceCheck { .. } => None,
    }
}

/// A name's kind: its directory and the start of its last component up to the first `_`, `.`
/// or `-` (`/dev/shm/torch_`, `/dev/shm/PostgreSQL.`, `/dev/shm/sem.`); the whole path when it
/// has none.
fn stem(path: &str) -> &str {
    let name_at = path.rfind('/').map_or(0, |slash| slash + 1);
    match path[name_at..].find(['_', '.', '-']) {
        Some(at) => &path[..name_at + at + 1],
        None => path,
    }
}

/// The paths as one pattern: the path when all are one, else their common start and `*`.
fn common_pattern(paths: &[&str]) -> Option<String> {
    let first = *paths.first()?;
    let mut common = first.len();
    for path in &paths[1..] {
        common = common.min(
            first
                .char_indices()
                .zip(path.chars())
                .find(|((_, a), b)| a != b)
                .map_or(first.len().min(path.len()), |((at, _), _)| at),
        );
    }
    if paths.iter().all(|p| *p == first) {
        Some(first.to_owned())
    } else {
        Some(format!("{}*", &first[..common]))
    }
}

impl FailureKind {
    /// The path it names, if any.
    pub fn path(&self) -> Option<&str> {
        match self {
            FailureKind::Call { path, .. } | FailureKind::Fault { path, .. } => path.as_deref(),
            FailureKind::SpaceCheck { path, .. } => path.as_deref(),
            FailureKind::OomKill => None,
        }
    }
}

#[cfg(test)]
mod run_tests {
    use super::*;

    fn enospc(ts_ns: u64, syscall: &'static str, path: &str) -> Failure {
        Failure {
            ts_ns,
            pid: 7,
            tid: 7,
            comm: "pt_data_worker".to_owned(),
            cause: Cause::InodesFull,
            kind: FailureKind::Call {
                syscall,
                errno: "ENOSPC".to_owned(),
                path: Some(path.to_owned()),
                request: 0,
            },
            dev: None,
            usage: None,
            capacity: None,
            workers_allocating: 0,
            unmet: 0,
            held: 0,
            peers: 0,
            leftovers: Vec::new(),
            others: Vec::new(),
            removal: None,
        }
    }

    #[test]
    fn like_failures_make_one_run_with_their_first_and_last() {
        let mut failures: Vec<Failure> = (0..209)
            .map(|n| {
                enospc(
                    1_000 + n,
                    "openat",
                    &format!("/dev/shm/torch_14_{}_{n}", 7 * n),
                )
            })
            .collect();
        failures.push(enospc(5_000, "fallocate", "/dev/shm/torch_14_9_9"));
        failures.push(enospc(6_000, "openat", "/dev/shm/sem.mp-x"));
        let runs = runs(&failures);
        assert_eq!(runs.len(), 3, "{runs:?}");
        assert_eq!(runs[0].count, 209);
        assert_eq!(runs[0].first.ts_ns, 1_000);
        assert_eq!(runs[0].last_ts_ns, 1_208);
        assert_eq!(runs[0].pattern.as_deref(), Some("/dev/shm/torch_14_*"));
        // Another call, or names of another kind, are runs of their own.
        assert_eq!(runs[1].count, 1);
        assert_eq!(runs[2].pattern.as_deref(), Some("/dev/shm/sem.mp-x"));
    }

    #[test]
    fn unlike_failures_interleaved_with_like_ones_keep_their_order_and_counts() {
        // Thousands of names of their own (a long-lived process's failures on another
        // program's files), each its own run, between the failures of one kind.
        let mut failures = Vec::new();
        for n in 0..20_000u64 {
            failures.push(enospc(n, "unlinkat", &format!("/dev/shm/a{n}")));
            failures.push(enospc(n, "openat", &format!("/dev/shm/torch_1_{n}")));
        }
        let runs = runs(&failures);
        assert_eq!(runs.len(), 20_001);
        assert_eq!(
            runs[1].count, 20_000,
            "the torch_ run, where its first stands"
        );
        assert_eq!(runs[1].first.ts_ns, 0);
        assert_eq!(runs[1].last_ts_ns, 19_999);
        assert_eq!(runs[0].pattern.as_deref(), Some("/dev/shm/a0"));
        assert_eq!(runs[20_000].pattern.as_deref(), Some("/dev/shm/a19999"));
    }
}
