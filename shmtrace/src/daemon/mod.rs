//! `shmtrace daemon`: the node agent. Host-wide tracing through the same pipeline as a live
//! trace, with three sinks of its own: metrics (`metrics`, served by `http`), JSON lines on
//! stdout (the pipeline's JSON output, failures and diagnoses only, plus the `incidents` log),
//! and incident recordings (`incidents`). `fleet` follows the containers that come and go and
//! says whose each count is; `observer` feeds it from the pipeline; `unseen` adds the failures
//! the kernel counted whose records were lost.
mod connections;
mod fleet;
#[cfg(test)]
mod fleet_tests;
mod http;
mod incidents;
mod json_lines;
mod limits;
mod membership;
mod metrics;
mod observer;
mod unseen;

use std::{
    cell::RefCell,
    io::Write,
    process::ExitCode,
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use serde_json::json;
use shmtrace_common::{Loss, TallyKey};
use tokio::signal::unix::{SignalKind, signal};

use self::{
    connections::Connections,
    fleet::{Fleet, Tally},
    http::Heartbeat,
    incidents::{Incidents, Log},
    json_lines::JsonLines,
    limits::OpenFiles,
    metrics::{KindLabels, Metrics},
    observer::FleetObserver,
    unseen::Unseen,
};
use crate::{
    cli::DaemonArgs,
    clock::{Clock, boot_ns},
    commands::init_logging,
    container::{Candidate, Container, Resolver, host_shm_dev, measure_shm},
    diagnose::Diagnoser,
    event::LostCounts,
    live::{
        bpf::{EventReader, Tracer, TracerOptions},
        machine::LiveMachine,
        target, watch,
    },
    model::{QUIET_LINGER_NS, Retention, World},
    output::{Format, Output, filter::Filter, json::SCHEMA_VERSION},
    pipeline::{Evicted, Pipeline},
};

/// How often records are collected and the tap flushes (as in a live trace).
const TICK: Duration = Duration::from_millis(100);
/// How often the kernel's loss counters are read, and what ended is forgotten.
const LOST_EVERY: Duration = Duration::from_secs(1);
/// Most processes and /dev/shm objects the analysis keeps (a kilobyte or so each), and most
/// diagnoses kept for the closing summary.
const MAX_PROCESSES: usize = 32_768;
const MAX_OBJECTS: usize = 32_768;
const MAX_DIAGNOSES: usize = 256;
/// The soonest a survey of the runtimes follows the last one, when events from an unknown
/// namespace ask for one.
const SURVEY_AT_MOST_EVERY: Duration = Duration::from_millis(250);

pub fn run(args: &DaemonArgs) -> Result<ExitCode> {
    init_logging(args.verbose);
    // First, before the probes' maps and the runtimes' sockets take descriptors.
    let open_files = OpenFiles::raise().context("reading the open files limit")?;
    let window = positive(args.window, "--window")?;
    let tail = positive(args.tail, "--tail")?;
    let options = TracerOptions {
        all: true,
        match_containers: false,
        failed_only: false,
        ring_buffer_bytes: args.buffer_size,
        btf_path: args.kernel_btf.clone(),
    };
    let mut tracer = Tracer::load(&options)?;
    let shm_devs = target::register_shm_devs(&mut tracer, true)?;
    // Followed from the start; what they hold is not named (the daemon keeps no seed).
    target::register_shm_holders(&mut tracer, &shm_devs)?;
    // The event loop runs on this thread; the HTTP server and the surveys of the runtimes on
    // a worker of their own, so that a scrape is answered while the loop is busy (and
    // /healthz can say that the loop is stuck).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("shmtrace-daemon-io")
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let (metrics, registry) = Metrics::new();
        let heartbeat = Heartbeat::default();
        heartbeat.beat();
        let listening = http::serve(
            args.listen,
            Arc::new(registry),
            metrics.clone(),
            heartbeat.clone(),
            Connections::new(open_files.connections()),
        )
        .await?;
        let log: Log = Rc::default();
        let mut agent = Agent::new(args, tracer, metrics, log, window, tail)?;
        eprintln!(
            "shmtrace daemon: tracing /dev/shm use of every process and container; metrics at \
             http://{}/metrics{}",
            listening,
            match &args.record_dir {
                Some(dir) => format!(", incident recordings in {}", dir.display()),
                None => String::new(),
            }
        );
        eprintln!("shmtrace daemon: {}", open_files.describe());
        agent.run(heartbeat).await
    })?;
    Ok(ExitCode::SUCCESS)
}

fn positive(seconds: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("{flag} must be a positive number of seconds, not {seconds}"))
}

/// One answer of the runtimes, from a survey that started at `started`.
struct Survey {
    started: Instant,
    running: Vec<Container>,
    /// Listed, not running: names for containers that stopped before a survey saw them.
    stopped: Vec<Candidate>,
    /// Runtimes that did not answer, said as the CLI says it.
    problems: Vec<String>,
}

struct Agent {
    tracer: Tracer,
    pipeline: Pipeline,
    fleet: Rc<RefCell<Fleet>>,
    metrics: Metrics,
    resolver: Resolver,
    log: Log,
    /// The pipeline's JSON lines, held while their namespace waits for a survey.
    json_lines: JsonLines,
    interval: Duration,
    lost: LostCounts,
    /// Failures and SIGBUS counted in the kernel, against the records read.
    unseen: Rc<RefCell<Unseen>>,
    /// When the kernel's counts were last read (`CLOCK_BOOTTIME` ns): what is found missing
    /// at the next reading happened before.
    counts_read_ns: u64,
    /// Losses counted, and when, at the last look for vanished processes.
    lost_at_vanish_check: u64,
    vanish_checked: Instant,
    /// A gone process was seen too recently to be forgotten at the last look.
    vanish_check_owed: bool,
    /// Runtime problems already logged, so that a runtime that stays down is said once.
    problems_logged: Vec<String>,
    started: Instant,
    /// Evictions already counted in the metrics.
    evicted: Evicted,
    /// The host's /dev/shm, whose files outlive the containers that made them.
    host_shm_dev: Option<u32>,
}

/// Most distinct runtime problems remembered (beyond them, repeats are logged again).
const MAX_PROBLEMS_REMEMBERED: usize = 64;

impl Agent {
    fn new(
        args: &DaemonArgs,
        tracer: Tracer,
        metrics: Metrics,
        log: Log,
        window: Duration,
        tail: Duration,
    ) -> Result<Agent> {
        // The host is pid 1's namespace: in a DaemonSet (hostPID) the daemon's own is its
        // container's.
        let host_mntns = crate::kernel_ids::mount_namespace(1)
            .or_else(|| crate::kernel_ids::mount_namespace(std::process::id()))
            .unwrap_or(0);
        let fleet = Rc::new(RefCell::new(Fleet::new(
            metrics.clone(),
            host_mntns,
            args.retain,
        )));
        let json_lines = JsonLines::default();
        let output = Output::new(
            Box::new(json_lines.sink()),
            Format::Json,
            Clock::now().context("reading the clocks")?,
            false,
        );
        // Weeks of processes: what ended is forgotten once the diagnoses that may follow it
        // are past (the flight recorder keeps what its recordings need on its own); what
        // ended quietly, at once, as `--all` does: otherwise a node's churn of short lives
        // fills memory up to the cap on processes.
        let forget_after = args.forget_after.as_nanos() as u64;
        let retention = Retention {
            linger_ns: forget_after,
            quiet_linger_ns: QUIET_LINGER_NS.min(forget_after),
            max_processes: MAX_PROCESSES,
            max_objects: MAX_OBJECTS,
        };
        let unseen = Rc::new(RefCell::new(Unseen::default()));
        let mut pipeline = Pipeline::new(
            World::new().with_retention(retention),
            Diagnoser::new(host_mntns),
            output,
            Filter::failed_only(),
        )
        .bounded(MAX_DIAGNOSES)
        .with_observer(Box::new(FleetObserver {
            fleet: fleet.clone(),
            metrics: metrics.clone(),
            unseen: unseen.clone(),
        }));
        if let Some(dir) = &args.record_dir {
            let incidents = Incidents::open(
                dir,
                args.record_quota,
                window,
                tail,
                metrics.clone(),
                log.clone(),
            )?;
            pipeline = pipeline.with_tap(Box::new(incidents));
        }
        let mut resolver = match &args.docker_socket {
            Some(socket) => Resolver::new().docker_socket(socket),
            None => Resolver::new(),
        };
        for socket in &args.cri_socket {
            resolver = resolver.cri_socket(socket);
        }
        // Every kind's loss counter exists from the start, so that the first loss is an
        // increase Prometheus sees.
        for kind in shmtrace_common::EventKind::ALL {
            drop(
                metrics
                    .lost
                    .get_or_create(&loss_labels(Loss::RingFull(kind))),
            );
        }
        Ok(Agent {
            tracer,
            pipeline,
            fleet,
            metrics,
            resolver,
            log,
            json_lines,
            interval: args.interval,
            lost: LostCounts::default(),
            unseen,
            counts_read_ns: 0,
            lost_at_vanish_check: 0,
            vanish_checked: Instant::now(),
            vanish_check_owed: false,
            problems_logged: Vec::new(),
            started: Instant::now(),
            evicted: Evicted::default(),
            host_shm_dev: host_shm_dev(),
        })
    }

    async fn run(&mut self, heartbeat: Heartbeat) -> Result<()> {
        let ring = self
            .tracer
            .take_events()
            .context("the ring buffer was already taken")?;
        let mut reader = EventReader::new(ring).context("watching the ring buffer")?;
        let mut interrupt =
            signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
        let mut terminate =
            signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut batch: Vec<Bytes> = Vec::new();
        let mut last_survey: Option<Instant> = None;
        let mut last_lost = Instant::now();
        // The runtimes answer in a task of their own: on a node with many containers a survey
        // takes a while, and the ring buffer must be read meanwhile.
        let mut surveying: Option<tokio::task::JoinHandle<Survey>> = None;
        loop {
            tokio::select! {
                read = reader.read(&mut batch) => {
                    read.context("reading the ring buffer")?;
                    self.handle(&mut batch)?;
                }
                joined = async { surveying.as_mut().expect("guarded").await }, if surveying.is_some() => {
                    surveying = None;
                    self.take_survey(joined.context("surveying the container runtimes")?)?;
                    self.write_log()?;
                }
                _ = ticker.tick() => {
                    heartbeat.beat();
                    // What is left waits for the next read or tick.
                    let _ = reader.drain(&mut batch);
                    self.handle(&mut batch)?;
                    self.pipeline.tick(boot_ns()?)?;
                    if last_lost.elapsed() >= LOST_EVERY {
                        last_lost = Instant::now();
                        self.check_lost()?;
                        self.count_unseen()?;
                        self.forget()?;
                    }
                    let wanted = self.fleet.borrow_mut().take_survey_wanted();
                    let due = last_survey.is_none_or(|at| {
                        at.elapsed() >= self.interval
                            || (wanted && at.elapsed() >= SURVEY_AT_MOST_EVERY)
                    });
                    if due && surveying.is_none() {
                        last_survey = Some(Instant::now());
                        let resolver = self.resolver.clone();
                        surveying = Some(tokio::spawn(async move {
                            let started = Instant::now();
                            let (running, stopped, problems) =
                                resolver.running_and_stopped().await;
                            let problems = problems.iter().map(ToString::to_string).collect();
                            Survey { started, running, stopped, problems }
                        }));
                    } else if wanted {
                        // Not yet: ask again at the next tick.
                        self.fleet.borrow_mut().want_survey();
                    }
                    self.write_log()?;
                }
                _ = interrupt.recv() => break,
                _ = terminate.recv() => break,
            }
        }
        self.read_all(&mut reader, &mut batch)?;
        self.check_lost()?;
        // The kernel's counts are read once more, and compared once everything written up to
        // then has been read too.
        self.count_unseen()?;
        self.read_all(&mut reader, &mut batch)?;
        self.count_unseen()?;
        self.pipeline
            .finish(self.started.elapsed().as_secs_f64(), boot_ns()?)?;
        self.write_log_all(true)
    }

    /// Reads and handles everything the ring buffer holds now.
    fn read_all(&mut self, reader: &mut EventReader, batch: &mut Vec<Bytes>) -> Result<()> {
        while reader.drain(batch) {
            self.handle(batch)?;
        }
        self.handle(batch)
    }

    fn handle(&mut self, batch: &mut Vec<Bytes>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        // Failing processes are looked up in /proc before the batch is handled, while they
        // may still be there.
        let mut machine = LiveMachine::default();
        machine.read_failing_early(batch);
        for record in batch.drain(..) {
            if self
                .pipeline
                .kernel_record(&record, &mut machine)?
                .is_none()
            {
                self.metrics.malformed.inc();
            }
            // A namespace number taken by another container, found by a process's cgroup:
            // what follows in the recordings is not the gone container's.
            let stale = self.fleet.borrow_mut().take_stale();
            for mntns in stale {
                self.pipeline.forget_container(mntns, boot_ns()?)?;
            }
        }
        self.write_log()
    }

    /// What the runtimes said runs: follows what started, forgets what stopped, and measures
    /// the /dev/shm of every container that has series.
    fn take_survey(&mut self, survey: Survey) -> Result<()> {
        let Survey {
            started,
            running,
            stopped,
            problems,
        } = survey;
        for text in problems {
            if !self.problems_logged.contains(&text) {
                self.log.borrow_mut().push(json!({
                    "v": SCHEMA_VERSION,
                    "event": "runtime_problem",
                    "problem": text,
                }));
                if self.problems_logged.len() >= MAX_PROBLEMS_REMEMBERED {
                    self.problems_logged.remove(0);
                }
                self.problems_logged.push(text);
            }
        }
        self.fleet.borrow_mut().know_stopped(&stopped);
        let changes = self.fleet.borrow_mut().survey(&running, started);
        let now_ns = crate::clock::boot_ns().unwrap_or(0);
        for mntns in changes.stopped_mntns {
            self.pipeline.forget_container(mntns, now_ns)?;
        }
        for (mntns, before) in changes.ended {
            self.unseen.borrow_mut().ended(mntns);
            self.pipeline
                .retire_namespace(mntns, self.host_shm_dev, before);
        }
        for container in &changes.started {
            if let Err(error) = watch::register(container, &mut self.tracer, &mut self.pipeline) {
                self.probe_error("shm_devs", format!("{error:#}"));
            }
        }
        let pids = self.fleet.borrow().to_measure();
        for pid in pids {
            let Ok(shm) = measure_shm(pid) else { continue };
            if let Some(sample) = shm.capacity() {
                // The pipeline passes it on to the fleet (as the observer's capacity).
                self.pipeline.capacity(sample, Some(pid))?;
            }
        }
        Ok(())
    }

    /// Forgets what ended long enough ago, and says how much the analysis holds and what
    /// its bounds dropped.
    fn forget(&mut self) -> Result<()> {
        self.pipeline.prune(boot_ns()?)?;
        self.forget_vanished()?;
        let state = self.pipeline.state();
        let followed = self.fleet.borrow().followed();
        for (kind, entries) in [
            ("process", state.processes),
            ("object", state.objects),
            ("diagnosis", state.diagnoses),
            ("summary_diagnosis", state.summary_diagnoses),
            ("role", state.roles),
            ("container", followed),
            ("tally", self.unseen.borrow().entries()),
        ] {
            self.metrics
                .state_entries
                .get_or_create(&KindLabels { kind: kind.into() })
                .set(entries as i64);
        }
        let (now, before) = (state.evicted, self.evicted);
        for (kind, count) in [
            ("process", now.processes - before.processes),
            ("object", now.objects - before.objects),
            (
                "summary_diagnosis",
                now.summary_diagnoses - before.summary_diagnoses,
            ),
            ("table_row", now.table_rows - before.table_rows),
            ("vanished_process", now.vanished - before.vanished),
        ] {
            // Every kind's counter exists from the start, so that a first eviction is an
            // increase Prometheus sees.
            self.metrics
                .state_evictions
                .get_or_create(&KindLabels { kind: kind.into() })
                .inc_by(count);
        }
        self.evicted = now;
        Ok(())
    }

    /// After records were lost (and every so often), looks in /proc for the processes the
    /// analysis thinks alive: one that is gone, its exit record lost, is forgotten (counted
    /// in `shmtrace_state_evictions_total{kind="vanished_process"}`), so that the state
    /// built from lost records does not grow.
    fn forget_vanished(&mut self) -> Result<()> {
        let lost = self.lost.total();
        if lost == self.lost_at_vanish_check
            && !self.vanish_check_owed
            && self.vanish_checked.elapsed() < VANISH_CHECK_EVERY
        {
            return Ok(());
        }
        self.lost_at_vanish_check = lost;
        self.vanish_checked = Instant::now();
        self.vanish_check_owed = false;
        let now_ns = boot_ns()?;
        let mut gone = Vec::new();
        for (pid, first_seen_ns, last_seen_ns) in self.pipeline.live_processes() {
            if still_there(pid, first_seen_ns) {
                continue;
            }
            if last_seen_ns.saturating_add(QUIET_BEFORE_VANISHED_NS) < now_ns {
                gone.push(pid);
            } else {
                // Its exit record may still be on its way: looked at again next time.
                self.vanish_check_owed = true;
            }
        }
        if gone.is_empty() {
            return Ok(());
        }
        self.pipeline.forget_vanished(&gone)
    }

    fn check_lost(&mut self) -> Result<()> {
        let total = match self.tracer.lost() {
            Ok(total) => total,
            Err(error) => {
                self.probe_error("lost_counters", error.to_string());
                return Ok(());
            }
        };
        for (loss, count) in total.since(&self.lost).by_kind() {
            // A full ring buffer loses events; a failed probe read is a probe error (under
            // host-wide tracing, mostly other processes' paths that were not paged in).
            let family = match loss {
                Loss::RingFull(_) => &self.metrics.lost,
                _ => &self.metrics.probe_errors,
            };
            family.get_or_create(&loss_labels(loss)).inc_by(count);
        }
        self.lost = total.clone();
        self.pipeline.lost(total, boot_ns()?)
    }

    /// Counts the failures and SIGBUS that the kernel counted and whose records were lost,
    /// for the container of their namespace, so that the metrics' counts stay exact.
    fn count_unseen(&mut self) -> Result<()> {
        let reading = match self.tracer.tallies() {
            Ok(reading) => reading,
            Err(error) => {
                self.probe_error("tally_counters", error.to_string());
                return Ok(());
            }
        };
        let before_ns = self.counts_read_ns;
        self.counts_read_ns = boot_ns()?;
        let found = self.unseen.borrow_mut().reconcile(reading);
        let now = Instant::now();
        for (key, count) in found.unseen {
            let (kind, tally) = match unseen_tally(key, count) {
                Some(found) => found,
                None => continue,
            };
            self.metrics
                .unrecorded
                .get_or_create(&KindLabels { kind: kind.into() })
                .inc_by(count);
            self.fleet
                .borrow_mut()
                .tally_in(key.mntns, tally, before_ns, now);
        }
        if let Err(error) = self.tracer.forget_tallies(&found.forget) {
            self.probe_error("tally_counters", error.to_string());
        }
        Ok(())
    }

    fn probe_error(&mut self, kind: &str, error: String) {
        self.metrics
            .probe_errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
        self.log.borrow_mut().push(json!({
            "v": SCHEMA_VERSION,
            "event": "probe_error",
            "kind": kind,
            "error": error,
        }));
    }

    /// The daemon's own JSON lines, after the pipeline's output, whole lines at a time.
    fn write_log(&mut self) -> Result<()> {
        self.write_log_all(false)
    }

    /// As [`Agent::write_log`]; `all` also lets the lines held for a survey go (at the end).
    fn write_log_all(&mut self, all: bool) -> Result<()> {
        self.pipeline.output().flush().context("writing output")?;
        let mut stdout = std::io::stdout().lock();
        let pipeline = &self.pipeline;
        self.json_lines.pass(
            &self.fleet.borrow(),
            |mntns| pipeline.container(mntns).cloned(),
            all,
            &mut stdout,
        )?;
        let lines = std::mem::take(&mut *self.log.borrow_mut());
        if lines.is_empty() {
            return stdout.flush().context("writing output");
        }
        for line in lines {
            writeln!(stdout, "{line}").context("writing output")?;
        }
        stdout.flush().context("writing output")
    }
}

/// What a count of the kernel's is, as the metrics say it, and its kind for
/// `shmtrace_unrecorded_total`.
fn unseen_tally(key: TallyKey, count: u64) -> Option<(&'static str, Tally)> {
    match key.what {
        TallyKey::SIGBUS => return Some(("sigbus", Tally::Sigbus { count })),
        // Who died is in the records that were lost.
        TallyKey::DEATH => {
            return Some((
                "death",
                Tally::Death {
                    role: "unknown".to_owned(),
                    count,
                },
            ));
        }
        _ => {}
    }
    let syscall = shmtrace_common::Syscall::try_from(key.what).ok()?;
    let errno = match key.errno {
        0 => "MSG_CTRUNC".to_owned(),
        errno => crate::event::names::errno_name(i32::from(errno)),
    };
    Some((
        "failure",
        Tally::Failure {
            syscall: syscall.name().to_owned(),
            errno,
            count,
        },
    ))
}

/// How often the analysis' live processes are looked for in /proc when nothing was lost.
const VANISH_CHECK_EVERY: Duration = Duration::from_secs(30);
/// How long a process must have been silent to be looked for: its exit record, if it has one,
/// has been read by then.
const QUIET_BEFORE_VANISHED_NS: u64 = 2_000_000_000;
/// Clock ticks' worth of slack between a process's start in /proc and its first record.
const START_SLACK_NS: u64 = 20_000_000;

/// Whether the process first seen at `first_seen_ns` is still there: its pid is, and was not
/// taken by a process that started after.
fn still_there(pid: u32, first_seen_ns: u64) -> bool {
    crate::live::proc_scan::start_ns(pid)
        .is_some_and(|start| start <= first_seen_ns.saturating_add(START_SLACK_NS))
}

fn loss_labels(loss: Loss) -> KindLabels {
    let kind = match loss {
        Loss::RingFull(kind) => format!("{kind:?}").to_lowercase(),
        Loss::PathRead => "path_read".to_owned(),
        Loss::KernelRead => "kernel_read".to_owned(),
        Loss::UserRead => "argument_read".to_owned(),
        Loss::Pending => "pending_calls_full".to_owned(),
        Loss::Tally => "tally_full".to_owned(),
    };
    KindLabels { kind }
}
