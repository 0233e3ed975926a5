//! The tracer thread: waits for every traced thread's stops and answers each, so that the
//! traced program behaves as it would untraced, while `calls` turns the stops that matter into
//! records.
//!
//! - A signal is delivered as the program would have received it; a stop signal puts the
//!   thread in its group stop and it stays there (`PTRACE_LISTEN`) until continued, so job
//!   control works; a thread's exit is reported as the probes report one.
//! - New processes and threads are followed from their first instruction (the fork events);
//!   a child's first stop that comes before its parent's fork event waits for it.
//! - With a command, the command's exit is reported at once; tracing goes on until every
//!   process of its tree has exited, since one left with the filter and no tracer would have
//!   its traced calls fail.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    ffi::CString,
    fs,
    os::unix::fs::MetadataExt,
};

use shmtrace_common::{COMM_LEN, FileRef};

use super::{
    feed::Sink,
    memory::Mem,
    records::{self, Who},
    wait::{self, Stop},
};
use crate::kernel_ids;
use shmtrace_core::{clock::boot_ns, event::ExitStatus};

/// How the traced threads stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// At the calls the seccomp filters pick (a command shmtrace started).
    Seccomp,
    /// At every call's entry and exit (`PTRACE_SYSCALL`): processes attached while running,
    /// which must be left as they were when shmtrace detaches.
    EverySyscall,
}

/// A traced thread.
pub(super) struct Thread {
    pub tgid: i32,
    pub comm: [u8; COMM_LEN],
    /// The call whose exit is awaited.
    pub pending: Option<super::pending::Pending>,
}

/// A traced process (thread group).
#[derive(Clone, Default)]
pub(super) struct Process {
    pub mntns: u32,
    pub parent: Option<i32>,
    /// Descriptor numbers whose calls stop the process: those of /dev/shm objects it has
    /// had (in [`Mode::Seccomp`], each has its filter).
    pub armed: BTreeSet<i32>,
    /// Instructions of the filters added to its chain so far.
    pub chain: usize,
    /// Whether its `munmap`s stop it.
    pub munmap_armed: bool,
    /// Its mappings of /dev/shm objects: `(start, length)`.
    pub mappings: Vec<(u64, u64)>,
    /// `RLIMIT_NOFILE`'s soft limit, once asked, and the highest descriptor seen.
    pub nofile: Option<u64>,
    /// `RLIMIT_FSIZE`'s soft limit, once asked.
    pub fsize: Option<u64>,
    pub highest_fd: i32,
    /// What `flags::SHM_DEATH` is decided by (see `shmtrace-ebpf`'s `tally.rs`).
    pub failed_own: bool,
    pub failed_child: bool,
    pub looked: bool,
    /// Its memory, where calls' arguments point.
    pub mem: Mem,
}

/// What was counted that no record shows.
#[derive(Default)]
pub(super) struct Counts {
    /// Paths that could not be read from the traced process.
    pub path_reads: u64,
    /// /dev/shm descriptors whose calls could not be made to stop the process.
    pub unwatched: u64,
}

pub(super) struct Tracer {
    pub mode: Mode,
    pub sink: Sink,
    pub threads: HashMap<i32, Thread>,
    pub processes: HashMap<i32, Process>,
    /// The /dev/shm file systems (kernel `dev_t`), as shmtrace and its tracees have met them.
    pub shm_devs: HashSet<u32>,
    /// The command, when shmtrace started one.
    pub root: Option<i32>,
    /// Threads whose first stop came before the fork event that announces them.
    parked: HashSet<i32>,
    pub cgroup_id: u64,
    pub counts: Counts,
    /// The cgroup's count of OOM kills, when readable.
    oom: Option<super::oom::OomKills>,
}

impl Tracer {
    pub fn new(mode: Mode, sink: Sink) -> Tracer {
        let mut shm_devs = HashSet::new();
        if let Ok(meta) = fs::metadata("/dev/shm") {
            shm_devs.insert(kernel_ids::kernel_dev_from_stat(meta.dev()));
        }
        Tracer {
            mode,
            sink,
            threads: HashMap::new(),
            processes: HashMap::new(),
            shm_devs,
            root: None,
            parked: HashSet::new(),
            cgroup_id: super::oom::cgroup_id(),
            counts: Counts::default(),
            oom: super::oom::OomKills::open(),
        }
    }

    /// Starts following `tid`, a thread of process `tgid`.
    pub fn adopt(&mut self, tid: i32, tgid: i32) {
        let comm = read_comm(tid);
        if tid == tgid && !self.processes.contains_key(&tgid) {
            let process = Process {
                mntns: kernel_ids::mount_namespace(tgid as u32).unwrap_or(0),
                mem: Mem::new(tgid),
                ..Process::default()
            };
            self.processes.insert(tgid, process);
        }
        self.threads.insert(
            tid,
            Thread {
                tgid,
                comm,
                pending: None,
            },
        );
    }

    /// Who thread `tid` is, for a record.
    pub fn who(&self, tid: i32) -> Who {
        let thread = self.threads.get(&tid);
        let tgid = thread.map_or(tid, |t| t.tgid);
        Who {
            tgid: tgid as u32,
            tid: tid as u32,
            mntns: self.processes.get(&tgid).map_or(0, |p| p.mntns),
            cgroup_id: self.cgroup_id,
            comm: thread.map_or([0; COMM_LEN], |t| t.comm),
        }
    }

    /// The memory of `tid`'s process.
    pub fn mem(&mut self, tid: i32) -> &mut Mem {
        let tgid = self.threads.get(&tid).map_or(tid, |t| t.tgid);
        &mut self
            .processes
            .entry(tgid)
            .or_insert_with(|| Process {
                mem: Mem::new(tgid),
                ..Process::default()
            })
            .mem
    }

    pub fn process_of(&mut self, tid: i32) -> Option<&mut Process> {
        let tgid = self.threads.get(&tid)?.tgid;
        self.processes.get_mut(&tgid)
    }

    /// Runs until every traced thread is gone. (Processes attached while running are let go
    /// by the kernel when shmtrace ends before them.)
    pub fn run(mut self) {
        let error = loop {
            let (tid, status) = match wait::wait_any() {
                Ok(report) => report,
                Err(error) if error.raw_os_error() == Some(libc::ECHILD) => break None,
                Err(error) => break Some(format!("waiting for traced processes: {error}")),
            };
            self.on_stop(tid, wait::classify(status));
        };
        if self.counts.unwatched > 0 {
            self.sink.notice(format!(
                "{} /dev/shm descriptors could not be watched (their calls are not shown)",
                self.counts.unwatched
            ));
        }
        if self.counts.path_reads > 0 {
            self.sink.notice(format!(
                "{} paths could not be read from the traced processes (their calls are not \
                 shown)",
                self.counts.path_reads
            ));
        }
        self.sink.end(error);
    }

    fn on_stop(&mut self, tid: i32, stop: Stop) {
        if let Stop::Ended(status) = stop {
            self.ended(tid, status);
            return;
        }
        if !self.threads.contains_key(&tid) {
            // A new task's first stop, before its parent's fork event: it waits for it.
            self.parked.insert(tid);
            return;
        }
        let signal = match stop {
            Stop::Seccomp | Stop::Syscall => {
                self.on_call(tid);
                0
            }
            Stop::Event(event) => {
                self.on_event(tid, event);
                0
            }
            Stop::JobControl => {
                // Stays stopped until continued, as untraced; a SIGCONT already on its way
                // would find it stopped by its own stop signal after the fact, so it goes on.
                if !sigcont_pending(tid) {
                    let _ = wait::listen(tid);
                    return;
                }
                0
            }
            Stop::Interrupt => 0,
            Stop::Signal(signo) => {
                self.on_signal(tid, signo);
                signo
            }
            Stop::Ended(_) => unreachable!("handled above"),
        };
        self.resume(tid, signal);
    }

    /// Lets `tid` go on, to its awaited call's exit or its next stop.
    pub fn resume(&mut self, tid: i32, signal: i32) {
        let wants_exit = self.threads.get(&tid).is_some_and(|t| t.pending.is_some());
        let request = if wants_exit || self.mode == Mode::EverySyscall {
            libc::PTRACE_SYSCALL
        } else {
            libc::PTRACE_CONT
        };
        // ESRCH: it was killed meanwhile; its end is reported next.
        let _ = wait::resume(tid, request, signal);
    }

    fn on_call(&mut self, tid: i32) {
        match wait::call_info(tid) {
            Ok(wait::CallInfo::Entry { nr, args }) => self.call_entry(tid, nr, args),
            Ok(wait::CallInfo::Exit { ret, is_error }) => self.call_exit(tid, ret, is_error),
            Ok(wait::CallInfo::None) | Err(_) => {}
        }
    }

    fn on_event(&mut self, tid: i32, event: i32) {
        match event {
            libc::PTRACE_EVENT_FORK | libc::PTRACE_EVENT_VFORK | libc::PTRACE_EVENT_CLONE => {
                if let Ok(new) = wait::event_message(tid) {
                    self.forked(tid, new as i32);
                }
            }
            libc::PTRACE_EVENT_EXEC => self.executed(tid),
            _ => {}
        }
    }

    /// `parent` made task `new`: a thread of its own, or a process that inherits its
    /// filters, descriptors and mappings.
    fn forked(&mut self, parent: i32, new: i32) {
        let tgid = thread_group_of(new).unwrap_or(new);
        let parent_tgid = self.threads.get(&parent).map_or(parent, |t| t.tgid);
        let comm = self.threads.get(&parent).map_or([0; COMM_LEN], |t| t.comm);
        if tgid == parent_tgid {
            self.threads.insert(
                new,
                Thread {
                    tgid,
                    comm,
                    pending: None,
                },
            );
        } else {
            let mut process = self
                .processes
                .get(&parent_tgid)
                .cloned()
                .unwrap_or_default();
            process.parent = Some(parent_tgid);
            process.mem.reset(new);
            process.failed_own = false;
            process.failed_child = false;
            process.looked = false;
            self.processes.insert(new, process);
            self.threads.insert(
                new,
                Thread {
                    tgid: new,
                    comm,
                    pending: None,
                },
            );
            let ts = boot_ns().unwrap_or(0);
            let record = records::fork(&self.who(parent), new as u32, ts);
            self.sink.record(record, false);
        }
        // Its first stop came already: it was waiting for this.
        if self.parked.remove(&new) {
            self.resume(new, 0);
        }
    }

    /// `tid` ran a new program; if it was not its process's leader, it has taken the
    /// leader's id.
    pub(super) fn executed(&mut self, tid: i32) {
        let former = wait::event_message(tid).map_or(tid, |former| former as i32);
        if former != tid
            && let Some(thread) = self.threads.remove(&former)
        {
            self.threads.insert(tid, thread);
        }
        let comm = read_comm(tid);
        if let Some(thread) = self.threads.get_mut(&tid) {
            thread.comm = comm;
            thread.pending = None;
        }
        if let Some(process) = self.process_of(tid) {
            // The old program's mappings are gone; its filters are not (they stay, as does
            // its use of them: a number that was /dev/shm's may be again).
            process.mappings.clear();
            process.mem.reset(tid);
            process.mntns = kernel_ids::mount_namespace(tid as u32).unwrap_or(process.mntns);
        }
        let filename = fs::read_link(format!("/proc/{tid}/exe"))
            .map(|p| p.into_os_string().into_encoded_bytes())
            .unwrap_or_default();
        let mut argv = fs::read(format!("/proc/{tid}/cmdline")).unwrap_or_default();
        argv.truncate(shmtrace_common::ARGS_LEN + 1);
        let ts = boot_ns().unwrap_or(0);
        let record = records::exec(&self.who(tid), &filename, &argv, ts);
        self.sink.record(record, true);
    }

    fn on_signal(&mut self, tid: i32, signo: i32) {
        if signo != libc::SIGBUS && signo != libc::SIGSEGV {
            return;
        }
        let Ok(info) = wait::signal_info(tid) else {
            return;
        };
        let addr = fault_address(&info);
        let target = self.who(tid);
        // A fault's sender is the faulting thread; a signal sent with kill or tkill names its
        // sender.
        let sender = if info.si_code <= 0 {
            // SAFETY: si_pid is valid for signals sent by a process (SI_USER, SI_TKILL).
            let pid = unsafe { info.si_pid() };
            if pid > 0 {
                self.who_outside(pid)
            } else {
                target
            }
        } else {
            target
        };
        let maps_shm = self
            .process_of(tid)
            .is_some_and(|process| !process.mappings.is_empty());
        if signo == libc::SIGBUS
            && info.si_code == BUS_ADRERR
            && maps_shm
            && let Some(process) = self.process_of(tid)
        {
            process.failed_own = true;
        }
        let signal = records::Signal {
            signo,
            code: info.si_code,
            errno: info.si_errno,
            addr,
            target_maps_shm: maps_shm,
        };
        let ts = boot_ns().unwrap_or(0);
        let record = signal.record(&sender, &target, ts);
        self.sink.record(record, true);
    }

    /// Who process `pid` is, traced or not (the sender of a signal).
    fn who_outside(&self, pid: i32) -> Who {
        if self.threads.contains_key(&pid) {
            return self.who(pid);
        }
        Who {
            tgid: pid as u32,
            tid: pid as u32,
            mntns: kernel_ids::mount_namespace(pid as u32).unwrap_or(0),
            cgroup_id: self.cgroup_id,
            comm: read_comm(pid),
        }
    }

    /// Thread `tid` ended with wait status `status`; with its process's leader, the process.
    pub(super) fn ended(&mut self, tid: i32, status: i32) {
        self.parked.remove(&tid);
        let Some(thread) = self.threads.remove(&tid) else {
            return;
        };
        if thread.tgid != tid {
            return;
        }
        let who = Who {
            comm: thread.comm,
            ..self.who(tid)
        };
        let process = self.processes.remove(&tid).unwrap_or_default();
        let ts = boot_ns().unwrap_or(0);
        if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL {
            self.oom_kill(&who, ts);
        }
        let shm_death = self.shm_death(&process, status);
        self.sink
            .record(records::exit(&who, status, shm_death, ts), true);
        if Some(tid) == self.root {
            self.sink.command_exited(ExitStatus::from_raw(status));
        }
    }

    /// A SIGKILL that the cgroup's count of OOM kills went up with is the OOM killer's: its
    /// record comes before the exit, as the probes' does.
    fn oom_kill(&mut self, victim: &Who, ts: u64) {
        if let Some(oom) = &mut self.oom
            && oom.rose()
        {
            self.sink.record(records::oom(victim, ts), true);
        }
    }

    /// The rule of `flags::SHM_DEATH`: an unsuccessful end after a /dev/shm failure of its
    /// own, or of a child of its, or after a look at the free space, unless it was stopped
    /// on purpose. The parent is told when this one failed.
    fn shm_death(&mut self, process: &Process, status: i32) -> bool {
        let signal = status & 0x7f;
        let stopped = matches!(signal, libc::SIGHUP | libc::SIGINT | libc::SIGTERM);
        let marked = process.failed_own || process.failed_child || process.looked;
        let died = marked && status != 0 && (process.failed_own || !stopped);
        if (process.failed_own || (died && process.looked))
            && let Some(parent) = process.parent.and_then(|p| self.processes.get_mut(&p))
        {
            parent.failed_child = true;
        }
        died
    }
}

/// The address a fault signal carries; 0 for a signal a process sent (kill, tkill, sigqueue:
/// `si_code` ≤ 0) or the kernel sent otherwise (`SI_KERNEL`), whose `siginfo` holds the
/// sender's pid and uid where a fault's address would be, as the probes read it
/// (`siginfo_fault` in shmtrace-ebpf). A PyTorch worker's handler re-raises its SIGBUS with
/// tgkill: that is no second fault.
fn fault_address(info: &libc::siginfo_t) -> u64 {
    const SI_KERNEL: i32 = 0x80;
    if info.si_code <= 0 || info.si_code >= SI_KERNEL {
        return 0;
    }
    // SAFETY: si_addr is the field a fault's siginfo (positive si_code below SI_KERNEL)
    // holds.
    unsafe { info.si_addr() as u64 }
}

/// `BUS_ADRERR`: an access the file cannot back (past its end, or a page a full tmpfs could
/// not allocate).
const BUS_ADRERR: i32 = 2;

/// The thread's name, NUL-padded.
pub(super) fn read_comm(tid: i32) -> [u8; COMM_LEN] {
    let mut comm = [0u8; COMM_LEN];
    if let Ok(text) = fs::read(format!("/proc/{tid}/comm")) {
        let text = text.strip_suffix(b"\n").unwrap_or(&text);
        let n = text.len().min(COMM_LEN - 1);
        comm[..n].copy_from_slice(&text[..n]);
    }
    comm
}

/// The thread group of task `tid`, from /proc.
fn thread_group_of(tid: i32) -> Option<i32> {
    let status = fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|value| value.trim().parse().ok())
}

/// Whether a SIGCONT waits for the thread's process.
fn sigcont_pending(tid: i32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{tid}/status")) else {
        return false;
    };
    let bit = 1u64 << (libc::SIGCONT - 1);
    status
        .lines()
        .filter_map(|line| {
            line.strip_prefix("ShdPnd:")
                .or_else(|| line.strip_prefix("SigPnd:"))
        })
        .filter_map(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .any(|mask| mask & bit != 0)
}

/// The inode behind descriptor `fd` of thread `tid`, as a record carries it, when it is a
/// regular file.
pub(super) fn file_of(tid: i32, fd: i32) -> Option<FileRef> {
    stat_fd(tid, fd).map(|(file, _)| file)
}

/// The file behind descriptor `fd` of thread `tid`, when it is a regular file, and its
/// `statx` attributes (`STATX_ATTR_APPEND`, `STATX_ATTR_IMMUTABLE`...): one `statx`.
pub(super) fn stat_fd(tid: i32, fd: i32) -> Option<(FileRef, u64)> {
    if fd < 0 {
        return None;
    }
    let path = CString::new(format!("/proc/{tid}/fd/{fd}")).ok()?;
    // SAFETY: statx is plain data; the kernel fills it.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of the size the kernel writes.
    let done = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            0,
            libc::STATX_BASIC_STATS,
            &raw mut stx,
        )
    };
    if done != 0 || u32::from(stx.stx_mode) & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    let file = FileRef {
        dev: kernel_ids::kernel_dev_from_stat(dev),
        mode: u32::from(stx.stx_mode),
        ino: stx.stx_ino,
        size: stx.stx_size as i64,
        blocks: stx.stx_blocks,
    };
    Some((file, stx.stx_attributes))
}

/// Whether descriptor `fd` of thread `tid` is open for writing: its /proc link's owner
/// write bit says so (procfs sets it from the open file's mode).
pub(super) fn fd_writable(tid: i32, fd: i32) -> bool {
    fs::symlink_metadata(format!("/proc/{tid}/fd/{fd}"))
        .is_ok_and(|meta| meta.mode() & libc::S_IWUSR != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fault_carries_an_address() {
        // SAFETY: siginfo_t is plain data; zeroes are a valid one.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // Where a fault's address is, tkill puts the sender's pid, then its uid.
        let sender = (1000u64 << 32) | 4534;
        // SAFETY: the union after the three ints starts at byte 16 of the 128-byte struct.
        unsafe {
            std::ptr::write_unaligned((&raw mut info).cast::<u8>().add(16).cast::<u64>(), sender)
        };
        info.si_code = BUS_ADRERR;
        assert_eq!(fault_address(&info), sender, "a fault's address");
        info.si_code = -6; // SI_TKILL
        assert_eq!(fault_address(&info), 0);
        info.si_code = 0; // SI_USER
        assert_eq!(fault_address(&info), 0);
        info.si_code = 0x80; // SI_KERNEL
        assert_eq!(fault_address(&info), 0);
    }

    #[test]
    fn reads_ids_and_names_from_proc() {
        let me = std::process::id() as i32;
        assert_eq!(thread_group_of(me), Some(me));
        let comm = read_comm(me);
        assert_ne!(comm[0], 0);
        assert!(!sigcont_pending(me));
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        use std::os::fd::AsRawFd;
        let found = file_of(me, file.as_raw_fd()).unwrap();
        assert!(found.size > 0 && found.ino > 0);
        assert!(file_of(me, -1).is_none());
        // What statx says is what std's metadata says.
        let meta = std::fs::metadata("/proc/self/exe").unwrap();
        assert_eq!(found.mode, meta.mode());
        assert_eq!(found.ino, meta.ino());
        assert_eq!(found.dev, kernel_ids::kernel_dev_from_stat(meta.dev()));
        assert!(!fd_writable(me, file.as_raw_fd()), "opened to read");
        let written = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        assert!(fd_writable(me, written.as_raw_fd()));
    }
}
