//! The path every record takes, live or replayed: decode, model, diagnose, show, and copy to
//! a tap (a trace file); an observer may watch it all to draw a picture (`report --html`).
//!
//! Live tracing and replay differ only in where records come from and in the
//! [`Environment`]: live, a process first seen is looked up in /proc and /dev/shm is measured
//! when something fails; the results go to the tap as records, so that a replay meets the same
//! inputs at the same place and reaches the same diagnosis without a live machine.
use std::collections::HashSet;

use anyhow::{Context, Result};
use bytes::Bytes;

use crate::{
    diagnose::{Capacity, Diagnoser, Diagnosis, Role, RoleKind, Roles},
    event::{Body, Event, LostCounts, decode},
    model::{Annotation, ContainerInfo, ProcSnapshot, World},
    output::{Output, Summary, filter::Filter},
    record::{self, Trigger, TriggerReason, UserRecord},
};

/// What the pipeline may ask of the machine.
pub trait Environment {
    /// The process as /proc shows it now.
    fn snapshot(&mut self, pid: u32) -> Option<ProcSnapshot>;
    /// The /dev/shm of the first of `pids` that can be reached.
    fn measure(&mut self, pids: &[u32], ts_ns: u64) -> Option<Capacity>;
}

/// A recorded trace: everything the machine said is in the file already.
pub struct Recorded;

impl Environment for Recorded {
    fn snapshot(&mut self, _: u32) -> Option<ProcSnapshot> {
        None
    }

    fn measure(&mut self, _: &[u32], _: u64) -> Option<Capacity> {
        None
    }
}

/// Where a copy of the trace goes.
pub trait Tap {
    fn kernel(&mut self, bytes: &Bytes) -> Result<()>;
    fn user(&mut self, ts_ns: u64, record: &UserRecord) -> Result<()>;
    /// Something failed: the flight recorder writes its window.
    fn trigger(&mut self, ts_ns: u64, trigger: Trigger) -> Result<()>;
    /// Called often (every 100 ms): time to flush what is due.
    fn tick(&mut self, world: &World, now_ns: u64) -> Result<()>;
    /// Tracing ended; returns what to tell the user (`wrote trace.shmtrace: ...`).
    fn finish(self: Box<Self>, world: &World, now_ns: u64) -> Result<Option<String>>;
}

/// Watches what the pipeline learns, in order, to describe the whole trace afterwards (the
/// HTML and Perfetto pictures of `report`). It sees every event and diagnosis, whatever the
/// filter shows.
pub trait Observer {
    /// An event, once the model has applied it; `role` and `place` as the output shows them.
    fn event(&mut self, event: &Event, note: &Annotation, role: &Role, place: &str, world: &World);
    /// A process learned from /proc, with what it already held.
    fn seeded(&mut self, pid: u32, ts_ns: u64, world: &World);
    fn capacity(&mut self, sample: &Capacity);
    fn container(&mut self, info: &ContainerInfo);
    fn diagnosis(&mut self, diagnosis: &Diagnosis);
    /// The trace ended at `end_ns`; `roles` are as known at the end, `lost` counts the events
    /// the kernel could not deliver. Returns what to tell the user (`wrote report.html`).
    fn finish(
        self: Box<Self>,
        world: &World,
        roles: &Roles,
        lost: u64,
        end_ns: u64,
    ) -> Result<Option<String>>;
}

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
    /// Mount namespaces whose /dev/shm was measured once.
    measured: HashSet<u32>,
    /// File systems (`dev_t`) of /dev/shm objects that were measured, or tried once.
    measured_devs: HashSet<u32>,
    lost: LostCounts,
    malformed: u64,
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
            measured: HashSet::new(),
            measured_devs: HashSet::new(),
            lost: LostCounts::default(),
            malformed: 0,
        }
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

    /// A container stopped: its mount namespace number may come back for another one.
    pub fn forget_container(&mut self, mntns: u32) {
        self.diagnoser.forget_container(mntns);
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
        self.diagnoser.set_container(info);
        self.tap_user(ts_ns, &record)
    }

    /// A measurement of a /dev/shm taken outside a failure (the session samples containers).
    pub fn capacity(&mut self, sample: Capacity, pid: Option<u32>) -> Result<()> {
        self.learn_capacity(sample);
        self.tap_user(sample.ts_ns, &capacity_record(sample, pid))
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
        let event = match decode(bytes) {
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
        if !self.world.knows(event.pid) && !matches!(event.body, Body::Exec(_)) {
            // First sight of a process that existed before: learn what it already holds.
            if let Some(snapshot) = env.snapshot(event.pid) {
                self.seed(&snapshot, event.ts_ns)?;
            }
        }
        self.measure_if_needed(&event, env)?;
        if let Some(tap) = &mut self.tap {
            tap.kernel(bytes)?;
        }
        let note = self.world.apply(&event);
        let role = self.role_shown(&event);
        let place = self.diagnoser.place(event.mntns);
        if let Some(observer) = &mut self.observer {
            observer.event(&event, &note, &role, &place, &self.world);
        }
        if self.show_events && self.filter.keep(&event, &role, &place) {
            self.output
                .event(
                    &event,
                    &note,
                    &role,
                    &place,
                    self.diagnoser.container(event.mntns),
                )
                .context("writing output")?;
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
            UserRecord::Capacity(sample) => self.learn_capacity(Capacity {
                dev: sample.capacity.dev,
                size: sample.capacity.size_bytes,
                used: sample.capacity.used_bytes,
                ts_ns,
            }),
            UserRecord::Lost(counters) => self.lost = counters.to_counts().0,
            UserRecord::Container(container) => {
                self.output.show_places();
                let info = container.to_info();
                if let Some(observer) = &mut self.observer {
                    observer.container(&info);
                }
                self.diagnoser.set_container(info);
            }
            UserRecord::WriterLoss(loss) => self.output.notice(&format!(
                "the recorder could not write {} records ({}): the trace has a hole here",
                loss.records, loss.reason
            ))?,
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
        Ok(())
    }

    pub fn notice(&mut self, text: &str) -> Result<()> {
        Ok(self.output.notice(text)?)
    }

    pub fn tick(&mut self, now_ns: u64) -> Result<()> {
        match &mut self.tap {
            Some(tap) => tap.tick(&self.world, now_ns),
            None => Ok(()),
        }
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
        let summary = Summary::new(
            &self.world,
            self.lost.clone(),
            seconds,
            self.diagnoser.table(&self.world),
            &self.diagnoses,
        );
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
            self.output
                .diagnosis(&diagnosis)
                .context("writing output")?;
        }
        self.diagnoses.push(diagnosis);
        Ok(())
    }

    fn tap_user(&mut self, ts_ns: u64, record: &UserRecord) -> Result<()> {
        match &mut self.tap {
            Some(tap) => tap.user(ts_ns, record),
            None => Ok(()),
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

    /// Measures /dev/shm when a namespace is first seen, when a call first touches an object
    /// on a file system not measured yet, and before a failure is diagnosed, so that the
    /// diagnosis can say how big it was and how full.
    ///
    /// The second covers a /dev/shm mounted after its namespace was first seen (`unshare -m`
    /// then `mount`, as sandboxes do): measured at the failure only, it would be missing
    /// whenever the failing processes, and all others of their namespace, are gone by the time
    /// their events are read.
    fn measure_if_needed(&mut self, event: &Event, env: &mut dyn Environment) -> Result<()> {
        let failure = event.is_failure();
        let new_file_system = match &event.body {
            // Tried once per file system, whatever the outcome: a file system that is not
            // this namespace's /dev/shm (a descriptor passed from elsewhere) costs one try.
            Body::Call(call) => call
                .file
                .is_some_and(|file| self.measured_devs.insert(file.inode.dev)),
            _ => false,
        };
        if !failure && !new_file_system && self.measured.contains(&event.mntns) {
            return Ok(());
        }
        let subject = match &event.body {
            Body::Signal(signal) => signal.target_pid,
            _ => event.pid,
        };
        // The subject may be gone (it just died): any live process of its namespace will do.
        let mut pids = vec![subject];
        pids.extend(
            self.world
                .processes()
                .filter(|p| p.mntns == event.mntns && p.alive() && p.pid != subject)
                .map(|p| p.pid),
        );
        let Some(sample) = env.measure(&pids, event.ts_ns) else {
            return Ok(());
        };
        self.measured.insert(event.mntns);
        self.measured_devs.insert(sample.dev);
        self.learn_capacity(sample);
        self.tap_user(event.ts_ns, &capacity_record(sample, Some(subject)))
    }
}

fn capacity_record(sample: Capacity, pid: Option<u32>) -> UserRecord {
    UserRecord::Capacity(record::CapacitySample {
        pid,
        container: None,
        capacity: record::ShmCapacity {
            dev: sample.dev,
            size_bytes: sample.size,
            used_bytes: sample.used,
            available_bytes: sample.size.saturating_sub(sample.used),
        },
    })
}

/// What makes the flight recorder write its window: ENOSPC, a SIGBUS fault, a worker's death.
fn trigger(event: &Event, note: &Annotation, role: &Role) -> Option<Trigger> {
    let (reason, detail) = match &event.body {
        Body::Call(call) if call.errno() == Some(libc::ENOSPC) => (
            TriggerReason::Enospc,
            format!(
                "{} on {} returned ENOSPC",
                call.syscall.name(),
                note.object_path.as_deref().unwrap_or("?")
            ),
        ),
        Body::Signal(signal) if signal.signo == libc::SIGBUS && signal.addr != 0 => (
            TriggerReason::Sigbus,
            format!(
                "SIGBUS at {:#x}{}",
                signal.addr,
                note.fault
                    .as_ref()
                    .map(|f| format!(" in {}", f.path))
                    .unwrap_or_default()
            ),
        ),
        Body::Exit(status)
            if !status.success()
                && (role.kind == RoleKind::DataloaderWorker
                    || matches!(status, crate::event::ExitStatus::Signal { .. })) =>
        {
            (
                TriggerReason::WorkerDeath,
                format!("pid {} ({}) ended: {status:?}", event.pid, event.comm),
            )
        }
        _ => return None,
    };
    let pid = match &event.body {
        Body::Signal(signal) => signal.target_pid,
        _ => event.pid,
    };
    Some(Trigger {
        reason,
        pid: Some(pid),
        detail,
    })
}

#[cfg(test)]
mod tests {
    use shmtrace_common::{
        EventKind, ExitEvent, FileRef, ForkEvent, Header, PATH_LEN, PathEvent, Syscall,
        SyscallEvent, flags,
    };

    use super::*;
    use crate::{clock::Clock, output::Format};

    const NS: u32 = 4026532177;
    const HOST_SHM: u32 = 26;
    const PRIVATE_SHM: u32 = 47;

    /// The machine as the pipeline asks it: /dev/shm is the host's until the namespace mounts
    /// its own, and nothing can be measured once every process is gone.
    struct Machine {
        shm: u32,
        gone: bool,
    }

    impl Environment for Machine {
        fn snapshot(&mut self, _: u32) -> Option<ProcSnapshot> {
            None
        }

        fn measure(&mut self, _: &[u32], ts_ns: u64) -> Option<Capacity> {
            (!self.gone).then_some(Capacity {
                dev: self.shm,
                size: if self.shm == PRIVATE_SHM {
                    1 << 20
                } else {
                    64 << 20
                },
                used: 0,
                ts_ns,
            })
        }
    }

    fn bytes_of<T>(value: &T) -> Bytes {
        // SAFETY: test-only view of a plain-old-data struct as bytes.
        let bytes =
            unsafe { std::slice::from_raw_parts(value as *const T as *const u8, size_of::<T>()) };
        Bytes::copy_from_slice(bytes)
    }

    fn header(kind: EventKind, flags: u16, pid: u32, ts_ns: u64) -> Header {
        let mut comm = [0u8; 16];
        comm[..7].copy_from_slice(b"python3");
        Header {
            kind: kind as u16,
            flags,
            ts_ns,
            pid,
            tid: pid,
            mntns: NS,
            cgroup_id: 1,
            comm,
            ..Header::default()
        }
    }

    fn call(syscall: Syscall, pid: u32, ts_ns: u64, ret: i64, args: [u64; 6]) -> SyscallEvent {
        SyscallEvent {
            header: header(EventKind::Syscall, flags::FILE, pid, ts_ns),
            syscall: syscall as u16,
            fd: 3,
            ret,
            args,
            file: FileRef {
                dev: PRIVATE_SHM,
                mode: libc::S_IFREG | 0o600,
                ino: 9,
                size: 0,
                blocks: 0,
            },
            ..SyscallEvent::default()
        }
    }

    #[test]
    fn a_shm_mounted_after_the_namespace_was_seen_is_measured_while_its_processes_live() {
        let mut pipeline = Pipeline::new(
            World::new(),
            Diagnoser::new(4026531841),
            Output::new(
                Box::new(std::io::sink()),
                Format::Json,
                Clock::with_offset(0, jiff::tz::TimeZone::UTC),
                false,
            ),
            Filter::default(),
        );
        let mut machine = Machine {
            shm: HOST_SHM,
            gone: false,
        };
        // `unshare -m` then a fork: first sight of the namespace, /dev/shm still the host's.
        let fork = ForkEvent {
            header: header(EventKind::Fork, 0, 10, 1),
            child_pid: 11,
            _pad: 0,
        };
        pipeline
            .kernel_record(&bytes_of(&fork), &mut machine)
            .unwrap();
        // A 1 MiB tmpfs is mounted on /dev/shm; a semaphore is created on it.
        machine.shm = PRIVATE_SHM;
        let flags = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
        let mut path = [0u8; PATH_LEN];
        path[..19].copy_from_slice(b"/dev/shm/sem.AbCdEf");
        let open = PathEvent {
            call: SyscallEvent {
                header: header(EventKind::Path, flags::FILE, 11, 2),
                ..call(Syscall::Openat, 11, 2, 3, [0, 0, flags, 0o600, 0, 0])
            },
            path,
        };
        pipeline
            .kernel_record(&bytes_of(&open), &mut machine)
            .unwrap();
        // Its write fails; by the time the events are read, every process has exited.
        machine.gone = true;
        let write = call(
            Syscall::Write,
            11,
            3,
            -(libc::ENOSPC as i64),
            [3, 0, 32, 0, 0, 0],
        );
        pipeline
            .kernel_record(&bytes_of(&write), &mut machine)
            .unwrap();
        let exit = ExitEvent {
            header: header(EventKind::Exit, 0, 11, 4),
            exit_code: 1 << 8,
            _pad: 0,
        };
        pipeline
            .kernel_record(&bytes_of(&exit), &mut machine)
            .unwrap();

        let diagnosis = &pipeline.diagnoses()[0];
        assert_eq!(diagnosis.pid, 11);
        let capacity = diagnosis
            .capacity
            .expect("the size of the /dev/shm that filled up");
        assert_eq!(capacity.dev, PRIVATE_SHM);
        assert_eq!(capacity.size, 1 << 20);
    }
}
