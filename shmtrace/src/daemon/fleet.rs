//! The containers on this node: whose each record is (`whose`), what each container is called
//! (`names`), and their metric series (`series`), kept up by the surveys of the runtimes and
//! their events.
//!
//! What cannot be placed or named yet waits: a record whose namespace nothing placed waits for a
//! survey to say who had the number then; a container whose name no runtime gave yet (its
//! events are late, or it is a CRI container and there are none) is asked for at once, and
//! waits for the answer. Waiting is bounded: after three surveys, a namespace nobody claimed is
//! counted as `runtime="unknown"` (it was in no container), and a container nobody named is
//! counted under its short id. The JSON lines wait with them ([`Fleet::take_settled`]).
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    metrics::{ContainerLabels, Metrics},
    names::{Named, Names, labels_of, unnamed},
    series::{Countable, Series},
    whose::{ContainerRef, Found, Lookups, Owner, Whose},
};
use crate::{
    container::{Action, Candidate, Container, RuntimeEvent},
    live::proc_scan::start_ns,
};
use shmtrace_core::{capacity::Capacity, model::ContainerInfo};

/// Where something is counted, and how its lines name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placed {
    Host,
    /// A namespace no container had.
    NoContainer,
    Container {
        named: Arc<Named>,
        /// Why no runtime's name for it is known, when none is.
        unnamed: Option<String>,
    },
}

impl Placed {
    pub fn labels(&self) -> ContainerLabels {
        match self {
            Placed::Host => ContainerLabels::host(),
            Placed::NoContainer => ContainerLabels::unknown(),
            Placed::Container { named, .. } => named.labels.clone(),
        }
    }

    pub fn info(&self) -> Option<&ContainerInfo> {
        match self {
            Placed::Container { named, .. } => Some(&named.info),
            _ => None,
        }
    }
}

/// What became of a key that waited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    Placed(Placed),
    /// Placed in a container whose name it waits for now.
    Moved(WaitKey),
}

/// What a record or a line waits for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WaitKey {
    /// Who had this mount namespace number.
    Namespace(u32),
    /// What this container is called.
    Name(ContainerRef),
}

struct Waiting {
    since: Instant,
    /// Surveys that started since it began waiting: a runtime under load may leave a
    /// container out of one answer, so a few are waited for.
    surveys: u32,
    /// The earliest record's time (`CLOCK_BOOTTIME` ns).
    first_ts_ns: u64,
    /// The cgroup of a record that waits for its namespace, once one is known: its container
    /// may be told by its cgroup before a survey comes.
    cgroup_id: u64,
    tallies: Vec<Countable>,
}

/// Surveys a record waits through before it is counted for nobody, or under a short id.
const SURVEYS_WAITED: u32 = 3;
/// The longest a container's name is waited for, surveys or not.
const NAME_WAITED: Duration = Duration::from_secs(10);
/// Bounds on what waits, so that a flood of events in unknown namespaces costs fixed memory
/// (beyond them, tallies are counted at once as if the wait had ended).
const MAX_WAITING: usize = 256;
const MAX_WAITING_TALLIES: usize = 1024;

/// A container the runtimes list as running, as the last survey saw it.
struct Listed {
    container: ContainerRef,
    pid: Option<u32>,
    mntns: Option<u32>,
}

/// A mount namespace whose container is gone: for the caller to tell the pipeline and the
/// kernel's tallies.
#[derive(Debug, PartialEq, Eq)]
pub struct Ended {
    pub mntns: u32,
    /// The container that had it, when one is known.
    pub container: Option<ContainerRef>,
}

pub struct Fleet {
    whose: Whose,
    names: Names,
    series: Series,
    waiting: HashMap<WaitKey, Waiting>,
    /// Keys that stopped waiting, and where they went, for the JSON lines.
    settled: Vec<(WaitKey, Settled)>,
    listed: HashMap<Arc<str>, Listed>,
    ended: Vec<Ended>,
    survey_wanted: bool,
    /// Containers whose name is wanted from their runtime, and those asked for already.
    to_describe: Vec<ContainerRef>,
    asked: HashSet<ContainerRef>,
    /// Namespaces in no container (or not placed yet) whose last process the analysis followed
    /// has ended, not yet looked for in /proc (`fresh`) and looked for while someone was still
    /// in them (an untraced shell): each ends, with its /dev/shm, once nobody is in it.
    sandboxes_fresh: Vec<u32>,
    sandboxes_occupied: Vec<u32>,
}

/// Most sandboxes waited for at once; beyond, the oldest is no longer looked for (its
/// objects go with the cap on objects).
const MAX_SANDBOXES_WAITED: usize = 256;

/// A runtime's Unix time (ns) on the boot clock of records, or now where it cannot be told.
fn boot_time_of(unix_ns: i64) -> u64 {
    let now_boot = shmtrace_core::clock::boot_ns().unwrap_or(u64::MAX);
    let Ok(now_unix) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) else {
        return now_boot;
    };
    let ago = i64::try_from(now_unix.as_nanos())
        .unwrap_or(i64::MAX)
        .saturating_sub(unix_ns);
    match u64::try_from(ago) {
        Ok(ago) if unix_ns > 0 => now_boot.saturating_sub(ago),
        _ => now_boot,
    }
}

/// Containers asked for by id, remembered (then asked again).
const ASKED_REMEMBERED: usize = 4096;

impl Fleet {
    pub fn new(
        metrics: Metrics,
        host_mntns: u32,
        retain: Duration,
        lookups: Box<dyn Lookups>,
    ) -> Fleet {
        Fleet {
            whose: Whose::new(host_mntns, lookups),
            names: Names::default(),
            series: Series::new(metrics, retain),
            waiting: HashMap::new(),
            settled: Vec::new(),
            listed: HashMap::new(),
            ended: Vec::new(),
            survey_wanted: false,
            to_describe: Vec::new(),
            asked: HashSet::new(),
            sandboxes_fresh: Vec::new(),
            sandboxes_occupied: Vec::new(),
        }
    }

    /// Whose the record of `pid` (in `mntns`, cgroup `cgroup_id`, at `ts_ns`) is.
    pub fn place(&mut self, pid: u32, mntns: u32, cgroup_id: u64, ts_ns: u64) -> Found {
        let found = self.whose.place(pid, mntns, cgroup_id, ts_ns);
        if matches!(found, Found::Unplaced { .. }) {
            self.survey_wanted = true;
        }
        found
    }

    /// Where what was `found` at `ts_ns` is counted and named, or what it waits for.
    pub fn resolve(&mut self, found: &Found, ts_ns: u64) -> Result<Placed, WaitKey> {
        let container = match found {
            Found::Owner(Owner::Host) => return Ok(Placed::Host),
            Found::Owner(Owner::NoContainer) => return Ok(Placed::NoContainer),
            Found::Owner(Owner::Container(container)) => container.clone(),
            Found::Unplaced { mntns, cgroup_id } => {
                match self.whose.place_again(*mntns, *cgroup_id, ts_ns) {
                    Some(container) => container,
                    None => return Err(WaitKey::Namespace(*mntns)),
                }
            }
        };
        match self.names.get(&container.id) {
            Some(named) => Ok(Placed::Container {
                named: named.clone(),
                unnamed: None,
            }),
            None => {
                self.ask_for(&container);
                Err(WaitKey::Name(container))
            }
        }
    }

    /// Counts `tally`, of a record at `ts_ns` that was `found`, now or once it is placed.
    pub fn count(&mut self, found: &Found, ts_ns: u64, tally: Countable) {
        match self.resolve(found, ts_ns) {
            Ok(placed) => self.series.apply(&placed.labels(), tally),
            Err(key) => {
                self.wait(key.clone(), ts_ns, Some(tally));
                if let (Found::Unplaced { cgroup_id, .. }, Some(waiting)) =
                    (found, self.waiting.get_mut(&key))
                {
                    waiting.cgroup_id = waiting.cgroup_id.max(*cgroup_id);
                }
            }
        }
    }

    /// Counts `tally` for whoever had `mntns` by `ts_ns`: the kernel counted it there before
    /// then, and its record never came.
    pub fn count_in(&mut self, mntns: u32, ts_ns: u64, tally: Countable) {
        let found = if mntns == self.whose.host_mntns() {
            Found::Owner(Owner::Host)
        } else {
            match self.whose.tenant_at(mntns, ts_ns) {
                Some(container) => Found::Owner(Owner::Container(container)),
                // Gone by then; the count was its, unless the number passed on since.
                None => match self.whose.last_tenant(mntns) {
                    Some(container) => Found::Owner(Owner::Container(container.clone())),
                    None => Found::Unplaced {
                        mntns,
                        cgroup_id: 0,
                    },
                },
            }
        };
        self.count(&found, ts_ns, tally);
    }

    /// Counts `tally` for process `pid`, seen at `ts_ns` in `mntns`: for the container it was
    /// placed in, if it was met there, else for whoever had `mntns` then.
    pub fn count_for(&mut self, pid: u32, mntns: u32, ts_ns: u64, tally: Countable) {
        match self.whose.of_process(pid) {
            Some((met_in, owner)) if met_in == mntns => {
                let found = Found::Owner(owner.clone());
                self.count(&found, ts_ns, tally);
            }
            _ => self.count_in(mntns, ts_ns, tally),
        }
    }

    /// Whose process `pid` was, as last met (for a diagnosis of it).
    pub fn of_process(&self, pid: u32) -> Option<Found> {
        self.whose
            .of_process(pid)
            .map(|(_, owner)| Found::Owner(owner.clone()))
    }

    /// Something of a record at `ts_ns` waits for `key` (a JSON line, a count).
    pub fn wait(&mut self, key: WaitKey, ts_ns: u64, tally: Option<Countable>) {
        if !self.waiting.contains_key(&key) && self.waiting.len() >= MAX_WAITING {
            let placed = self.give_up(&key);
            if let Some(tally) = tally {
                self.series.apply(&placed.labels(), tally);
            }
            self.settled.push((key, Settled::Placed(placed)));
            return;
        }
        if let WaitKey::Namespace(_) = key {
            self.survey_wanted = true;
        }
        let waiting = self.waiting.entry(key.clone()).or_insert_with(|| Waiting {
            since: Instant::now(),
            surveys: 0,
            first_ts_ns: ts_ns,
            cgroup_id: 0,
            tallies: Vec::new(),
        });
        waiting.first_ts_ns = waiting.first_ts_ns.min(ts_ns);
        let Some(tally) = tally else { return };
        if waiting.tallies.len() >= MAX_WAITING_TALLIES {
            let placed = self.give_up(&key);
            self.series.apply(&placed.labels(), tally);
            return;
        }
        if tally != Countable::Touch || !waiting.tallies.contains(&Countable::Touch) {
            waiting.tallies.push(tally);
        }
    }

    /// Keys that stopped waiting since the last call, and where they went.
    pub fn take_settled(&mut self) -> Vec<(WaitKey, Settled)> {
        std::mem::take(&mut self.settled)
    }

    /// Places what waited and can be placed now; gives up on what waited long enough.
    /// `surveyed`: a survey that started at this instant has just been taken in.
    fn settle(&mut self, surveyed: Option<Instant>) {
        let now = Instant::now();
        let keys: Vec<WaitKey> = self.waiting.keys().cloned().collect();
        for key in keys {
            let waiting = self.waiting.get_mut(&key).expect("listed");
            if surveyed.is_some_and(|started| waiting.since < started) {
                waiting.surveys += 1;
            }
            let (first_ts_ns, surveys, since, cgroup_id) = (
                waiting.first_ts_ns,
                waiting.surveys,
                waiting.since,
                waiting.cgroup_id,
            );
            let found = match &key {
                WaitKey::Namespace(mntns) => Found::Unplaced {
                    mntns: *mntns,
                    cgroup_id,
                },
                WaitKey::Name(container) => Found::Owner(Owner::Container(container.clone())),
            };
            let placed = match self.resolve(&found, first_ts_ns) {
                Ok(placed) => placed,
                // Placed, not named yet: its counts wait for the name.
                Err(WaitKey::Name(container)) if matches!(key, WaitKey::Namespace(_)) => {
                    let waiting = self.waiting.remove(&key).expect("listed");
                    let into = WaitKey::Name(container);
                    self.settled.push((key, Settled::Moved(into.clone())));
                    for tally in waiting.tallies {
                        self.wait(into.clone(), waiting.first_ts_ns, Some(tally));
                    }
                    self.wait(into, waiting.first_ts_ns, None);
                    continue;
                }
                Err(_) if surveys >= SURVEYS_WAITED => self.give_up(&key),
                Err(WaitKey::Name(_)) if now.duration_since(since) >= NAME_WAITED => {
                    self.give_up(&key)
                }
                Err(_) => continue,
            };
            let waiting = self.waiting.remove(&key).expect("listed");
            for tally in waiting.tallies {
                self.series.apply(&placed.labels(), tally);
            }
            self.settled.push((key, Settled::Placed(placed)));
        }
    }

    /// Gives up on what waited long enough for a name (no survey needed).
    pub fn tick(&mut self) {
        self.settle(None);
    }

    /// Where what waited for `key` goes when nothing places it: a namespace nobody claimed was
    /// in no container (and if nobody is in it any more, it is gone with its /dev/shm); a
    /// container nobody named goes under its short id, followed as gone so that its series
    /// retire.
    fn give_up(&mut self, key: &WaitKey) -> Placed {
        match key {
            WaitKey::Namespace(mntns) => {
                if !self.whose.anyone_in(*mntns) {
                    self.namespace_ended(*mntns, None);
                }
                Placed::NoContainer
            }
            WaitKey::Name(container) => {
                let named = unnamed(container);
                self.series.gone(&named.labels, Instant::now());
                Placed::Container {
                    named,
                    unnamed: Some(format!(
                        "no runtime named {} container {} within {} s or {SURVEYS_WAITED} surveys",
                        container.runtime,
                        shmtrace_core::model::short_id(&container.id),
                        NAME_WAITED.as_secs()
                    )),
                }
            }
        }
    }

    fn ask_for(&mut self, container: &ContainerRef) {
        if self.asked.len() >= ASKED_REMEMBERED {
            self.asked.clear();
        }
        if self.asked.insert(container.clone()) {
            self.to_describe.push(container.clone());
        }
    }

    /// Containers whose name is wanted from their runtime.
    pub fn take_to_describe(&mut self) -> Vec<ContainerRef> {
        std::mem::take(&mut self.to_describe)
    }

    /// Whether a record waits for a survey: one is wanted soon.
    pub fn take_survey_wanted(&mut self) -> bool {
        std::mem::take(&mut self.survey_wanted)
    }

    pub fn want_survey(&mut self) {
        self.survey_wanted = true;
    }

    /// Process `pid` ended.
    pub fn process_exited(&mut self, pid: u32) {
        self.whose.exited(pid);
    }

    /// The last process the analysis followed in `mntns` ended, its exit record placed as
    /// `found`. A namespace in no container (an `unshare -m` sandbox) ends with the /dev/shm it
    /// may have mounted, whose device number the next tmpfs made takes, and no runtime says
    /// when: once nobody is in it, it ends ([`Fleet::check_sandboxes`]). So does one not placed
    /// yet: its processes were gone before their records were read (a loaded machine reads
    /// late), and only a live process says it is in no container. Whoever's it was, nobody in
    /// it means it is gone. A container's ends when its runtime says so; the host's never.
    pub fn last_exit_in(&mut self, mntns: u32, found: &Found) {
        if let Found::Owner(Owner::Host | Owner::Container(_)) = found {
            return;
        }
        self.sandbox_quiet(mntns);
    }

    fn sandbox_quiet(&mut self, mntns: u32) {
        if mntns == 0 || mntns == self.whose.host_mntns() || self.sandboxes_fresh.contains(&mntns) {
            return;
        }
        // Someone was in it at an earlier last exit (the shell that then ran the last
        // process): looked for again at once, not at the next look at every one.
        if let Some(at) = self.sandboxes_occupied.iter().position(|m| *m == mntns) {
            self.sandboxes_occupied.remove(at);
        } else if self.sandboxes_fresh.len() + self.sandboxes_occupied.len() >= MAX_SANDBOXES_WAITED
        {
            if self.sandboxes_occupied.is_empty() {
                self.sandboxes_fresh.remove(0);
            } else {
                self.sandboxes_occupied.remove(0);
            }
        }
        self.sandboxes_fresh.push(mntns);
    }

    /// Looks in /proc for the quiet sandboxes not looked for yet, or (`all`) for every one
    /// waited for: those nobody is in any more have ended ([`Fleet::take_ended`]).
    pub fn check_sandboxes(&mut self, all: bool) {
        let mut asked = std::mem::take(&mut self.sandboxes_fresh);
        if all {
            asked.append(&mut self.sandboxes_occupied);
        }
        if asked.is_empty() {
            return;
        }
        let occupied = self.whose.anyone_in_each(&asked);
        for (mntns, occupied) in asked.into_iter().zip(occupied) {
            if occupied {
                self.sandboxes_occupied.push(mntns);
            } else {
                self.namespace_ended(mntns, None);
            }
        }
    }

    /// Namespaces whose container is gone, since the last call.
    pub fn take_ended(&mut self) -> Vec<Ended> {
        std::mem::take(&mut self.ended)
    }

    fn namespace_ended(&mut self, mntns: u32, container: Option<ContainerRef>) {
        self.whose.namespace_ended(mntns);
        self.ended.push(Ended { mntns, container });
    }

    /// When the next container took the number of `ended`, if one did as far as the records
    /// read so far tell: what was there before was the gone one's. `Some(0)` when that one's
    /// start is not known (nothing can be told apart).
    pub fn taken_at(&self, ended: &Ended) -> Option<u64> {
        match (&ended.container, self.whose.last_tenant(ended.mntns)) {
            (Some(gone), Some(last)) if last != gone => {
                self.whose.tenant_since(ended.mntns, last).or(Some(0))
            }
            _ => None,
        }
    }

    /// A container's runtime event.
    pub fn runtime_event(&mut self, event: &RuntimeEvent) {
        let now = Instant::now();
        self.names.event(event, now);
        if matches!(event.action, Action::Died | Action::Destroyed) {
            let container = ContainerRef::new(event.runtime, &event.id);
            self.whose.ended(&container, boot_time_of(event.time_ns));
            match self.listed.remove(event.id.as_str()) {
                Some(listed) => self.stopped(listed, now),
                // Never listed (it lived between two surveys): its namespaces end all the same.
                None if event.action == Action::Died => {
                    for mntns in self.whose.last_had(&container) {
                        self.namespace_ended(mntns, Some(container.clone()));
                    }
                }
                None => {}
            }
        }
        self.settle(None);
    }

    /// A container its runtime described when asked (its name was wanted, or it just
    /// started): its name, and whose its namespace and cgroup are.
    /// `started_ns`: when its main process started, if it runs.
    pub fn described(&mut self, container: &Container, started_ns: Option<u64>) {
        let now = Instant::now();
        self.names.described(container, now);
        let owner = ContainerRef::new(container.runtime, &container.id);
        if let (Some(mntns), Some(since)) = (container.mntns, started_ns)
            && container.state.is_running()
        {
            self.whose.learn_tenant(mntns, &owner, since);
        }
        if let Some(cgroup) = container.cgroup_id {
            self.whose.learn_cgroup(cgroup, &owner);
        }
        self.settle(None);
    }

    /// Container `container`'s processes are in cgroup `id`.
    pub fn learn_cgroup(&mut self, id: u64, container: &ContainerRef) {
        self.whose.learn_cgroup(id, container);
    }

    /// What the runtimes said in a survey that started at `started`: those that run and those
    /// listed stopped. Returns the containers seen for the first time, or with a new main
    /// process (restarted).
    pub fn survey(
        &mut self,
        running: &[Container],
        stopped: &[Candidate],
        started: Instant,
    ) -> Vec<Container> {
        let now = Instant::now();
        self.know_stopped(stopped, now);
        let (starts, seen) = self.follow_running(running);
        self.notice_gone(&seen, now);
        let running_labels = running
            .iter()
            .filter(|c| c.state.is_running())
            .map(|c| labels_of(&c.info()))
            .collect();
        self.series.survey_done(&running_labels, now);
        self.names.prune(now);
        self.settle(Some(started));
        starts
    }

    /// Step 1: names for containers that stopped before a survey saw them run.
    fn know_stopped(&mut self, stopped: &[Candidate], now: Instant) {
        for candidate in stopped {
            self.names.stopped(candidate, now);
        }
    }

    /// Step 2: the running containers' names, namespaces and series; returns those that
    /// started since the last survey, and the ids of all.
    fn follow_running(&mut self, running: &[Container]) -> (Vec<Container>, HashSet<Arc<str>>) {
        let mut starts = Vec::new();
        let mut seen = HashSet::new();
        for container in running.iter().filter(|c| c.state.is_running()) {
            let owner = ContainerRef::new(container.runtime, &container.id);
            seen.insert(owner.id.clone());
            self.names.listed(container);
            let before = self.listed.get(owner.id.as_ref());
            let restarted = before.is_none_or(|l| l.pid != container.pid);
            // A new main process, or its namespace could not be read again (it is ending):
            // the number it had is no longer its own.
            if let Some(old) = before.and_then(|l| l.mntns)
                && (restarted || container.mntns != Some(old))
            {
                self.whose.left(
                    old,
                    &owner,
                    shmtrace_core::clock::boot_ns().unwrap_or(u64::MAX),
                );
                self.namespace_ended(old, Some(owner.clone()));
            }
            if let (Some(pid), Some(mntns)) = (container.pid, container.mntns)
                && let Some(since) = start_ns(pid)
            {
                self.whose.learn_tenant(mntns, &owner, since);
            }
            if let Some(cgroup) = container.cgroup_id {
                self.whose.learn_cgroup(cgroup, &owner);
            }
            self.series.running(
                &labels_of(&container.info()),
                container.pid,
                container.shm.dev(),
                restarted,
            );
            if restarted {
                starts.push(container.clone());
            }
            self.listed.insert(
                owner.id.clone(),
                Listed {
                    container: owner,
                    pid: container.pid,
                    mntns: container.mntns,
                },
            );
        }
        (starts, seen)
    }

    /// Step 3: containers listed running before and not now are gone: their namespace number
    /// may come back for another.
    fn notice_gone(&mut self, seen: &HashSet<Arc<str>>, now: Instant) {
        let gone: Vec<Arc<str>> = self
            .listed
            .keys()
            .filter(|id| !seen.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            let listed = self.listed.remove(&id).expect("listed");
            self.stopped(listed, now);
        }
    }

    fn stopped(&mut self, listed: Listed, now: Instant) {
        self.names.gone(&listed.container.id, now);
        if let Some(mntns) = listed.mntns {
            let now_ns = shmtrace_core::clock::boot_ns().unwrap_or(u64::MAX);
            self.whose.left(mntns, &listed.container, now_ns);
            self.namespace_ended(mntns, Some(listed.container));
        }
    }

    /// A /dev/shm was measured.
    pub fn measured(&mut self, sample: &Capacity) {
        self.series.measured(sample);
    }

    /// Main processes of the containers whose /dev/shm should be measured now.
    pub fn to_measure(&self) -> Vec<u32> {
        self.series.to_measure()
    }

    /// Containers followed, for the state metrics.
    pub fn followed(&self) -> usize {
        self.series.followed()
    }

    /// Entries of the container bookkeeping (names, records' owners, namespaces' tenants,
    /// what waits), for the state metrics.
    pub fn entries(&self) -> usize {
        self.names.len() + self.whose.entries() + self.waiting.len() + self.listed.len()
    }
}
