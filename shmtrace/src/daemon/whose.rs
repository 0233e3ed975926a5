//! Whose a kernel record is: the host's, a container's (which one, by runtime and id), or a
//! namespace's that was never in any container.
//!
//! Mount namespace numbers are recycled at once: a container removed and another started a
//! moment later can share one, and a record of the first may be read after the second took
//! the number. So a record is placed, in this order:
//! 1. by the host's mount namespace: the host;
//! 2. by its cgroup v2 id (`cgroup_id`): the kernel never hands an id out twice, so a
//!    container's cgroup names it for good, and a record whose cgroup is not the number's
//!    current owner's belongs to the old owner. The id is looked up in the cgroup tree once,
//!    while the cgroup exists (a runtime removes it some time after the container ended), and
//!    remembered;
//! 3. by its process, met before (`/proc/PID/cgroup`, where cgroup ids name no container: a
//!    runtime that leaves cgroup2 alone on a hybrid host);
//! 4. by who had its mount namespace number at the record's time, as the records above, the
//!    surveys of the runtimes and their events told (each number's tenants, oldest first);
//! 5. by another process still in its namespace (one pass over /proc, once per namespace).
//!
//! What none of these places waits (`Found::Unplaced`) until a survey says who had the number
//! then, or that nobody did.
use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
};

use crate::container::{CgroupOwner, CgroupTree, PathClass, Runtime, parse_proc_cgroup};

/// A container, as a record's cgroup or a runtime names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerRef {
    pub runtime: Runtime,
    pub id: Arc<str>,
}

impl ContainerRef {
    pub fn new(runtime: Runtime, id: &str) -> ContainerRef {
        ContainerRef {
            runtime,
            id: Arc::from(id),
        }
    }

    /// The container a description names (its runtime as JSON spells it).
    pub fn of_info(info: &shmtrace_core::model::ContainerInfo) -> ContainerRef {
        let runtime = [
            Runtime::Docker,
            Runtime::Podman,
            Runtime::Containerd,
            Runtime::CriO,
        ]
        .into_iter()
        .find(|r| r.as_str() == info.runtime)
        .unwrap_or(Runtime::Unknown);
        ContainerRef::new(runtime, &info.id)
    }
}

/// Whose a record is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A process in the host's mount namespace.
    Host,
    Container(ContainerRef),
    /// A mount namespace that no container had (a sandbox made with `unshare`).
    NoContainer,
}

/// What [`Whose::place`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Owner(Owner),
    /// Nothing says yet whose `mntns` was at the record's time (nor whose its cgroup is).
    Unplaced {
        mntns: u32,
        cgroup_id: u64,
    },
}

/// How records are looked up on the machine; the tests give their own.
pub trait Lookups {
    /// Whose cgroup `id` is.
    fn cgroup(&mut self, id: u64) -> CgroupOwner;
    /// Which container process `pid` is in, by `/proc/PID/cgroup`; `None` once it is gone
    /// (or its number is a process's that started after `ts_ns`).
    fn process(&mut self, pid: u32, ts_ns: u64) -> Option<Option<ContainerRef>>;
    /// The container of a process in mount namespace `mntns` that was there at `ts_ns`, if
    /// any is still there.
    fn namespace(&mut self, mntns: u32, ts_ns: u64) -> Option<ContainerRef>;
    /// Whether any process is in mount namespace `mntns` now.
    fn anyone_in(&mut self, mntns: u32) -> bool;
    /// Whether any process is in each of `mntns` now.
    fn anyone_in_each(&mut self, mntns: &[u32]) -> Vec<bool> {
        mntns.iter().map(|m| self.anyone_in(*m)).collect()
    }
}

/// One container's time on a mount namespace number.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Tenancy {
    owner: ContainerRef,
    /// From when (`CLOCK_BOOTTIME` ns): its main process's start, or its first record.
    since_ns: u64,
    /// Until when, once known to be gone (its successor's start, or the survey that missed it).
    until_ns: Option<u64>,
}

/// Tenants remembered per number: a record is read within seconds, and a number does not pass
/// through more containers than this in that time.
const TENANTS_KEPT: usize = 4;
/// Most namespaces whose tenants are remembered, cgroups and processes met (each a few dozen
/// bytes); beyond, the oldest are forgotten (and looked up again if they act again).
const MAX_NAMESPACES: usize = 16_384;
const MAX_CGROUPS: usize = 65_536;
const MAX_PROCESSES: usize = 65_536;
/// cgroups remembered per container (a container's processes are in one, or a few nested).
const CGROUPS_PER_CONTAINER: usize = 8;
/// Processes that ended whose container is remembered, for the diagnoses that follow.
const EXITED_REMEMBERED: usize = 4096;
/// The root cgroup's id: every process of a runtime that leaves cgroup2 alone is in it.
const ROOT_CGROUP: u64 = 1;

pub struct Whose {
    host_mntns: u32,
    lookups: Box<dyn Lookups>,
    /// cgroup id: its container, or `None` for one of no container (or gone unknown).
    cgroups: HashMap<u64, Option<ContainerRef>>,
    /// The cgroups each container was seen in: a record of another cgroup is not its own,
    /// whatever namespace number it shares.
    cgroups_of: HashMap<ContainerRef, Vec<u64>>,
    /// Processes met: their namespace, and whose they were.
    processes: HashMap<u32, (u32, Owner)>,
    exited: VecDeque<u32>,
    /// Each mount namespace number's tenants, oldest first.
    tenants: HashMap<u32, Vec<Tenancy>>,
    /// Namespaces whose processes were looked through in /proc already.
    scanned: HashSet<u32>,
}

impl Whose {
    pub fn new(host_mntns: u32, lookups: Box<dyn Lookups>) -> Whose {
        Whose {
            host_mntns,
            lookups,
            cgroups: HashMap::new(),
            cgroups_of: HashMap::new(),
            processes: HashMap::new(),
            exited: VecDeque::new(),
            tenants: HashMap::new(),
            scanned: HashSet::new(),
        }
    }

    pub fn host_mntns(&self) -> u32 {
        self.host_mntns
    }

    /// Whose the record of process `pid`, in `mntns` and cgroup `cgroup_id`, at `ts_ns` is.
    pub fn place(&mut self, pid: u32, mntns: u32, cgroup_id: u64, ts_ns: u64) -> Found {
        if mntns == self.host_mntns {
            self.met(pid, mntns, Owner::Host);
            return Found::Owner(Owner::Host);
        }
        // A container's cgroup names it, whatever has the number now.
        if let Some(container) = self.by_cgroup(cgroup_id) {
            self.took(mntns, &container, ts_ns);
            let owner = Owner::Container(container);
            self.met(pid, mntns, owner.clone());
            return Found::Owner(owner);
        }
        if let Some((met_in, owner)) = self.processes.get(&pid)
            && *met_in == mntns
        {
            return Found::Owner(owner.clone());
        }
        match self.lookups.process(pid, ts_ns) {
            Some(Some(container)) => {
                self.took(mntns, &container, ts_ns);
                let owner = Owner::Container(container);
                self.met(pid, mntns, owner.clone());
                return Found::Owner(owner);
            }
            // In no container's cgroup, in a namespace of its own: unless a container's
            // process is in it too (`nsenter` into a running one), nobody's. Not the number's
            // last tenant: a container that has just ended gives its number to the next
            // namespace made, an `unshare` sandbox's as soon as another container's.
            Some(None) => {
                let owner = self
                    .lookups
                    .namespace(mntns, ts_ns)
                    .map_or(Owner::NoContainer, Owner::Container);
                self.met(pid, mntns, owner.clone());
                return Found::Owner(owner);
            }
            None => {}
        }
        if let Some(container) = self.tenant_of(mntns, cgroup_id, ts_ns) {
            return Found::Owner(Owner::Container(container));
        }
        // Gone already (`dd` writes and exits in a millisecond): another process of its
        // namespace may still say.
        if self.scanned.len() >= MAX_NAMESPACES {
            self.scanned.clear();
        }
        if self.scanned.insert(mntns)
            && let Some(container) = self.lookups.namespace(mntns, ts_ns)
        {
            self.took(mntns, &container, ts_ns);
            return Found::Owner(Owner::Container(container));
        }
        Found::Unplaced { mntns, cgroup_id }
    }

    /// What is known now of the record `found` could not place (its cgroup or its namespace's
    /// tenant at `ts_ns`, learned since), without looking anything up.
    pub fn place_again(&mut self, mntns: u32, cgroup_id: u64, ts_ns: u64) -> Option<ContainerRef> {
        if let Some(Some(container)) = self.cgroups.get(&cgroup_id).cloned() {
            self.took(mntns, &container, ts_ns);
            return Some(container);
        }
        self.tenant_of(mntns, cgroup_id, ts_ns)
    }

    /// Who had `mntns` at `ts_ns`, if a record of cgroup `cgroup_id` can be theirs: not if
    /// they were seen in other cgroups only (the record is of a container whose cgroup was
    /// gone before it could be looked up, which had the number after or before them).
    fn tenant_of(&self, mntns: u32, cgroup_id: u64, ts_ns: u64) -> Option<ContainerRef> {
        let tenant = self.tenant_at(mntns, ts_ns)?;
        let other = cgroup_id > ROOT_CGROUP
            && self
                .cgroups_of
                .get(&tenant)
                .is_some_and(|ids| !ids.contains(&cgroup_id));
        (!other).then_some(tenant)
    }

    /// The container of cgroup `id`, looked up once.
    fn by_cgroup(&mut self, id: u64) -> Option<ContainerRef> {
        if id <= ROOT_CGROUP {
            return None;
        }
        if let Some(known) = self.cgroups.get(&id) {
            return known.clone();
        }
        let container = match self.lookups.cgroup(id) {
            CgroupOwner::Container(found) => Some(ContainerRef::new(found.runtime, &found.id)),
            CgroupOwner::NotAContainer | CgroupOwner::Gone => None,
        };
        self.remember_cgroup(id, container.clone());
        container
    }

    fn remember_cgroup(&mut self, id: u64, container: Option<ContainerRef>) {
        if self.cgroups.len() >= MAX_CGROUPS {
            self.cgroups.clear();
            self.cgroups_of.clear();
        }
        if let Some(container) = &container {
            let ids = self.cgroups_of.entry(container.clone()).or_default();
            if !ids.contains(&id) && ids.len() < CGROUPS_PER_CONTAINER {
                ids.push(id);
            }
        }
        self.cgroups.insert(id, container);
    }

    /// A cgroup's container, as the runtime told it (a container just started): its records
    /// are placed by it however late they are read.
    pub fn learn_cgroup(&mut self, id: u64, container: &ContainerRef) {
        if id > ROOT_CGROUP {
            self.remember_cgroup(id, Some(container.clone()));
        }
    }

    fn met(&mut self, pid: u32, mntns: u32, owner: Owner) {
        if self.processes.len() >= MAX_PROCESSES {
            self.processes.clear();
            self.exited.clear();
        }
        self.processes.insert(pid, (mntns, owner));
    }

    /// Process `pid` ended: its number may be another's soon. Its container is remembered a
    /// while for the diagnoses that follow its end.
    pub fn exited(&mut self, pid: u32) {
        self.exited.push_back(pid);
        while self.exited.len() > EXITED_REMEMBERED {
            if let Some(old) = self.exited.pop_front() {
                self.processes.remove(&old);
            }
        }
    }

    /// Whose process `pid` was, as last met.
    pub fn of_process(&self, pid: u32) -> Option<(u32, &Owner)> {
        self.processes
            .get(&pid)
            .map(|(mntns, owner)| (*mntns, owner))
    }

    /// `container` had `mntns` at `ts_ns`: from then on, unless known already. The tenant
    /// before it is gone by then.
    fn took(&mut self, mntns: u32, container: &ContainerRef, ts_ns: u64) {
        self.learn_tenant(mntns, container, ts_ns);
    }

    /// `container` has mount namespace `mntns` since `since_ns` (a survey or an event saw its
    /// main process, which started then).
    pub fn learn_tenant(&mut self, mntns: u32, container: &ContainerRef, since_ns: u64) {
        if mntns == self.host_mntns || mntns == 0 {
            return;
        }
        if !self.tenants.contains_key(&mntns) && self.tenants.len() >= MAX_NAMESPACES {
            // The namespaces whose last tenant ended longest ago go first.
            let oldest = self
                .tenants
                .iter()
                .filter_map(|(n, t)| Some((t.last()?.until_ns?, *n)))
                .min();
            match oldest {
                Some((_, n)) => drop(self.tenants.remove(&n)),
                None => self.tenants.clear(),
            }
        }
        let tenants = self.tenants.entry(mntns).or_default();
        if let Some(known) = tenants.iter_mut().find(|t| t.owner == *container) {
            known.since_ns = known.since_ns.min(since_ns);
            return;
        }
        // In order of start; the one before it ended by then, the one after it started after
        // its end.
        let at = tenants.partition_point(|t| t.since_ns <= since_ns);
        if let Some(before) = at.checked_sub(1).map(|i| &mut tenants[i]) {
            let until = before.until_ns.get_or_insert(since_ns);
            *until = (*until).min(since_ns);
        }
        let until_ns = tenants.get(at).map(|after| after.since_ns);
        tenants.insert(
            at,
            Tenancy {
                owner: container.clone(),
                since_ns,
                until_ns,
            },
        );
        if tenants.len() > TENANTS_KEPT {
            tenants.remove(0);
        }
    }

    /// `container` left `mntns` by `until_ns` (a survey no longer lists it, or it died).
    pub fn left(&mut self, mntns: u32, container: &ContainerRef, until_ns: u64) {
        if let Some(tenancy) = self
            .tenants
            .get_mut(&mntns)
            .and_then(|t| t.iter_mut().find(|t| t.owner == *container))
        {
            let until = tenancy.until_ns.get_or_insert(until_ns);
            *until = (*until).min(until_ns).max(tenancy.since_ns);
        }
    }

    /// `container` ended by `until_ns` (its runtime said it died): none of its namespaces is
    /// its after that.
    pub fn ended(&mut self, container: &ContainerRef, until_ns: u64) {
        for tenants in self.tenants.values_mut() {
            if let Some(tenancy) = tenants.iter_mut().find(|t| t.owner == *container) {
                let until = tenancy.until_ns.get_or_insert(until_ns);
                *until = (*until).min(until_ns).max(tenancy.since_ns);
            }
        }
    }

    /// The namespaces whose last known tenant `container` is.
    pub fn last_had(&self, container: &ContainerRef) -> Vec<u32> {
        self.tenants
            .iter()
            .filter(|(_, t)| t.last().is_some_and(|t| t.owner == *container))
            .map(|(mntns, _)| *mntns)
            .collect()
    }

    /// Who had `mntns` at `ts_ns`, as far as is known.
    pub fn tenant_at(&self, mntns: u32, ts_ns: u64) -> Option<ContainerRef> {
        let tenants = self.tenants.get(&mntns)?;
        let tenancy = tenants.iter().rev().find(|t| t.since_ns <= ts_ns)?;
        tenancy
            .until_ns
            .is_none_or(|until| ts_ns <= until)
            .then(|| tenancy.owner.clone())
    }

    /// Since when `container` had `mntns`, if it did.
    pub fn tenant_since(&self, mntns: u32, container: &ContainerRef) -> Option<u64> {
        self.tenants
            .get(&mntns)?
            .iter()
            .find(|t| t.owner == *container)
            .map(|t| t.since_ns)
    }

    /// The last container known on `mntns`.
    pub fn last_tenant(&self, mntns: u32) -> Option<&ContainerRef> {
        self.tenants.get(&mntns)?.last().map(|t| &t.owner)
    }

    /// Whether any process is in `mntns` now (it is gone with its /dev/shm otherwise).
    pub fn anyone_in(&mut self, mntns: u32) -> bool {
        self.lookups.anyone_in(mntns)
    }

    /// Whether any process is in each of `mntns` now.
    pub fn anyone_in_each(&mut self, mntns: &[u32]) -> Vec<bool> {
        self.lookups.anyone_in_each(mntns)
    }

    /// A namespace nobody is in any more: its number may come back for anyone.
    pub fn namespace_ended(&mut self, mntns: u32) {
        self.scanned.remove(&mntns);
    }

    /// Entries held, for the daemon's state metrics.
    pub fn entries(&self) -> usize {
        self.cgroups.len() + self.processes.len() + self.tenants.len()
    }
}

/// The machine itself: the cgroup tree, /proc.
pub struct OnTheMachine {
    tree: Option<CgroupTree>,
}

impl OnTheMachine {
    pub fn new() -> OnTheMachine {
        OnTheMachine {
            tree: CgroupTree::open(),
        }
    }
}

impl Lookups for OnTheMachine {
    fn cgroup(&mut self, id: u64) -> CgroupOwner {
        match &self.tree {
            Some(tree) => tree.owner_of(id).unwrap_or_else(|error| {
                log::debug!("cgroup {id}: {error}");
                CgroupOwner::Gone
            }),
            None => CgroupOwner::Gone,
        }
    }

    fn process(&mut self, pid: u32, ts_ns: u64) -> Option<Option<ContainerRef>> {
        if !there_at(pid, ts_ns) {
            return None;
        }
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        Some(match parse_proc_cgroup(&text) {
            PathClass::Container(found) => Some(ContainerRef::new(found.runtime, &found.id)),
            _ => None,
        })
    }

    fn namespace(&mut self, mntns: u32, ts_ns: u64) -> Option<ContainerRef> {
        // Only a process that was there then: one that came later may be the number's next
        // owner's.
        pids()
            .filter(|pid| crate::kernel_ids::mount_namespace(*pid) == Some(mntns))
            .find_map(|pid| self.process(pid, ts_ns).flatten())
    }

    fn anyone_in(&mut self, mntns: u32) -> bool {
        match std::fs::read_dir("/proc") {
            Ok(_) => pids().any(|pid| crate::kernel_ids::mount_namespace(pid) == Some(mntns)),
            // Unreadable: assume it is there (forgetting a live /dev/shm would be worse).
            Err(_) => true,
        }
    }

    /// One pass over /proc for all of them.
    fn anyone_in_each(&mut self, mntns: &[u32]) -> Vec<bool> {
        if std::fs::read_dir("/proc").is_err() {
            return vec![true; mntns.len()];
        }
        let mut occupied = vec![false; mntns.len()];
        for pid in pids() {
            let Some(theirs) = crate::kernel_ids::mount_namespace(pid) else {
                continue;
            };
            if let Some(at) = mntns.iter().position(|m| *m == theirs) {
                occupied[at] = true;
                if occupied.iter().all(|o| *o) {
                    break;
                }
            }
        }
        occupied
    }
}

/// Clock ticks' worth of slack between a process's start in /proc and its first record.
const START_SLACK_NS: u64 = 20_000_000;

/// Whether process `pid` was there at `ts_ns`: the number is not a later process's.
pub fn there_at(pid: u32, ts_ns: u64) -> bool {
    crate::live::proc_scan::start_ns(pid)
        .is_some_and(|start| start <= ts_ns.saturating_add(START_SLACK_NS))
}

fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
}
