//! The leak check: the BPF programs, maps and links one shmtrace process holds, and the proof
//! that every one of them is gone from the kernel once that process has ended, however it
//! ended (exit, Ctrl-C, SIGKILL).
//!
//! Other shmtrace processes may run at the same time (other tests, other checkouts on the same
//! machine), so a run's objects are told apart by the process that holds them: a thread reads
//! `/proc/PID/fdinfo/*` of that one process while it runs (`prog_id:`, `map_id:`, `link_id:`
//! lines), and whatever it saw must be unknown to the kernel afterwards.
use std::{
    collections::BTreeSet,
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// What kind of BPF object an id names; each kind has its own id space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Prog,
    Map,
    Link,
}

impl Kind {
    /// The `bpf(2)` command that opens an object of this kind by id.
    fn get_fd_by_id(self) -> libc::c_long {
        match self {
            Kind::Prog => 13, // BPF_PROG_GET_FD_BY_ID
            Kind::Map => 14,  // BPF_MAP_GET_FD_BY_ID
            Kind::Link => 30, // BPF_LINK_GET_FD_BY_ID
        }
    }

    fn fdinfo_key(self) -> &'static str {
        match self {
            Kind::Prog => "prog_id:",
            Kind::Map => "map_id:",
            Kind::Link => "link_id:",
        }
    }
}

/// One BPF object, by kind and kernel id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Object {
    pub kind: Kind,
    pub id: u32,
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Prog => "prog",
            Kind::Map => "map",
            Kind::Link => "link",
        };
        write!(f, "{kind} {}", self.id)
    }
}

/// The BPF objects process `pid` holds descriptors to now (none once it has exited).
pub fn held_by(pid: u32) -> BTreeSet<Object> {
    let mut held = BTreeSet::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return held;
    };
    for fd in fds.filter_map(Result::ok) {
        let Ok(info) = std::fs::read_to_string(fd.path()) else {
            continue;
        };
        for line in info.lines() {
            for kind in [Kind::Prog, Kind::Map, Kind::Link] {
                if let Some(id) = line.strip_prefix(kind.fdinfo_key())
                    && let Ok(id) = id.trim().parse()
                {
                    held.insert(Object { kind, id });
                }
            }
        }
    }
    held
}

/// Whether the kernel still knows the object: `bpf(BPF_*_GET_FD_BY_ID)` opens it, or fails
/// with ENOENT once it is freed.
pub fn exists(object: Object) -> bool {
    // The id fields of the by-id commands share offset 0 of `union bpf_attr`; `next_id` and
    // `open_flags` follow, left zero.
    let mut attr = [0u32; 4];
    attr[0] = object.id;
    // SAFETY: bpf(2) reads `size_of_val(&attr)` bytes from a live, initialised buffer.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            object.kind.get_fd_by_id(),
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd >= 0 {
        // SAFETY: the descriptor was just returned to us and is closed once.
        unsafe { libc::close(fd as libc::c_int) };
        return true;
    }
    let error = std::io::Error::last_os_error();
    assert_eq!(
        error.raw_os_error(),
        Some(libc::ENOENT),
        "cannot look up BPF {object} ({error}): the leak check needs root"
    );
    false
}

/// Every live process holding `object`, as `pid (comm)`: who to blame for a leak.
fn holders(object: Object) -> Vec<String> {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    processes
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| held_by(*pid).contains(&object))
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} ({})", comm.trim())
        })
        .collect()
}

/// The start time of `pid` (field 22 of /proc/PID/stat), which tells it from a later process
/// that reuses its pid; None once it is gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: count fields after its last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Fast while shmtrace loads its objects, slower once they have stayed the same a while.
const POLL_FAST: Duration = Duration::from_millis(10);
const POLL_SLOW: Duration = Duration::from_millis(200);
const SETTLED: Duration = Duration::from_secs(1);
/// The kernel frees a link's program after an RCU grace period: generous on a loaded machine,
/// and stretched in the kernel matrix's guests (`crate::scaled`), where releasing every
/// tracepoint took 15 to 32 s on the PREEMPT_RT kernel under emulation.
const RELEASE_LIMIT: Duration = Duration::from_secs(30);

/// Watches the BPF objects of one shmtrace process, and checks at the end that they are all
/// gone. Call [`assert_released`](Self::assert_released) once the process has been reaped;
/// dropping the guard without it checks too (unless the test is already failing).
pub struct OwnBpfObjects {
    pid: u32,
    seen: Arc<Mutex<BTreeSet<Object>>>,
    stop: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
}

impl OwnBpfObjects {
    /// Starts watching `pid`: every object it holds from now until it exits is recorded.
    pub fn watch(pid: u32) -> OwnBpfObjects {
        let seen = Arc::new(Mutex::new(held_by(pid)));
        let stop = Arc::new(AtomicBool::new(false));
        let born = start_time(pid);
        let watcher = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut last_change = Instant::now();
                while !stop.load(Ordering::Relaxed) && born.is_some() && start_time(pid) == born {
                    let now = held_by(pid);
                    {
                        let mut seen = seen.lock().unwrap();
                        let before = seen.len();
                        seen.extend(now);
                        if seen.len() != before {
                            last_change = Instant::now();
                        }
                    }
                    let settled = last_change.elapsed() > SETTLED;
                    std::thread::sleep(if settled { POLL_SLOW } else { POLL_FAST });
                }
            })
        };
        OwnBpfObjects {
            pid,
            seen,
            stop,
            watcher: Some(watcher),
        }
    }

    /// Records what the process holds right now (call it once shmtrace says it is tracing:
    /// then every object is loaded) and returns everything seen so far.
    pub fn snapshot(&self) -> BTreeSet<Object> {
        let mut seen = self.seen.lock().unwrap();
        seen.extend(held_by(self.pid));
        seen.clone()
    }

    /// Once the process has ended (and been reaped): waits until the kernel has freed every
    /// object it was seen holding, and fails naming those left and who holds them. Returns
    /// the objects that were checked.
    pub fn assert_released(mut self) -> BTreeSet<Object> {
        self.check(crate::scaled(RELEASE_LIMIT))
    }

    /// [`assert_released`](Self::assert_released) with a shorter wait, for the test that
    /// shows the check fails when it should.
    pub fn assert_released_within(mut self, limit: Duration) -> BTreeSet<Object> {
        self.check(limit)
    }

    fn check(&mut self, limit: Duration) -> BTreeSet<Object> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        let seen = self.seen.lock().unwrap().clone();
        let deadline = Instant::now() + limit;
        loop {
            let left: Vec<Object> = seen.iter().copied().filter(|o| exists(*o)).collect();
            if left.is_empty() {
                return seen;
            }
            if Instant::now() > deadline {
                let blame: Vec<String> = left
                    .iter()
                    .map(|o| format!("{o} held by {:?}", holders(*o)))
                    .collect();
                panic!(
                    "shmtrace (pid {}) ended, but {} of the {} BPF objects it held are still \
                     loaded {limit:?} later: {}",
                    self.pid,
                    left.len(),
                    seen.len(),
                    blame.join("; ")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for OwnBpfObjects {
    fn drop(&mut self) {
        if self.watcher.is_some() && !std::thread::panicking() {
            self.check(crate::scaled(RELEASE_LIMIT));
        }
        self.stop.store(true, Ordering::Relaxed);
    }
}
