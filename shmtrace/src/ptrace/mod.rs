//! The second source of records, for users who may not load eBPF programs: ptrace, with
//! seccomp filters that stop the traced program only at the calls that matter. It makes the
//! records the probes make (`shmtrace-common`), so that everything after the source, from
//! decoding to the diagnosis, trace files and reports, is the same. docs/unprivileged.md says
//! what it sees and what it does not.
//!
//! `filter` writes the seccomp filters and `inject` adds one to a running process; `spawn`
//! starts the command, `attach` follows processes already running; `tracer` answers every stop (signals, job control, new processes and
//! threads, exits) and `calls` turns the stops that matter into records (`records`), a call
//! awaiting its exit being `pending`; `memory`
//! reads the traced program's memory, `wait` classifies stops, `arch` holds what differs
//! between x86-64 and arm64, `oom` tells the OOM killer's kills, and `feed` hands it all to
//! the session.
mod arch;
mod attach;
mod calls;
mod feed;
mod filter;
mod inject;
mod memory;
mod oom;
mod pending;
mod records;
mod spawn;
mod tracer;
mod wait;

use std::{ffi::OsString, fs, sync::mpsc, thread};

use anyhow::{Context, Result};
use nix::errno::Errno;

pub use feed::{Ended, Feed};
use tracer::{Mode, Tracer};
use wait::Stop;

/// What this mode does not see, for the line that says it is in use.
pub const BLIND_SPOTS: &str = "processes outside the traced tree (other containers sharing \
    /dev/shm are named only from /proc), System V and memfd objects' pages, calls made through \
    io_uring or by 32-bit programs, and the senders of SIGKILL";

/// Why the ptrace source cannot run here. Each message says what is wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum PtraceError {
    #[error(
        "ptrace is refused here ({errno}){why}; without ptrace and without root, `shmtrace \
         check` still reports what /dev/shm can hold"
    )]
    Refused { errno: Errno, why: String },
    #[error(
        "cannot install a seccomp filter in the traced command ({errno}): this kernel or the \
         container's security profile does not allow seccomp filters; without them, `shmtrace \
         check` still reports what /dev/shm can hold"
    )]
    NoFilter { errno: Errno },
    #[error("cannot trace pid {pid} with ptrace ({errno}): {why}")]
    Attach { pid: u32, errno: Errno, why: String },
}

impl PtraceError {
    fn refused(errno: Errno) -> PtraceError {
        PtraceError::Refused {
            errno,
            why: why_refused(),
        }
    }
}

/// What the kernel's ptrace rules here say about being refused.
fn why_refused() -> String {
    match fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        Some(3) => ": Yama's ptrace_scope is 3, which forbids ptrace to everyone".to_owned(),
        Some(2) => {
            ": Yama's ptrace_scope is 2, which allows ptrace only with CAP_SYS_PTRACE".to_owned()
        }
        _ => ": the container's seccomp profile may forbid ptrace (Docker's default allows it \
               on Linux 4.8 and newer)"
            .to_owned(),
    }
}

/// What is traced with ptrace, and the records it makes.
pub struct Traced {
    /// The command, when one was started.
    pub pid: u32,
    /// The processes attached while running (`--pid`).
    pub attached: Vec<u32>,
    pub feed: Feed,
}

/// Starts `argv` under ptrace, on a tracer thread of its own, and returns once it has
/// started its program (or failed to).
pub fn trace_command(argv: &[OsString]) -> Result<Traced> {
    let (sink, feed) = feed::channel();
    let (started_tx, started_rx) = mpsc::channel::<Result<u32>>();
    let argv = argv.to_vec();
    thread::Builder::new()
        .name("ptrace".to_owned())
        .spawn(move || {
            let mut tracer = Tracer::new(Mode::Seccomp, sink);
            match start(&mut tracer, &argv) {
                Ok(pid) => {
                    let _ = started_tx.send(Ok(pid as u32));
                    tracer.run();
                }
                Err(error) => {
                    let _ = started_tx.send(Err(error));
                    tracer.sink.end(None);
                }
            }
        })
        .context("starting the ptrace tracer thread")?;
    let pid = started_rx
        .recv()
        .context("the ptrace tracer thread ended before the command started")??;
    Ok(Traced {
        pid,
        attached: Vec::new(),
        feed,
    })
}

/// Attaches to the running processes `pids` (every thread of each), on a tracer thread of
/// its own. They stop at every call's entry and exit (`PTRACE_SYSCALL`), with no filter and
/// no other change to them, so that when shmtrace ends (the kernel detaches them then) they
/// run on as before. Returns those attached; fails, saying why, if none could be.
pub fn trace_pids(pids: &[u32]) -> Result<Traced> {
    let (sink, feed) = feed::channel();
    let (started_tx, started_rx) = mpsc::channel::<Result<Vec<u32>>>();
    let pids = pids.to_vec();
    thread::Builder::new()
        .name("ptrace".to_owned())
        .spawn(move || {
            let mut tracer = Tracer::new(Mode::EverySyscall, sink);
            match attach::attach(&mut tracer, &pids) {
                Ok(attached) => {
                    let _ = started_tx.send(Ok(attached));
                    tracer.run();
                }
                Err(error) => {
                    let _ = started_tx.send(Err(error));
                    tracer.sink.end(None);
                }
            }
        })
        .context("starting the ptrace tracer thread")?;
    let attached = started_rx
        .recv()
        .context("the ptrace tracer thread ended before it attached")??;
    Ok(Traced {
        pid: 0,
        attached,
        feed,
    })
}

/// Forks, attaches and lets the command go, then follows it to its exec: the first stops
/// are answered here, so that a command that cannot start is an error, not a trace.
fn start(tracer: &mut Tracer, argv: &[OsString]) -> Result<i32> {
    let spawned = spawn::spawn(argv).map_err(|error| match error.downcast::<PtraceError>() {
        Ok(PtraceError::Refused { errno, .. }) => PtraceError::refused(errno).into(),
        Ok(other) => other.into(),
        Err(error) => error,
    })?;
    let pid = spawned.pid;
    tracer.adopt(pid, pid);
    tracer.root = Some(pid);
    loop {
        match wait::wait_for(pid)? {
            Stop::Event(libc::PTRACE_EVENT_EXEC) => {
                tracer.executed(pid);
                tracer.resume(pid, 0);
                return Ok(pid);
            }
            Stop::Ended(status) => {
                tracer.threads.clear();
                return Err(
                    spawn::start_failure(&spawned.status, &argv[0]).unwrap_or_else(|| {
                        anyhow::anyhow!(
                            "the traced command ended before it started (status {status})"
                        )
                    }),
                );
            }
            Stop::Signal(signo) => {
                let _ = wait::resume(pid, libc::PTRACE_CONT, signo);
            }
            _ => {
                let _ = wait::resume(pid, libc::PTRACE_CONT, 0);
            }
        }
    }
}

/// Whether ptrace and seccomp filters can be used here: tried on a child that exits at once.
/// `Err` says why not.
pub fn usable() -> Result<(), PtraceError> {
    match fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        Some(scope @ (2 | 3)) if scope == 3 || !has_sys_ptrace() => {
            Err(PtraceError::refused(Errno::EPERM))
        }
        _ => Ok(()),
    }
}

fn has_sys_ptrace() -> bool {
    const CAP_SYS_PTRACE: u32 = 19;
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}
