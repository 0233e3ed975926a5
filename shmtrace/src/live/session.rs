//! A live trace: records from the kernel (or the ptrace tracer, see `source`) go through the
//! [`Pipeline`] until the target is gone or the user interrupts; then a summary.
use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;

use crate::{
    live::{
        bpf::{EventReader, Tracer},
        hold::Hold,
        host_environment::LiveMachine,
        progress::Progress,
        signals::{Received, Signals, Stop},
        source::{Probes, Source},
        target::RunningCommand,
        watch::Watch,
    },
    ptrace::Feed,
};
use shmtrace_core::{
    clock::boot_ns,
    event::{Body, ExitStatus, names},
    pipeline::{Evicted, Pipeline},
};

/// When a live trace ends.
pub enum Ending {
    /// When this command exits; its status becomes shmtrace's.
    Command(RunningCommand),
    /// When every one of these processes has exited.
    Pids(HashSet<u32>),
    /// Only when interrupted (Ctrl-C, SIGTERM or SIGHUP), or when the reader of the output
    /// goes away. (With a command, those signals are passed on to it first: see [`STOP_GRACE`].)
    Interrupt,
}

/// How a trace ended.
#[derive(Debug)]
pub struct Outcome {
    /// The traced command's status, when a command was traced.
    pub command_status: Option<ExitStatus>,
    pub interrupted: bool,
}

/// How long at most to keep reading after the traced command exits, for the last events of
/// processes that ended with it, and how often to look meanwhile.
const GRACE: Duration = Duration::from_millis(100);
const GRACE_POLL: Duration = Duration::from_millis(2);
/// How long a trace asked to end (SIGINT, SIGTERM, SIGHUP) waits for the traced command, to
/// which the signal was passed on, to exit: its last records (the frees and deaths a summary
/// and a size are made of) come as it exits. Shorter than `docker stop`'s 10 s before SIGKILL,
/// so that shmtrace as a container's PID 1 prints its result before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often ordinary records are collected from the ring buffer and the pipeline's tap may
/// flush, and how often kernel losses are checked (every tenth tick).
const TICK: Duration = Duration::from_millis(100);
const TICKS_PER_LOST_CHECK: u32 = 10;
/// How often the analysis forgets what ended (only a host-wide trace's does): often enough
/// that a fork storm's exited processes do not pile up between two passes.
const TICKS_PER_FORGET: u32 = 3;
/// How often followed containers are checked for restarts and their /dev/shm measured.
const WATCH_EVERY: Duration = Duration::from_secs(1);

pub struct Session {
    signals: Option<Signals>,
    source: Source,
    pipeline: Pipeline,
    watch: Option<Watch>,
    hold: Hold,
    started: Instant,
    /// What the analysis's caps had dropped when last told.
    evicted: Evicted,
    /// With a traced command: the processes of its tree whose exit has not been read yet.
    command_tree: HashSet<u32>,
    /// A status line, when nothing else shows that the trace goes on (`size`, `record`) and
    /// stderr is a terminal.
    progress: Option<Progress>,
}

impl Session {
    pub fn new(tracer: Tracer, pipeline: Pipeline) -> Session {
        Session::of(
            Source::Probes(Box::new(Probes {
                tracer,
                reader: None,
            })),
            pipeline,
        )
    }

    /// A session fed by the ptrace tracer.
    pub fn ptrace(feed: Feed, pipeline: Pipeline) -> Session {
        Session::of(Source::Ptrace(feed), pipeline)
    }

    fn of(source: Source, pipeline: Pipeline) -> Session {
        Session {
            signals: None,
            source,
            pipeline,
            watch: None,
            hold: Hold::default(),
            started: Instant::now(),
            evicted: Evicted::default(),
            command_tree: HashSet::new(),
            progress: None,
        }
    }

    /// Signals installed earlier (otherwise `run` installs them).
    pub fn with_signals(mut self, signals: Signals) -> Session {
        self.signals = Some(signals);
        self
    }

    /// Goes on reading the ring buffer from where `reader` is, with the records `hold` kept
    /// while the containers were waited for.
    pub fn with_reader(mut self, reader: EventReader, hold: Hold) -> Session {
        if let Source::Probes(probes) = &mut self.source {
            probes.reader = Some(reader);
        }
        self.hold = hold;
        self
    }

    /// Follows containers (restarts, /dev/shm use) while tracing.
    pub fn with_watch(mut self, watch: Watch) -> Session {
        self.watch = Some(watch);
        self
    }

    pub async fn run(mut self, mut ending: Ending) -> Result<Outcome> {
        self.source.open()?;
        let mut signals = match self.signals.take() {
            Some(signals) => signals,
            None => Signals::install()?,
        };
        if !self.pipeline.shows_events() {
            self.progress = Progress::on_terminal();
        }
        let mut ticker = tokio::time::interval(TICK);
        let mut ticks = 0u32;
        let mut watch_ticker = tokio::time::interval(WATCH_EVERY);

        let mut command_done = match &ending {
            Ending::Command(command) => {
                self.command_tree.insert(command.pid());
                Some(self.source.command_end(command))
            }
            _ => None,
        };
        // Set when a signal asked the trace to end while the command runs: when the wait for
        // the command to exit ends.
        let mut stopping: Option<tokio::time::Instant> = None;

        let mut batch: Vec<Bytes> = self.hold.take_ready();
        self.handle(&mut batch, &mut ending)?;
        let mut outcome = Outcome {
            command_status: None,
            interrupted: false,
        };
        loop {
            tokio::select! {
                read = self.source.read(&mut batch) => {
                    read?;
                    self.handle(&mut batch, &mut ending)?;
                    if all_exited(&ending) || self.pipeline.output().reader_gone() {
                        break;
                    }
                }
                status = async { command_done.as_mut().expect("guarded").await }, if command_done.is_some() => {
                    let status = status?;
                    outcome.command_status = Some(status);
                    break;
                }
                received = signals.next() => match received {
                    Received::Stop(stop) => {
                        outcome.interrupted = true;
                        // A second signal while waiting for the command ends the wait.
                        match (&ending, stopping) {
                            (Ending::Command(command), None) => {
                                self.pass_on(command, stop)?;
                                stopping = Some(tokio::time::Instant::now() + STOP_GRACE);
                            }
                            _ => break,
                        }
                    }
                    Received::Dump => {
                        self.drain_all(&mut batch, &mut ending)?;
                        if !self.pipeline.trigger_manual(boot_ns()?)? {
                            self.pipeline.notice("SIGUSR1: nothing to write, this is not `record --on-failure`")?;
                        }
                    }
                },
                _ = async { tokio::time::sleep_until(stopping.expect("guarded")).await }, if stopping.is_some() => {
                    if let Ending::Command(command) = &ending {
                        self.pipeline.notice(&format!(
                            "the traced command (pid {}) is still running {} s after the signal; \
                             the trace ends without it ({})",
                            command.pid(),
                            STOP_GRACE.as_secs(),
                            self.source.left_running()
                        ))?;
                    }
                    break;
                }
                _ = watch_ticker.tick(), if self.watch.is_some() => {
                    if let Some(progress) = &mut self.progress {
                        progress.clear(); // a container's restart is told on stderr
                    }
                    let watch = self.watch.as_mut().expect("guarded");
                    let tracer = self.source.tracer().context("containers are followed with the probes only")?;
                    watch.check(tracer, &mut self.pipeline, &mut self.hold).await?;
                    // A container's first records, made before it was known to be it.
                    let mut released = self.hold.take_ready();
                    self.handle(&mut released, &mut ending)?;
                }
                _ = ticker.tick() => {
                    // Ordinary records do not wake the reader (it costs the traced call
                    // microseconds): they are collected here.
                    // What is left waits for the next read or tick.
                    let _ = self.source.drain(&mut batch);
                    self.handle(&mut batch, &mut ending)?;
                    if all_exited(&ending) || self.pipeline.output().reader_gone() {
                        break;
                    }
                    ticks += 1;
                    if ticks.is_multiple_of(TICKS_PER_LOST_CHECK) {
                        self.check_lost()?;
                        if self.forget_exited_unseen(&mut ending)? {
                            break;
                        }
                    }
                    if ticks.is_multiple_of(TICKS_PER_FORGET) {
                        self.forget_what_ended()?;
                    }
                    self.pipeline.tick(boot_ns()?)?;
                    if let Some(progress) = &mut self.progress {
                        progress.show(|| self.pipeline.status());
                    }
                }
            }
        }
        if let Some(progress) = &mut self.progress {
            progress.clear();
        }
        self.progress = None;

        if all_exited(&ending) {
            self.pipeline.notice("every traced process has exited")?;
        }
        // The last records of processes that ended with the command may still be on their
        // way; none can follow the exits of every traced process, so the wait ends there.
        let grace_ends = Instant::now() + GRACE;
        while outcome.command_status.is_some()
            && !self.tree_exited(&ending)
            && Instant::now() < grace_ends
        {
            tokio::time::sleep(GRACE_POLL).await;
            self.drain_all(&mut batch, &mut ending)?;
        }
        self.drain_all(&mut batch, &mut ending)?;
        self.check_lost()?;
        if let Some(status) = outcome.command_status {
            self.pipeline.notice(&match status {
                ExitStatus::Code(code) => format!("command exited with status {code}"),
                ExitStatus::Signal { signo, .. } => {
                    format!("command killed by {}", names::signal_name(signo))
                }
            })?;
        }
        // The summary ends as the trace began: each container's /dev/shm, as it is now.
        if let Some(watch) = &self.watch {
            for line in watch.closing_lines() {
                self.pipeline.output().closing_line(line);
            }
        }
        self.pipeline
            .finish(self.started.elapsed().as_secs_f64(), boot_ns()?)?;
        Ok(outcome)
    }

    /// A signal asked the trace to end while the command runs: the command gets it as it
    /// would without shmtrace (once: the terminal's reached it already), and the trace goes on
    /// until the command exits or [`STOP_GRACE`] passes.
    fn pass_on(&mut self, command: &RunningCommand, stop: Stop) -> Result<()> {
        let name = names::signal_name(stop.signo());
        let how = if stop.from_terminal() {
            format!(
                "{name} from the terminal reached the traced command (pid {}) too",
                command.pid()
            )
        } else {
            match command.signal(stop.signo()) {
                Ok(()) => format!(
                    "passed {name} on to the traced command (pid {})",
                    command.pid()
                ),
                // The trace still ends with its summary; the command may exit by itself.
                Err(error) => format!("{error:#}"),
            }
        };
        self.pipeline.notice(&format!(
            "{how}; waiting up to {} s for it to exit (signal shmtrace again to stop waiting)",
            STOP_GRACE.as_secs()
        ))
    }

    /// Reads and handles every record the ring holds now, a batch at a time.
    fn drain_all(&mut self, batch: &mut Vec<Bytes>, ending: &mut Ending) -> Result<()> {
        while self.source.drain(batch) {
            self.handle(batch, ending)?;
        }
        self.handle(batch, ending)
    }

    /// Whether every traced process (the command's tree, or the pids followed) has been seen
    /// exiting.
    fn tree_exited(&self, ending: &Ending) -> bool {
        match ending {
            Ending::Command(_) => self.command_tree.is_empty(),
            _ => all_exited(ending),
        }
    }

    fn handle(&mut self, batch: &mut Vec<Bytes>, ending: &mut Ending) -> Result<()> {
        for notice in self.source.notices() {
            self.pipeline.notice(&notice)?;
        }
        if batch.is_empty() {
            return Ok(());
        }
        // What the records print (a diagnosis) must not land on the status line.
        if let Some(progress) = &mut self.progress {
            progress.clear();
        }
        let mut machine = LiveMachine::default();
        machine.read_failing_early(batch);
        let now = Instant::now();
        for record in batch.drain(..) {
            if !self.hold.admit_one(&record, now) {
                continue;
            }
            let event = self.pipeline.kernel_record(&record, &mut machine)?;
            // A followed container's first process exited: the probes stopped matching its
            // namespace there, and so does the hold, in the same place in the stream.
            if let (Some(watch), Some(event)) = (&mut self.watch, &event)
                && matches!(event.body, Body::Exit(_))
                && let Some(mntns) = watch.ended_by(event.pid)
            {
                self.hold.unfollow(mntns);
            }
            let live = match &mut *ending {
                Ending::Pids(live) => Some(live),
                Ending::Command(_) => Some(&mut self.command_tree),
                Ending::Interrupt => None,
            };
            if let (Some(live), Some(event)) = (live, event) {
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

    /// The exit record of a followed process can be lost (a full ring buffer): without it the
    /// trace would wait forever. A process that is gone, or a zombie, after its records were
    /// read has exited; it is said so, and the trace ends if it was the last one.
    fn forget_exited_unseen(&mut self, ending: &mut Ending) -> Result<bool> {
        let Ending::Pids(live) = ending else {
            return Ok(false);
        };
        let gone: Vec<u32> = live
            .iter()
            .copied()
            .filter(|&pid| has_exited(pid))
            .collect();
        for pid in gone {
            live.remove(&pid);
            self.pipeline.notice(&format!(
                "process {pid} has exited, but its exit record was not seen (see the lost counts)"
            ))?;
        }
        Ok(live.is_empty())
    }

    /// Lets the analysis forget what no longer matters (a host-wide trace's model forgets;
    /// others keep everything), and says when a cap had to drop more.
    fn forget_what_ended(&mut self) -> Result<()> {
        self.pipeline.prune(boot_ns()?)?;
        let state = self.pipeline.state();
        log::debug!(
            "analysis holds {} processes, {} objects, {} roles",
            state.processes,
            state.objects,
            state.roles
        );
        let evicted = state.evicted;
        let before = std::mem::replace(&mut self.evicted, evicted);
        if evicted != before {
            self.pipeline.notice(&format!(
                "memory bounds reached: {} processes, {} /dev/shm objects and {} rows of the \
                 closing table forgotten early so far (their later events are still shown)",
                evicted.processes, evicted.objects, evicted.table_rows
            ))?;
        }
        Ok(())
    }

    fn check_lost(&mut self) -> Result<()> {
        let total = self.source.lost()?;
        self.pipeline.lost(total, boot_ns()?)
    }
}

/// Whether /proc says the process is gone or a zombie. ESRCH comes from a process that exited
/// while its file was read. Any other error says nothing, so the process is taken to be running.
fn has_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state == 'Z' || state == 'X'),
        Err(error) => {
            matches!(
                error.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidInput
            ) || error.raw_os_error() == Some(libc::ESRCH)
        }
    }
}

/// Whether the trace follows processes and every one of them has exited. The records that
/// say so may arrive through a wake-up or through the timer: both check.
fn all_exited(ending: &Ending) -> bool {
    matches!(ending, Ending::Pids(live) if live.is_empty())
}
