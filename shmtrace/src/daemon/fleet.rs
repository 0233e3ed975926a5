//! The containers on this node, as the metrics see them: which mount namespace is which
//! container, which of them touched /dev/shm (only those have series), and when a gone one's
//! series retire.
//!
//! A series is named by its labels (container, pod, namespace, runtime), not by the runtime's
//! id: a container restarted, or re-created under its name, continues its series.
//!
//! Events can arrive before the runtimes are asked about a new container (a container that
//! fails as it starts). What they count waits, per mount namespace, for the next survey of the
//! runtimes, which is then asked for at once; a namespace that three surveys do not claim is
//! counted as `runtime="unknown"`. Namespace numbers are recycled: a container that claims the number
//! is credited only if its main process started before the first event waiting there.
use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant},
};

use super::metrics::{ContainerLabels, DeathLabels, FailureLabels, Metrics};
use crate::{capacity::Capacity, container::Container};

/// Something to count for whoever a namespace turns out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tally {
    /// A /dev/shm call: the container has series from now on.
    Touch,
    Failure {
        syscall: String,
        errno: String,
    },
    Sigbus,
    Death {
        role: String,
    },
    Recommended(u64),
}

/// Bounds on what waits for a survey, so that a flood of events in unknown namespaces costs
/// fixed memory (beyond them, tallies go to `runtime="unknown"` at once).
const MAX_PENDING_NAMESPACES: usize = 256;
const MAX_PENDING_PER_NAMESPACE: usize = 1024;
/// How many exited processes' namespaces are remembered, for diagnoses that come after the
/// death.
const EXITED_REMEMBERED: usize = 4096;
/// Surveys a namespace waits through before its counts go to `runtime="unknown"`.
const SURVEYS_WAITED: u32 = 3;

struct Pending {
    since: Instant,
    /// Surveys that ended since, without claiming the namespace. A runtime that answers
    /// slowly may leave a container out of one answer: a few are waited for.
    surveys: u32,
    /// The earliest event's time (`CLOCK_BOOTTIME` ns).
    first_ts_ns: u64,
    tallies: Vec<Tally>,
}

/// A series' container.
struct Tracked {
    id: String,
    pid: Option<u32>,
    /// When its main process started (`CLOCK_BOOTTIME` ns): an event from before is not its
    /// own, whatever its namespace number says.
    start_ns: Option<u64>,
    mntns: Option<u32>,
    shm_dev: Option<u32>,
    /// Has series (touched /dev/shm).
    touched: bool,
    peak: u64,
    gone_since: Option<Instant>,
    /// Label combinations used in the families with more labels, to retire them.
    failures: HashSet<(String, String)>,
    roles: HashSet<String>,
}

/// What a survey changed, for the caller to tell the tracer and the pipeline.
#[derive(Default)]
pub struct Changes {
    /// Containers seen for the first time, or with a new main process (restarted).
    pub started: Vec<Container>,
    /// Mount namespaces of containers that stopped or were replaced.
    pub stopped_mntns: Vec<u32>,
}

pub struct Fleet {
    metrics: Metrics,
    host_mntns: u32,
    retain: Duration,
    by_labels: HashMap<ContainerLabels, Tracked>,
    by_mntns: HashMap<u32, ContainerLabels>,
    pending: HashMap<u32, Pending>,
    pid_mntns: HashMap<u32, u32>,
    exited: VecDeque<u32>,
    survey_wanted: bool,
}

impl Fleet {
    pub fn new(metrics: Metrics, host_mntns: u32, retain: Duration) -> Fleet {
        Fleet {
            metrics,
            host_mntns,
            retain,
            by_labels: HashMap::new(),
            by_mntns: HashMap::new(),
            pending: HashMap::new(),
            pid_mntns: HashMap::new(),
            exited: VecDeque::new(),
            survey_wanted: false,
        }
    }

    /// Whether an event came from a namespace no survey has claimed yet.
    pub fn take_survey_wanted(&mut self) -> bool {
        std::mem::take(&mut self.survey_wanted)
    }

    pub fn want_survey(&mut self) {
        self.survey_wanted = true;
    }

    /// A process acted in `mntns`.
    pub fn saw_process(&mut self, pid: u32, mntns: u32) {
        self.pid_mntns.insert(pid, mntns);
    }

    /// A process exited; its namespace is kept a while for the diagnosis that follows.
    pub fn process_exited(&mut self, pid: u32) {
        self.exited.push_back(pid);
        while self.exited.len() > EXITED_REMEMBERED {
            if let Some(old) = self.exited.pop_front() {
                self.pid_mntns.remove(&old);
            }
        }
    }

    pub fn mntns_of(&self, pid: u32) -> Option<u32> {
        self.pid_mntns.get(&pid).copied()
    }

    /// Counts `tally`, of an event at `ts_ns`, for the container of `mntns` (or the host), now
    /// or after the next survey.
    pub fn tally_in(&mut self, mntns: u32, tally: Tally, ts_ns: u64, now: Instant) {
        if mntns == self.host_mntns {
            self.apply(&ContainerLabels::host(), tally);
            return;
        }
        if let Some(labels) = self.by_mntns.get(&mntns).cloned() {
            // An event read late, from before this container took the number: not its own.
            let before = self.by_labels[&labels]
                .start_ns
                .is_some_and(|start| ts_ns < start);
            let labels = if before {
                ContainerLabels::unknown()
            } else {
                labels
            };
            self.apply(&labels, tally);
            return;
        }
        if !self.pending.contains_key(&mntns) && self.pending.len() >= MAX_PENDING_NAMESPACES {
            self.apply(&ContainerLabels::unknown(), tally);
            return;
        }
        let pending = self.pending.entry(mntns).or_insert_with(|| Pending {
            since: now,
            surveys: 0,
            first_ts_ns: ts_ns,
            tallies: Vec::new(),
        });
        pending.first_ts_ns = pending.first_ts_ns.min(ts_ns);
        if pending.tallies.len() >= MAX_PENDING_PER_NAMESPACE {
            self.apply(&ContainerLabels::unknown(), tally);
            return;
        }
        if tally != Tally::Touch || !pending.tallies.contains(&Tally::Touch) {
            pending.tallies.push(tally);
        }
        self.survey_wanted = true;
    }

    /// Counts `tally` for the container with this runtime id, if it is followed.
    pub fn tally_for_id(&mut self, id: &str, tally: Tally) -> Result<(), Tally> {
        let labels = self
            .by_labels
            .iter()
            .find(|(_, t)| t.id == id)
            .map(|(l, _)| l.clone());
        match labels {
            Some(labels) => {
                self.apply(&labels, tally);
                Ok(())
            }
            None => Err(tally),
        }
    }

    /// A /dev/shm was measured: size, use, and the high-water mark.
    pub fn measured(&mut self, sample: &Capacity) {
        for (labels, tracked) in &mut self.by_labels {
            if tracked.shm_dev == Some(sample.dev)
                && tracked.gone_since.is_none()
                && tracked.touched
            {
                tracked.peak = tracked.peak.max(sample.used);
                self.metrics
                    .shm_size
                    .get_or_create(labels)
                    .set(clamp(sample.size));
                self.metrics
                    .shm_used
                    .get_or_create(labels)
                    .set(clamp(sample.used));
                self.metrics
                    .shm_peak
                    .get_or_create(labels)
                    .set(clamp(tracked.peak));
            }
        }
    }

    /// Containers whose /dev/shm should be measured now: running ones that have series.
    pub fn to_measure(&self) -> Vec<u32> {
        self.by_labels
            .values()
            .filter(|t| t.touched && t.gone_since.is_none())
            .filter_map(|t| t.pid)
            .collect()
    }

    /// Takes what the runtimes say runs now (a survey that started at `started`).
    pub fn survey(&mut self, running: &[Container], started: Instant) -> Changes {
        let now = Instant::now();
        let mut changes = Changes::default();
        let mut seen: HashSet<ContainerLabels> = HashSet::new();
        for container in running.iter().filter(|c| c.state.is_running()) {
            let labels = labels_of(container);
            seen.insert(labels.clone());
            let tracked = self.by_labels.entry(labels.clone()).or_insert(Tracked {
                id: String::new(),
                pid: None,
                start_ns: None,
                mntns: None,
                shm_dev: None,
                touched: false,
                peak: 0,
                gone_since: None,
                failures: HashSet::new(),
                roles: HashSet::new(),
            });
            let new_process = tracked.pid != container.pid || tracked.id != container.id;
            if new_process {
                if let Some(old) = tracked.mntns.take() {
                    // Unless a container met earlier in this survey has the number now.
                    if self.by_mntns.get(&old) == Some(&labels) {
                        self.by_mntns.remove(&old);
                        changes.stopped_mntns.push(old);
                    }
                }
                // The high-water mark is since this start.
                tracked.peak = 0;
                changes.started.push(container.clone());
            }
            if new_process {
                tracked.start_ns = container.pid.and_then(start_ns);
            }
            tracked.id = container.id.clone();
            tracked.pid = container.pid;
            tracked.mntns = container.mntns;
            tracked.shm_dev = container.shm.dev();
            tracked.gone_since = None;
            if let Some(mntns) = container.mntns {
                self.by_mntns.insert(mntns, labels);
            }
        }
        self.metrics.containers.set(seen.len() as i64);

        // Gone: out of the namespace map now (its number may be reused), series later.
        let mut retire = Vec::new();
        for (labels, tracked) in &mut self.by_labels {
            if seen.contains(labels) {
                continue;
            }
            if let Some(old) = tracked.mntns.take() {
                // The number may be a running container's already (recycled).
                if self.by_mntns.get(&old) == Some(labels) {
                    self.by_mntns.remove(&old);
                    changes.stopped_mntns.push(old);
                }
                tracked.pid = None;
            }
            let since = *tracked.gone_since.get_or_insert(now);
            if !tracked.touched || now.duration_since(since) >= self.retain {
                retire.push(labels.clone());
            }
        }
        for labels in retire {
            if let Some(tracked) = self.by_labels.remove(&labels)
                && tracked.touched
            {
                self.metrics
                    .retire(&labels, &tracked.failures, &tracked.roles);
            }
        }

        // Namespaces that waited for this survey: claimed now, or nobody's.
        for pending in self.pending.values_mut() {
            if pending.since < started {
                pending.surveys += 1;
            }
        }
        let waited: Vec<u32> = self
            .pending
            .iter()
            .filter(|(mntns, p)| p.surveys >= SURVEYS_WAITED || self.by_mntns.contains_key(mntns))
            .map(|(mntns, _)| *mntns)
            .collect();
        for mntns in waited {
            let pending = self.pending.remove(&mntns).expect("listed");
            let labels = self
                .by_mntns
                .get(&mntns)
                .filter(|labels| {
                    self.by_labels[*labels]
                        .start_ns
                        .is_some_and(|start| start <= pending.first_ts_ns)
                })
                .cloned()
                .unwrap_or_else(ContainerLabels::unknown);
            for tally in pending.tallies {
                self.apply(&labels, tally);
            }
        }
        changes
    }

    fn apply(&mut self, labels: &ContainerLabels, tally: Tally) {
        let tracked = self.by_labels.get_mut(labels);
        let has_series = tracked.as_ref().is_none_or(|t| t.touched);
        if let Some(tracked) = tracked {
            tracked.touched = true;
            match &tally {
                Tally::Failure { syscall, errno } => {
                    tracked.failures.insert((syscall.clone(), errno.clone()));
                }
                Tally::Death { role } => {
                    tracked.roles.insert(role.clone());
                }
                _ => {}
            }
        }
        let m = &self.metrics;
        match tally {
            Tally::Touch => {}
            Tally::Failure { syscall, errno } => {
                m.failures
                    .get_or_create(&FailureLabels::new(labels, &syscall, &errno))
                    .inc();
            }
            Tally::Sigbus => {
                m.sigbus.get_or_create(labels).inc();
            }
            Tally::Death { role } => {
                m.deaths
                    .get_or_create(&DeathLabels::new(labels, &role))
                    .inc();
            }
            Tally::Recommended(bytes) => {
                let gauge = m.recommended.get_or_create(labels);
                gauge.set(gauge.get().max(clamp(bytes)));
            }
        }
        // A container's first touch: its counters start at zero, so that `increase()` sees
        // its first failure.
        if !has_series {
            drop(m.sigbus.get_or_create(labels));
        }
    }
}

/// When a process started (`CLOCK_BOOTTIME` ns), from /proc/PID/stat.
fn start_ns(pid: u32) -> Option<u64> {
    let stat = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?;
    let ticks = procfs::ticks_per_second();
    Some(stat.starttime.saturating_mul(1_000_000_000) / ticks)
}

fn clamp(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// The labels of a container's series.
pub fn labels_of(container: &Container) -> ContainerLabels {
    ContainerLabels {
        container: if container.name.is_empty() {
            container.short_id().to_owned()
        } else {
            container.name.clone()
        },
        pod: container.pod.clone().unwrap_or_default(),
        namespace: container.namespace.clone().unwrap_or_default(),
        runtime: container.runtime.as_str().to_owned(),
    }
}
