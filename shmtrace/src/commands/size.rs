//! `shmtrace size` (live) and `shmtrace report --size` (from a trace file): the peak of
//! /dev/shm a workload allocated, and the size to give it.
use std::{
    collections::HashMap,
    fs::File,
    io::Write,
    path::Path,
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context, Result};

use super::{
    DefaultStream, init_logging, open_output,
    replay::{describe, diagnoser, open, replay},
    trace::{exit_code, host_diagnoser},
};
use crate::{
    cli::{ColorWhen, ReportArgs, SizeArgs},
    live::launch::{self as live, What},
};
use shmtrace_core::{
    capacity::Capacity,
    clock::Clock,
    diagnose::{Diagnosis, Role, Roles},
    event::{Body, Event},
    model::{Annotation, ContainerInfo, World},
    output::filter::Filter,
    pipeline::{Observer, Pipeline},
    safe_open::{self, FileId, OpenOptions},
    sizing::{self, CommandEnd, SizeReport, Sizer},
};

/// With `--budget`, shmtrace's exit status is the verdict, never the command's (which a
/// command exiting 3 would make ambiguous; the command's is printed and in the JSON):
/// the workload does not fit the budget,
const OVER_BUDGET: u8 = 3;
/// or it fits but the traced command failed (a non-zero status, a signal), so the measurement
/// is of a run that did not finish its work,
const COMMAND_FAILED: u8 = 4;
/// or processes failed for lack of /dev/shm while it was measured: the peak is what fitted,
/// and says nothing of the budget.
const UNMEASURED: u8 = 5;
/// How often a live run measures each /dev/shm the workload uses (statfs), to see pages
/// written through mappings, which no system call shows.
const SAMPLE_EVERY: Duration = Duration::from_millis(20);

pub fn run(args: &SizeArgs) -> Result<ExitCode> {
    init_logging(args.verbose);
    let what = What::from_args(&args.target)?;
    let options = live::options(&what, &args.target);
    let to = open_result(args.output.as_deref(), &[])?;
    let result = Arc::new(Mutex::new(None));
    let budget = args.size.budget;
    let make_pipeline = |_: &live::Launched<'_>| -> Result<Pipeline> {
        // Diagnoses of failures go to stderr; the result goes to stdout or -o.
        let output = open_output(
            None,
            false,
            ColorWhen::Auto,
            DefaultStream::Stderr,
            Clock::now().context("reading the clocks")?,
        )?;
        Ok(
            Pipeline::new(World::new(), host_diagnoser(), output, Filter::default())
                .diagnoses_only()
                .with_observer(Box::new(SizeObserver::new(budget, result.clone(), true))),
        )
    };
    let outcome = live::run(what, &options, make_pipeline)?;
    let mut report = take(&result)?;
    report.command = outcome.command_status.map(CommandEnd::of);
    let fits = write(
        &report,
        args.json,
        to,
        &Clock::now().context("reading the clocks")?,
    )?;
    Ok(match (&report.budget, &report.command) {
        (None, _) => exit_code(&outcome),
        (Some(budget), _) if budget.unmeasured => ExitCode::from(UNMEASURED),
        (Some(_), _) if !fits => ExitCode::from(OVER_BUDGET),
        (Some(_), Some(command)) if !command.success() => ExitCode::from(COMMAND_FAILED),
        // Fits: an interrupted watch of containers or pids (Ctrl-C is how it ends) passes.
        (Some(_), _) => ExitCode::SUCCESS,
    })
}

/// `shmtrace report --size FILE`.
pub fn from_trace(args: &ReportArgs) -> Result<ExitCode> {
    let set = open(&args.file)?;
    let header = set.header().clone();
    let to = open_result(args.output.as_deref(), set.file_ids())?;
    let output = open_output(
        None,
        false,
        args.color,
        DefaultStream::Stderr,
        header.clock(),
    )?;
    let result = Arc::new(Mutex::new(None));
    let mut pipeline = Pipeline::new(World::new(), diagnoser(&header), output, Filter::default())
        .diagnoses_only()
        .with_observer(Box::new(SizeObserver::new(
            args.budget,
            result.clone(),
            false,
        )));
    pipeline.notice(&describe(&header))?;
    let replayed = replay(set, &mut pipeline);
    drop(pipeline);
    let report = take(&result)?;
    let fits = write(&report, args.json, to, &header.clock())?;
    let status = replayed?;
    Ok(match &report.budget {
        Some(budget) if budget.unmeasured => ExitCode::from(UNMEASURED),
        _ if !fits => ExitCode::from(OVER_BUDGET),
        _ => status,
    })
}

fn take(result: &Mutex<Option<SizeReport>>) -> Result<SizeReport> {
    result
        .lock()
        .map_err(|_| anyhow::anyhow!("the size measurement panicked"))?
        .take()
        .context("the trace ended before anything was measured")
}

/// Writes the report; returns whether it fits the budget (true without one).
/// Opens `-o` before the measurement, so that a bad path fails before a long run: as every
/// output, never through a link, never over the trace being read.
fn open_result<'a>(path: Option<&'a Path>, inputs: &[FileId]) -> Result<Option<(File, &'a Path)>> {
    path.map(|path| {
        safe_open::create(path, &OpenOptions::new().not_over(inputs))
            .context("cannot write the result (-o)")
            .map(|file| (file, path))
    })
    .transpose()
}

fn write(
    report: &SizeReport,
    json: bool,
    to: Option<(File, &Path)>,
    clock: &Clock,
) -> Result<bool> {
    let text = if json {
        let mut text = serde_json::to_string(report).context("writing the result as JSON")?;
        text.push('\n');
        text
    } else {
        sizing::text(report, &|ns| clock.rfc3339(ns))
    };
    match to {
        Some((mut file, path)) => {
            file.write_all(text.as_bytes())
                .and_then(|()| file.flush())
                .with_context(|| format!("cannot write the result to {}", path.display()))?;
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(text.as_bytes())?;
            stdout.flush()?;
        }
    }
    Ok(report.budget.is_none_or(|b| b.fits))
}

/// Feeds the pipeline's view to a [`Sizer`], and hands its result over at the end. Live, it
/// also measures each /dev/shm the workload touched, through a process that uses it.
struct SizeObserver {
    sizer: Sizer,
    budget: Option<u64>,
    result: Arc<Mutex<Option<SizeReport>>>,
    sampler: Option<Sampler>,
    /// Samples taken after the last event seen: events reach the pipeline up to 100 ms late,
    /// and a sample must meet the model as it was when the sample was taken.
    pending: Vec<Capacity>,
}

/// A thread that measures /dev/shm file systems every [`SAMPLE_EVERY`].
struct Sampler {
    /// Per /dev/shm (`dev_t`), a process to reach it through.
    through: Arc<Mutex<HashMap<u32, u32>>>,
    samples: Arc<Mutex<Vec<Capacity>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Sampler {
    fn new() -> Sampler {
        Sampler {
            through: Arc::default(),
            samples: Arc::default(),
            stop: Arc::default(),
            thread: None,
        }
    }

    /// `pid` uses /dev/shm `dev`; the thread starts with the first one (after the traced
    /// command was forked).
    fn reach(&mut self, dev: u32, pid: u32) {
        if let Ok(mut through) = self.through.lock() {
            through.insert(dev, pid);
        }
        if self.thread.is_none() {
            let (through, samples, stop) = (
                self.through.clone(),
                self.samples.clone(),
                self.stop.clone(),
            );
            self.thread = Some(thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let targets: Vec<(u32, u32)> = through
                        .lock()
                        .map(|t| t.iter().map(|(d, p)| (*d, *p)).collect())
                        .unwrap_or_default();
                    for (dev, pid) in targets {
                        let Ok(shm) = crate::container::measure_shm(pid) else {
                            continue;
                        };
                        if let Some(capacity) = shm.capacity().filter(|c| c.dev == dev)
                            && let Ok(mut samples) = samples.lock()
                        {
                            samples.push(capacity);
                        }
                    }
                    thread::sleep(SAMPLE_EVERY);
                }
            }));
        }
    }

    fn drain(&self) -> Vec<Capacity> {
        self.samples
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl SizeObserver {
    fn new(budget: Option<u64>, result: Arc<Mutex<Option<SizeReport>>>, live: bool) -> Self {
        SizeObserver {
            sizer: Sizer::new(),
            budget,
            result,
            sampler: live.then(Sampler::new),
            pending: Vec::new(),
        }
    }

    /// Gives the sizer the samples taken before `until_ns` (all, with `None`).
    fn take_samples(&mut self, until_ns: Option<u64>) {
        if let Some(sampler) = &self.sampler {
            self.pending.extend(sampler.drain());
        }
        self.pending.sort_by_key(|s| s.ts_ns);
        let due = self
            .pending
            .partition_point(|s| until_ns.is_none_or(|until| s.ts_ns <= until));
        for sample in self.pending.drain(..due).collect::<Vec<_>>() {
            self.sizer.capacity(&sample);
        }
    }
}

impl Observer for SizeObserver {
    fn event(&mut self, event: &Event, note: &Annotation, role: &Role, place: &str, world: &World) {
        if let (Some(sampler), Body::Call(call)) = (&mut self.sampler, &event.body)
            && let Some(file) = call.file
        {
            sampler.reach(file.inode.dev, event.pid);
        }
        self.take_samples(Some(event.ts_ns));
        self.sizer.event(event, note, role.kind, place, world);
    }

    fn seeded(&mut self, _: u32, _: u64, _: &World) {}

    fn capacity(&mut self, sample: &Capacity) {
        self.sizer.capacity(sample);
    }

    fn container(&mut self, info: &ContainerInfo) {
        self.sizer
            .container(info.shm_dev, info.label(), info.started_by.clone());
    }

    fn diagnosis(&mut self, diagnosis: &Diagnosis) {
        self.sizer.diagnosis(diagnosis);
    }

    fn finish(
        mut self: Box<Self>,
        _: &World,
        _: &Roles,
        lost: u64,
        _: u64,
    ) -> Result<Option<String>> {
        if let Some(sampler) = &mut self.sampler {
            sampler.stop();
        }
        self.take_samples(None);
        let report = self.sizer.report(self.budget, lost);
        if let Ok(mut slot) = self.result.lock() {
            *slot = Some(report);
        }
        Ok(None)
    }
}
