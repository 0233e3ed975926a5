//! The state machine: events in, processes and objects updated, each event annotated with what
//! the model knows about it (which object a descriptor is, where a fault address points).
use std::collections::{HashMap, VecDeque};

use super::{Mapping, ObjectState, OpenFd, Process, ShmObject, process::MAX_NAMES};
use crate::event::{Body, Call, Event, ExitStatus, InodeId, Syscall};

/// What the model adds to an event for display and diagnosis.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotation {
    /// Name of the /dev/shm object the event acts on.
    pub object_path: Option<String>,
    /// For a fault signal: the mapping and file the address belongs to.
    pub fault: Option<FaultSite>,
    /// Objects whose memory this event released (their last descriptor and mapping went away
    /// after they were unlinked).
    pub freed: Vec<String>,
    /// The event touched nothing shmtrace follows (an `munmap` of other memory, say).
    pub irrelevant: bool,
    /// For the death of a process by a signal another process sent it on purpose (a parent
    /// ending its children at shutdown): the sender's pid, or 0 for a termination request
    /// (SIGTERM, SIGINT, SIGHUP) whose sender the probes do not see. Such a death is not a
    /// failure.
    pub killed_by: Option<u32>,
    /// For an unsuccessful exit: the process had nothing to do with shared memory (see
    /// [`crate::model::Process::involved`]), so its status is its own business.
    pub uninvolved_exit: bool,
}

impl Annotation {
    /// Whether the event shows the program hurt: a failure ([`Event::is_failure`]) other than
    /// a death another process asked for or the exit status of a process that never touched
    /// shared memory.
    pub fn is_failure(&self, event: &Event) -> bool {
        event.is_failure() && self.killed_by.is_none() && !self.uninvolved_exit
    }
}

/// Where a fault address points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSite {
    pub path: String,
    pub inode: InodeId,
    /// Offset of the address inside the file.
    pub file_offset: u64,
    pub mapping_start: u64,
    pub mapping_len: u64,
    /// `i_size` of the file when last seen.
    pub file_size: i64,
}

/// A process as /proc showed it when shmtrace first met it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcSnapshot {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub exe: Option<String>,
    pub argv: Vec<String>,
    pub mntns: u32,
    /// Its pid in its own pid namespace (`NSpid` in /proc/PID/status), when that differs.
    pub nspid: Option<u32>,
    pub fds: Vec<SnapshotFd>,
    pub mappings: Vec<SnapshotMapping>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFd {
    pub fd: i32,
    pub inode: InodeId,
    /// Path as /proc shows it, without the ` (deleted)` suffix.
    pub path: String,
    pub deleted: bool,
    pub cloexec: bool,
    pub size: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotMapping {
    pub start: u64,
    pub len: u64,
    pub offset: u64,
    pub inode: InodeId,
    pub path: String,
    pub deleted: bool,
}

/// Running totals over the whole trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub events: u64,
    pub failed_calls: u64,
    pub objects_created: u64,
    pub objects_freed: u64,
    /// Memory held by live objects now, and at most.
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub processes_seen: u64,
    pub deaths_by_signal: u64,
}

/// What the traced processes' objects take on one /dev/shm file system.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShmUsage {
    /// Live objects.
    pub objects: u64,
    /// What the live objects take once fully written: the sum of `max(size, allocated)`.
    pub demand: u64,
    /// What they hold now, as far as system calls showed it.
    pub allocated: u64,
    pub peak_demand: u64,
    pub peak_allocated: u64,
}

impl ShmUsage {
    /// Replaces one object's `(demand, allocated)` contribution by another.
    fn change(&mut self, before: (u64, u64), after: (u64, u64)) {
        self.demand = (self.demand + after.0).saturating_sub(before.0);
        self.allocated = (self.allocated + after.1).saturating_sub(before.1);
        self.peak_demand = self.peak_demand.max(self.demand);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
    }
}

#[derive(Debug, Default)]
pub struct World {
    processes: HashMap<u32, Process>,
    objects: HashMap<InodeId, ShmObject>,
    /// Per /dev/shm file system (`dev_t`).
    usage: HashMap<u32, ShmUsage>,
    /// Names present in /dev/shm, per mount namespace.
    names: HashMap<(u32, String), InodeId>,
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
    recently_freed: HashMap<InodeId, String>,
}

/// Bound on `change_log`: a reader further behind recomputes from scratch.
const CHANGE_LOG: usize = 1 << 16;

/// Bound on `recently_freed`.
const RECENTLY_FREED: usize = 4096;

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
        self.processes.values()
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
            object.path.get_or_insert_with(|| fd.path.clone());
            object.linked = !fd.deleted;
            object.fds += 1;
            let allocated = object.allocated;
            self.update_size(fd.inode, fd.size, allocated);
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
            object.path.get_or_insert_with(|| m.path.clone());
            object.linked = object.linked && !m.deleted;
            object.mappings += 1;
            process.map(Mapping {
                start: m.start,
                len: m.len,
                inode: m.inode,
                offset: m.offset,
            });
        }
        self.totals.processes_seen += 1;
        self.changed(snapshot.pid);
        self.processes.insert(snapshot.pid, process);
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
        if let Some(process) = self.processes.get_mut(&event.pid)
            && event.mntns != 0
        {
            process.mntns = event.mntns;
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
                if call.failed() && call.expected_error().is_none() {
                    self.totals.failed_calls += 1;
                }
                if let Some(process) = self.processes.get_mut(&event.pid) {
                    process.involved = true;
                }
                self.apply_call(event, call, &mut note);
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
            Body::Exit(status) => {
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
                    let fds: Vec<InodeId> = std::mem::take(&mut process.fds)
                        .into_values()
                        .map(|f| f.inode)
                        .collect();
                    let maps: Vec<InodeId> = process.mappings.drain(..).map(|m| m.inode).collect();
                    (fds, maps)
                };
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
                        self.processes.insert(signal.target_pid, target);
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
        self.processes.insert(
            event.pid,
            Process::new(event.pid, event.comm.clone(), event.mntns, event.ts_ns),
        );
    }

    fn object_entry(&mut self, inode: InodeId, mntns: u32, ts_ns: u64) -> &mut ShmObject {
        let usage = &mut self.usage;
        self.objects.entry(inode).or_insert_with(|| {
            usage.entry(inode.dev).or_default().objects += 1;
            ShmObject::new(inode, mntns, ts_ns)
        })
    }

    fn apply_call(&mut self, event: &Event, call: &Call, note: &mut Annotation) {
        let ok = !call.failed();
        match call.syscall {
            Syscall::Openat | Syscall::Openat2 => {
                note.object_path = call.display_path();
                if let (true, Some(file), Some(fd), Some(path)) =
                    (ok, call.file, call.fd, call.display_path())
                {
                    let flags = call.args[2];
                    if self.is_stale(file.inode, flags, event.mntns) {
                        self.retire(file.inode, note);
                    }
                    // Opened by its name, so it is alive: not an object freed before and
                    // brought back by a passed descriptor, but a new one with the same
                    // number (a restarted container's fresh /dev/shm numbers from 1 again).
                    self.recently_freed.remove(&file.inode);
                    let created = flags & libc::O_CREAT as u64 != 0
                        && (flags & libc::O_EXCL as u64 != 0
                            || !self.objects.contains_key(&file.inode));
                    let is_new = !self.objects.contains_key(&file.inode);
                    if is_new {
                        self.totals.objects_created += u64::from(created);
                    }
                    let object = self.object_entry(file.inode, event.mntns, event.ts_ns);
                    object.path = Some(path.clone());
                    object.linked = true;
                    object.fds += 1;
                    if created && is_new {
                        object.creator = Some(event.pid);
                    }
                    self.names.insert((event.mntns, path.clone()), file.inode);
                    self.update_size(file.inode, file.size, file.allocated);
                    let process = self.processes.get_mut(&event.pid).expect("ensured");
                    if process.opened.len() < MAX_NAMES && !process.opened.contains(&path) {
                        process.opened.push(path);
                        // Inline, as `process` still borrows the map; `changed` trims the log.
                        self.version += 1;
                        self.change_log.push_back(event.pid);
                    }
                    let previous = process.fds.insert(
                        fd,
                        OpenFd {
                            inode: file.inode,
                            cloexec: flags & libc::O_CLOEXEC as u64 != 0,
                        },
                    );
                    // A descriptor number reused without a close we saw (or one a /proc
                    // snapshot already showed): the old reference is gone.
                    if let Some(previous) = previous {
                        self.release(vec![previous.inode], Vec::new(), note);
                    }
                }
            }
            Syscall::Ftruncate
            | Syscall::Fallocate
            | Syscall::Write
            | Syscall::Mmap
            | Syscall::Close => {
                let Some(file) = call.file else { return };
                let inode = file.inode;
                let path = self
                    .name_for_fd(event.pid, call.fd, inode)
                    .or_else(|| self.recently_freed.get(&inode).cloned());
                let is_new = !self.objects.contains_key(&inode);
                let object = self.object_entry(inode, event.mntns, event.ts_ns);
                if object.path.is_none() {
                    object.path = path;
                }
                if is_new {
                    // First seen through a descriptor: one passed from another process, whose
                    // name is normally gone already (PyTorch unlinks before passing it).
                    object.linked = false;
                }
                let request = match call.syscall {
                    Syscall::Ftruncate => call.args[1],
                    Syscall::Fallocate => call.args[2].saturating_add(call.args[3]),
                    _ => 0,
                };
                object.peak_request = object.peak_request.max(request);
                note.object_path = Some(object.display_name());
                self.update_size(inode, file.size, file.allocated);
                match call.syscall {
                    Syscall::Mmap if ok => {
                        let process = self.processes.get_mut(&event.pid).expect("ensured");
                        let start = call.ret as u64;
                        let len = call.args[1];
                        let changes = process.unmap(start, len);
                        process.map(Mapping {
                            start,
                            len,
                            inode,
                            offset: call.args[5],
                        });
                        self.adjust_mappings(changes, note);
                        self.object_entry(inode, event.mntns, event.ts_ns).mappings += 1;
                    }
                    // close releases the descriptor even when it reports an error, except EBADF.
                    Syscall::Close if call.errno() != Some(libc::EBADF) => {
                        let process = self.processes.get_mut(&event.pid).expect("ensured");
                        let removed = call.fd.and_then(|fd| process.fds.remove(&fd));
                        if removed.is_some() {
                            self.release(vec![inode], Vec::new(), note);
                        }
                    }
                    _ => {}
                }
            }
            Syscall::Munmap => {
                let process = self.processes.get_mut(&event.pid).expect("ensured");
                let changes = if ok {
                    process.unmap(call.args[0], call.args[1])
                } else {
                    Vec::new()
                };
                match changes.first() {
                    Some((inode, _)) => {
                        note.object_path = self.objects.get(inode).map(ShmObject::display_name)
                    }
                    None => note.irrelevant = true,
                }
                self.adjust_mappings(changes, note);
            }
            Syscall::Unlink | Syscall::Unlinkat => {
                let Some(path) = call.display_path() else {
                    return;
                };
                note.object_path = Some(path.clone());
                if ok && let Some(inode) = self.names.remove(&(event.mntns, path)) {
                    if let Some(object) = self.objects.get_mut(&inode) {
                        object.linked = false;
                    }
                    self.free_if_released(inode, note);
                }
            }
            Syscall::MemfdCreate
            | Syscall::Recvmsg
            | Syscall::Shmget
            | Syscall::Shmat
            | Syscall::Shmdt
            | Syscall::Shmctl => {}
        }
    }

    /// The name a descriptor was opened under, when the object has none yet.
    fn name_for_fd(&self, pid: u32, fd: Option<i32>, inode: InodeId) -> Option<String> {
        if let Some(object) = self.objects.get(&inode)
            && object.path.is_some()
        {
            return object.path.clone();
        }
        let process = self.processes.get(&pid)?;
        let open = process.fds.get(&fd?)?;
        self.objects.get(&open.inode)?.path.clone()
    }

    fn update_size(&mut self, inode: InodeId, size: i64, allocated: u64) {
        let Some(object) = self.objects.get_mut(&inode) else {
            return;
        };
        let before = object.footprint();
        object.size = size;
        object.allocated = allocated;
        let after = object.footprint();
        self.usage
            .entry(inode.dev)
            .or_default()
            .change(before, after);
        self.totals.live_bytes = (self.totals.live_bytes + after.1).saturating_sub(before.1);
        self.totals.peak_live_bytes = self.totals.peak_live_bytes.max(self.totals.live_bytes);
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
        self.processes.insert(child_pid, child);
    }

    fn adjust_mappings(&mut self, changes: Vec<(InodeId, i32)>, note: &mut Annotation) {
        for (inode, delta) in changes {
            if let Some(object) = self.objects.get_mut(&inode) {
                object.mappings = object.mappings.saturating_add_signed(delta);
            }
            self.free_if_released(inode, note);
        }
    }

    /// Drops descriptors and mappings of `fds` and `maps` inodes.
    fn release(&mut self, fds: Vec<InodeId>, maps: Vec<InodeId>, note: &mut Annotation) {
        for inode in &fds {
            if let Some(object) = self.objects.get_mut(inode) {
                object.fds = object.fds.saturating_sub(1);
            }
        }
        for inode in &maps {
            if let Some(object) = self.objects.get_mut(inode) {
                object.mappings = object.mappings.saturating_sub(1);
            }
        }
        for inode in fds.into_iter().chain(maps) {
            self.free_if_released(inode, note);
        }
    }

    /// Whether a file just opened under `inode` cannot be the object the model knows by that
    /// number. A file system cannot hand out the number of a file that still exists, so when
    /// it does, the known one is gone without a trace: its /dev/shm was unmounted (a container
    /// restarted; its new tmpfs numbers inodes from 1 on the same device number) or its
    /// removal was among lost events. Proof is a create that had to be new (`O_EXCL`), or a
    /// create in another mount namespace of a file nobody traced holds.
    fn is_stale(&self, inode: InodeId, flags: u64, mntns: u32) -> bool {
        let Some(known) = self.objects.get(&inode) else {
            return false;
        };
        let creates = flags & libc::O_CREAT as u64 != 0;
        let exclusive = flags & libc::O_EXCL as u64 != 0;
        creates && (exclusive || (known.mntns != mntns && known.fds == 0 && known.mappings == 0))
    }

    /// Ends the lives of the objects named in mount namespace `mntns` on file system `dev`:
    /// that namespace's private /dev/shm, unmounted when its last process ended (a container
    /// that stopped or restarted). Returns how many.
    pub fn retire_file_system(&mut self, dev: u32, mntns: u32) -> usize {
        let gone: Vec<InodeId> = self
            .objects
            .values()
            .filter(|o| o.inode.dev == dev && o.mntns == mntns)
            .map(|o| o.inode)
            .collect();
        let mut note = Annotation::default();
        for inode in &gone {
            self.retire(*inode, &mut note);
        }
        gone.len()
    }

    /// Ends the life of an object whose file system went away with it (see `is_stale`).
    fn retire(&mut self, inode: InodeId, note: &mut Annotation) {
        let Some(object) = self.objects.remove(&inode) else {
            return;
        };
        self.totals.live_bytes = self.totals.live_bytes.saturating_sub(object.allocated);
        // Counted as freed only what was counted as created: not the objects found already
        // there, nor /dev/shm itself held open.
        if object.creator.is_some() {
            self.totals.objects_freed += 1;
        }
        let usage = self.usage.entry(inode.dev).or_default();
        usage.change(object.footprint(), (0, 0));
        usage.objects = usage.objects.saturating_sub(1);
        if let Some(path) = &object.path {
            let key = (object.mntns, path.clone());
            if self.names.get(&key) == Some(&inode) {
                self.names.remove(&key);
            }
        }
        note.freed.push(object.display_name());
        // Every bump has its entry in the change log (pid 0: no process to look at again),
        // or `changes_since` would skip the changes after it.
        self.changed(0);
    }

    /// An unlinked object with no descriptor or mapping left has given its memory back.
    fn free_if_released(&mut self, inode: InodeId, note: &mut Annotation) {
        let Some(object) = self.objects.get(&inode) else {
            return;
        };
        if object.state() != ObjectState::Freed {
            return;
        }
        let object = self.objects.remove(&inode).expect("present");
        self.totals.live_bytes = self.totals.live_bytes.saturating_sub(object.allocated);
        // An object brought back by a passed descriptor was counted when first freed.
        if !self.recently_freed.contains_key(&inode) {
            self.totals.objects_freed += 1;
        }
        let usage = self.usage.entry(inode.dev).or_default();
        usage.change(object.footprint(), (0, 0));
        usage.objects = usage.objects.saturating_sub(1);
        note.freed.push(object.display_name());
        if let Some(path) = object.path {
            if self.recently_freed.len() >= RECENTLY_FREED {
                self.recently_freed.clear();
            }
            self.recently_freed.insert(inode, path);
        }
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
