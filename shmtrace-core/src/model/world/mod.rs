//! The state machine: events in, processes and objects updated, each event annotated with what
//! the model knows about it (which object a descriptor is, where a fault address points).
use std::{collections::VecDeque, sync::Arc};

mod calls;
mod forgetting;
mod objects;
mod removals;
#[cfg(test)]
mod test_events;

pub use forgetting::{Evictions, QUIET_LINGER_NS, Retention};

use super::{
    Annotation, FastMap, FastSet, FaultSite, Mapping, OpenFd, ProcSnapshot, Process, Removal,
    ShmObject, ShmUsage, Totals, process::MAX_NAMES,
};
use crate::event::{Body, Event, Exit, ExitStatus, InodeId};

#[derive(Debug, Default)]
pub struct World {
    processes: FastMap<u32, Process>,
    objects: FastMap<InodeId, ShmObject>,
    /// Per /dev/shm file system (`dev_t`).
    usage: FastMap<u32, ShmUsage>,
    /// Names present in /dev/shm, per mount namespace.
    names: FastMap<(u32, String), InodeId>,
    totals: Totals,
    /// Bumped whenever a fact that roles depend on changes (lineage, names, creations).
    version: u64,
    /// Which process each recent bump was about, oldest first; entry `i` is bump
    /// `change_base + i`. Lets roles be updated for what changed instead of recomputed over
    /// every process ever seen ([`World::changes_since`]).
    change_log: VecDeque<u32>,
    change_base: u64,
    /// Names of objects recently freed, by inode: a descriptor passed to another process
    /// (SCM_RIGHTS, which is not traced) brings one back.
    recently_freed: FastMap<InodeId, Arc<str>>,
    /// Names removed by someone other than their maker while others held them, with the
    /// file system they were on, newest last ([`REMOVALS`] at most): an open of one that
    /// fails is told.
    removals: VecDeque<(u32, Removal)>,
    /// The /dev/shm file system (`dev_t`) of each mount namespace, and the namespaces on each
    /// ([`removals`]).
    shm_dev_of: FastMap<u32, u32>,
    namespaces_on: FastMap<u32, Vec<u32>>,
    /// Directories on a /dev/shm opened by whole path, by mount namespace and inode number
    /// ([`DIRECTORIES`] at most): a name relative to a descriptor of one is named whole by
    /// the inode the probes read behind the descriptor, however the descriptor was moved.
    directories: FastMap<(u32, u64), Arc<str>>,
    /// What ended, to be forgotten once it no longer matters; `None` keeps everything.
    forgetting: Option<forgetting::Forgetting>,
    /// The live processes of each mount namespace: whether a container's last process has
    /// ended is asked at every exit, and a scan of every process there made a replay of a
    /// fork storm quadratic (issue 25). Kept by [`World::insert_process`], the namespace
    /// update in [`World::apply`], exits, and [`World::forget`].
    live_in: FastMap<u32, FastSet<u32>>,
    /// Entries of `processes` that scans of every process may have visited
    /// ([`World::processes`]): a measure of work that grows with the square of the processes
    /// when something scans them per event, for the tests that keep replay linear.
    scanned: std::sync::atomic::AtomicU64,
}

/// Bound on `change_log`: a reader further behind recomputes from scratch.
const CHANGE_LOG: usize = 1 << 16;

/// Bound on `recently_freed`.
const RECENTLY_FREED: usize = 4096;

/// Bound on `directories`, kept by clearing: a directory opened again is learned again.
const DIRECTORIES: usize = 4096;

/// Bound on `removals`.
const REMOVALS: usize = 256;

impl World {
    pub fn new() -> World {
        World::default()
    }

    pub fn knows(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid)
    }

    /// Objects not yet freed.
    pub fn live_objects(&self) -> impl Iterator<Item = &ShmObject> {
        self.objects.values()
    }

    pub fn totals(&self) -> &Totals {
        &self.totals
    }

    /// Changes whenever process lineage, names or object creations change, so that what is
    /// derived from them can be cached.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The processes whose role-relevant facts changed after `version` (repeats possible), or
    /// `None` when the log no longer reaches back that far.
    pub fn changes_since(&self, version: u64) -> Option<impl Iterator<Item = u32> + '_> {
        debug_assert_eq!(
            self.change_base + self.change_log.len() as u64,
            self.version,
            "every version bump has its change-log entry"
        );
        let skip = version.checked_sub(self.change_base)?;
        Some(self.change_log.iter().skip(skip as usize).copied())
    }

    fn changed(&mut self, pid: u32) {
        self.version += 1;
        self.change_log.push_back(pid);
        if self.change_log.len() > CHANGE_LOG {
            self.change_log.pop_front();
            self.change_base += 1;
        }
    }

    pub fn process(&self, pid: u32) -> Option<&Process> {
        self.processes.get(&pid)
    }

    pub fn processes(&self) -> impl Iterator<Item = &Process> {
        self.scanned.fetch_add(
            self.processes.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.processes.values()
    }

    /// How many process entries scans of every process may have visited so far.
    pub fn scanned(&self) -> u64 {
        self.scanned.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The live processes of mount namespace `mntns`, without a scan of every process.
    pub fn alive_in(&self, mntns: u32) -> impl Iterator<Item = u32> + '_ {
        self.live_in
            .get(&mntns)
            .into_iter()
            .flatten()
            .copied()
            .filter(move |pid| {
                self.processes
                    .get(pid)
                    .is_some_and(|p| p.alive() && p.mntns == mntns)
            })
    }

    /// Whether a process of mount namespace `mntns` is alive, without a scan.
    pub fn any_alive_in(&self, mntns: u32) -> bool {
        self.alive_in(mntns).next().is_some()
    }

    /// Adds (or replaces) a process, indexing it by namespace while alive.
    fn insert_process(&mut self, process: Process) {
        if let Some(old) = self.processes.get(&process.pid) {
            let (pid, mntns) = (old.pid, old.mntns);
            self.unindex(pid, mntns);
        }
        if process.alive() {
            self.live_in
                .entry(process.mntns)
                .or_default()
                .insert(process.pid);
        }
        self.processes.insert(process.pid, process);
    }

    /// `pid` is no longer alive in `mntns` (it exited, moved, or was forgotten).
    fn unindex(&mut self, pid: u32, mntns: u32) {
        if let Some(pids) = self.live_in.get_mut(&mntns) {
            pids.remove(&pid);
            if pids.is_empty() {
                self.live_in.remove(&mntns);
            }
        }
    }

    pub fn object(&self, inode: &InodeId) -> Option<&ShmObject> {
        self.objects.get(inode)
    }

    /// Use of the /dev/shm file system `dev`.
    pub fn usage(&self, dev: u32) -> Option<&ShmUsage> {
        self.usage.get(&dev)
    }

    /// Use of every /dev/shm file system seen (the report's use-over-time chart).
    pub fn usages(&self) -> impl Iterator<Item = (u32, &ShmUsage)> {
        self.usage.iter().map(|(dev, usage)| (*dev, usage))
    }

    /// Adds a process found in /proc, with the /dev/shm descriptors and mappings it already
    /// had. For a process already known, only refreshes its title and container pid.
    pub fn seed(&mut self, snapshot: &ProcSnapshot, ts_ns: u64) {
        if self.processes.contains_key(&snapshot.pid) {
            self.refresh(snapshot);
            return;
        }
        let mut process = Process::new(snapshot.pid, snapshot.comm.clone(), snapshot.mntns, ts_ns);
        process.parent = snapshot.ppid;
        process.exe = snapshot.exe.clone();
        process.argv = snapshot.argv.clone();
        process.nspid = snapshot.nspid;
        for fd in &snapshot.fds {
            let object = self.object_entry(fd.inode, snapshot.mntns, ts_ns);
            object.path.get_or_insert_with(|| fd.path.as_str().into());
            object.linked = !fd.deleted;
            object.fds += 1;
            let allocated = object.allocated;
            self.update_size(fd.inode, fd.size, allocated);
            // /proc gives no page count: what it holds is known at its next call.
            if let Some(object) = self.objects.get_mut(&fd.inode) {
                object.uncounted_writes = true;
            }
            if !fd.deleted {
                self.names
                    .insert((snapshot.mntns, fd.path.clone()), fd.inode);
            }
            process.fds.insert(
                fd.fd,
                OpenFd {
                    inode: fd.inode,
                    cloexec: fd.cloexec,
                },
            );
        }
        for m in &snapshot.mappings {
            let object = self.object_entry(m.inode, snapshot.mntns, ts_ns);
            object.path.get_or_insert_with(|| m.path.as_str().into());
            object.linked = object.linked && !m.deleted;
            object.mappings += 1;
            object.uncounted_writes = true;
            process.map(Mapping {
                start: m.start,
                len: m.len,
                inode: m.inode,
                offset: m.offset,
            });
        }
        self.totals.processes_seen += 1;
        self.changed(snapshot.pid);
        self.insert_process(process);
    }

    /// What /proc says of a process already known, read again (at a failure): its pid in its
    /// container, and its title when it rewrote its command line. Descriptors and mappings
    /// come from events only.
    fn refresh(&mut self, snapshot: &ProcSnapshot) {
        let Some(process) = self.processes.get_mut(&snapshot.pid) else {
            return;
        };
        if snapshot.nspid.is_some() {
            process.nspid = snapshot.nspid;
        }
        let title = snapshot.argv.join(" ");
        if !snapshot.argv.is_empty() && snapshot.argv != process.argv {
            process.title = Some(title);
        }
        self.changed(snapshot.pid);
    }

    /// Applies one event and says what it meant.
    pub fn apply(&mut self, event: &Event) -> Annotation {
        self.totals.events += 1;
        self.ensure_process(event);
        // A process can change mount namespace (unshare, setns): the latest event says where.
        if let Some(process) = self.processes.get_mut(&event.pid) {
            process.last_seen_ns = process.last_seen_ns.max(event.ts_ns);
            if event.mntns != 0 && process.mntns != event.mntns {
                let (old, alive) = (process.mntns, process.alive());
                process.mntns = event.mntns;
                self.unindex(event.pid, old);
                if alive {
                    self.live_in
                        .entry(event.mntns)
                        .or_default()
                        .insert(event.pid);
                }
            }
        }
        match &event.body {
            Body::Fork { child_pid, .. } => self.changed(*child_pid),
            Body::Rename { pid, .. } => self.changed(*pid),
            Body::Exec(_) | Body::Exit(_) => self.changed(event.pid),
            _ => {}
        }
        if event.tid != event.pid {
            self.note_thread_name(event.pid, &event.comm);
        }
        let mut note = Annotation::default();
        match &event.body {
            Body::Call(call) => {
                if let Some(process) = self.processes.get_mut(&event.pid) {
                    process.involved = true;
                }
                self.apply_call(event, call, &mut note);
                // Counted as its line shows it: an open of a name someone removed is one.
                if call.failed() && note.expected_error(call).is_none() {
                    self.totals.failed_calls += 1;
                }
            }
            Body::Fork { child_pid } => self.fork(event.pid, *child_pid, event.ts_ns),
            Body::Exec(exec) => {
                let released = {
                    let process = self.processes.get_mut(&event.pid).expect("ensured");
                    process.exe = Some(exec.filename.clone());
                    process.argv = exec.argv.clone();
                    process.title = None;
                    process.exec_ns = Some(event.ts_ns);
                    process.comm = event.comm.clone();
                    let cloexec: Vec<i32> = process
                        .fds
                        .iter()
                        .filter(|(_, fd)| fd.cloexec)
                        .map(|(fd, _)| *fd)
                        .collect();
                    let fds: Vec<InodeId> = cloexec
                        .iter()
                        .filter_map(|fd| process.fds.remove(fd))
                        .map(|fd| fd.inode)
                        .collect();
                    let maps: Vec<InodeId> = process.mappings.drain(..).map(|m| m.inode).collect();
                    (fds, maps)
                };
                self.release(released.0, released.1, &mut note);
            }
            Body::Exit(Exit { status, .. }) => {
                if matches!(status, ExitStatus::Signal { .. }) {
                    self.totals.deaths_by_signal += 1;
                }
                let released = {
                    let process = self.processes.get_mut(&event.pid).expect("ensured");
                    if let ExitStatus::Signal { signo, .. } = status {
                        note.killed_by = match process.sent_signal {
                            Some((sender, sent)) if sent == *signo => Some(sender),
                            // Only ever sent on purpose, by a person, a parent or a runtime
                            // stopping a container; the kernel raises none of them for a fault.
                            _ if matches!(*signo, libc::SIGTERM | libc::SIGINT | libc::SIGHUP) => {
                                Some(0)
                            }
                            _ => None,
                        };
                    }
                    note.uninvolved_exit = matches!(status, ExitStatus::Code(_))
                        && !process.involved
                        && process.fds.is_empty()
                        && process.mappings.is_empty();
                    process.exit = Some(*status);
                    process.exit_ns = Some(event.ts_ns);
                    if let Some(forgetting) = &mut self.forgetting {
                        let quiet = matches!(status, ExitStatus::Code(0)) || note.uninvolved_exit;
                        forgetting.exited(event.pid, event.ts_ns, quiet);
                    }
                    let fds: Vec<InodeId> = std::mem::take(&mut process.fds)
                        .into_values()
                        .map(|f| f.inode)
                        .collect();
                    let maps: Vec<InodeId> = process.mappings.drain(..).map(|m| m.inode).collect();
                    (fds, maps, process.mntns)
                };
                self.unindex(event.pid, released.2);
                self.release(released.0, released.1, &mut note);
            }
            Body::Rename { pid, tid, comm } => {
                if pid != tid {
                    self.note_thread_name(*pid, comm);
                } else if let Some(process) = self.processes.get_mut(pid) {
                    process.comm = comm.clone();
                }
            }
            Body::Signal(signal) => {
                if signal.addr != 0 {
                    note.fault = self.fault_site(signal.target_pid, signal.addr);
                } else if signal.sent_by_other(event.pid)
                    || (signal.signo == libc::SIGKILL && signal.target_pid != event.pid)
                {
                    // The target may not be known yet: a process that ran before the trace
                    // and made no traced call since, killed from outside.
                    if !self.processes.contains_key(&signal.target_pid) {
                        self.totals.processes_seen += 1;
                        self.changed(signal.target_pid);
                        // Its namespace is not the sender's: its own events will say.
                        let target = Process::new(
                            signal.target_pid,
                            signal.target_comm.clone(),
                            0,
                            event.ts_ns,
                        );
                        self.insert_process(target);
                    }
                    if let Some(target) = self.processes.get_mut(&signal.target_pid) {
                        target.sent_signal = Some((event.pid, signal.signo));
                    }
                }
            }
            // The OOM killer's SIGKILL is no request: its victim's death is a failure.
            Body::Oom { victim_pid } => {
                if let Some(victim) = self.processes.get_mut(victim_pid) {
                    victim.sent_signal = None;
                }
            }
        }
        if note.is_failure(event) {
            let subject = match &event.body {
                Body::Signal(signal) => signal.target_pid,
                Body::Oom { victim_pid } => *victim_pid,
                _ => event.pid,
            };
            self.involve_ancestors(subject);
        }
        note
    }

    /// A process failed: those that started it are involved, and their unsuccessful exits
    /// are failures (a trainer that exits 1 because its DataLoader worker died).
    fn involve_ancestors(&mut self, pid: u32) {
        let mut next = self.processes.get(&pid).and_then(|p| p.parent);
        // Bounded: parent links come from events, and a reused pid could make a loop.
        for _ in 0..64 {
            let Some(process) = next.and_then(|pid| self.processes.get_mut(&pid)) else {
                break;
            };
            process.involved = true;
            next = process.parent;
        }
    }

    fn note_thread_name(&mut self, pid: u32, name: &str) {
        if let Some(process) = self.processes.get_mut(&pid)
            && process.thread_names.len() < MAX_NAMES
            && !process.thread_names.contains(name)
        {
            process.thread_names.insert(name.to_owned());
            self.changed(pid);
        }
    }

    fn ensure_process(&mut self, event: &Event) {
        if self.processes.contains_key(&event.pid) {
            return;
        }
        self.totals.processes_seen += 1;
        self.changed(event.pid);
        self.insert_process(Process::new(
            event.pid,
            event.comm.clone(),
            event.mntns,
            event.ts_ns,
        ));
    }

    fn object_entry(&mut self, inode: InodeId, mntns: u32, ts_ns: u64) -> &mut ShmObject {
        let usage = &mut self.usage;
        self.objects.entry(inode).or_insert_with(|| {
            usage.entry(inode.dev).or_default().objects += 1;
            ShmObject::new(inode, mntns, ts_ns)
        })
    }

    fn fork(&mut self, parent_pid: u32, child_pid: u32, ts_ns: u64) {
        let Some(parent) = self.processes.get(&parent_pid) else {
            return;
        };
        let mut child = Process::new(child_pid, parent.comm.clone(), parent.mntns, ts_ns);
        child.parent = Some(parent_pid);
        child.exe = parent.exe.clone();
        child.argv = parent.argv.clone();
        child.fds = parent.fds.clone();
        child.dir_fds = parent.dir_fds.clone();
        child.mappings = parent.mappings.clone();
        for fd in child.fds.values() {
            if let Some(object) = self.objects.get_mut(&fd.inode) {
                object.fds += 1;
            }
        }
        for m in &child.mappings {
            if let Some(object) = self.objects.get_mut(&m.inode) {
                object.mappings += 1;
            }
        }
        self.totals.processes_seen += u64::from(!self.processes.contains_key(&child_pid));
        self.insert_process(child);
    }

    fn fault_site(&self, pid: u32, addr: u64) -> Option<FaultSite> {
        let process = self.processes.get(&pid)?;
        let mapping = process.mapping_at(addr)?;
        let object = self.objects.get(&mapping.inode);
        Some(FaultSite {
            path: object
                .map(ShmObject::display_name)
                .unwrap_or_else(|| format!("<inode {}>", mapping.inode.ino)),
            inode: mapping.inode,
            file_offset: mapping.offset + (addr - mapping.start),
            mapping_start: mapping.start,
            mapping_len: mapping.len,
            file_size: object.map(|o| o.size).unwrap_or(-1),
        })
    }
}
