//! The path every record takes, live or replayed: decode, model, diagnose, show, and copy to
//! a tap (a trace file); an observer may watch it all to draw a picture (`report --html`).
//!
//! Live tracing and replay differ only in where records come from and in the
//! [`Environment`]: live, a process first seen is looked up in /proc and /dev/shm is measured
//! when something fails; the results go to the tap as records, so that a replay meets the same
//! inputs at the same place and reaches the same diagnosis without a live machine.
mod asking_the_machine;
mod bounded_state;
#[cfg(test)]
mod bounded_state_tests;
mod ports;
#[cfg(test)]
mod tests;
mod trigger;

use anyhow::Result;
use bytes::Bytes;

use crate::{
    capacity::Capacity,
    diagnose::{Diagnoser, Diagnosis, Role},
    event::{Body, Event, LostCounts, decode},
    model::{ContainerInfo, FastMap, FastSet, ProcSnapshot, World},
    output::{Output, Summary, filter::Filter},
    record::{Trigger, TriggerReason, UserRecord},
};

pub use bounded_state::{Evicted, State};
pub use ports::{Environment, Observer, Recorded, Tap};
use trigger::{capacity_record, trigger};

/// Runs every record through decode, model, diagnose and output, and copies it to the tap.
pub struct Pipeline {
    world: World,
    diagnoser: Diagnoser,
    diagnoses: Vec<Diagnosis>,
    output: Output,
    filter: Filter,
    /// Show each event, or only diagnoses and the summary.
    show_events: bool,
    tap: Option<Box<dyn Tap>>,
    observer: Option<Box<dyn Observer>>,
    /// Mount namespaces whose /dev/shm was measured, with the pid whose event asked for it.
    measured: FastMap<u32, u32>,
    /// File systems (`dev_t`) of /dev/shm objects that were measured, or tried once.
    measured_devs: FastSet<u32>,
    /// When each /dev/shm file system's holders were last looked for (a failure on it).
    holders_read: FastMap<u32, u64>,
    /// Processes whose title and container pid were read again at their first /dev/shm call,
    /// and at their first failure.
    read_at_call: FastSet<u32>,
    read_at_failure: FastSet<u32>,
    lost: LostCounts,
    malformed: u64,
    /// Most diagnoses kept for the summary ([`Pipeline::bounded`]); `None` keeps all.
    max_diagnoses: Option<usize>,
    evicted_diagnoses: u64,
    /// Processes forgotten as gone without an exit record (`bounded_state`).
    vanished: u64,
    /// See [`Pipeline::trace_was_cut`].
    cut: bool,
    /// Per /dev/shm file system, its latest measurement and the most it was seen using.
    measurements: FastMap<u32, (Capacity, u64)>,
}

/// What a status line shows while a trace that prints nothing else runs (`size`, `record`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub events: u64,
    pub processes: u64,
    /// The /dev/shm the traced processes use most, if one was measured.
    pub shm: Option<ShmStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShmStatus {
    /// As last measured (statfs), and the most measured.
    pub size: u64,
    pub used: u64,
    pub peak_used: u64,
    /// Pages the traced processes' objects hold on it, as system calls showed, now and at most.
    pub traced: u64,
    pub traced_peak: u64,
}

impl Pipeline {
    pub fn new(world: World, diagnoser: Diagnoser, output: Output, filter: Filter) -> Pipeline {
        Pipeline {
            world,
            diagnoser,
            diagnoses: Vec::new(),
            output,
            filter,
            show_events: true,
            tap: None,
            observer: None,
            measured: FastMap::default(),
            measured_devs: FastSet::default(),
            holders_read: FastMap::default(),
            read_at_call: FastSet::default(),
            read_at_failure: FastSet::default(),
            lost: LostCounts::default(),
            malformed: 0,
            max_diagnoses: None,
            evicted_diagnoses: 0,
            vanished: 0,
            cut: false,
            measurements: FastMap::default(),
        }
    }

    /// Whether events are shown as they come (a trace), or only diagnoses (`record`, `size`).
    pub fn shows_events(&self) -> bool {
        self.show_events
    }

    /// Where the trace stands: events so far, and the /dev/shm in most use.
    pub fn status(&self) -> Status {
        let totals = self.world.totals();
        let shm = self
            .measurements
            .iter()
            .map(|(dev, (latest, peak))| {
                let usage = self.world.usage(*dev);
                ShmStatus {
                    size: latest.size,
                    used: latest.used,
                    peak_used: *peak,
                    traced: usage.map_or(0, |u| u.allocated),
                    traced_peak: usage.map_or(0, |u| u.peak_allocated),
                }
            })
            .max_by_key(|s| (s.traced_peak, s.peak_used));
        Status {
            events: totals.events,
            processes: totals.processes_seen,
            shm,
        }
    }

    /// The trace being replayed stops before its end: the summary must not speak of what is
    /// held now, only of what was held where it stops.
    pub fn trace_was_cut(&mut self) {
        self.cut = true;
    }

    /// Shows diagnoses and the summary, not each event (`record`, `report`).
    pub fn diagnoses_only(mut self) -> Pipeline {
        self.show_events = false;
        self
    }

    pub fn with_tap(mut self, tap: Box<dyn Tap>) -> Pipeline {
        self.tap = Some(tap);
        self
    }

    pub fn with_observer(mut self, observer: Box<dyn Observer>) -> Pipeline {
        self.observer = Some(observer);
        self
    }

    #[cfg(test)]
    pub fn diagnoses(&self) -> &[Diagnosis] {
        &self.diagnoses
    }

    pub fn output(&mut self) -> &mut Output {
        &mut self.output
    }

    /// The container of mount namespace `mntns`, as the runtimes told it.
    pub fn container(&self, mntns: u32) -> Option<&ContainerInfo> {
        self.diagnoser.container(mntns)
    }

    /// A container stopped: its mount namespace number may come back for another one.
    /// Recorded, so that a replay (an incident recording above all) stops naming the number
    /// after it too.
    pub fn forget_container(&mut self, mntns: u32, ts_ns: u64) -> Result<()> {
        self.diagnoser.forget_container(mntns);
        self.world.forget_shm_dev(mntns);
        // Measured again when another container has the number.
        self.measured.remove(&mntns);
        self.tap_user(ts_ns, &UserRecord::ContainerEnd { mntns })
    }

    pub fn name_other_namespaces(&mut self, label: &str) {
        self.diagnoser.set_unnamed_place(label.to_owned());
    }

    /// Tells which container a mount namespace is: its events are labelled with it, and its
    /// diagnoses speak of it.
    pub fn set_container(&mut self, info: ContainerInfo, ts_ns: u64) -> Result<()> {
        self.output.show_places();
        let record = UserRecord::Container(Box::new((&info).into()));
        if let Some(observer) = &mut self.observer {
            observer.container(&info);
        }
        self.learn_container(info);
        self.tap_user(ts_ns, &record)
    }

    /// What a container is, for the diagnoser (its name, its /dev/shm) and the model (which
    /// namespaces share a /dev/shm: a name one removes is gone from the others).
    fn learn_container(&mut self, info: ContainerInfo) {
        if let (Some(mntns), Some(dev)) = (info.mntns, info.shm_dev) {
            self.world.learn_shm_dev(mntns, dev);
        }
        self.diagnoser.set_container(info);
    }

    /// A measurement of a /dev/shm taken outside a failure (the session samples containers).
    pub fn capacity(&mut self, sample: Capacity, pid: Option<u32>) -> Result<()> {
        self.learn_capacity(sample);
        self.tap_user(sample.ts_ns, &capacity_record(&sample, pid))
    }

    /// Records a process found before tracing started (`--pid`).
    pub fn seed(&mut self, snapshot: &ProcSnapshot, ts_ns: u64) -> Result<()> {
        self.learn_process(snapshot, ts_ns);
        self.tap_user(ts_ns, &UserRecord::Snapshot(snapshot.into()))
    }

    /// One raw kernel record; returns its event, `None` for a malformed record.
    ///
    /// What the environment adds (a /proc snapshot, a /dev/shm measurement) goes to the tap
    /// before the record itself, so that a replay has it at hand when it meets the record.
    pub fn kernel_record(
        &mut self,
        bytes: &Bytes,
        env: &mut dyn Environment,
    ) -> Result<Option<Event>> {
        let mut event = match decode(bytes) {
            Ok(event) => event,
            Err(error) => {
                self.malformed += 1;
                log::warn!("skipping a malformed record: {error}");
                if let Some(tap) = &mut self.tap {
                    tap.kernel(bytes)?;
                }
                return Ok(None);
            }
        };
        // A name relative to a directory descriptor (`find`, `du`, `rm -r` in a /dev/shm
        // subdirectory) is named whole, from the directory opened in the trace.
        if let Body::Call(call) = &mut event.body
            && let Some(whole) = self.world.resolve_relative(event.pid, event.mntns, call)
        {
            call.path = Some(whole);
        }
        // A pid the kernel gave again: the process the model knows by it ended before this
        // call, and the probes saw no fork of the new one (host-wide, a container's shell that
        // never touched /dev/shm starts dd). Forgotten, the one that ended lends the new one
        // nothing: its name, command line, role (issue 37).
        if matches!(event.body, Body::Call(_) | Body::Exec(_))
            && self.world.ended_before(event.pid, event.ts_ns)
        {
            self.forget_ended(event.pid);
        }
        if !self.world.knows(event.pid) && !matches!(event.body, Body::Exec(_)) {
            // First sight of a process that existed before: learn what it already holds.
            if let Some(snapshot) = env.snapshot(event.pid) {
                self.seed(&snapshot, event.ts_ns)?;
                self.read_at_call.insert(event.pid);
            }
        }
        self.measure_if_needed(&event, env)?;
        self.read_holders_if_full(&event, env)?;
        self.reread_title(&event, env)?;
        if let Some(tap) = &mut self.tap {
            tap.kernel(bytes)?;
        }
        let note = self.world.apply(&event);
        if let Body::Fork { child_pid } = &event.body {
            self.read_young_child(event.pid, *child_pid, env)?;
        }
        if let Body::Exec(exec) = &event.body {
            self.read_whole_command_line(&event, exec, env)?;
        }
        if let Body::Exit(_) = &event.body {
            self.retire_private_shm(event.mntns);
        }
        let role = self.role_shown(&event);
        let shown_mntns = self.shown_mntns(&event);
        let place = self.diagnoser.place_name(shown_mntns);
        if let Some(observer) = &mut self.observer {
            observer.event(&event, &note, &role, &place, &self.world);
        }
        if self.show_events && self.filter.keep(&event, &note, &role, &place) {
            self.output.event(
                &event,
                &note,
                &role,
                &place,
                self.diagnoser.container(shown_mntns),
                &self.world,
            )?;
        } else {
            self.output.tick(event.ts_ns)?;
        }
        if let Some(trigger) = trigger(&event, &note, &role)
            && let Some(tap) = &mut self.tap
        {
            tap.trigger(event.ts_ns, trigger)?;
        }
        for diagnosis in self.diagnoser.observe(&event, &note, &self.world) {
            self.show_diagnosis(diagnosis)?;
        }
        Ok(Some(event))
    }

    /// One userspace record of a recorded trace.
    pub fn user_record(&mut self, ts_ns: u64, record: &UserRecord) -> Result<()> {
        match record {
            UserRecord::Snapshot(snapshot) => self.learn_process(&snapshot.to_model(), ts_ns),
            UserRecord::Capacity(sample) => self.learn_capacity(sample.capacity.at(ts_ns)),
            UserRecord::Holders(sample) => self.diagnoser.holders(sample.to_model(ts_ns)),
            UserRecord::Lost(counters) => {
                self.lost = counters.to_counts().0;
                self.diagnoser.set_lost_events(self.lost.total());
            }
            UserRecord::Container(container) => {
                self.output.show_places();
                let info = container.to_info();
                if let Some(observer) = &mut self.observer {
                    observer.container(&info);
                }
                self.learn_container(info);
            }
            UserRecord::ContainerEnd { mntns } => {
                self.diagnoser.forget_container(*mntns);
                self.world.forget_shm_dev(*mntns);
            }
            UserRecord::WriterLoss(loss) => self.output.notice(&format!(
                "the recorder could not write {} records ({}): the trace has a hole here",
                loss.records,
                crate::event::escape::text(&loss.reason)
            ))?,
            // A failure's trigger repeats what its diagnosis says; the user's own mark does not.
            UserRecord::Trigger(trigger) if trigger.reason == TriggerReason::Manual => {
                self.output.notice(&format!(
                    "marked here by the user while recording: {}",
                    crate::event::escape::text(&trigger.detail)
                ))?
            }
            UserRecord::Trigger(_)
            | UserRecord::Note { .. }
            | UserRecord::End
            | UserRecord::Unknown => {}
        }
        Ok(())
    }

    /// The kernel's cumulative loss counts; reports what is new.
    pub fn lost(&mut self, total: LostCounts, ts_ns: u64) -> Result<()> {
        let delta = total.since(&self.lost);
        if delta.total() == 0 {
            return Ok(());
        }
        self.output.lost(&delta, &total)?;
        self.tap_user(ts_ns, &UserRecord::Lost((&total).into()))?;
        self.lost = total;
        self.diagnoser.set_lost_events(self.lost.total());
        Ok(())
    }

    pub fn notice(&mut self, text: &str) -> Result<()> {
        Ok(self.output.notice(text)?)
    }

    pub fn tick(&mut self, now_ns: u64) -> Result<()> {
        self.output.tick(now_ns)?;
        match &mut self.tap {
            Some(tap) => tap.tick(&self.world, now_ns),
            None => Ok(()),
        }
    }

    /// The user asked for the moments before now to be written (SIGUSR1): the tap does as for
    /// a failure. `false` when there is no tap.
    pub fn trigger_manual(&mut self, ts_ns: u64) -> Result<bool> {
        let Some(tap) = &mut self.tap else {
            return Ok(false);
        };
        tap.trigger(
            ts_ns,
            Trigger {
                reason: TriggerReason::Manual,
                pid: None,
                detail: "SIGUSR1 (asked for by the user)".to_owned(),
            },
        )?;
        Ok(true)
    }

    /// Diagnoses what is still open, closes the tap, and prints the summary.
    pub fn finish(&mut self, seconds: f64, now_ns: u64) -> Result<Summary> {
        if self.malformed > 0 {
            self.output.notice(&format!(
                "{} records from the kernel could not be decoded and were skipped (a probe and \
                 CLI version mismatch?)",
                self.malformed
            ))?;
        }
        for diagnosis in self.diagnoser.finish(&self.world) {
            self.show_diagnosis(diagnosis)?;
        }
        if let Some(tap) = self.tap.take()
            && let Some(message) = tap.finish(&self.world, now_ns)?
        {
            self.output.notice(&message)?;
        }
        if let Some(observer) = self.observer.take() {
            let roles = self.diagnoser.roles(&self.world);
            if let Some(message) = observer.finish(&self.world, roles, self.lost.total(), now_ns)? {
                self.output.notice(&message)?;
            }
        }
        let mut summary = Summary::new(
            &self.world,
            self.lost.clone(),
            seconds,
            self.diagnoser.table(&self.world),
            &self.diagnoses,
        );
        summary.cut = self.cut;
        self.output.summary(&summary)?;
        self.output.flush()?;
        Ok(summary)
    }

    fn learn_process(&mut self, snapshot: &ProcSnapshot, ts_ns: u64) {
        self.world.seed(snapshot, ts_ns);
        if let Some(observer) = &mut self.observer {
            observer.seeded(snapshot.pid, ts_ns, &self.world);
        }
    }

    fn learn_capacity(&mut self, sample: Capacity) {
        let peak = self
            .measurements
            .get(&sample.dev)
            .map_or(sample.used, |(_, peak)| (*peak).max(sample.used));
        self.measurements.insert(sample.dev, (sample, peak));
        self.diagnoser.capacity(sample);
        if let Some(observer) = &mut self.observer {
            observer.capacity(&sample);
        }
    }

    fn show_diagnosis(&mut self, diagnosis: Diagnosis) -> Result<()> {
        if let Some(observer) = &mut self.observer {
            observer.diagnosis(&diagnosis);
        }
        if self.filter.keep_diagnosis(&diagnosis) {
            self.output.diagnosis(&diagnosis)?;
        }
        self.diagnoses.push(diagnosis);
        if self
            .max_diagnoses
            .is_some_and(|max| self.diagnoses.len() > max)
        {
            self.diagnoses.remove(0);
            self.evicted_diagnoses += 1;
        }
        Ok(())
    }

    fn tap_user(&mut self, ts_ns: u64, record: &UserRecord) -> Result<()> {
        match &mut self.tap {
            Some(tap) => tap.user(ts_ns, record),
            None => Ok(()),
        }
    }

    /// The mount namespace of the process an event's line is about: a signal's line is about
    /// its receiver, whose container it belongs to whoever sent it (the kernel tearing a
    /// namespace down sends from a task whose namespace reads 0).
    fn shown_mntns(&self, event: &Event) -> u32 {
        match &event.body {
            Body::Signal(signal) => self
                .world
                .process(signal.target_pid)
                .map(|p| p.mntns)
                .filter(|mntns| *mntns != 0)
                .unwrap_or(event.mntns),
            _ => event.mntns,
        }
    }

    /// The role of the process an event's line is about (a signal's receiver, say).
    fn role_shown(&mut self, event: &Event) -> Role {
        let roles = self.diagnoser.roles(&self.world);
        match &event.body {
            Body::Signal(signal) if signal.target_pid != event.pid => roles.of(signal.target_pid),
            Body::Rename { pid, .. } => roles.of(*pid),
            Body::Oom { victim_pid } => roles.of(*victim_pid),
            _ => roles.of_thread(event.pid, &event.comm),
        }
    }

    /// When the last process of a container with a private /dev/shm has ended, that /dev/shm
    /// is unmounted with everything in it. Its objects end there: a restarted container gets
    /// a fresh /dev/shm whose files reuse the same device, inode numbers, names and even mount
    /// namespace number, and must not be taken for the old ones.
    fn retire_private_shm(&mut self, mntns: u32) {
        // Asked at every exit: indexed lookups, not a scan of every process (issue 25).
        let Some(container) = self.diagnoser.container(mntns) else {
            return;
        };
        if container.ipc != "private" || self.world.any_alive_in(mntns) {
            return;
        }
        if let Some(dev) = container.shm_dev {
            self.world.retire_file_system(dev, mntns);
        }
    }
}
