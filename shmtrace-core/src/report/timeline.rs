//! What the report pictures show, gathered while a trace goes through the pipeline: which
//! process held which /dev/shm object from when to when, where things failed or died, how much
//! each /dev/shm file system held over time against its measured size, and the diagnoses.
//!
//! The model already knows every descriptor and mapping; after each event the timeline compares
//! what the acting process holds with what it held before, so a span opens at an open, mmap or
//! fork and closes at the close, munmap, exec or exit that let go of the object's last
//! reference in that process.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::{
    capacity::Capacity,
    diagnose::{self, Cause, Diagnosis, FailureKind, Role, Roles, known::is_posix_semaphore},
    event::{Body, Event, Exit, ExitStatus, InodeId, Syscall, names},
    model::{Annotation, ContainerInfo, World},
};

/// At least this much is shown before the first and after the last activity.
const WINDOW_MARGIN_NS: u64 = 20_000_000;

/// One process's hold on one /dev/shm object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub pid: u32,
    pub inode: InodeId,
    /// The object's name (escaped), or `<inode N on M:m>`.
    pub name: String,
    /// The most the object took while held (its size, or more if more was allocated).
    pub bytes: u64,
    pub start_ns: u64,
    /// `None`: still held when the trace ended.
    pub end_ns: Option<u64>,
}

/// What a mark on a lane stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MarkKind {
    /// A call that found /dev/shm full (ENOSPC).
    Enospc,
    /// SIGBUS touching a page of a full /dev/shm.
    Sigbus,
    /// Another failed call, or a fault outside /dev/shm.
    Error,
    /// Chosen by the OOM killer.
    Oom,
    /// Died of a signal.
    Killed,
    /// Exited with a non-zero status.
    Exited,
}

impl MarkKind {
    /// The CSS class and Perfetto category: `enospc`, `sigbus`, ...
    pub fn class(self) -> &'static str {
        match self {
            MarkKind::Enospc => "enospc",
            MarkKind::Sigbus => "sigbus",
            MarkKind::Error => "error",
            MarkKind::Oom => "oom",
            MarkKind::Killed => "killed",
            MarkKind::Exited => "exited",
        }
    }

    /// A death rather than a failure.
    pub fn is_death(self) -> bool {
        matches!(self, MarkKind::Killed | MarkKind::Exited)
    }
}

/// A failure or a death, on the lane of the process it happened to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub ts_ns: u64,
    pub pid: u32,
    pub kind: MarkKind,
    /// Short, for beside the mark: `ENOSPC`, `SIGBUS`, `killed by SIGKILL`.
    pub short: String,
    /// The whole story: `fallocate of 256.0 KiB on /dev/shm/torch_1 returned ENOSPC`.
    pub detail: String,
    /// The /dev/shm file system concerned, when known.
    pub dev: Option<u32>,
}

/// One /dev/shm file system over time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Device {
    /// Whose it is: a container, `host`, a mount namespace (escaped).
    pub label: Option<String>,
    /// `(ts, bytes)` whenever the traced objects' demand on it (their sizes, written or not)
    /// changed.
    pub demand: Vec<(u64, u64)>,
    /// `(ts, bytes)` whenever the pages the traced objects hold, as system calls showed
    /// them, changed.
    pub held: Vec<(u64, u64)>,
    /// Measurements of its size and use (statfs), at failures and once a second per container.
    pub samples: Vec<Capacity>,
}

impl Device {
    pub fn peak_demand(&self) -> u64 {
        self.demand.iter().map(|(_, b)| *b).max().unwrap_or(0)
    }

    pub fn peak_held(&self) -> u64 {
        self.held.iter().map(|(_, b)| *b).max().unwrap_or(0)
    }

    /// The most statfs measured in use.
    pub fn peak_used(&self) -> u64 {
        self.samples.iter().map(|s| s.used).max().unwrap_or(0)
    }

    /// The largest size measured: the capacity line.
    pub fn size(&self) -> Option<u64> {
        self.samples.iter().map(|s| s.size).max()
    }
}

/// A process drawn as a lane, as known at the end of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    pub pid: u32,
    pub comm: String,
    pub role: Role,
    pub place: String,
    pub first_ns: u64,
    pub exit: Option<(u64, ExitStatus)>,
}

impl Lane {
    /// `worker 1 · pid 4242`, or `sh · pid 17` for a process with no particular role.
    pub fn title(&self) -> String {
        let tag = self.role.tag();
        let who = if tag.is_empty() { &self.comm } else { &tag };
        format!("{who} · pid {}", self.pid)
    }
}

/// Everything the pictures need.
#[derive(Debug, Default)]
pub struct Timeline {
    first_ns: Option<u64>,
    last_ns: u64,
    spans: Vec<Span>,
    /// Open spans, per process and object: index into `spans`. A process holding none has
    /// no entry.
    open: HashMap<u32, BTreeMap<InodeId, usize>>,
    /// The same spans per object, for [`Timeline::resize`] at every call: looking through
    /// every process's made a report of a fork storm quadratic (issue 25).
    open_of: HashMap<InodeId, Vec<usize>>,
    marks: Vec<Mark>,
    devices: BTreeMap<u32, Device>,
    /// Where each process ran, by its own events.
    places: HashMap<u32, String>,
    diagnoses: Vec<Diagnosis>,
    /// Containers of the trace, in words.
    containers: Vec<String>,
    /// Filled in by `finish`.
    lanes: Vec<Lane>,
    /// Processes seen that held no /dev/shm object and neither failed nor died badly.
    quiet_processes: usize,
    /// Draw POSIX semaphores too (`--show-all`); otherwise they are counted.
    show_all: bool,
    semaphore_holds: usize,
    /// Events the kernel dropped (its ring buffer was full): the pictures have gaps.
    lost: u64,
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline::default()
    }

    /// Draws everything: POSIX semaphores too, each hold a bar.
    pub fn show_all(mut self) -> Timeline {
        self.show_all = true;
        self
    }

    pub fn event(&mut self, event: &Event, note: &Annotation, place: &str, world: &World) {
        self.saw(event.ts_ns);
        self.places.insert(event.pid, place.to_owned());
        match &event.body {
            Body::Call(call) => {
                if call.syscall.opens_a_path()
                    || matches!(
                        call.syscall,
                        Syscall::Mmap | Syscall::Munmap | Syscall::Close
                    )
                {
                    self.refresh(event.pid, event.ts_ns, world);
                }
                if let Some(file) = call.file {
                    self.resize(file.inode, world);
                    // Until a container claims it, a file system is named after where it is used.
                    let device = self.devices.entry(file.inode.dev).or_default();
                    device.label.get_or_insert_with(|| place.to_owned());
                }
            }
            Body::Fork { child_pid } => {
                self.places.insert(*child_pid, place.to_owned());
                self.refresh(*child_pid, event.ts_ns, world);
            }
            Body::Exec(_) | Body::Exit(_) => self.refresh(event.pid, event.ts_ns, world),
            Body::Signal(_) | Body::Rename { .. } | Body::Oom { .. } => {}
        }
        self.mark(event, note);
        self.track_demand(event.ts_ns, world);
    }

    /// A process found in /proc: what it already holds starts now.
    pub fn seeded(&mut self, pid: u32, ts_ns: u64, world: &World) {
        self.saw(ts_ns);
        self.refresh(pid, ts_ns, world);
        self.track_demand(ts_ns, world);
    }

    pub fn capacity(&mut self, sample: &Capacity) {
        self.saw(sample.ts_ns);
        self.devices
            .entry(sample.dev)
            .or_default()
            .samples
            .push(*sample);
    }

    /// A container's name is the best label for its /dev/shm.
    pub fn container(&mut self, info: &ContainerInfo) {
        let description = info.describe();
        if !self.containers.contains(&description) {
            self.containers.push(description);
        }
        if let Some(dev) = info.shm_dev {
            self.devices.entry(dev).or_default().label =
                Some(format!("container {}", info.label()));
        }
    }

    pub fn diagnosis(&mut self, diagnosis: &Diagnosis) {
        self.diagnoses.push(diagnosis.clone());
    }

    /// Closes the books: lanes for the processes worth drawing, with their final names and
    /// roles.
    pub fn finish(&mut self, world: &World, roles: &Roles, lost: u64, end_ns: u64) {
        self.saw(end_ns);
        self.lost = lost;
        if !self.show_all {
            // A page each, dozens a process: never what filled /dev/shm. Counted instead.
            let before = self.spans.len();
            self.spans.retain(|s| !is_posix_semaphore(&s.name));
            self.semaphore_holds = before - self.spans.len();
        }
        let mut drawn: BTreeSet<u32> = self.spans.iter().map(|s| s.pid).collect();
        drawn.extend(self.marks.iter().map(|m| m.pid));
        self.lanes = drawn
            .iter()
            .map(|pid| {
                let process = world.process(*pid);
                Lane {
                    pid: *pid,
                    comm: process.map(|p| p.comm.clone()).unwrap_or_default(),
                    role: roles.of(*pid),
                    place: self.places.get(pid).cloned().unwrap_or_default(),
                    first_ns: process.map(|p| p.first_seen_ns).unwrap_or(end_ns),
                    exit: process.and_then(|p| Some((p.exit_ns?, p.exit?))),
                }
            })
            .collect();
        // A trainer above its workers, in worker order, then the rest as they came.
        self.lanes.sort_by_key(|lane| {
            let group = match lane.role.kind {
                diagnose::RoleKind::DataloaderWorker => lane.role.trainer.unwrap_or(lane.pid),
                diagnose::RoleKind::Trainer => lane.pid,
                _ => u32::MAX,
            };
            let order = match lane.role.kind {
                diagnose::RoleKind::Trainer => 0,
                diagnose::RoleKind::DataloaderWorker => 1,
                _ => 2,
            };
            (
                lane.place.clone(),
                group,
                order,
                lane.role.worker_index,
                lane.first_ns,
                lane.pid,
            )
        });
        self.quiet_processes = world
            .processes()
            .filter(|p| !drawn.contains(&p.pid))
            .count();
    }

    /// When the trace starts and ends (boot-time ns).
    pub fn range(&self) -> (u64, u64) {
        let start = self.first_ns.unwrap_or(self.last_ns);
        (start, self.last_ns.max(start))
    }

    /// Where /dev/shm was in use: from the first hold, failure or death to the last, with a
    /// margin; the whole trace when there was none. A recording often idles before and after.
    pub fn window(&self) -> (u64, u64) {
        let (start, end) = self.range();
        let times = self
            .spans
            .iter()
            .flat_map(|s| [Some(s.start_ns), s.end_ns])
            .flatten()
            .chain(self.marks.iter().map(|m| m.ts_ns));
        let (Some(first), Some(last)) = (times.clone().min(), times.max()) else {
            return (start, end);
        };
        let margin = ((last - first) / 20).max(WINDOW_MARGIN_NS);
        (
            first.saturating_sub(margin).max(start),
            last.saturating_add(margin).min(end),
        )
    }

    pub fn containers(&self) -> &[String] {
        &self.containers
    }

    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    pub fn marks(&self) -> &[Mark] {
        &self.marks
    }

    /// /dev/shm file systems worth a chart: those with objects or measurements.
    pub fn devices(&self) -> impl Iterator<Item = (u32, &Device)> {
        self.devices
            .iter()
            .filter(|(_, d)| !d.samples.is_empty() || d.peak_demand() > 0)
            .map(|(dev, d)| (*dev, d))
    }

    pub fn lanes(&self) -> &[Lane] {
        &self.lanes
    }

    pub fn diagnoses(&self) -> &[Diagnosis] {
        &self.diagnoses
    }

    pub fn quiet_processes(&self) -> usize {
        self.quiet_processes
    }

    /// Holds of POSIX semaphores left out of the picture.
    pub fn semaphore_holds(&self) -> usize {
        self.semaphore_holds
    }

    pub fn lost(&self) -> u64 {
        self.lost
    }

    fn saw(&mut self, ts_ns: u64) {
        // Records without a time (0) would stretch the axis back to boot.
        if ts_ns == 0 {
            return;
        }
        self.first_ns = Some(self.first_ns.map_or(ts_ns, |f| f.min(ts_ns)));
        self.last_ns = self.last_ns.max(ts_ns);
    }

    /// Opens and closes `pid`'s spans to match what the model says it holds now.
    fn refresh(&mut self, pid: u32, ts_ns: u64, world: &World) {
        let held: BTreeSet<InodeId> = world
            .process(pid)
            .map(|p| {
                p.fds
                    .values()
                    .map(|fd| fd.inode)
                    .chain(p.mappings.iter().map(|m| m.inode))
                    .collect()
            })
            .unwrap_or_default();
        let open = self.open.entry(pid).or_default();
        let released: Vec<InodeId> = open
            .keys()
            .filter(|inode| !held.contains(inode))
            .copied()
            .collect();
        for inode in released {
            let index = open.remove(&inode).expect("listed");
            self.spans[index].end_ns = Some(ts_ns);
            if let Some(spans) = self.open_of.get_mut(&inode) {
                spans.retain(|i| *i != index);
                if spans.is_empty() {
                    self.open_of.remove(&inode);
                }
            }
        }
        for inode in held {
            if let Some(index) = open.get(&inode) {
                let span = &mut self.spans[*index];
                if let Some(object) = world.object(&inode) {
                    span.bytes = span.bytes.max(object.footprint().0);
                }
                continue;
            }
            let object = world.object(&inode);
            open.insert(inode, self.spans.len());
            self.open_of
                .entry(inode)
                .or_default()
                .push(self.spans.len());
            self.spans.push(Span {
                pid,
                inode,
                name: object
                    .map(|o| o.display_name())
                    .unwrap_or_else(|| format!("<inode {} on {}>", inode.ino, inode.dev_string())),
                bytes: object.map(|o| o.footprint().0).unwrap_or(0),
                start_ns: ts_ns,
                end_ns: None,
            });
        }
        if open.is_empty() {
            self.open.remove(&pid);
        }
    }

    /// An object changed size: every open span of it says so.
    fn resize(&mut self, inode: InodeId, world: &World) {
        let Some(object) = world.object(&inode) else {
            return;
        };
        let bytes = object.footprint().0;
        for index in self.open_of.get(&inode).into_iter().flatten() {
            let span = &mut self.spans[*index];
            span.bytes = span.bytes.max(bytes);
            // The name may have been learned after the span opened (a passed descriptor).
            if span.name.starts_with("<inode")
                && let Some(path) = &object.path
            {
                span.name = path.to_string();
            }
        }
    }

    fn mark(&mut self, event: &Event, note: &Annotation) {
        if let Some((pid, cause, kind, dev)) = diagnose::classify(event, note) {
            let (mark, short) = match (&kind, cause) {
                (FailureKind::Call { errno, .. }, Cause::ShmFull) => {
                    (MarkKind::Enospc, errno.clone())
                }
                (FailureKind::Fault { signal, .. }, Cause::ShmFull) => {
                    (MarkKind::Sigbus, signal.clone())
                }
                (FailureKind::OomKill, _) => (MarkKind::Oom, "OOM kill".to_owned()),
                (FailureKind::Call { errno, .. }, _) => (MarkKind::Error, errno.clone()),
                (FailureKind::Fault { signal, .. }, _) => (MarkKind::Error, signal.clone()),
                // The diagnoser's conclusion, not a classified event: not met here.
                (FailureKind::SpaceCheck { .. }, _) => (MarkKind::Error, "space".to_owned()),
            };
            self.marks.push(Mark {
                ts_ns: event.ts_ns,
                pid,
                kind: mark,
                short,
                detail: kind.headline(),
                dev,
            });
        }
        // An exit another process asked for, or the status of one that never touched shared
        // memory (a compiler probing for a library), is no failure to mark.
        if let Body::Exit(Exit { status, .. }) = &event.body
            && note.is_failure(event)
        {
            let (kind, short) = match status {
                ExitStatus::Signal { signo, .. } => (
                    MarkKind::Killed,
                    format!("killed by {}", names::signal_name(*signo)),
                ),
                ExitStatus::Code(0) => return,
                ExitStatus::Code(code) => (MarkKind::Exited, format!("exit {code}")),
            };
            let detail = match status {
                ExitStatus::Code(code) => format!("{} exited with status {code}", event.comm),
                ExitStatus::Signal { .. } => format!("{} {short}", event.comm),
            };
            self.marks.push(Mark {
                ts_ns: event.ts_ns,
                pid: event.pid,
                kind,
                short,
                detail,
                dev: None,
            });
        }
    }

    /// Adds a point to each file system whose demand changed.
    fn track_demand(&mut self, ts_ns: u64, world: &World) {
        for (dev, usage) in world.usages() {
            let device = self.devices.entry(dev).or_default();
            step(&mut device.demand, ts_ns, usage.demand);
            step(&mut device.held, ts_ns, usage.allocated);
        }
    }
}

/// Adds a point to a step series when its value changed.
fn step(series: &mut Vec<(u64, u64)>, ts_ns: u64, bytes: u64) {
    let last = series.last().map(|(_, b)| *b);
    if last != Some(bytes) {
        if last.is_none() && bytes > 0 {
            // Start the line from nothing, not from the first value.
            series.push((ts_ns, 0));
        }
        series.push((ts_ns, bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Call, FileRef};

    fn event(ts_ns: u64, pid: u32, body: Body) -> Event {
        Event {
            ts_ns,
            cpu: 0,
            pid,
            tid: pid,
            comm: "python3".to_owned(),
            mntns: 4026531841,
            cgroup_id: 1,
            container_match: false,
            body,
        }
    }

    /// Issue 25, item 4: `report --html` of a fork storm was quadratic: every call's resize
    /// looked through the open spans of every process ever seen (each kept an empty entry
    /// after its last close). Counted as the entries a resize visits, not timed.
    #[test]
    fn a_storm_of_processes_leaves_no_open_spans_to_look_through() {
        let mut world = World::new();
        let mut timeline = Timeline::default();
        let mut most_visited = 0;
        let mut ts = 0;
        let feed = |world: &mut World, timeline: &mut Timeline, event: Event| {
            let note = world.apply(&event);
            timeline.event(&event, &note, "host", world);
        };
        for i in 0..2000u32 {
            let child = 1000 + i;
            ts += 10;
            feed(
                &mut world,
                &mut timeline,
                event(ts, 10, Body::Fork { child_pid: child }),
            );
            let file = FileRef {
                inode: InodeId {
                    dev: 26,
                    ino: 100 + u64::from(i),
                },
                mode: libc::S_IFREG | 0o600,
                size: 4096,
                allocated: 4096,
            };
            let open = Call {
                syscall: Syscall::Openat,
                fd: Some(3),
                ret: 3,
                args: [0, 0, (libc::O_RDWR | libc::O_CREAT) as u64, 0o600, 0, 0],
                file: Some(file),
                path: Some(format!("/dev/shm/storm-{i}")),
                path_truncated: false,
                relative_to_shm: false,
                dir_ino: None,
            };
            feed(
                &mut world,
                &mut timeline,
                event(ts + 1, child, Body::Call(open)),
            );
            // What the next call's resize looks through.
            most_visited = most_visited.max(timeline.open.len());
            let exit = Body::Exit(ExitStatus::Code(0).into());
            feed(&mut world, &mut timeline, event(ts + 2, child, exit));
        }
        assert!(
            most_visited <= 2,
            "a resize looked through {most_visited} processes' open spans"
        );
        assert_eq!(timeline.spans.len(), 2000, "every hold is still drawn");
        assert!(timeline.spans.iter().all(|s| s.end_ns.is_some()));
    }
}
