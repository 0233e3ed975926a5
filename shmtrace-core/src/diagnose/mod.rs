//! From events to answers: which process died or failed, why, whether /dev/shm size is the
//! cause, and what to change.
//!
//! A failure (a call returning ENOSPC, a SIGBUS inside a /dev/shm mapping, an OOM kill, ...)
//! is held against its process; when that process dies, or when tracing ends, its failures
//! become one [`Diagnosis`]. A trainer that dies after one of its workers is linked to the
//! worker's diagnosis rather than diagnosed again. Capacity comes from [`Capacity`] samples fed
//! in by the caller, so a recorded trace replays to the same diagnosis.
mod capacity;
mod failure;
pub mod known;
mod leftovers;
mod pressure;
mod recommend;
pub mod role;

use std::collections::{BTreeMap, HashMap, HashSet};

use capacity::at_least_held;
use failure::at_least_refused;
pub use failure::{Cause, Failure, FailureKind, Leftover, classify};
pub use known::KnownUser;
pub use leftovers::Leftovers;
use leftovers::{leftovers_on, summarise_leftovers};
pub use recommend::{DataloaderDemand, Demand, Recommendation, advise, with_headroom};
pub use role::{Role, RoleKind, Roles};

use crate::{
    capacity::Capacity,
    event::{Body, Event, ExitStatus, InodeId, Syscall},
    model::{Annotation, ContainerInfo, ShmUsage, StartedBy, World},
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
    pub recommendation: Option<Recommendation>,
    /// Why /dev/shm size is not the answer, and what is.
    pub explanation: Option<String>,
    /// Files of dead processes on the /dev/shm that failed, and what they mean for the size.
    pub leftovers: Option<Leftovers>,
    /// Ways the program itself offers to need less /dev/shm, or none.
    pub program_alternatives: Vec<String>,
    /// Events the kernel could not deliver before this diagnosis: its counts may be short.
    pub lost_events: u64,
}

/// Per place and role, for the closing table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoleStats {
    pub processes: u64,
    /// Most bytes the role's processes held in /dev/shm at once.
    pub peak_bytes: u64,
    pub failures: u64,
    pub deaths: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct LoaderStats {
    batch_bytes: u64,
    max_in_flight: u32,
}

/// What a later diagnosis needs of one already made: a trainer that dies after its worker
/// failed takes the worker's cause and recommendation.
#[derive(Clone, Debug)]
struct Diagnosed {
    /// When its earliest failure happened; `None` when it had none (only a fatal signal).
    first_failure_ns: Option<u64>,
    cause: Cause,
    recommendation: Option<Recommendation>,
}

#[derive(Default)]
pub struct Diagnoser {
    roles: Roles,
    pending: HashMap<u32, Vec<Failure>>,
    capacity: HashMap<u32, Capacity>,
    containers: HashMap<u32, ContainerInfo>,
    host_mntns: u32,
    loaders: HashMap<u32, LoaderStats>,
    diagnosed: HashMap<u32, Diagnosed>,
    /// Objects each process holds now, with its group (place and role at the time); per
    /// group, how many of its processes hold each object (an object shared by several counts
    /// once), and the most bytes the group held at once.
    held: HashMap<u32, (HashSet<InodeId>, (String, RoleKind))>,
    group_now: HashMap<(String, RoleKind), HashMap<InodeId, u32>>,
    group_peak: HashMap<(String, RoleKind), u64>,
    /// Failures and deaths per process.
    outcomes: HashMap<u32, (u64, bool)>,
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
}

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
        if let Some(mntns) = info.mntns {
            self.containers.insert(mntns, info);
        }
    }

    pub fn forget_container(&mut self, mntns: u32) {
        self.containers.remove(&mntns);
    }

    pub fn container(&self, mntns: u32) -> Option<&ContainerInfo> {
        self.containers.get(&mntns)
    }

    /// Names every mount namespace other than shmtrace's own that has no name of its own.
    pub fn set_unnamed_place(&mut self, label: String) {
        self.unnamed_place = Some(label);
    }

    pub fn place(&self, mntns: u32) -> String {
        match (self.containers.get(&mntns), &self.unnamed_place) {
            (Some(container), _) => container.label(),
            _ if mntns == self.host_mntns || mntns == 0 => "host".to_owned(),
            (None, Some(label)) => label.clone(),
            (None, None) => format!("mount namespace {mntns}"),
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

    /// Roles as of the model's current state.
    pub fn roles(&mut self, world: &World) -> &Roles {
        self.roles.update(world);
        &self.roles
    }

    /// Takes in one event, already applied to `world`; returns the diagnoses it completes.
    pub fn observe(&mut self, event: &Event, note: &Annotation, world: &World) -> Vec<Diagnosis> {
        self.roles(world);
        if let Body::Call(call) = &event.body {
            self.learn_loader(event.pid, call, note, world);
            self.learn_requests(call);
            if matches!(
                call.syscall,
                Syscall::Openat
                    | Syscall::Openat2
                    | Syscall::Ftruncate
                    | Syscall::Fallocate
                    | Syscall::Write
                    | Syscall::Mmap
                    | Syscall::Munmap
                    | Syscall::Close
            ) {
                self.update_held(event.pid, event.mntns, world);
            }
            if note.object_path.as_deref().is_some_and(role::is_nccl) {
                self.nccl_seen = true;
            }
        }
        if let Some((pid, cause, kind, dev)) = failure::classify(event, note) {
            let failure = self.failure_now(event, pid, cause, kind, dev, world);
            if let (Some(dev), FailureKind::Call { request, .. }) = (dev, &failure.kind) {
                self.pressure
                    .refused(dev, event.ts_ns, pid, *request, failure.unmet);
            }
            self.outcomes.entry(pid).or_default().0 += 1;
            self.pending.entry(pid).or_default().push(failure);
        }
        let mut out = Vec::new();
        if let Body::Exit(status) = &event.body {
            let group = self.group(event.pid, event.mntns);
            self.held_to(event.pid, HashSet::new(), group, world);
            if !status.success() {
                self.outcomes.entry(event.pid).or_default().1 = true;
            }
            if let Some(diagnosis) = self.on_death(event, *status, note.killed_by, world) {
                out.push(diagnosis);
            }
        }
        out
    }

    /// Diagnoses for failures of processes that were still alive when tracing stopped.
    pub fn finish(&mut self, world: &World) -> Vec<Diagnosis> {
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

    /// Per place and role (as known at the end): processes, most bytes held at once,
    /// failures, deaths.
    pub fn table(&mut self, world: &World) -> Vec<(String, RoleKind, RoleStats)> {
        self.roles(world);
        let mut table: BTreeMap<(String, RoleKind), RoleStats> = BTreeMap::new();
        for process in world.processes() {
            let group = self.group(process.pid, process.mntns);
            let stats = table.entry(group).or_default();
            stats.processes += 1;
            let (failures, died) = self.outcomes.get(&process.pid).copied().unwrap_or_default();
            stats.failures += failures;
            stats.deaths += u64::from(died);
        }
        for (group, peak) in &self.group_peak {
            table.entry(group.clone()).or_default().peak_bytes = *peak;
        }
        table
            .into_iter()
            .map(|((place, role), stats)| (place, role, stats))
            .collect()
    }

    fn group(&self, pid: u32, mntns: u32) -> (String, RoleKind) {
        (self.place(mntns), self.roles.of(pid).kind)
    }

    /// DataLoader facts: batch size (the largest torch_ object its workers sized), and how
    /// many batches one worker keeps in flight.
    fn learn_loader(
        &mut self,
        pid: u32,
        call: &crate::event::Call,
        note: &Annotation,
        world: &World,
    ) {
        let role = self.roles.of(pid);
        let (RoleKind::DataloaderWorker, Some(trainer)) = (role.kind, role.trainer) else {
            return;
        };
        if !note.object_path.as_deref().is_some_and(role::is_torch) {
            return;
        }
        let size = match call.syscall {
            Syscall::Ftruncate => call.args[1],
            Syscall::Fallocate => call.args[3],
            Syscall::Mmap => call.args[1],
            _ => 0,
        };
        let in_flight = world
            .process(pid)
            .map(|p| {
                let mut inodes: HashSet<_> = p.fds.values().map(|fd| fd.inode).collect();
                inodes.extend(p.mappings.iter().map(|m| m.inode));
                inodes
                    .iter()
                    .filter(|inode| {
                        world
                            .object(inode)
                            .and_then(|o| o.path.as_deref())
                            .is_some_and(role::is_torch)
                    })
                    .count() as u32
            })
            .unwrap_or(0);
        let stats = self.loaders.entry(trainer).or_default();
        stats.batch_bytes = stats.batch_bytes.max(size);
        stats.max_in_flight = stats.max_in_flight.max(in_flight);
    }

    /// Sizes asked of /dev/shm objects, for the growth of requests.
    fn learn_requests(&mut self, call: &crate::event::Call) {
        let Some(file) = call.file else { return };
        let request = match call.syscall {
            Syscall::Ftruncate => call.args[1],
            Syscall::Fallocate => call.args[2].saturating_add(call.args[3]),
            _ => return,
        };
        self.pressure.asked(file.inode.dev, request);
    }

    /// Recomputes what `pid` holds (each object once, however many descriptors or mappings).
    fn update_held(&mut self, pid: u32, mntns: u32, world: &World) {
        let Some(process) = world.process(pid) else {
            return;
        };
        let mut inodes: HashSet<_> = process.fds.values().map(|fd| fd.inode).collect();
        inodes.extend(process.mappings.iter().map(|m| m.inode));
        let group = self.group(pid, mntns);
        self.held_to(pid, inodes, group, world);
    }

    fn held_to(
        &mut self,
        pid: u32,
        inodes: HashSet<InodeId>,
        group: (String, RoleKind),
        world: &World,
    ) {
        if let Some((before, old_group)) = self.held.remove(&pid)
            && let Some(counts) = self.group_now.get_mut(&old_group)
        {
            for inode in before {
                if let Some(n) = counts.get_mut(&inode) {
                    *n -= 1;
                    if *n == 0 {
                        counts.remove(&inode);
                    }
                }
            }
        }
        let counts = self.group_now.entry(group.clone()).or_default();
        for inode in &inodes {
            *counts.entry(*inode).or_default() += 1;
        }
        let now: u64 = counts
            .keys()
            .filter_map(|inode| world.object(inode))
            .map(|o| o.footprint().0)
            .sum();
        let peak = self.group_peak.entry(group.clone()).or_default();
        *peak = (*peak).max(now);
        if !inodes.is_empty() {
            self.held.insert(pid, (inodes, group));
        }
    }

    fn failure_now(
        &self,
        event: &Event,
        pid: u32,
        cause: Cause,
        kind: FailureKind,
        dev: Option<u32>,
        world: &World,
    ) -> Failure {
        let workers_allocating = dev
            .map(|dev| {
                world
                    .processes()
                    .filter(|p| p.alive())
                    .filter(|p| self.roles.of(p.pid).kind == RoleKind::DataloaderWorker)
                    .filter(|p| {
                        p.fds.values().any(|fd| fd.inode.dev == dev)
                            || p.mappings.iter().any(|m| m.inode.dev == dev)
                    })
                    .count() as u32
            })
            .unwrap_or(0);
        let comm = world
            .process(pid)
            .map(|p| p.comm.clone())
            .unwrap_or_else(|| event.comm.clone());
        let unmet = match &kind {
            // A write appends: all of it is new.
            FailureKind::Call {
                syscall: "write",
                request,
                ..
            } => *request,
            FailureKind::Call { request, path, .. } => {
                let counted = path
                    .as_ref()
                    .and_then(|p| world.live_objects().find(|o| o.path.as_ref() == Some(p)))
                    // Pages it holds: an ftruncate before a failed fallocate holds nothing.
                    .map(|o| o.allocated)
                    .unwrap_or(0);
                request.saturating_sub(counted)
            }
            _ => 0,
        };
        let capacity = dev
            .and_then(|d| self.capacity.get(&d).copied())
            .map(|c| at_least_held(c, dev.and_then(|d| world.usage(d))))
            .map(|c| at_least_refused(c, cause, &kind));
        let leftovers = match (cause, dev) {
            (Cause::ShmFull, Some(dev)) => leftovers_on(dev, world),
            _ => Vec::new(),
        };
        Failure {
            ts_ns: event.ts_ns,
            pid,
            tid: event.tid,
            comm,
            cause,
            kind,
            dev,
            usage: dev.and_then(|d| world.usage(d).cloned()),
            capacity,
            workers_allocating,
            unmet,
            held: dev.map(|dev| held_on(dev, world)).unwrap_or(0),
            peers: dev.map(|dev| peers_of(pid, dev, world)).unwrap_or(0),
            leftovers,
        }
    }

    fn on_death(
        &mut self,
        event: &Event,
        status: ExitStatus,
        killed_by: Option<u32>,
        world: &World,
    ) -> Option<Diagnosis> {
        let pid = event.pid;
        let failures = self.pending.remove(&pid).unwrap_or_default();
        let role = self.roles.of(pid);
        if failures.is_empty() {
            // Ended by another process on purpose (a parent stopping its children at
            // shutdown): nothing went wrong in it.
            if status.success() || killed_by.is_some() {
                return None;
            }
            // A trainer dying after one of its workers, or any process after its child: that
            // diagnosis says why.
            let failed_worker = self
                .first_failed_worker(pid)
                .or_else(|| self.first_failed_child(pid, world));
            let touched_shm = world
                .process(pid)
                .is_some_and(|p| !p.opened.is_empty() || role.kind != RoleKind::Other);
            let by_signal = matches!(status, ExitStatus::Signal { .. });
            if failed_worker.is_none() && !by_signal && !touched_shm {
                return None; // an ordinary non-zero exit, nothing to do with /dev/shm
            }
            let mut diagnosis = self.diagnose(
                pid,
                event.mntns,
                event.ts_ns,
                Some(status),
                Vec::new(),
                world,
            );
            if let Some(worker) = failed_worker {
                self.follow(&mut diagnosis, worker);
            }
            return Some(diagnosis);
        }
        Some(self.diagnose(pid, event.mntns, event.ts_ns, Some(status), failures, world))
    }

    /// Of `trainer`'s diagnosed workers, the one whose failure came first; failing that (none
    /// had a failure of its own, say all were killed), the lowest pid.
    fn first_failed_worker(&self, trainer: u32) -> Option<u32> {
        let diagnosed: Vec<(u32, &Diagnosed)> = self
            .roles
            .workers_of(trainer)
            .filter_map(|(worker, _)| Some((worker, self.diagnosed.get(&worker)?)))
            .collect();
        diagnosed
            .iter()
            .filter_map(|(worker, d)| Some((d.first_failure_ns?, *worker)))
            .min()
            .map(|(_, worker)| worker)
            .or_else(|| diagnosed.iter().map(|(worker, _)| *worker).min())
    }

    /// Of `parent`'s children, the one diagnosed with the earliest failure: a multiprocessing
    /// parent whose writer died of SIGBUS, a launcher whose NCCL rank failed.
    fn first_failed_child(&self, parent: u32, world: &World) -> Option<u32> {
        world
            .processes()
            .filter(|p| p.parent == Some(parent))
            .filter_map(|p| Some((self.diagnosed.get(&p.pid)?.first_failure_ns?, p.pid)))
            .min()
            .map(|(_, child)| child)
    }

    /// Makes `diagnosis` (of a process with no failure of its own) point to the process whose
    /// failure it died of, and take that cause: a trainer killed by its worker's ENOSPC died of
    /// /dev/shm too, and the same size fixes it.
    fn follow(&mut self, diagnosis: &mut Diagnosis, followed: u32) {
        diagnosis.follows = Some(followed);
        let Some(other) = self.diagnosed.get(&followed).cloned() else {
            return;
        };
        if other.first_failure_ns.is_none() {
            return;
        }
        diagnosis.cause = other.cause;
        diagnosis.recommendation = other.recommendation.clone();
        diagnosis.explanation = explain(other.cause);
        self.diagnosed.insert(
            diagnosis.pid,
            Diagnosed {
                first_failure_ns: None,
                cause: other.cause,
                recommendation: other.recommendation,
            },
        );
    }

    fn diagnose(
        &mut self,
        pid: u32,
        mntns: u32,
        ts_ns: u64,
        ending: Option<ExitStatus>,
        mut failures: Vec<Failure>,
        world: &World,
    ) -> Diagnosis {
        let first_failure_ns = failures.iter().map(|f| f.ts_ns).min();
        // The decisive failure first: an OOM kill explains more than the ENOSPC before it.
        failures.sort_by_key(|f| (f.cause, f.ts_ns));
        let cause = match (failures.first(), ending) {
            (Some(f), _) => f.cause,
            (None, Some(ExitStatus::Signal { .. })) => Cause::Crash,
            _ => Cause::Other,
        };
        let process = world.process(pid);
        let role = self.roles.of(pid);
        let container = self.containers.get(&mntns).cloned();
        let title = process.and_then(|p| p.title.clone());
        let program = failures
            .iter()
            .find_map(|f| match &f.kind {
                FailureKind::Call { path: Some(p), .. }
                | FailureKind::Fault { path: Some(p), .. } => known::by_object(p),
                _ => None,
            })
            .or_else(|| {
                process.and_then(|p| {
                    known::by_process(&p.comm, title.as_deref())
                        .or_else(|| p.opened.iter().find_map(|o| known::by_object(o)))
                })
            });
        let program_role = program
            .zip(title.as_deref())
            .and_then(|(k, t)| known::role_in_title(k, t));
        let leftovers = failures
            .first()
            .filter(|f| f.cause == Cause::ShmFull && !f.leftovers.is_empty())
            .map(|f| summarise_leftovers(f, program, container.as_ref()));
        let cause = match (&leftovers, cause) {
            (Some(l), Cause::ShmFull) if l.enough_without => Cause::Leftovers,
            _ => cause,
        };
        let started_by = container
            .as_ref()
            .map(|c| c.started_by.clone())
            .unwrap_or(StartedBy::Unknown);
        let trainer = role.trainer.map(|t| {
            (
                t,
                world.process(t).map(|p| p.argv.clone()).unwrap_or_default(),
            )
        });
        let primary = failures.first();
        let capacity = primary.and_then(|f| f.capacity);
        let usage = primary.and_then(|f| f.usage.clone());
        let recommendation = (cause == Cause::ShmFull).then(|| {
            let primary = primary.expect("a cause from a failure");
            let traced = primary.held;
            let (burst, growth) = self.pressure.at(primary);
            let dataloader = role
                .trainer
                .or((role.kind == RoleKind::Trainer).then_some(pid))
                .and_then(|t| {
                    let stats = self.loaders.get(&t)?;
                    let workers = self.roles.workers_of(t).count() as u32;
                    (stats.batch_bytes > 0 && workers > 0).then(|| DataloaderDemand {
                        workers,
                        // A failure early in the run shows fewer than a DataLoader queues by
                        // default.
                        in_flight: stats.max_in_flight.max(recommend::DEFAULT_PREFETCH),
                        batch_bytes: stats.batch_bytes,
                    })
                });
            recommend::recommend(
                &Demand {
                    traced,
                    others: capacity
                        .map(|c| {
                            let beyond = c.used.saturating_sub(traced);
                            // A DataLoader's batches reach the trainer through descriptors
                            // passed untraced, so the model misses some of their pages: there,
                            // use beyond the traced objects is the batches' own, which the
                            // DataLoader figure counts already; others' is at most what was
                            // there before.
                            match (&dataloader, self.first_used.get(&c.dev)) {
                                (Some(_), Some(first)) => beyond.min(*first),
                                _ => beyond,
                            }
                        })
                        .unwrap_or(0),
                    burst,
                    growth,
                    dataloader,
                    capacity: capacity.map(|c| c.size),
                },
                self.nccl_seen,
                &started_by,
            )
        });
        self.diagnosed.insert(
            pid,
            Diagnosed {
                first_failure_ns,
                cause,
                recommendation: recommendation.clone(),
            },
        );
        let already: Vec<&str> = recommendation
            .iter()
            .flat_map(|r| r.alternatives.iter().map(String::as_str))
            .collect();
        let program_alternatives = match cause {
            Cause::ShmFull | Cause::NoShm | Cause::ReadOnly => program
                .map(|k| k.alternatives)
                .unwrap_or_default()
                .iter()
                .filter(|alt| !already.iter().any(|a| known::same_setting(a, alt)))
                .map(|alt| (*alt).to_owned())
                .collect(),
            _ => Vec::new(),
        };
        Diagnosis {
            ts_ns,
            pid,
            container_pid: process.and_then(|p| p.nspid),
            comm: process.map(|p| p.comm.clone()).unwrap_or_default(),
            title,
            program,
            program_role,
            role,
            argv: process.map(|p| p.argv.clone()).unwrap_or_default(),
            trainer,
            place: self.place(mntns),
            container,
            ending,
            cause,
            workers_allocating: primary.map(|f| f.workers_allocating).unwrap_or(0),
            failures,
            follows: None,
            capacity,
            usage,
            recommendation,
            explanation: explain(cause),
            leftovers,
            program_alternatives,
            lost_events: self.lost_events,
        }
    }
}

/// Pages the live objects on /dev/shm `dev` hold: a mapped object counts by its size, as its
/// pages may have been written through the mapping; others by their allocated pages, as a file
/// that was only ftruncated holds nothing.
fn held_on(dev: u32, world: &World) -> u64 {
    world
        .live_objects()
        .filter(|o| o.inode.dev == dev)
        .map(|o| {
            if o.mappings > 0 {
                o.allocated.max(o.size.max(0) as u64)
            } else {
                o.allocated
            }
        })
        .sum()
}

/// Live processes other than `pid` that hold (by descriptor or mapping) an object on /dev/shm
/// `dev` that `pid` holds too, other than those its parent holds.
fn peers_of(pid: u32, dev: u32, world: &World) -> u32 {
    let holds = |p: &crate::model::Process| -> HashSet<crate::event::InodeId> {
        p.fds
            .values()
            .map(|fd| fd.inode)
            .chain(p.mappings.iter().map(|m| m.inode))
            .filter(|inode| inode.dev == dev)
            .collect()
    };
    let Some(process) = world.process(pid) else {
        return 0;
    };
    // What it inherited with everyone else from its parent (PostgreSQL's postmaster maps its
    // control segment into every backend) says nothing about who works with it.
    let inherited = process
        .parent
        .and_then(|parent| world.process(parent))
        .map(holds)
        .unwrap_or_default();
    let own: HashSet<_> = holds(process).difference(&inherited).copied().collect();
    if own.is_empty() {
        return 0;
    }
    world
        .processes()
        .filter(|p| p.pid != pid && p.alive())
        .filter(|p| !holds(p).is_disjoint(&own))
        .count() as u32
}

/// For causes a bigger /dev/shm does not fix: what does.
fn explain(cause: Cause) -> Option<String> {
    let text = match cause {
        Cause::ShmFull | Cause::Leftovers => return None,
        Cause::NoShm => {
            "there is no /dev/shm to create files in: the container was started with \
             --ipc=none, or its image or sandbox has no /dev/shm. Give it one: drop --ipc=none \
             (docker run --ipc=private --shm-size=64m ..., compose ipc: private), or mount a \
             tmpfs there (docker run --tmpfs /dev/shm:rw,size=64m; Kubernetes: an emptyDir \
             with medium: Memory mounted at /dev/shm)"
        }
        Cause::ReadOnly => {
            "/dev/shm is mounted read-only (EROFS): programs need to create files there. \
             Mount it read-write (docker run --tmpfs /dev/shm:rw,size=64m, or drop ro/readonly \
             from its mount; Kubernetes: readOnly: false on the /dev/shm volumeMount)"
        }
        Cause::OomKill => {
            "the OOM killer ended it: the memory limit was reached. /dev/shm pages count \
             against the container's memory limit, so a bigger --shm-size alone makes this \
             worse: raise the memory limit (docker --memory, Kubernetes resources.limits.memory) \
             or use less /dev/shm"
        }
        Cause::MapLimit => {
            "mmap failed with ENOMEM: the process reached vm.max_map_count, not the end of \
             /dev/shm. Raise it (sysctl -w vm.max_map_count=262144) or keep fewer mappings"
        }
        Cause::FdLimit => {
            "it ran out of file descriptors (EMFILE/ENFILE), not of /dev/shm. Raise the limit \
             (ulimit -n 65536; docker run --ulimit nofile=65536:65536), or in PyTorch use \
             torch.multiprocessing.set_sharing_strategy('file_system')"
        }
        Cause::SysvLimit => {
            "a System V shared memory limit refused it (kernel.shmmax for one segment, \
             kernel.shmall for all, kernel.shmmni for their number; see ipcs -l): raise it with \
             sysctl, or docker run --sysctl kernel.shmmax=..."
        }
        Cause::Crash => {
            "it died of a signal with no /dev/shm failure before it: not a /dev/shm problem"
        }
        Cause::Other => "no /dev/shm failure was seen before it ended: not a /dev/shm problem",
    };
    Some(text.to_owned())
}

#[cfg(test)]
mod tests;
