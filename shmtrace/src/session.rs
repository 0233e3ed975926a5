//! A live trace: records from the kernel, decoded, applied to the model, rendered, until the
//! target is gone or the user interrupts; then a summary.
use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    bpf::{EventReader, LostCounts, Tracer, watch},
    diagnose::{Diagnoser, Diagnosis, Role},
    event::{Body, Event, ExitStatus, decode},
    model::World,
    output::{Output, Summary},
    proc_scan, shm_fs,
    target::RunningCommand,
};

/// When a live trace ends.
pub enum Ending {
    /// When this command exits; its status becomes shmtrace's.
    Command(RunningCommand),
    /// When every one of these processes has exited.
    Pids(HashSet<u32>),
    /// Only when interrupted (Ctrl-C or SIGTERM).
    Interrupt,
}

/// How a trace ended.
#[derive(Debug)]
pub struct Outcome {
    /// The traced command's status, when a command was traced.
    pub command_status: Option<ExitStatus>,
    pub interrupted: bool,
}

pub struct Session {
    tracer: Tracer,
    world: World,
    diagnoser: Diagnoser,
    diagnoses: Vec<Diagnosis>,
    /// Mount namespaces whose /dev/shm has been measured at least once.
    measured: HashSet<u32>,
    output: Output,
    verbose: bool,
    lost_reported: LostCounts,
    malformed: u64,
    started: Instant,
}

/// How long to keep reading after the traced command exits, for the last events of processes
/// that ended with it.
const GRACE: Duration = Duration::from_millis(100);
const LOST_CHECK_EVERY: Duration = Duration::from_secs(1);

impl Session {
    pub fn new(tracer: Tracer, world: World, output: Output, verbose: bool) -> Session {
        let host_mntns = proc_scan::mount_namespace(std::process::id()).unwrap_or(0);
        Session {
            tracer,
            world,
            diagnoser: Diagnoser::new(host_mntns),
            diagnoses: Vec::new(),
            measured: HashSet::new(),
            output,
            verbose,
            lost_reported: LostCounts::default(),
            malformed: 0,
            started: Instant::now(),
        }
    }

    /// Names the mount namespaces that are not shmtrace's and have no other name.
    pub fn name_other_namespaces(&mut self, label: &str) {
        self.diagnoser.set_unnamed_place(label.to_owned());
    }

    pub async fn run(mut self, mut ending: Ending) -> Result<Outcome> {
        let ring = self
            .tracer
            .take_events()
            .context("the ring buffer was already taken")?;
        let mut reader = EventReader::new(ring).context("watching the ring buffer")?;
        let mut logger = match (self.verbose, self.tracer.take_logger()) {
            (true, Some(logger)) => Some(watch(logger).context("watching the eBPF log")?),
            _ => None,
        };
        let mut interrupt =
            signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
        let mut terminate =
            signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
        let mut ticker = tokio::time::interval(LOST_CHECK_EVERY);

        let mut command_done = match &ending {
            Ending::Command(command) => {
                let waiter = *command;
                Some(tokio::task::spawn_blocking(move || waiter.wait()))
            }
            _ => None,
        };

        let mut batch: Vec<Bytes> = Vec::new();
        let mut outcome = Outcome {
            command_status: None,
            interrupted: false,
        };
        loop {
            tokio::select! {
                read = reader.read(&mut batch) => {
                    read.context("reading the ring buffer")?;
                    self.handle(&mut batch, &mut ending)?;
                    if let Ending::Pids(live) = &ending
                        && live.is_empty() {
                            self.output.notice("every traced process has exited")?;
                            break;
                        }
                }
                status = async { command_done.as_mut().expect("guarded").await }, if command_done.is_some() => {
                    let status = status.context("waiting for the traced command")??;
                    outcome.command_status = Some(status);
                    break;
                }
                _ = interrupt.recv() => {
                    outcome.interrupted = true;
                    break;
                }
                _ = terminate.recv() => {
                    outcome.interrupted = true;
                    break;
                }
                _ = ticker.tick() => self.report_lost()?,
                guard = async { logger.as_mut().expect("guarded").readable_mut().await }, if logger.is_some() => {
                    let mut guard = guard.context("reading the eBPF log")?;
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            }
        }

        tokio::time::sleep(GRACE).await;
        reader.drain(&mut batch);
        self.handle(&mut batch, &mut ending)?;
        self.report_lost()?;
        if self.malformed > 0 {
            self.output.notice(&format!(
                "{} records from the kernel could not be decoded and were skipped (a probe and \
                 CLI version mismatch?)",
                self.malformed
            ))?;
        }
        if let Some(status) = outcome.command_status {
            self.output.notice(&match status {
                ExitStatus::Code(code) => format!("command exited with status {code}"),
                ExitStatus::Signal { signo, .. } => format!(
                    "command killed by {}",
                    crate::event::names::signal_name(signo)
                ),
            })?;
        }
        for diagnosis in self.diagnoser.finish(&self.world) {
            self.output.diagnosis(&diagnosis)?;
            self.diagnoses.push(diagnosis);
        }
        let summary = Summary::new(
            &self.world,
            self.lost_reported.clone(),
            self.started.elapsed().as_secs_f64(),
            self.diagnoser.table(&self.world),
            &self.diagnoses,
        );
        self.output.summary(&summary)?;
        self.output.flush()?;
        Ok(outcome)
    }

    fn handle(&mut self, batch: &mut Vec<Bytes>, ending: &mut Ending) -> Result<()> {
        for record in batch.drain(..) {
            let event = match decode(&record) {
                Ok(event) => event,
                Err(error) => {
                    self.malformed += 1;
                    log::warn!("skipping a malformed record: {error}");
                    continue;
                }
            };
            if !self.world.knows(event.pid) && !matches!(event.body, Body::Exec(_)) {
                // First sight of a process that existed before: learn what it already holds.
                if let Some(snapshot) = proc_scan::snapshot(event.pid) {
                    self.world.seed(&snapshot, event.ts_ns);
                }
            }
            self.measure_if_needed(&event);
            let note = self.world.apply(&event);
            let role = self.role_shown(&event);
            self.output
                .event(&event, &note, &role)
                .context("writing output")?;
            for diagnosis in self.diagnoser.observe(&event, &note, &self.world) {
                self.output
                    .diagnosis(&diagnosis)
                    .context("writing output")?;
                self.diagnoses.push(diagnosis);
            }
            if let (Ending::Pids(live), Body::Exit(_)) = (&mut *ending, &event.body) {
                live.remove(&event.pid);
            }
            if let (Ending::Pids(live), Body::Fork { child_pid }) = (&mut *ending, &event.body) {
                live.insert(*child_pid);
            }
        }
        Ok(())
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

    /// Measures /dev/shm when a namespace is first seen and before a failure is diagnosed, so
    /// the diagnosis can say how big it was and how full.
    fn measure_if_needed(&mut self, event: &Event) {
        let failure = match &event.body {
            Body::Call(call) => call.failed(),
            Body::Signal(signal) => signal.addr != 0,
            Body::Exit(status) => !status.success(),
            Body::Oom { .. } => true,
            _ => false,
        };
        if !failure && self.measured.contains(&event.mntns) {
            return;
        }
        let subject = match &event.body {
            Body::Signal(signal) => signal.target_pid,
            _ => event.pid,
        };
        // The subject may be gone (it just died): any live process of its namespace will do.
        let candidates = std::iter::once(subject).chain(
            self.world
                .processes()
                .filter(|p| p.mntns == event.mntns && p.alive())
                .map(|p| p.pid),
        );
        for pid in candidates {
            if let Some(sample) = shm_fs::measure(pid, event.ts_ns) {
                self.diagnoser.capacity(sample);
                self.measured.insert(event.mntns);
                return;
            }
        }
    }

    fn report_lost(&mut self) -> Result<()> {
        let total = self.tracer.lost()?;
        let delta = total.since(&self.lost_reported);
        if delta.total() > 0 {
            self.output.lost(&delta, &total)?;
            self.lost_reported = total;
        }
        Ok(())
    }
}
