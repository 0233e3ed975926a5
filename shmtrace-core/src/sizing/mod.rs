//! How much /dev/shm a workload needs, measured while it works (`shmtrace size`).
//!
//! The measure is pages allocated (the inodes' `i_blocks`, as the kernel reports them at every
//! call on a /dev/shm object: open, ftruncate, fallocate, write, mmap, close), summed over the
//! live objects of every traced process on each /dev/shm, at every event; and, where /dev/shm
//! was measured with statfs (at start, at failures and once a second for containers), its use
//! beyond what it held before the workload started, which also sees pages written through a
//! mapping between two calls. The peak of the two is what the workload needs at once.
mod render;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

pub use render::text;

use crate::{
    capacity::Capacity,
    diagnose::{
        Cause, DEFAULT_PREFETCH, DataloaderDemand, Diagnosis, Recommendation, RoleKind,
        TRAINER_HOLDS, advise, known, role, space_check::RayStore,
    },
    event::{Body, Event, ExitStatus, InodeId, names},
    model::{Annotation, ShmObject, StartedBy, World},
    units::{count, human},
};

/// Objects listed as live at the peak, largest first.
const LIVE_AT_PEAK: usize = 8;

/// One /dev/shm and what the workload took of it.
#[derive(Clone, Debug, Default)]
struct Shm {
    place: String,
    started_by: Option<StartedBy>,
    /// Pages held by traced objects now, and at most.
    now: u64,
    peak: u64,
    peak_ns: u64,
    at_peak: Vec<LiveObject>,
    /// Live objects as of the last event, for the moment of a statfs peak.
    live_now: Vec<LiveObject>,
    statfs_at_peak: Vec<LiveObject>,
    /// statfs: its size, its use before the workload, the most used beyond that.
    size: Option<u64>,
    baseline: Option<u64>,
    statfs_peak: u64,
    statfs_peak_ns: u64,
    /// The largest `torch_` object: a DataLoader batch.
    batch_bytes: u64,
    /// Ray's object store kept here: Ray asks for its size free, not for its pages.
    ray_store: Option<RayStore>,
    /// The most the live objects' sizes (not their pages) came to at once: what a program
    /// that looks at the free space before making its files (Open MPI) compares with it.
    sizes_peak: u64,
}

/// Object at the peak.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveObject {
    pub name: String,
    /// Pages it held as the kernel last reported them.
    pub bytes: u64,
    /// Its size (`i_size`).
    pub size: u64,
    /// It was mapped: pages written through the mapping show only in statfs.
    pub mapped: bool,
    pub pid: Option<u32>,
    pub role: &'static str,
}

/// Watches a trace and keeps the peaks.
#[derive(Default)]
pub struct Sizer {
    shms: BTreeMap<u32, Shm>,
    /// Who first touched each object (its creator, or the process it was passed to).
    owners: HashMap<InodeId, (u32, RoleKind)>,
    start_ns: Option<u64>,
    end_ns: u64,
    failures: Vec<SizeFailure>,
    /// The largest size a diagnosis of a failure advised.
    advised_after_failure: Option<Recommendation>,
    /// DataLoader workers alive now, and the most alive at once (each epoch starts new ones).
    workers: BTreeSet<u32>,
    most_workers: u32,
    /// A traced process looked at a /dev/shm's free space (statfs).
    looked_at_space: bool,
}

impl Sizer {
    pub fn new() -> Sizer {
        Sizer::default()
    }

    /// An event, already applied to `world`, by a process of `role` in `place`.
    pub fn event(
        &mut self,
        event: &Event,
        note: &Annotation,
        role: RoleKind,
        place: &str,
        world: &World,
    ) {
        self.start_ns.get_or_insert(event.ts_ns);
        self.end_ns = self.end_ns.max(event.ts_ns);
        if matches!(event.body, Body::Exit(_)) {
            self.workers.remove(&event.pid);
        } else if role == RoleKind::DataloaderWorker {
            self.workers.insert(event.pid);
            self.most_workers = self.most_workers.max(self.workers.len() as u32);
        }
        let mut touched = None;
        if let Body::Call(call) = &event.body
            && call.space_seen().is_some()
        {
            self.looked_at_space = true;
        }
        if let Body::Call(call) = &event.body
            && let Some(file) = call.file
        {
            self.owners.entry(file.inode).or_insert((event.pid, role));
            let shm = self.shms.entry(file.inode.dev).or_default();
            if shm.place.is_empty() {
                shm.place = place.to_owned();
            }
            if shm.ray_store.is_none() {
                shm.ray_store = world
                    .process(event.pid)
                    .and_then(RayStore::of)
                    .filter(RayStore::in_dev_shm);
            }
            touched = Some(file.inode.dev);
        }
        let freed = !note.freed.is_empty();
        let changed: Vec<u32> = world
            .usages()
            .filter(|(dev, usage)| {
                self.shms
                    .get(dev)
                    .is_some_and(|shm| shm.now != usage.allocated || freed || touched == Some(*dev))
            })
            .map(|(dev, _)| dev)
            .collect();
        for dev in changed {
            self.remeasure(dev, event.ts_ns, world);
        }
    }

    pub fn capacity(&mut self, sample: &Capacity) {
        let Some(shm) = self.shms.get_mut(&sample.dev) else {
            // Not (yet) a /dev/shm the workload used: its use now is the baseline.
            self.shms.insert(
                sample.dev,
                Shm {
                    size: Some(sample.size),
                    baseline: Some(sample.used),
                    ..Shm::default()
                },
            );
            return;
        };
        shm.size = Some(sample.size);
        // What others held before the workload's first object: the first sample, less what
        // the workload held then.
        let baseline = *shm
            .baseline
            .get_or_insert(sample.used.saturating_sub(shm.now));
        let beyond = sample.used.saturating_sub(baseline);
        if beyond > shm.statfs_peak {
            shm.statfs_peak = beyond;
            shm.statfs_peak_ns = sample.ts_ns;
            shm.statfs_at_peak = shm.live_now.clone();
        }
    }

    pub fn container(&mut self, dev: Option<u32>, place: String, started_by: StartedBy) {
        if let Some(dev) = dev {
            let shm = self.shms.entry(dev).or_default();
            shm.place = place;
            shm.started_by = Some(started_by);
        }
    }

    pub fn diagnosis(&mut self, diagnosis: &Diagnosis) {
        if let Some(r) = &diagnosis.recommendation
            && self
                .advised_after_failure
                .as_ref()
                .is_none_or(|before| before.min_bytes < r.min_bytes)
        {
            self.advised_after_failure = Some(r.clone());
        }
        if let Some(failure) = diagnosis.failures.first() {
            self.failures.push(SizeFailure {
                pid: diagnosis.pid,
                comm: crate::event::escape::text(&diagnosis.comm),
                cause: failure.cause,
                what: failure.headline(),
            });
        }
    }

    fn remeasure(&mut self, dev: u32, ts_ns: u64, world: &World) {
        let live: Vec<&ShmObject> = world
            .live_objects()
            .filter(|o| o.inode.dev == dev)
            .collect();
        let shm = self.shms.get_mut(&dev).expect("checked by the caller");
        shm.now = world.usage(dev).map(|u| u.allocated).unwrap_or(0);
        let mut live_now: Vec<LiveObject> = Vec::with_capacity(live.len());
        for object in &live {
            let (pid, role) = self
                .owners
                .get(&object.inode)
                .copied()
                .unwrap_or((object.creator.unwrap_or(0), RoleKind::Other));
            let size = object.size.max(0) as u64;
            let mapped = object.mappings > 0;
            // A mapping may have written every page: count those of a mapped object by size.
            let held = if mapped {
                object.allocated.max(size)
            } else {
                object.allocated
            };
            if object.path.as_deref().is_some_and(role::is_torch) {
                shm.batch_bytes = shm.batch_bytes.max(object.allocated);
            }
            if held > 0 {
                live_now.push(LiveObject {
                    name: object.display_name(),
                    bytes: object.allocated,
                    size,
                    mapped,
                    pid: (pid != 0).then_some(pid),
                    role: role.describe(),
                });
            }
        }
        let sizes: u64 = live.iter().map(|o| o.size.max(0) as u64).sum();
        shm.sizes_peak = shm.sizes_peak.max(sizes);
        live_now
            .sort_by(|a, b| (b.bytes.max(b.size), &a.name).cmp(&(a.bytes.max(a.size), &b.name)));
        if shm.now > shm.peak {
            shm.peak = shm.now;
            shm.peak_ns = ts_ns;
            shm.at_peak = live_now.clone();
        }
        shm.live_now = live_now;
    }

    /// The result, checked against `budget` when one is given.
    pub fn report(&self, budget: Option<u64>, lost: u64) -> SizeReport {
        let shms: Vec<ShmReport> = self
            .shms
            .iter()
            .filter(|(_, shm)| shm.peak > 0 || shm.statfs_peak > 0)
            .map(|(dev, shm)| self.shm_report(*dev, shm))
            .collect();
        let needed = shms.iter().map(|s| s.with_headroom).max();
        SizeReport {
            duration_s: self
                .end_ns
                .saturating_sub(self.start_ns.unwrap_or(self.end_ns))
                as f64
                / 1e9,
            shm: shms,
            failures: self.failures.clone(),
            lost_events: lost,
            budget: budget.map(|budget| {
                let unmeasured = self.failures.iter().any(SizeFailure::for_lack_of_shm);
                Budget {
                    bytes: budget,
                    needed: needed.unwrap_or(0),
                    fits: needed.unwrap_or(0) <= budget && !unmeasured,
                    unmeasured,
                    measure_on: unmeasured.then(|| needed.unwrap_or(0).max(budget)),
                }
            }),
            command: None,
        }
    }

    fn shm_report(&self, dev: u32, shm: &Shm) -> ShmReport {
        let (peak, peak_ns, measured_by, at_peak) = if shm.statfs_peak > shm.peak {
            (
                shm.statfs_peak,
                shm.statfs_peak_ns,
                "statfs",
                &shm.statfs_at_peak,
            )
        } else {
            (shm.peak, shm.peak_ns, "system calls", &shm.at_peak)
        };
        let live = at_peak.len();
        let processes = {
            let mut pids: Vec<u32> = at_peak.iter().filter_map(|o| o.pid).collect();
            pids.sort();
            pids.dedup();
            pids.len()
        };
        let basis = format!(
            "peak {} allocated at once ({}, {} of {}; measured by {measured_by})",
            human(peak),
            self.seconds(peak_ns),
            count(live as u64, "live object"),
            if processes == 1 {
                "1 process".to_owned()
            } else {
                format!("{processes} processes")
            }
        );
        let started_by = shm.started_by.clone().unwrap_or(StartedBy::Unknown);
        let workers = self.most_workers;
        let loader = (workers > 0 && shm.batch_bytes > 0).then_some(DataloaderDemand {
            workers,
            in_flight: DEFAULT_PREFETCH,
            batch_bytes: shm.batch_bytes,
        });
        // How many batches a DataLoader has in flight at its peak depends on how fast the
        // trainer takes them, which varies from run to run (a fast trainer can leave workers
        // one batch ahead in one run and two in the next). What the default queue holds is the
        // floor of the advice, so that a lucky measurement does not advise too little.
        let (need, basis) = match loader.map(|loader| loader.measured()) {
            Some(floor) if floor > peak => (
                floor,
                format!(
                    "{basis}; but a DataLoader of {} queues up to ({workers} x {DEFAULT_PREFETCH} \
                     batches + {TRAINER_HOLDS} the trainer holds as it takes the next) x {} = \
                     {}, more than this run held at once",
                    count(u64::from(workers), "worker"),
                    human(shm.batch_bytes),
                    human(floor)
                ),
            ),
            _ => (peak, basis),
        };
        // Ray decides from the free space, so its sparse store's pages say too little.
        let (need, basis) = match &shm.ray_store {
            Some(store) if store.free_needed() > need => (
                store.free_needed(),
                format!("{basis}; but {}", store.rule_text()),
            ),
            _ => (need, basis),
        };
        // A program that looks at the free space before it makes its files asks for their
        // sizes free, whatever pages they come to hold.
        let (need, basis) = if self.looked_at_space && shm.sizes_peak > need {
            (
                shm.sizes_peak,
                format!(
                    "{basis}; but it looks at /dev/shm's free space before making its files \
                     (statfs), and their sizes came to {} at once",
                    human(shm.sizes_peak)
                ),
            )
        } else {
            (need, basis)
        };
        let mut advice = advise(need, &basis, &started_by);
        // A run that failed for lack of /dev/shm measured only what fitted: the failures'
        // diagnosis knows better what was asked.
        if let Some(failed) = &self.advised_after_failure
            && failed.min_bytes > advice.min_bytes
        {
            advice = Recommendation {
                basis: format!(
                    "{basis}, only what fitted, as processes failed for lack of /dev/shm; their \
                     diagnosis: {}",
                    failed.basis
                ),
                ..failed.clone()
            };
        }
        let dataloader_bound = loader.map(|loader| {
            DataloaderDemand {
                in_flight: 0,
                ..loader
            }
            .bound()
        });
        ShmReport {
            place: if shm.place.is_empty() {
                "host".to_owned()
            } else {
                shm.place.clone()
            },
            dev: InodeId { dev, ino: 0 }.dev_string(),
            size: shm.size,
            peak_bytes: peak,
            peak_ns,
            peak_after_s: self.seconds_f(peak_ns),
            measured_by,
            syscall_peak_bytes: shm.peak,
            statfs_peak_bytes: shm.size.map(|_| shm.statfs_peak),
            roles: roles_at(peak, at_peak),
            live_at_peak: collapse_semaphores(at_peak)
                .into_iter()
                .take(LIVE_AT_PEAK)
                .collect(),
            live_at_peak_total: live,
            // What is advised, floors included: a budget that fits the peak alone would pass a
            // DataLoader or a Ray store that the advice says needs more.
            with_headroom: advice.min_bytes,
            dataloader_bound,
            near_full: shm.size.is_some_and(|size| peak * 10 >= size * 9),
            advice,
        }
    }

    fn seconds_f(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.start_ns.unwrap_or(ts_ns)) as f64 / 1e9
    }

    fn seconds(&self, ts_ns: u64) -> String {
        format!("{:.3} s after the start", self.seconds_f(ts_ns))
    }
}

/// What `shmtrace size` prints, and with `--json` writes as one object.
#[derive(Clone, Debug, Serialize)]
pub struct SizeReport {
    pub duration_s: f64,
    pub shm: Vec<ShmReport>,
    /// Processes that failed while it was measured: the peak may then be short of the need.
    pub failures: Vec<SizeFailure>,
    pub lost_events: u64,
    pub budget: Option<Budget>,
    /// How the traced command ended (`size -- CMD`): with `--budget` shmtrace's exit status
    /// is the verdict, so the command's own is here. `None` without a command.
    pub command: Option<CommandEnd>,
}

/// How a traced command ended: an exit code, or the signal that killed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CommandEnd {
    pub exit_code: Option<i32>,
    /// The signal's name (`SIGTERM`).
    pub signal: Option<String>,
}

impl CommandEnd {
    pub fn of(status: ExitStatus) -> CommandEnd {
        match status {
            ExitStatus::Code(code) => CommandEnd {
                exit_code: Some(code),
                signal: None,
            },
            ExitStatus::Signal { signo, .. } => CommandEnd {
                exit_code: None,
                signal: Some(names::signal_name(signo)),
            },
        }
    }

    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ShmReport {
    /// Host, or the container whose /dev/shm it is.
    pub place: String,
    pub dev: String,
    /// Its size, when it was measured.
    pub size: Option<u64>,
    pub peak_bytes: u64,
    #[serde(skip)]
    pub peak_ns: u64,
    pub peak_after_s: f64,
    /// `system calls` or `statfs`: which measure gave the peak.
    pub measured_by: &'static str,
    pub syscall_peak_bytes: u64,
    pub statfs_peak_bytes: Option<u64>,
    pub roles: Vec<RolePeak>,
    pub live_at_peak: Vec<LiveObject>,
    /// How many objects were live at the peak (the list shows the largest).
    pub live_at_peak_total: usize,
    /// The size advised (the need, headroom added, rounded): what `--budget` is checked
    /// against.
    pub with_headroom: u64,
    /// PyTorch's rule of thumb for the DataLoader seen, for comparison only.
    pub dataloader_bound: Option<u64>,
    /// The peak came within 10% of the /dev/shm size: it was not roomy enough to measure.
    pub near_full: bool,
    pub advice: Recommendation,
}

/// What the objects of one role's making held at the peak; the rows add up to the peak.
#[derive(Clone, Debug, Serialize)]
pub struct RolePeak {
    /// The role of the process that made (or first touched) the objects; `unseen` for pages
    /// statfs counted that the traced calls had not shown (calls still running, writes
    /// through mappings, processes not traced).
    pub role: &'static str,
    pub bytes_at_peak: u64,
}

/// A process that failed while the workload was measured.
#[derive(Clone, Debug, Serialize)]
pub struct SizeFailure {
    pub pid: u32,
    pub comm: String,
    pub cause: Cause,
    /// Its decisive failure: `fallocate of 46.0 MiB on /dev/shm/torch_1 returned ENOSPC`.
    pub what: String,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Budget {
    pub bytes: u64,
    pub needed: u64,
    /// The advice fits the budget, and the run measured what it needed: nothing failed for
    /// lack of /dev/shm.
    pub fits: bool,
    /// Processes failed for lack of /dev/shm while the workload was measured: the peak is
    /// what fitted, so no budget can be said to fit.
    pub unmeasured: bool,
    /// When unmeasured: a /dev/shm size to measure again on (the failures' diagnoses' advice,
    /// or more).
    pub measure_on: Option<u64>,
}

impl SizeFailure {
    /// It failed because /dev/shm was full: the workload got less than it asked for.
    pub fn for_lack_of_shm(&self) -> bool {
        matches!(self.cause, Cause::ShmFull | Cause::Leftovers)
    }
}

/// The roles whose objects were live at the peak, largest first, and what statfs saw beyond
/// them: rows that add up to `peak`.
fn roles_at(peak: u64, at_peak: &[LiveObject]) -> Vec<RolePeak> {
    let mut by_role: BTreeMap<&'static str, u64> = BTreeMap::new();
    for object in at_peak {
        *by_role.entry(object.role).or_default() += object.bytes;
    }
    let seen: u64 = by_role.values().sum();
    let mut rows: Vec<RolePeak> = by_role
        .into_iter()
        .filter(|(_, bytes)| *bytes > 0)
        .map(|(role, bytes)| RolePeak {
            role,
            bytes_at_peak: bytes,
        })
        .collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes_at_peak));
    if peak > seen {
        rows.push(RolePeak {
            role: UNSEEN,
            bytes_at_peak: peak - seen,
        });
    }
    rows
}

/// `objects` (largest first) with the POSIX semaphores among them as one entry, after the
/// rest: a page each, dozens of them, never what a size is about.
fn collapse_semaphores(objects: &[LiveObject]) -> Vec<LiveObject> {
    let (semaphores, mut rest): (Vec<&LiveObject>, Vec<&LiveObject>) = objects
        .iter()
        .partition(|o| known::is_posix_semaphore(&o.name));
    let mut out: Vec<LiveObject> = rest.drain(..).cloned().collect();
    match semaphores.as_slice() {
        [] => {}
        [one] => out.push((*one).clone()),
        many => {
            let mut pids: Vec<u32> = many.iter().filter_map(|o| o.pid).collect();
            pids.sort_unstable();
            pids.dedup();
            out.push(LiveObject {
                name: format!("{} POSIX semaphores (/dev/shm/sem.*)", many.len()),
                bytes: many.iter().map(|o| o.bytes).sum(),
                size: many.iter().map(|o| o.size).sum(),
                mapped: many.iter().any(|o| o.mapped),
                pid: (pids.len() == 1).then(|| pids[0]),
                role: many[0].role,
            });
        }
    }
    out
}

/// The row of [`roles_at`] for pages no system call showed.
pub const UNSEEN: &str = "unseen";
