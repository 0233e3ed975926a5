//! From events to answers: which process died or failed, why, whether /dev/shm size is the
//! cause, and what to change.
//!
//! A failure (a call returning ENOSPC, a SIGBUS inside a /dev/shm mapping, an OOM kill, ...)
//! is held against its process; when that process dies, or when tracing ends, its failures
//! become one [`Diagnosis`]. A trainer that dies after one of its workers is linked to the
//! worker's diagnosis rather than diagnosed again. Capacity comes from [`Capacity`] samples fed
//! in by the caller, so a recorded trace replays to the same diagnosis.
//!
//! This file routes events and holds the diagnoser's state; `evidence` notes what a failure
//! needs as it happens, `verdict` turns failures and deaths into a [`Diagnosis`], `table` keeps
//! the closing table; `failure`, `role`, `known`, `recommend`, `pressure` and `leftovers` are
//! what they decide with.
mod evidence;
mod failure;
mod fallback;
pub mod file_count;
mod forget;
mod growth;
pub mod known;
mod leftovers;
mod parallel_query;
mod pressure;
mod recommend;
pub mod role;
pub mod space_check;
mod table;
mod untraced_holders;
mod usage_floor;

/// The last component of a path, or all of it. `memrchr`: `rsplit('/')`'s general pattern
/// search cost ten times as much, on every event of a replay, and a byte-by-byte search still
/// 3% of it.
fn base_name(path: &str) -> &str {
    match memchr::memrchr(b'/', path.as_bytes()) {
        Some(slash) => &path[slash + 1..],
        None => path,
    }
}
mod verdict;

use std::{borrow::Cow, collections::HashMap};

use evidence::LoaderStats;
pub use failure::{Cause, Failure, FailureKind, FailureRun, Leftover, classify, runs};
pub use file_count::FileCountAdvice;
pub use forget::Remembered;
pub use known::KnownUser;
pub use leftovers::Leftovers;
pub use recommend::{
    Burst, DEFAULT_PREFETCH, DataloaderDemand, Demand, Recommendation, TRAINER_HOLDS, advise,
    with_headroom,
};
pub use role::{Role, RoleKind, Roles};
pub use table::RoleStats;
pub use untraced_holders::{OtherFile, OtherHolder, Others, Sharer};

use verdict::Diagnosed;

use crate::{
    capacity::Capacity,
    event::{Body, Event, Exit, ExitStatus, InodeId, Syscall},
    model::{Annotation, ContainerInfo, FastMap, FastSet, ShmUsage, World},
};

/// The answer about one process that failed or died.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnosis {
    pub ts_ns: u64,
    pub pid: u32,
    /// Its pid inside its container (what the program's own logs print), when it differs.
    pub container_pid: Option<u32>,
    pub comm: String,
    /// Its process title at the failure, when it rewrote its command line.
    pub title: Option<String>,
    /// The known /dev/shm user it is ([`known::KNOWN`]), by its objects or its name.
    pub program: Option<&'static KnownUser>,
    /// What its title says it does (`parallel worker for PID 34`).
    pub program_role: Option<String>,
    pub role: Role,
    pub argv: Vec<String>,
    /// The trainer a worker served: pid and command line.
    pub trainer: Option<(u32, Vec<String>)>,
    /// Where it ran: `host`, a container, a namespace.
    pub place: String,
    /// The container, when it ran in one shmtrace knows.
    pub container: Option<ContainerInfo>,
    /// How it ended, if it did.
    pub ending: Option<ExitStatus>,
    pub cause: Cause,
    /// Its failures, the decisive one first.
    pub failures: Vec<Failure>,
    /// For a trainer that died after a worker's failure: that worker.
    pub follows: Option<u32>,
    pub capacity: Option<Capacity>,
    pub usage: Option<ShmUsage>,
    pub workers_allocating: u32,
    /// The requests refused on that /dev/shm within a second of the decisive failure, this
    /// one's included: what the processes asked at once.
    pub burst: recommend::Burst,
    pub recommendation: Option<Recommendation>,
    /// When /dev/shm ran out of files rather than bytes: the file count to give it.
    pub files: Option<FileCountAdvice>,
    /// When a name it opened had been removed by another process: who, when, who held it.
    pub removed: Option<RemovedName>,
    /// Why /dev/shm size is not the answer, and what is.
    pub explanation: Option<String>,
    /// Files of dead processes on the /dev/shm that failed, and what they mean for the size.
    pub leftovers: Option<Leftovers>,
    /// What others (untraced, maybe in another container) held of the /dev/shm that failed,
    /// and who shares it.
    pub others: Option<Others>,
    /// Ways the program itself offers to need less /dev/shm, or none.
    pub program_alternatives: Vec<String>,
    /// Events the kernel could not deliver before this diagnosis: its counts may be short.
    pub lost_events: u64,
}

/// A /dev/shm name removed under a program that still used it, as its diagnosis tells it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RemovedName {
    pub path: String,
    pub by_pid: u32,
    pub by_comm: String,
    /// Where the remover ran: `host`, a container's name.
    pub by_place: String,
    pub by_argv: Vec<String>,
    /// Who still had it open or mapped when it was removed.
    pub holders: Vec<NamedPid>,
    /// Its maker, when the trace saw it made.
    pub made_by: Option<u32>,
    /// How long before the failed open it was removed.
    pub ns_before: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NamedPid {
    pub pid: u32,
    pub comm: String,
}

#[derive(Default)]
pub struct Diagnoser {
    roles: Roles,
    pending: HashMap<u32, Vec<Failure>>,
    capacity: HashMap<u32, Capacity>,
    containers: FastMap<u32, ContainerInfo>,
    host_mntns: u32,
    loaders: HashMap<u32, LoaderStats>,
    diagnosed: HashMap<u32, Diagnosed>,
    /// Per parent, its children diagnosed with a failure of their own: (when, pid), earliest
    /// first ([`Diagnoser::first_failed_child`]).
    failed_children: FastMap<u32, std::collections::BTreeSet<(u64, u32)>>,
    /// Objects each process holds now, with its group (place and role at the time); per
    /// group, how many of its processes hold each object (an object shared by several counts
    /// once), and the most bytes the group held at once.
    held: FastMap<u32, (FastSet<InodeId>, (String, RoleKind))>,
    group_now: FastMap<(String, RoleKind), FastMap<InodeId, u32>>,
    group_peak: FastMap<(String, RoleKind), (u64, u64)>,
    /// The /dev/shm file systems each group's objects were on.
    group_devs: FastMap<(String, RoleKind), FastSet<u32>>,
    /// Processes the model forgot, counted per group for the closing table.
    forgotten: HashMap<(String, RoleKind), table::RoleStats>,
    /// Failures and deaths per process.
    outcomes: FastMap<u32, (u64, bool)>,
    /// Label for mount namespaces nobody named (the demo's private one, say).
    unnamed_place: Option<String>,
    nccl_seen: bool,
    /// Requests failing together, and the growth of sizes asked for, per /dev/shm.
    pressure: pressure::Pressure,
    /// Use of each /dev/shm when first measured: what others held before the traced
    /// processes started, at most.
    first_used: HashMap<u32, u64>,
    /// Events lost so far (the caller says): a diagnosis made after losses says so.
    lost_events: u64,
    /// Per /dev/shm, what held it when it was last full, as the machine showed it.
    holders: HashMap<u32, crate::model::ShmHolders>,
    /// Rows of the closing table dropped to bound memory ([`Diagnoser::forget`]).
    evicted_groups: u64,
    /// Per process, its latest look at a /dev/shm's free space; per mount namespace, the
    /// latest look of any process there ([`space_check`]).
    looks: FastMap<u32, space_check::Look>,
    looks_by_place: FastMap<u32, space_check::Look>,
    /// Ray's raylets alive, judged at their end ([`Diagnoser::ray_decision`]).
    raylets: FastSet<u32>,
    /// Reused to gather what a process holds after each call, which is most often what it
    /// held before ([`Diagnoser::update_held`]).
    held_scratch: FastSet<InodeId>,
    /// Per mount namespace, the file system (`dev_t`) of its /dev/shm, as its calls on
    /// /dev/shm objects showed it: a failed create names no file, only a path.
    shm_devs: FastMap<u32, u32>,
    /// Per /dev/shm, creates refused for want of inodes so far.
    inode_refusals: FastMap<u32, u64>,
    /// Per thread, its latest call if it failed, and its huge-page requests refused that no
    /// ordinary request followed yet ([`fallback`]).
    last_failed: FastMap<u32, fallback::LastFailed>,
    huge_refused: FastMap<u32, Vec<fallback::LastFailed>>,
    /// Processes that a termination request (SIGINT, SIGTERM, SIGHUP) from another reached:
    /// what they saw of /dev/shm's free space did not end them.
    interrupted: FastSet<u32>,
    /// Processes that made or sized a /dev/shm file after looking at its free space: their
    /// looks decided nothing (UCX looks again after making its segment).
    went_ahead: FastSet<u32>,
    /// Files grown by write ([`growth`]), and the processes that ended successfully among
    /// their writers.
    grown: growth::GrownFiles,
    ended_well: FastSet<u32>,
}

/// `si_code` of a signal the kernel sent (a terminal's Ctrl-C).
const SI_KERNEL: i32 = 0x80;

impl Diagnoser {
    /// `host_mntns`: shmtrace's own mount namespace, called `host`.
    pub fn new(host_mntns: u32) -> Diagnoser {
        Diagnoser {
            host_mntns,
            ..Diagnoser::default()
        }
    }

    /// Tells which container a mount namespace is.
    pub fn set_container(&mut self, info: ContainerInfo) {
        if let (Some(mntns), Some(dev)) = (info.mntns, info.shm_dev) {
            self.shm_devs.entry(mntns).or_insert(dev);
        }
        if let Some(mntns) = info.mntns {
            self.containers.insert(mntns, info);
        }
    }

    pub fn forget_container(&mut self, mntns: u32) {
        self.containers.remove(&mntns);
        self.looks_by_place.remove(&mntns);
        self.shm_devs.remove(&mntns);
    }

    pub fn container(&self, mntns: u32) -> Option<&ContainerInfo> {
        self.containers.get(&mntns)
    }

    /// Names every mount namespace other than shmtrace's own that has no name of its own.
    pub fn set_unnamed_place(&mut self, label: String) {
        self.unnamed_place = Some(label);
    }

    pub fn place(&self, mntns: u32) -> String {
        self.place_name(mntns).into_owned()
    }

    /// [`Diagnoser::place`], borrowed where it can be: asked for every event.
    pub fn place_name(&self, mntns: u32) -> Cow<'_, str> {
        match (self.containers.get(&mntns), &self.unnamed_place) {
            (Some(container), _) => Cow::Owned(container.label()),
            _ if mntns == self.host_mntns || mntns == 0 => Cow::Borrowed("host"),
            (None, Some(label)) => Cow::Borrowed(label),
            (None, None) => Cow::Owned(format!("mount namespace {mntns}")),
        }
    }

    /// How many events the kernel could not deliver so far.
    pub fn set_lost_events(&mut self, lost: u64) {
        self.lost_events = lost;
    }

    /// A fresh measurement of a /dev/shm file system.
    pub fn capacity(&mut self, sample: Capacity) {
        for container in self.containers.values_mut() {
            if container.shm_dev == Some(sample.dev) {
                container.shm_size = Some(sample.size);
                container.shm_used = Some(sample.used);
            }
        }
        self.first_used.entry(sample.dev).or_insert(sample.used);
        self.capacity.insert(sample.dev, sample);
    }

    /// What held a /dev/shm at a failure on it, read from the machine.
    pub fn holders(&mut self, sample: crate::model::ShmHolders) {
        self.holders.insert(sample.dev, sample);
    }

    /// Roles as of the model's current state.
    pub fn roles(&mut self, world: &World) -> &Roles {
        self.roles.update(world);
        &self.roles
    }

    /// Takes in one event, already applied to `world`; returns the diagnoses it completes.
    pub fn observe(&mut self, event: &Event, note: &Annotation, world: &World) -> Vec<Diagnosis> {
        self.roles(world);
        // Neither a failure nor a fallback from one: dd's report of its refused write, to a
        // /dev/null whose file system has a number a /dev/shm had, took its failure back.
        if let Body::Call(call) = &event.body
            && call.file.is_some_and(|file| file.is_special())
        {
            return Vec::new();
        }
        if let Body::Call(call) = &event.body {
            if let (Some(file), Some(path)) = (call.file, note.object_path.as_deref())
                && path.starts_with("/dev/shm/")
                && self.shm_devs.get(&event.mntns) != Some(&file.inode.dev)
            {
                self.shm_devs.insert(event.mntns, file.inode.dev);
            }
            self.learn_loader(event.pid, call, note, world);
            self.learn_space(event, call, note.object_path.as_deref());
            // It went on to make or size a file there: what it saw did not stop it (Open MPI
            // looks before every segment it makes).
            if !call.failed()
                && call.file.is_some()
                && (call.syscall.opens_a_path()
                    || matches!(call.syscall, Syscall::Ftruncate | Syscall::Fallocate))
                && note
                    .object_path
                    .as_deref()
                    .is_some_and(|p| p.starts_with("/dev/shm/"))
                && self.looks.remove(&event.pid).is_some()
            {
                self.went_ahead.insert(event.pid);
            }
            self.learn_requests(call);
            self.learn_growth(event, call, world);
            if call.syscall.opens_a_path()
                || matches!(
                    call.syscall,
                    Syscall::Ftruncate
                        | Syscall::Fallocate
                        | Syscall::Write
                        | Syscall::Mmap
                        | Syscall::Munmap
                        | Syscall::Close
                )
            {
                self.update_held(event.pid, event.mntns, world);
            }
            if !self.nccl_seen && note.object_path.as_deref().is_some_and(role::is_nccl) {
                self.nccl_seen = true;
            }
        }
        let classified = failure::classify(event, note);
        if let Body::Call(call) = &event.body {
            self.learn_fallback(event, call, classified.is_some());
        }
        if let Body::Signal(signal) = &event.body
            && matches!(signal.signo, libc::SIGINT | libc::SIGTERM | libc::SIGHUP)
            // Sent by another (a user's kill, a runtime's stop) or by the terminal (Ctrl-C).
            && (signal.target_pid != event.pid || signal.code == SI_KERNEL)
        {
            self.interrupted.insert(signal.target_pid);
        }
        if let Some((pid, cause, kind, dev)) = classified {
            // A path-only failure (a refused create) is on its namespace's /dev/shm.
            let dev = dev.or_else(|| match &kind {
                FailureKind::Call { path: Some(p), .. } if p.starts_with("/dev/shm/") => {
                    self.shm_devs.get(&event.mntns).copied()
                }
                _ => None,
            });
            if cause == Cause::InodesFull {
                *self.inode_refusals.entry(dev.unwrap_or(0)).or_default() += 1;
            }
            let mut failure = self.failure_now(event, pid, cause, kind, dev, world);
            failure.removal = note.name_removed.clone();
            if let (Some(dev), FailureKind::Call { request, .. }) = (dev, &failure.kind) {
                self.pressure
                    .refused(dev, event.ts_ns, pid, *request, failure.unmet);
            }
            self.outcomes.entry(pid).or_default().0 += 1;
            self.pending.entry(pid).or_default().push(failure);
        }
        if let Body::Exec(exec) = &event.body
            && space_check::needs_whole_command_line(&exec.filename)
        {
            self.raylets.insert(event.pid);
        }
        let mut out = Vec::new();
        if let Body::Exit(Exit { status, .. }) = &event.body {
            if self.raylets.remove(&event.pid)
                && let Some(failure) = self.ray_decision(event.pid, event.ts_ns, world)
            {
                self.pending.entry(event.pid).or_default().push(failure);
            }
            let group = self.group(event.pid, event.mntns);
            self.held_to(event.pid, FastSet::default(), group, world);
            // A death the table counts: not the status of a process that never touched
            // shared memory (a compiler probing for a library), nor an end another asked for
            // (unless it failed first: below).
            if note.is_failure(event) {
                self.outcomes.entry(event.pid).or_default().1 = true;
            } else if self
                .grown
                .values()
                .any(|g| g.values().any(|g| g.pid == event.pid))
            {
                self.ended_well.insert(event.pid);
            }
            if note.killed_by.is_some() {
                self.withdraw_unanswered_huge_requests(event.pid);
            }
            if let Some(diagnosis) = self.on_death(event, *status, note.killed_by, world) {
                // A process with failures of its own that its launcher then stopped died
                // of them too: the table counts every end it diagnoses as a death.
                if !status.success() {
                    self.outcomes.entry(event.pid).or_default().1 = true;
                }
                out.push(diagnosis);
            }
            // Its look counted at its death only; the place keeps the latest for a raylet.
            self.looks.remove(&event.pid);
            self.interrupted.remove(&event.pid);
            self.went_ahead.remove(&event.pid);
            self.forget_fallbacks(event.pid, event.tid);
        }
        out
    }

    /// Diagnoses for failures of processes that were still alive when tracing stopped.
    pub fn finish(&mut self, world: &World) -> Vec<Diagnosis> {
        for pid in std::mem::take(&mut self.raylets) {
            let ts_ns = world.process(pid).map_or(0, |p| p.last_seen_ns);
            if let Some(failure) = self.ray_decision(pid, ts_ns, world) {
                self.pending.entry(pid).or_default().push(failure);
            }
        }
        let mut pids: Vec<u32> = self.pending.keys().copied().collect();
        pids.sort();
        pids.into_iter()
            .filter_map(|pid| {
                let failures = self.pending.remove(&pid)?;
                let process = world.process(pid)?;
                let ts = failures.last().map(|f| f.ts_ns).unwrap_or(0);
                Some(self.diagnose(pid, process.mntns, ts, None, failures, world))
            })
            .collect()
    }

    fn group(&self, pid: u32, mntns: u32) -> (String, RoleKind) {
        (self.place(mntns), self.roles.of(pid).kind)
    }
}

#[cfg(test)]
mod tests;
