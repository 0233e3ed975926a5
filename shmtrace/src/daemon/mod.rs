//! `shmtrace daemon`: the node agent. Host-wide tracing through the same pipeline as a live
//! trace, with three sinks of its own: metrics (`metrics`, served by `http_endpoint`), JSON lines on
//! stdout (the pipeline's JSON output, failures and diagnoses only, plus the `incidents` log),
//! and incident recordings (`incidents`).
//!
//! Each record is placed before the pipeline takes it (`fleet`: `whose` it is, what its
//! container is called by `names`, which `series` count it), so that the pipeline, its
//! recordings and the JSON lines name the container the record came from, even when another
//! container has its mount namespace number by then. `runtimes` brings the runtimes' events
//! and descriptions between the surveys; `observer` turns what the pipeline learns into counts;
//! `accounting` adds what the kernel counted whose records were lost (`unseen`); `endings`
//! holds a gone container's end until its last records are read.
mod accounting;
mod connections;
mod endings;
mod fleet;
#[cfg(test)]
mod fleet_tests;
mod http_endpoint;
mod incidents;
mod json_lines;
mod limits;
mod metrics;
mod names;
mod observer;
mod runtimes;
mod series;
mod unseen;
mod whose;

use std::{
    cell::RefCell,
    collections::HashMap,
    io::Write,
    process::ExitCode,
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use serde_json::json;
use shmtrace_common::Header;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use zerocopy::FromBytes;

use self::{
    accounting::{Accounting, ProbeError},
    connections::Connections,
    endings::Endings,
    fleet::{Fleet, WaitKey},
    http_endpoint::Heartbeat,
    incidents::{Incidents, Log},
    json_lines::JsonLines,
    limits::OpenFiles,
    metrics::{KindLabels, Metrics},
    observer::FleetObserver,
    runtimes::{News, Runtimes},
    unseen::Unseen,
    whose::{Found, OnTheMachine, Owner},
};
use crate::{
    cli::DaemonArgs,
    commands::init_logging,
    container::{Candidate, Container, Resolver, host_shm_dev, measure_shm},
    live::{
        bpf::{EventReader, Tracer, TracerOptions},
        host_environment::LiveMachine,
        target,
    },
};
use shmtrace_core::{
    clock::{Clock, boot_ns},
    diagnose::Diagnoser,
    model::{ContainerInfo, QUIET_LINGER_NS, Retention, World},
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
/// How often the file systems the probes take for a /dev/shm are counted (a scan of their
/// verdicts, `Tracer::shm_file_systems`).
const SHM_FILE_SYSTEMS_EVERY: Duration = Duration::from_secs(5);

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
    // The event loop runs on this thread; the HTTP server, the surveys of the runtimes and
    // their event streams on a worker of their own, so that a scrape is answered while the
    // loop is busy (and /healthz can say that the loop is stuck).
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
        let listening = http_endpoint::serve(
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

/// Which container the pipeline names a mount namespace after now.
struct NamedInPipeline {
    id: String,
    /// With the runtime's name (not only its id).
    named: bool,
}

struct Agent {
    tracer: Tracer,
    pipeline: Pipeline,
    fleet: Rc<RefCell<Fleet>>,
    /// Whose the record the pipeline takes now is (for the observer).
    placed: Rc<RefCell<Option<Found>>>,
    /// What the pipeline names each mount namespace after, as the daemon told it, in the
    /// order of the records.
    in_pipeline: HashMap<u32, NamedInPipeline>,
    metrics: Metrics,
    resolver: Resolver,
    runtimes: Option<Runtimes>,
    log: Log,
    /// The pipeline's JSON lines, named, some held while their container is not.
    json_lines: JsonLines,
    /// Namespaces whose container ended, until their last records are read.
    endings: Endings,
    interval: Duration,
    accounting: Accounting,
    /// Runtime problems already logged, so that a runtime that stays down is said once.
    problems_logged: Vec<String>,
    started: Instant,
    /// Evictions already counted in the metrics.
    evicted: Evicted,
    /// The host's /dev/shm, whose files outlive the containers that made them.
    host_shm_dev: Option<u32>,
    last_shm_count: Instant,
    /// File systems the probes take for a /dev/shm, as of the last count.
    shm_file_systems: usize,
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
            Box::new(OnTheMachine::new()),
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
        let placed = Rc::new(RefCell::new(None));
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
            placed: placed.clone(),
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
        Ok(Agent {
            tracer,
            pipeline,
            fleet,
            placed,
            in_pipeline: HashMap::new(),
            accounting: Accounting::new(unseen, &metrics),
            metrics,
            resolver,
            runtimes: None,
            log,
            json_lines,
            endings: Endings::default(),
            interval: args.interval,
            problems_logged: Vec::new(),
            started: Instant::now(),
            evicted: Evicted::default(),
            host_shm_dev: host_shm_dev(),
            last_shm_count: Instant::now(),
            shm_file_systems: 0,
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
        let (runtimes, mut news) = Runtimes::start(self.resolver.clone());
        self.runtimes = Some(runtimes);
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
                    self.take_news(&mut news)?;
                    self.handle(&mut batch)?;
                }
                Some(first) = news.recv() => {
                    self.news(first)?;
                    self.take_news(&mut news)?;
                    self.write_log()?;
                }
                joined = async { surveying.as_mut().expect("guarded").await }, if surveying.is_some() => {
                    surveying = None;
                    self.take_news(&mut news)?;
                    self.take_survey(joined.context("surveying the container runtimes")?)?;
                    self.write_log()?;
                }
                _ = ticker.tick() => {
                    heartbeat.beat();
                    self.take_news(&mut news)?;
                    // What is left waits for the next read or tick.
                    let began_ns = boot_ns()?;
                    let more = reader.drain(&mut batch);
                    self.handle(&mut batch)?;
                    if !more {
                        self.accounting.caught_up();
                        self.endings.caught_up(began_ns);
                        self.after_fleet_changed()?;
                    }
                    self.pipeline.tick(boot_ns()?)?;
                    self.fleet.borrow_mut().tick();
                    if last_lost.elapsed() >= LOST_EVERY {
                        last_lost = Instant::now();
                        self.account()?;
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
        // The kernel's counts are read once more, and compared once everything written up to
        // then has been read too.
        self.account()?;
        self.read_all(&mut reader, &mut batch)?;
        self.account()?;
        let rest = self.endings.all();
        self.retire(rest, boot_ns()?)?;
        self.pipeline
            .finish(self.started.elapsed().as_secs_f64(), boot_ns()?)?;
        self.write_log()?;
        let mut stdout = std::io::stdout().lock();
        self.json_lines.release_all(&mut stdout)?;
        stdout.flush().context("writing output")
    }

    /// Reads and handles everything the ring buffer holds now.
    fn read_all(&mut self, reader: &mut EventReader, batch: &mut Vec<Bytes>) -> Result<()> {
        let began_ns = boot_ns()?;
        while reader.drain(batch) {
            self.handle(batch)?;
        }
        self.handle(batch)?;
        self.accounting.caught_up();
        self.endings.caught_up(began_ns);
        self.after_fleet_changed()
    }

    /// The runtimes' news that came meanwhile (before the records that follow: a container's
    /// start is told before its processes act).
    fn take_news(&mut self, news: &mut mpsc::Receiver<News>) -> Result<()> {
        while let Ok(one) = news.try_recv() {
            self.news(one)?;
        }
        Ok(())
    }

    fn news(&mut self, news: News) -> Result<()> {
        match news {
            News::Event(event) => self.fleet.borrow_mut().runtime_event(&event),
            News::Described {
                container,
                started_ns,
            } => self.fleet.borrow_mut().described(&container, started_ns),
            News::Cgroup { id, container } => self.fleet.borrow_mut().learn_cgroup(id, &container),
        }
        self.after_fleet_changed()
    }

    fn handle(&mut self, batch: &mut Vec<Bytes>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        // Failing processes are looked up in /proc before the batch is handled, while they
        // may still be there.
        let mut machine = LiveMachine::default();
        machine.read_failing_early(batch);
        let mut stdout = std::io::stdout().lock();
        for record in batch.drain(..) {
            let placed = Header::read_from_prefix(&record).ok().map(|(header, _)| {
                let found = self.fleet.borrow_mut().place(
                    header.pid,
                    header.mntns,
                    header.cgroup_id,
                    header.ts_ns,
                );
                (found, header.mntns, header.ts_ns)
            });
            if let Some((found, mntns, ts_ns)) = &placed {
                self.name_in_pipeline(*mntns, found, *ts_ns)?;
            }
            *self.placed.borrow_mut() = placed.as_ref().map(|(found, _, _)| found.clone());
            if self
                .pipeline
                .kernel_record(&record, &mut machine)?
                .is_none()
            {
                self.metrics.records_malformed.inc();
            }
            if let Some((_, _, ts_ns)) = &placed {
                self.accounting.handled(*ts_ns);
                self.endings.read_record(*ts_ns);
            }
            self.pipeline.output().flush().context("writing output")?;
            self.json_lines.pass(
                &mut self.fleet.borrow_mut(),
                placed.as_ref().map(|(found, _, ts_ns)| (found, *ts_ns)),
                &mut stdout,
            )?;
        }
        *self.placed.borrow_mut() = None;
        drop(stdout);
        self.after_fleet_changed()
    }

    /// Tells the pipeline which container mount namespace `mntns` is, when the record about to
    /// go through it (`found`, at `ts_ns`) says another than it knows: its events are named
    /// after it, its diagnoses speak of it, and the recordings say so at this place.
    fn name_in_pipeline(&mut self, mntns: u32, found: &Found, ts_ns: u64) -> Result<()> {
        let current = self.in_pipeline.get(&mntns);
        // The usual case, decided without a lookup: the same as the last record's.
        match (found, current) {
            (Found::Owner(Owner::Container(c)), Some(named))
                if named.named && *named.id == *c.id =>
            {
                return Ok(());
            }
            (Found::Owner(Owner::Host | Owner::NoContainer), None) => return Ok(()),
            _ => {}
        }
        let wanted: Option<(ContainerInfo, bool)> =
            match self.fleet.borrow_mut().resolve(found, ts_ns) {
                Ok(placed) => placed.info().map(|info| (info.clone(), true)),
                Err(WaitKey::Name(container)) => {
                    Some((names::unnamed(&container).info.clone(), false))
                }
                Err(WaitKey::Namespace(_)) => None,
            };
        match wanted {
            Some((info, named)) if current.is_none_or(|c| c.id != info.id || c.named != named) => {
                let id = info.id.clone();
                self.pipeline.set_container(
                    ContainerInfo {
                        mntns: Some(mntns),
                        ..info
                    },
                    ts_ns,
                )?;
                self.in_pipeline
                    .insert(mntns, NamedInPipeline { id, named });
            }
            None if current.is_some() => {
                self.pipeline.forget_container(mntns, ts_ns)?;
                self.in_pipeline.remove(&mntns);
            }
            _ => {}
        }
        Ok(())
    }

    /// What follows a change of the fleet: namespaces whose container ended are forgotten by
    /// the pipeline and the tallies, once their last records are read; lines that waited go
    /// out; names asked for are asked.
    fn after_fleet_changed(&mut self) -> Result<()> {
        let now_ns = boot_ns()?;
        let (settled, to_describe) = {
            let mut fleet = self.fleet.borrow_mut();
            fleet.check_sandboxes(false);
            self.endings.learned(fleet.take_ended(), now_ns);
            (fleet.take_settled(), fleet.take_to_describe())
        };
        let due = self.endings.due();
        self.retire(due, now_ns)?;
        if !settled.is_empty() {
            let mut stdout = std::io::stdout().lock();
            self.json_lines
                .settled(&mut self.fleet.borrow_mut(), settled, &mut stdout)?;
        }
        if let Some(runtimes) = &self.runtimes {
            for container in to_describe {
                runtimes.describe(container);
            }
        }
        Ok(())
    }

    /// Namespaces whose container ended, and whose records are all read: the pipeline
    /// forgets the container (unless another has the number by now) and the objects of its
    /// own /dev/shm, the tallies theirs.
    fn retire(&mut self, ended: Vec<fleet::Ended>, now_ns: u64) -> Result<()> {
        for ended in ended {
            let named_now = self.in_pipeline.get(&ended.mntns).map(|n| n.id.as_str());
            let theirs =
                ended.container.is_none() || named_now == ended.container.as_ref().map(|c| &*c.id);
            // A namespace in no container is named after nothing, but its /dev/shm is gone.
            if theirs && (named_now.is_some() || ended.container.is_none()) {
                self.pipeline.forget_container(ended.mntns, now_ns)?;
                self.in_pipeline.remove(&ended.mntns);
            }
            self.accounting.namespace_ended(ended.mntns);
            let taken_at_ns = self.fleet.borrow().taken_at(&ended);
            self.pipeline
                .retire_namespace(ended.mntns, self.host_shm_dev, taken_at_ns);
        }
        Ok(())
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
        let starts = self.fleet.borrow_mut().survey(&running, &stopped, started);
        self.after_fleet_changed()?;
        for container in &starts {
            if let Some(dev) = container.shm.dev()
                && let Err(error) = self.tracer.add_shm_dev(dev, container.shm.is_tmpfs)
            {
                self.probe_error(ProbeError {
                    kind: "shm_devs",
                    error: format!("{error:#}"),
                });
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

    /// Once a second: the kernel's loss counters and tallies against the records read.
    fn account(&mut self) -> Result<()> {
        if let Some(error) =
            self.accounting
                .check_lost(&self.tracer, &mut self.pipeline, &self.metrics)?
        {
            self.probe_error(error);
        }
        let errors = self.accounting.count_unseen(
            &mut self.tracer,
            &mut self.fleet.borrow_mut(),
            &self.metrics,
        )?;
        for error in errors {
            self.probe_error(error);
        }
        self.after_fleet_changed()
    }

    /// Forgets what ended long enough ago, and says how much the analysis holds and what
    /// its bounds dropped.
    fn forget(&mut self) -> Result<()> {
        self.pipeline.prune(boot_ns()?)?;
        // A /dev/shm unmounted needs no forgetting here: the probes forget every verdict when
        // a file system is made, the only way its number can name another one.
        if self.last_shm_count.elapsed() >= SHM_FILE_SYSTEMS_EVERY {
            self.last_shm_count = Instant::now();
            match self.tracer.shm_file_systems() {
                Ok(count) => self.shm_file_systems = count,
                Err(error) => self.probe_error(ProbeError {
                    kind: "shm_devs",
                    error: format!("{error:#}"),
                }),
            }
        }
        self.accounting.forget_vanished(&mut self.pipeline)?;
        // Sandboxes an untraced process was still in at their last traced exit.
        self.fleet.borrow_mut().check_sandboxes(true);
        self.after_fleet_changed()?;
        let state = self.pipeline.state();
        let (followed, containers) = {
            let fleet = self.fleet.borrow();
            (fleet.followed(), fleet.entries())
        };
        for (kind, entries) in [
            ("process", state.processes),
            ("object", state.objects),
            ("diagnosis", state.diagnoses),
            ("summary_diagnosis", state.summary_diagnoses),
            ("role", state.roles),
            ("container", followed),
            ("container_bookkeeping", containers),
            ("container_ending", self.endings.held()),
            ("tally", self.accounting.entries()),
            ("json_line_held", self.json_lines.held()),
            ("shm_file_system", self.shm_file_systems),
        ] {
            self.metrics
                .state_entries
                .get_or_create(&KindLabels::of(kind))
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
                .get_or_create(&KindLabels::of(kind))
                .inc_by(count);
        }
        self.evicted = now;
        Ok(())
    }

    fn probe_error(&mut self, error: ProbeError) {
        self.metrics
            .probe_errors
            .get_or_create(&KindLabels::of(error.kind))
            .inc();
        self.log.borrow_mut().push(json!({
            "v": SCHEMA_VERSION,
            "event": "probe_error",
            "kind": error.kind,
            "error": error.error,
        }));
    }

    /// The daemon's own JSON lines, after the pipeline's output (lines it wrote outside a
    /// record: the summary, diagnoses of what was forgotten), whole lines at a time.
    fn write_log(&mut self) -> Result<()> {
        self.pipeline.output().flush().context("writing output")?;
        let mut stdout = std::io::stdout().lock();
        self.json_lines
            .pass(&mut self.fleet.borrow_mut(), None, &mut stdout)?;
        let lines = std::mem::take(&mut *self.log.borrow_mut());
        for line in lines {
            writeln!(stdout, "{line}").context("writing output")?;
        }
        stdout.flush().context("writing output")
    }
}
