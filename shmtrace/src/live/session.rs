//! A live trace: records from the kernel go through the [`Pipeline`] until the target is gone
//! or the user interrupts; then a summary.
use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    clock::boot_ns,
    event::{Body, ExitStatus, names},
    live::{
        bpf::{EventReader, Tracer, watch},
        machine::LiveMachine,
        target::RunningCommand,
        watch::Watch,
    },
    pipeline::Pipeline,
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

/// How long to keep reading after the traced command exits, for the last events of processes
/// that ended with it.
const GRACE: Duration = Duration::from_millis(100);
/// How often ordinary records are collected from the ring buffer and the pipeline's tap may
/// flush, and how often kernel losses are checked (every tenth tick).
const TICK: Duration = Duration::from_millis(100);
const TICKS_PER_LOST_CHECK: u32 = 10;
/// How often followed containers are checked for restarts and their /dev/shm measured.
const WATCH_EVERY: Duration = Duration::from_secs(1);

pub struct Session {
    tracer: Tracer,
    pipeline: Pipeline,
    watch: Option<Watch>,
    verbose: bool,
    started: Instant,
}

impl Session {
    pub fn new(tracer: Tracer, pipeline: Pipeline, verbose: bool) -> Session {
        Session {
            tracer,
            pipeline,
            watch: None,
            verbose,
            started: Instant::now(),
        }
    }

    /// Follows containers (restarts, /dev/shm use) while tracing.
    pub fn with_watch(mut self, watch: Watch) -> Session {
        self.watch = Some(watch);
        self
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
        let mut ticker = tokio::time::interval(TICK);
        let mut ticks = 0u32;
        let mut watch_ticker = tokio::time::interval(WATCH_EVERY);

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
                    if all_exited(&ending) {
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
                _ = watch_ticker.tick(), if self.watch.is_some() => {
                    let watch = self.watch.as_mut().expect("guarded");
                    watch.check(&mut self.tracer, &mut self.pipeline).await?;
                }
                _ = ticker.tick() => {
                    // Ordinary records do not wake the reader (it costs the traced call
                    // microseconds): they are collected here.
                    reader.drain(&mut batch);
                    self.handle(&mut batch, &mut ending)?;
                    if all_exited(&ending) {
                        break;
                    }
                    ticks += 1;
                    if ticks.is_multiple_of(TICKS_PER_LOST_CHECK) {
                        self.check_lost()?;
                    }
                    self.pipeline.tick(boot_ns())?;
                }
                guard = async { logger.as_mut().expect("guarded").readable_mut().await }, if logger.is_some() => {
                    let mut guard = guard.context("reading the eBPF log")?;
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            }
        }

        if all_exited(&ending) {
            self.pipeline.notice("every traced process has exited")?;
        }
        tokio::time::sleep(GRACE).await;
        reader.drain(&mut batch);
        self.handle(&mut batch, &mut ending)?;
        self.check_lost()?;
        if let Some(status) = outcome.command_status {
            self.pipeline.notice(&match status {
                ExitStatus::Code(code) => format!("command exited with status {code}"),
                ExitStatus::Signal { signo, .. } => {
                    format!("command killed by {}", names::signal_name(signo))
                }
            })?;
        }
        self.pipeline
            .finish(self.started.elapsed().as_secs_f64(), boot_ns())?;
        Ok(outcome)
    }

    fn handle(&mut self, batch: &mut Vec<Bytes>, ending: &mut Ending) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut machine = LiveMachine::default();
        machine.read_failing_early(batch);
        for record in batch.drain(..) {
            let event = self.pipeline.kernel_record(&record, &mut machine)?;
            if let (Ending::Pids(live), Some(event)) = (&mut *ending, event) {
                match event.body {
                    Body::Exit(_) => {
                        live.remove(&event.pid);
                    }
                    Body::Fork { child_pid } => {
                        live.insert(child_pid);
                    }
                    _ => {}
                }
            }
        }
        // Output is buffered; a batch at a time reaches the terminal or file.
        self.pipeline.output().flush()?;
        Ok(())
    }

    fn check_lost(&mut self) -> Result<()> {
        let total = self.tracer.lost()?;
        self.pipeline.lost(total, boot_ns())
    }
}

/// Whether the trace follows processes and every one of them has exited. The records that
/// say so may arrive through a wake-up or through the timer: both check.
fn all_exited(ending: &Ending) -> bool {
    matches!(ending, Ending::Pids(live) if live.is_empty())
}
