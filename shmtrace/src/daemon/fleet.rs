//! The containers on this node, as the metrics see them: which mount namespace is which
//! container, which of them touched /dev/shm (only those have series), and when a gone one's
//! series retire.
//!
//! A series is named by its labels (container, pod, namespace, runtime), not by the runtime's
//! id: a container restarted, or re-created under its name, continues its series.
//!
//! Events can arrive before the runtimes are asked about a new container (a container that
//! fails as it starts). What they count waits, per mount namespace, for the next survey of the
//! runtimes, which is then asked for at once. The first process to count there is looked up in
//! /proc as it acts: its cgroup names its container's runtime and id. A namespace that three
//! surveys do not claim (the container stopped first) is counted for that container all the
//! same, by the name the runtime's list of stopped containers gives its id, or by its short id
//! once it is removed; only a namespace whose processes are in no container's cgroup (and no
//! survey claims) is counted as `runtime="unknown"`.
//!
//! Namespace numbers are recycled, and the kernel hands a freed one to the next namespace made:
//! a container removed and another started between two surveys share one. So the first process
//! to count in a claimed namespace is checked against the claimer's id by its cgroup too, and a
//! container that claims a number is credited with what waited there only if it is the one the
//! cgroup named (or, where no cgroup named one, if its main process started before the first
//! event waiting there). A claimer whose main process is gone by the time its events are read
//! keeps them if that process's exit is still ahead in the stream (it acted, then ended);
//! otherwise they wait, and are the claimer's after all if nobody else claims the number and
//! nobody is left in the namespace (`docker run --rm` removes a container before a survey).
use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant},
};

pub use super::membership::Member;
use super::{
    membership::{anyone_in, member_in, member_of},
    metrics::{ContainerLabels, DeathLabels, FailureLabels, Metrics, ShmLabels},
};
use crate::{
    capacity::Capacity,
    container::{Candidate, Container},
    live::proc_scan::start_ns,
};

/// Something to count for whoever a namespace turns out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tally {
    /// A /dev/shm call: the container has series from now on.
    Touch,
    /// `count` failed calls (more than one when the kernel counted failures whose records
    /// were lost: `unseen`).
    Failure {
        syscall: String,
        errno: String,
        count: u64,
    },
    Sigbus {
        count: u64,
    },
    /// An open of a /dev/shm name another process removed while it was held, counted for the
    /// remover's container.
    NameRemoved,
    /// Deaths of a full /dev/shm, as the probes count them (`flags::SHM_DEATH`); `role` is
    /// `unknown` for those whose records were lost.
    Death {
        role: String,
        count: u64,
    },
    Recommended(u64),
    /// How full its /dev/shm was at a failure, as the diagnosis says (at least what the traced
    /// objects held; a `size` of 0 when it was not measured then): a survey may never see it
    /// so, the processes having freed it all.
    FullAt(Capacity),
}

/// Bounds on what waits for a survey, so that a flood of events in unknown namespaces costs
/// fixed memory (beyond them, tallies go to `runtime="unknown"` at once).
const MAX_PENDING_NAMESPACES: usize = 256;
const MAX_PENDING_PER_NAMESPACE: usize = 1024;
/// How many exited processes' namespaces are remembered, for diagnoses that come after the
/// death.
const EXITED_REMEMBERED: usize = 4096;
/// Surveys a namespace waits through before its counts go to the container its cgroup named,
/// or to `runtime="unknown"`.
const SURVEYS_WAITED: u32 = 3;
/// Processes whose container was checked by cgroup, remembered (then checked again).
const CHECKED_REMEMBERED: usize = 65_536;

struct Pending {
    since: Instant,
    /// Surveys that ended since, without claiming the namespace. A runtime that answers
    /// slowly may leave a container out of one answer: a few are waited for.
    surveys: u32,
    /// The earliest event's time (`CLOCK_BOOTTIME` ns).
    first_ts_ns: u64,
    tallies: Vec<Tally>,
    /// The container the first process to count there is in, by its cgroup.
    member: Option<Member>,
    /// The container a survey last saw in the namespace, when its events were set to wait
    /// because its main process had gone: theirs, if nobody else turns up there.
    former: Option<Former>,
}

/// A container that claimed a namespace number until its main process was found gone.
struct Former {
    labels: ContainerLabels,
    id: String,
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
    /// Its /dev/shm series as last set: they change with the /dev/shm it sees.
    shm_series: Option<ShmLabels>,
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
    /// Mount namespaces of containers that are gone, claimed or not, even when another
    /// container has the number now: with the start of that one (what was there before it
    /// was the gone one's), or `None`.
    pub ended: Vec<(u32, Option<u64>)>,
}

pub struct Fleet {
    metrics: Metrics,
    host_mntns: u32,
    retain: Duration,
    by_labels: HashMap<ContainerLabels, Tracked>,
    by_mntns: HashMap<u32, ContainerLabels>,
    pending: HashMap<u32, Pending>,
    /// Waiting counts of a namespace number's earlier owner, set apart when a process of
    /// another container counted there: the next survey says whose they are.
    superseded: Vec<(u32, Pending)>,
    /// Namespaces whose claimer was found gone, or elsewhere, by a process's cgroup: for the
    /// caller to tell the pipeline ([`Fleet::take_stale`]).
    stale: Vec<u32>,
    pid_mntns: HashMap<u32, u32>,
    exited: VecDeque<u32>,
    survey_wanted: bool,
    /// Processes checked by cgroup against the container claiming their namespace.
    checked: HashSet<u32>,
    /// Names the runtimes list for stopped containers (by id), of namespaces still waiting.
    stopped: HashMap<String, ContainerLabels>,
    /// Each /dev/shm's use as last measured, for the node's figure (a shared one once).
    used_by_dev: HashMap<u32, u64>,
    /// How a process's container is found (its cgroup), and a namespace's (any of its
    /// processes'); the tests give their own.
    member_of: fn(u32) -> Option<Member>,
    member_in: fn(u32, u32) -> Option<Member>,
    /// Whether a process is in a mount namespace (the tests give their own).
    anyone_in: fn(u32) -> bool,
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
            superseded: Vec::new(),
            stale: Vec::new(),
            pid_mntns: HashMap::new(),
            exited: VecDeque::new(),
            survey_wanted: false,
            checked: HashSet::new(),
            stopped: HashMap::new(),
            used_by_dev: HashMap::new(),
            member_of,
            member_in,
            anyone_in,
        }
    }

    /// Containers with series or followed now, including gone ones not yet retired.
    pub fn followed(&self) -> usize {
        self.by_labels.len()
    }

    /// Finds processes' containers with `lookup` instead of their cgroups.
    #[cfg(test)]
    pub fn with_lookup(
        mut self,
        of_process: fn(u32) -> Option<Member>,
        in_namespace: fn(u32, u32) -> Option<Member>,
    ) -> Fleet {
        self.member_of = of_process;
        self.member_in = in_namespace;
        // The tests' made-up namespaces are alive.
        self.anyone_in = |_| true;
        self
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
        // Its number may be another process's soon (pid_max is often 32768): checked anew.
        self.checked.remove(&pid);
        self.exited.push_back(pid);
        while self.exited.len() > EXITED_REMEMBERED {
            if let Some(old) = self.exited.pop_front() {
                self.pid_mntns.remove(&old);
                self.checked.remove(&old);
            }
        }
    }

    /// Namespaces no longer their last claimer's, found since the last call.
    pub fn take_stale(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.stale)
    }

    /// Whether events of `mntns` wait for a survey to say whose they are.
    pub fn waiting(&self, mntns: u32) -> bool {
        self.pending.contains_key(&mntns)
    }

    pub fn mntns_of(&self, pid: u32) -> Option<u32> {
        self.pid_mntns.get(&pid).copied()
    }

    /// Counts `tally`, of an event at `ts_ns`, for the container of `mntns` (or the host), now
    /// or after the next survey.
    pub fn tally_in(&mut self, mntns: u32, tally: Tally, ts_ns: u64, now: Instant) {
        self.tally(mntns, None, tally, ts_ns, now);
    }

    /// As [`Fleet::tally_in`], for an event of process `pid`, which /proc may still show: its
    /// cgroup says which container it is in.
    pub fn tally_from(&mut self, pid: u32, mntns: u32, tally: Tally, ts_ns: u64, now: Instant) {
        self.tally(mntns, Some(pid), tally, ts_ns, now);
    }

    fn tally(&mut self, mntns: u32, pid: Option<u32>, tally: Tally, ts_ns: u64, now: Instant) {
        if mntns == self.host_mntns {
            self.apply(&ContainerLabels::host(), tally);
            return;
        }
        let mut member = None;
        let mut former = None;
        if self.checked.len() >= CHECKED_REMEMBERED {
            self.checked.clear();
        }
        if let (Some(pid), Some(labels)) = (pid, self.by_mntns.get(&mntns))
            && self.checked.insert(pid)
        {
            let claimer = self.by_labels.get(labels);
            // Its main process gone, or elsewhere: the number is not the claimer's any more.
            // Unless the main process acted here and its exit is still ahead in the stream: it
            // ended after this event (`dd` exec'd as a container's main process fails and
            // exits before its records are read), so at this event the number was still its.
            let here = claimer.and_then(|t| t.pid).is_some_and(|main| {
                match crate::kernel_ids::mount_namespace(main) {
                    Some(now) => now == mntns,
                    None => {
                        self.pid_mntns.get(&main) == Some(&mntns) && !self.exited.contains(&main)
                    }
                }
            });
            if here {
                member = (self.member_of)(pid);
            }
            if !here
                || member
                    .as_ref()
                    .is_some_and(|m| claimer.is_none_or(|t| t.id != m.id))
            {
                // The next survey says whose it is; meanwhile the pipeline (its recordings,
                // its JSON lines) must not name the gone one either.
                former = claimer.map(|t| Former {
                    labels: labels.clone(),
                    id: t.id.clone(),
                });
                self.by_mntns.remove(&mntns);
                self.stale.push(mntns);
            }
        }
        if let Some(labels) = self.by_mntns.get(&mntns).cloned() {
            // An event read late, from before this container took the number: not its own.
            let before = self
                .by_labels
                .get(&labels)
                .and_then(|t| t.start_ns)
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
        if !self.pending.contains_key(&mntns) && member.is_none() {
            let (of_process, in_namespace) = (self.member_of, self.member_in);
            member = pid.and_then(|pid| of_process(pid).or_else(|| in_namespace(pid, mntns)));
        }
        // The number has a new owner while the last one's counts still wait (containers that
        // come and go between two surveys reuse it): those go apart, to the one they were of.
        if let Some(pid) = pid
            && let Some(waiting) = self.pending.get(&mntns)
            && waiting.member.is_some()
            && self.checked.insert(pid)
            && let Some(now_member) = (self.member_of)(pid)
            && waiting
                .member
                .as_ref()
                .is_some_and(|m| m.id != now_member.id)
        {
            let old = self.pending.remove(&mntns).expect("just seen");
            if self.superseded.len() < MAX_PENDING_NAMESPACES {
                self.superseded.push((mntns, old));
            } else if let Some(gone) = &old.member {
                // Beyond the bound, they go to the container's short id at once.
                let labels = self.gone_member(gone, now);
                for tally in old.tallies {
                    self.apply(&labels, tally);
                }
            }
            member = Some(now_member);
        }
        let pending = self.pending.entry(mntns).or_insert_with(|| Pending {
            since: now,
            surveys: 0,
            first_ts_ns: ts_ns,
            tallies: Vec::new(),
            member,
            former,
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

    /// The containers the runtimes list that do not run, from the same answer as the next
    /// [`Fleet::survey`]: names for those of waiting namespaces.
    pub fn know_stopped(&mut self, stopped: &[Candidate]) {
        self.stopped.clear();
        let waiting: HashSet<&str> = self
            .pending
            .values()
            .chain(self.superseded.iter().map(|(_, p)| p))
            .filter_map(|p| p.member.as_ref())
            .map(|m| m.id.as_str())
            .collect();
        for candidate in stopped.iter().filter(|c| waiting.contains(c.id.as_str())) {
            let name = if candidate.name.is_empty() {
                candidate.id.chars().take(12).collect()
            } else {
                candidate.name.clone()
            };
            let labels = ContainerLabels {
                container: name,
                pod: candidate.pod.clone().unwrap_or_default(),
                namespace: candidate.namespace.clone().unwrap_or_default(),
                runtime: candidate.runtime.as_str().to_owned(),
            };
            self.stopped.insert(candidate.id.clone(), labels);
        }
    }

    /// A /dev/shm was measured: size, use, and the high-water mark, for each container that
    /// sees it; and the node's use, in which it counts once.
    pub fn measured(&mut self, sample: &Capacity) {
        let mut seen = false;
        for (labels, tracked) in &mut self.by_labels {
            if tracked.shm_dev == Some(sample.dev)
                && tracked.gone_since.is_none()
                && tracked.touched
            {
                seen = true;
                tracked.peak = tracked.peak.max(sample.used);
                let series = ShmLabels::new(labels, sample.dev);
                if let Some(old) = tracked.shm_series.take()
                    && old != series
                {
                    self.metrics.retire_shm(&old);
                }
                self.metrics
                    .shm_size
                    .get_or_create(&series)
                    .set(clamp(sample.size));
                self.metrics
                    .shm_used
                    .get_or_create(&series)
                    .set(clamp(sample.used));
                self.metrics
                    .shm_peak
                    .get_or_create(&series)
                    .set(clamp(tracked.peak));
                tracked.shm_series = Some(series);
            }
        }
        if seen {
            self.used_by_dev.insert(sample.dev, sample.used);
        }
        self.count_node_shm();
    }

    /// The node's /dev/shm use: each file system a running container with series sees, once.
    fn count_node_shm(&mut self) {
        let live: HashSet<u32> = self
            .by_labels
            .values()
            .filter(|t| t.touched && t.gone_since.is_none())
            .filter_map(|t| t.shm_dev)
            .collect();
        self.used_by_dev.retain(|dev, _| live.contains(dev));
        let used: u64 = self.used_by_dev.values().sum();
        self.metrics.node_shm_used.set(clamp(used));
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
        let mut ended = Vec::new();
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
                shm_series: None,
                touched: false,
                peak: 0,
                gone_since: None,
                failures: HashSet::new(),
                roles: HashSet::new(),
            });
            let new_process = tracked.pid != container.pid || tracked.id != container.id;
            // A new process, or its namespace could not be read again (it is ending): the
            // number it had is no longer its own.
            if (new_process || tracked.mntns != container.mntns)
                && let Some(old) = tracked.mntns.take()
            {
                ended.push(old);
                // Unless a container met earlier in this survey has the number now.
                if self.by_mntns.get(&old) == Some(&labels) {
                    self.by_mntns.remove(&old);
                    changes.stopped_mntns.push(old);
                }
            }
            if new_process {
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
                ended.push(old);
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
                self.metrics.retire(
                    &labels,
                    tracked.shm_series.as_ref(),
                    &tracked.failures,
                    &tracked.roles,
                );
            }
        }
        self.count_node_shm();

        // Counts of a namespace's earlier owner: its own, claimed or gone.
        for (mntns, pending) in std::mem::take(&mut self.superseded) {
            let member = pending
                .member
                .as_ref()
                .expect("superseded only with a member");
            let running = self
                .by_labels
                .iter()
                .find(|(_, t)| t.id == member.id && t.gone_since.is_none())
                .map(|(l, _)| l.clone());
            let labels = match running {
                Some(labels) => labels,
                None => {
                    ended.push(mntns);
                    self.gone_member(member, now)
                }
            };
            for tally in pending.tallies {
                self.apply(&labels, tally);
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
            let claimer = self.by_mntns.get(&mntns);
            let labels = match (&pending.member, claimer) {
                (Some(member), Some(labels))
                    if self
                        .by_labels
                        .get(labels)
                        .is_some_and(|t| t.id == member.id) =>
                {
                    labels.clone()
                }
                (Some(member), _) => {
                    ended.push(mntns);
                    self.gone_member(member, now)
                }
                (None, Some(labels))
                    if self
                        .by_labels
                        .get(labels)
                        .and_then(|t| t.start_ns)
                        .is_some_and(|start| start <= pending.first_ts_ns) =>
                {
                    labels.clone()
                }
                (None, _) => {
                    // Nobody's, and maybe gone already (its processes ended before their
                    // cgroup was read): then so is the /dev/shm it had of its own.
                    let empty = !(self.anyone_in)(mntns);
                    if empty {
                        ended.push(mntns);
                    }
                    match pending.former {
                        // The container seen there last, whose processes all ended (a
                        // wrapper script's child failed, then the script exited, and
                        // `docker run --rm` removed the container before a survey).
                        Some(former) if empty => self.follow_gone(former.labels, &former.id, now),
                        _ => ContainerLabels::unknown(),
                    }
                }
            };
            for tally in pending.tallies {
                self.apply(&labels, tally);
            }
        }
        self.stopped.clear();
        ended.sort_unstable();
        ended.dedup();
        changes.ended = ended
            .into_iter()
            .map(|mntns| {
                let taken_by = self
                    .by_mntns
                    .get(&mntns)
                    .and_then(|l| self.by_labels.get(l));
                // A claimer whose start is unknown: nothing can be told apart, nothing ends.
                (mntns, taken_by.map(|t| t.start_ns.unwrap_or(0)))
            })
            .collect();
        changes
    }

    /// The labels of a container no survey saw running (it stopped first): as the runtime
    /// lists it stopped, or by its short id once removed. Followed as gone, so that its series
    /// retire after `--retain`.
    fn gone_member(&mut self, member: &Member, now: Instant) -> ContainerLabels {
        let labels = self
            .stopped
            .get(&member.id)
            .cloned()
            .unwrap_or_else(|| ContainerLabels {
                container: member.id.chars().take(12).collect(),
                runtime: member.runtime.as_str().to_owned(),
                ..ContainerLabels::default()
            });
        self.follow_gone(labels, &member.id, now)
    }

    /// Follows a gone container (runtime id `id`) as gone from `now`, unless it is followed
    /// already, so that its series retire after `--retain`.
    fn follow_gone(&mut self, labels: ContainerLabels, id: &str, now: Instant) -> ContainerLabels {
        self.by_labels
            .entry(labels.clone())
            .or_insert_with(|| Tracked {
                id: id.to_owned(),
                pid: None,
                start_ns: None,
                mntns: None,
                shm_dev: None,
                shm_series: None,
                touched: false,
                peak: 0,
                gone_since: Some(now),
                failures: HashSet::new(),
                roles: HashSet::new(),
            });
        labels
    }

    fn apply(&mut self, labels: &ContainerLabels, tally: Tally) {
        let tracked = self.by_labels.get_mut(labels);
        let has_series = tracked.as_ref().is_none_or(|t| t.touched);
        if let Some(tracked) = tracked {
            tracked.touched = true;
            match &tally {
                Tally::Failure { syscall, errno, .. } => {
                    tracked.failures.insert((syscall.clone(), errno.clone()));
                }
                Tally::Death { role, .. } => {
                    tracked.roles.insert(role.clone());
                }
                Tally::FullAt(capacity) => {
                    // A size of 0: not measured at the failure (a survey sets it).
                    let used = match capacity.size {
                        0 => capacity.used,
                        size => capacity.used.min(size),
                    };
                    tracked.peak = tracked.peak.max(used);
                    let series = ShmLabels::new(labels, capacity.dev);
                    if let Some(old) = tracked.shm_series.take()
                        && old != series
                    {
                        self.metrics.retire_shm(&old);
                    }
                    if capacity.size > 0 {
                        self.metrics
                            .shm_size
                            .get_or_create(&series)
                            .set(clamp(capacity.size));
                    }
                    self.metrics
                        .shm_peak
                        .get_or_create(&series)
                        .set(clamp(tracked.peak));
                    tracked.shm_series = Some(series);
                }
                _ => {}
            }
        }
        let m = &self.metrics;
        match tally {
            Tally::Touch => {}
            Tally::Failure {
                syscall,
                errno,
                count,
            } => {
                m.failures
                    .get_or_create(&FailureLabels::new(labels, &syscall, &errno))
                    .inc_by(count);
            }
            Tally::Sigbus { count } => {
                m.sigbus.get_or_create(labels).inc_by(count);
            }
            Tally::NameRemoved => {
                m.names_removed.get_or_create(labels).inc();
            }
            Tally::Death { role, count } => {
                m.deaths
                    .get_or_create(&DeathLabels::new(labels, &role))
                    .inc_by(count);
            }
            Tally::Recommended(bytes) => {
                let gauge = m.recommended.get_or_create(labels);
                gauge.set(gauge.get().max(clamp(bytes)));
            }
            // Its series, set above, are its container's.
            Tally::FullAt(_) => {}
        }
        // A container's first touch: its counters start at zero, so that `increase()` sees
        // its first failure.
        if !has_series {
            drop(m.sigbus.get_or_create(labels));
        }
    }
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
