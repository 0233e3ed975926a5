//! `cargo xtask bench`: what tracing costs a PyTorch-like /dev/shm workload, for shmtrace
//! against strace and perf trace, in one run (method: docs/BENCHMARKS.md).
//!
//! For each case (object size), every variant (untraced, or a tracer running the workload)
//! runs several times, interleaved round by round so that drifting machine load spreads over
//! all of them. Then a table of medians and ratios to untraced, and where shmtrace's own time
//! goes, probe by probe.
//!
//! - `churn`: the workload (`cargo xtask churn`), the same binary under every variant;
//! - `variants`: how each variant runs it; `reported`: what each tracer reports back;
//! - `measure`: one process's wall time, CPU, context switches and peak memory;
//! - `neighbours`: other BPF users on the machine, which would skew the results;
//! - `pairs`: a paired measurement (two workers taking turns, one traced) that machine noise
//!   cannot swamp;
//! - `probes`: BPF run-time statistics per program;
//! - `stats`, `table`: medians, spreads and the printed tables.
mod churn;
mod daemon_idle;
mod floor;
mod measure;
mod neighbours;
mod pairs;
mod probes;
mod reported;
mod stats;
mod storm;
mod table;
mod targets;
mod variants;

use std::{
    collections::BTreeMap,
    ffi::OsString,
    fs,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::Instant,
};

use anyhow::{Context, Result, bail};
use serde_json::json;

use self::{
    stats::Spread,
    variants::{Outcome, Setup, Variant},
};
use crate::{cargo, root, run as run_command};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// A short run (fewer objects and rounds), well under a minute.
    #[arg(long)]
    quick: bool,
    /// Object sizes, one case each (suffixes K, M, G) [default: 1M,4K].
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Objects each worker makes per run [default: 3 GiB worth, within 2000..=30000; a sixth
    /// of that, within 300..=5000, with --quick].
    #[arg(long)]
    iterations: Option<u64>,
    /// Workload processes making objects at the same time.
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Runs of each variant [default: 5, or 3 with --quick].
    #[arg(long)]
    rounds: Option<u32>,
    /// Variants to run, by name [default: all; with --quick: untraced, floor, shmtrace-null,
    /// shmtrace-idle, shmtrace-all]: untraced, floor, shmtrace, shmtrace-json, shmtrace-null,
    /// shmtrace-failed, shmtrace-idle, shmtrace-all, strace, strace-seccomp, perf-trace.
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Also write(2) a header into each object (exercises the write probe).
    #[arg(long)]
    write_call: bool,
    /// Write every byte of each mapping (a tensor copy), not one byte per page.
    #[arg(long)]
    fill: bool,
    /// Skip the per-probe cost analysis (two extra shmtrace runs per case, one with --quick).
    #[arg(long)]
    no_probe_costs: bool,
    /// Skip the paired measurement (three extra runs per case, two with --quick).
    #[arg(long)]
    no_pairs: bool,
    /// Skip the fork storm, start-up and replay measurements of issue 12's targets.
    #[arg(long)]
    no_targets: bool,
    /// The shmtrace binary [default: build and use target/release/shmtrace].
    #[arg(long, value_name = "PATH")]
    shmtrace: Option<PathBuf>,
    /// Seconds to measure an idle `shmtrace daemon` (daemon-idle; 0 skips it)
    /// [default: 60, or 20 with --quick].
    #[arg(long, value_name = "SECONDS")]
    daemon_idle: Option<u64>,
    /// Only the daemon-idle part.
    #[arg(long)]
    only_daemon_idle: bool,
    /// Also write every measurement to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    save: Option<PathBuf>,
}

/// Options of the workload (`cargo xtask churn`), which `bench` runs under each tracer.
#[derive(clap::Args, Clone, Debug)]
pub struct ChurnArgs {
    /// Bytes per object (suffixes K, M, G).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub size: u64,
    /// Objects each worker creates and removes.
    #[arg(long, default_value_t = 10_000)]
    pub iterations: u64,
    /// Worker processes; with 1 the loop runs in this process, otherwise in forked children.
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// Also write(2) a 64-byte header into each object before mapping it.
    #[arg(long)]
    pub write_call: bool,
    /// Write every byte of the mapping (a tensor copy), not one byte per page.
    #[arg(long)]
    pub fill: bool,
    /// Marks the object names (`torch_<pid>_<tag>_<n>`), so leftovers can be found and removed.
    #[arg(long, default_value = "churn")]
    pub tag: String,
    /// Wait for a line on stdin before the loop, and for stdin to close after the report, so
    /// the benchmark can read the probes' statistics around the loop.
    #[arg(long)]
    pub hold: bool,
    /// Paired mode: two workers take turns making this many objects each (see bench/pairs.rs).
    #[arg(long, default_value_t = 0)]
    pub pair_block: u64,
}

pub fn churn(args: &ChurnArgs) -> Result<()> {
    churn::run(args)
}

pub fn floor(command: &[String]) -> Result<()> {
    floor::run(command)
}

pub fn storm(processes: u64, tag: &str) -> Result<()> {
    storm::run(processes, tag)
}

pub fn stamp() {
    storm::stamp()
}

/// All runs of one variant in one case.
pub struct VariantResult {
    variant: &'static Variant,
    outcomes: Vec<Outcome>,
    /// The round each of `outcomes` ran in.
    rounds: Vec<u32>,
    errors: Vec<String>,
    unavailable: Option<String>,
}

impl VariantResult {
    fn spread(&self, value: impl Fn(&Outcome) -> Option<f64>) -> Option<Spread> {
        Spread::of(&self.outcomes.iter().filter_map(value).collect::<Vec<_>>())
    }
    /// This variant's `value` over `base`'s, round by round, and the median of those ratios:
    /// load that drifts between rounds weighs on both sides of each ratio alike.
    fn paired_ratio(&self, base: &VariantResult, value: impl Fn(&Outcome) -> f64) -> Option<f64> {
        let ratios: Vec<f64> = self
            .rounds
            .iter()
            .zip(&self.outcomes)
            .filter_map(|(round, outcome)| {
                let i = base.rounds.iter().position(|r| r == round)?;
                Some(value(outcome) / value(&base.outcomes[i]))
            })
            .collect();
        Spread::of(&ratios).map(|s| s.median)
    }
    fn loop_times(&self) -> Option<Spread> {
        self.spread(|o| Some(o.workload.loop_seconds))
    }
    fn wall_times(&self) -> Option<Spread> {
        self.spread(|o| Some(o.top.wall_seconds))
    }
    fn tracer_cpu(&self) -> Option<Spread> {
        self.spread(|o| o.tracer.as_ref().map(|t| t.cpu_seconds))
    }
    fn tracer_peak_rss_kb(&self) -> Option<u64> {
        self.outcomes
            .iter()
            .filter_map(|o| o.tracer.as_ref().map(|t| t.peak_rss_kb))
            .max()
    }
    fn events(&self) -> Option<u64> {
        self.spread(|o| o.reported.events.map(|e| e as f64))
            .map(|s| s.median as u64)
    }
    fn lost(&self) -> Option<u64> {
        self.outcomes.iter().filter_map(|o| o.reported.lost).max()
    }
    /// `ok` when every run's tracer output matched the calls made, else the first mismatch.
    fn calls_seen(&self) -> String {
        if self.outcomes.iter().all(|o| o.reported.per_call.is_none()) {
            return "-".into();
        }
        let bad: Vec<String> = self.outcomes.iter().filter_map(Outcome::mismatch).collect();
        match bad.first() {
            None => "ok".into(),
            Some(first) => format!("{} of {} runs: {first}", bad.len(), self.outcomes.len()),
        }
    }
}

/// The benchmark's scheduling priority, and so its children's.
const NICE: libc::c_int = -10;

/// Set by SIGINT/SIGTERM; checked between runs.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Removes the workload's leftover objects and the scratch directory however the benchmark
/// ends, a tracer having killed the workload mid-loop included.
struct Cleanup {
    tag: String,
    scratch: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        churn::remove_leftovers(&self.tag);
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

pub fn run(args: &BenchArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark needs root: shmtrace loads BPF programs, strace and perf trace trace");
    }
    let started = Instant::now();
    // Ahead of unrelated work on the machine (builds, other tests), which would otherwise add
    // more noise than the differences measured. Children inherit it.
    // SAFETY: setpriority has no memory-safety preconditions.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICE) };
    let selected = select_variants(&args.variants, args.quick)?;
    let sizes = if args.sizes.is_empty() {
        vec![1 << 20, 4 << 10]
    } else {
        args.sizes.clone()
    };
    let shmtrace = match &args.shmtrace {
        Some(path) => path.clone(),
        None => {
            run_command(cargo().current_dir(root()).args([
                "build",
                "--release",
                "--quiet",
                "-p",
                "shmtrace",
            ]))?;
            root().join("target/release/shmtrace")
        }
    };
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let tag = format!("bench{}", std::process::id());
    let scratch = std::env::temp_dir().join(format!("shmtrace-{tag}"));
    fs::create_dir_all(&scratch)?;
    let _cleanup = Cleanup {
        tag: tag.clone(),
        scratch: scratch.clone(),
    };
    let setup = Setup { shmtrace, scratch };
    let exe = std::env::current_exe().context("finding the xtask binary")?;

    println!("# shmtrace benchmark\n");
    println!("{}\n", machine_description(&setup));
    let unavailable: Vec<Option<String>> = selected
        .iter()
        .map(|v| v.available(&setup).err().map(|e| format!("{e:#}")))
        .collect();
    let others = neighbours::foreign_bpf_holders();
    if !others.is_empty() {
        eprintln!(
            "warning: other processes hold BPF programs and may be tracing the workload too: {}",
            describe(&others)
        );
    }
    let mut saved = Vec::new();
    let mut target_rows = Vec::new();
    let sizes = if args.only_daemon_idle {
        Vec::new()
    } else {
        sizes
    };
    for size in sizes {
        let case = Case::new(args, size, &exe, &tag);
        check_room(size, args.workers)?;
        println!("## {}\n", case.title);
        let mut others = BTreeMap::new();
        let results = run_rounds(&case, &setup, &selected, &unavailable, &mut others)?;
        target_rows.extend(targets::from_case(&human_size(size), &results));
        let (text, notes) = table::variants(&results);
        println!("{text}");
        for note in &notes {
            println!("- {note}");
        }
        if !notes.is_empty() {
            println!();
        }
        others.extend(neighbours::foreign_bpf_holders());
        let (pairs, reference) = match args.no_pairs {
            true => (None, None),
            false => {
                let (text, reference) = paired(&setup, &case, args.quick);
                (Some(text), reference)
            }
        };
        others.extend(neighbours::foreign_bpf_holders());
        let probes = (!args.no_probe_costs)
            .then(|| probe_costs(&setup, &case, &results, reference, !args.quick));
        others.extend(neighbours::foreign_bpf_holders());
        if !others.is_empty() {
            println!(
                "**Warning**: other processes held BPF programs during this case, and may have \
                 traced the workload too (skewing every ratio): {}.\n",
                describe(&others)
            );
        }
        saved.push(json!({
            "case": case.title,
            "size": size,
            "iterations": case.iterations,
            "workers": args.workers,
            "rounds": case.rounds,
            "table": text,
            "notes": notes,
            "pairs": pairs,
            "probes": probes,
            "other_bpf_users": others,
            "runs": raw_runs(&results),
        }));
    }
    if !args.no_targets && !args.only_daemon_idle && !INTERRUPTED.load(Ordering::SeqCst) {
        let rounds = if args.quick { 1 } else { 3 };
        target_rows.extend(targets::fork_storm(&setup, &exe, &tag, rounds));
        churn::remove_leftovers(&tag);
        target_rows.extend(targets::startup(
            &setup,
            &exe,
            if args.quick { 5 } else { 15 },
        ));
        let replayed = if args.quick { 20_000 } else { 100_000 };
        target_rows.extend(targets::replay(&setup, &exe, &tag, replayed));
        churn::remove_leftovers(&tag);
    }
    let targets_text = targets::table(&target_rows);
    println!("## Issue 12's targets, measured in this run\n\n{targets_text}");
    let idle_seconds = args.daemon_idle.unwrap_or(if args.quick { 20 } else { 60 });
    if idle_seconds > 0 {
        let figures = daemon_idle::measure(&setup.shmtrace, &setup.scratch, idle_seconds)?;
        let (text, json) = daemon_idle::report(&figures);
        println!("{text}");
        saved.push(json!({ "case": "daemon-idle", "daemon_idle": json }));
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "Benchmark took {elapsed:.0} s. Load average at the end: {}.",
        load_average()
    );
    if let Some(path) = &args.save {
        let all = json!({
            "machine": machine_description(&setup),
            "seconds": elapsed,
            "cases": saved,
            "targets": targets_text,
        });
        fs::write(path, serde_json::to_string_pretty(&all)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One object size: the workload's command line and how often to run it.
struct Case {
    title: String,
    size: u64,
    iterations: u64,
    rounds: u32,
    /// Objects the workload makes in all (iterations × workers).
    objects: u64,
    tag: String,
    workload: Vec<OsString>,
}

impl Case {
    fn new(args: &BenchArgs, size: u64, exe: &std::path::Path, tag: &str) -> Case {
        let iterations = args
            .iterations
            .unwrap_or_else(|| default_iterations(size, args.quick));
        let rounds = args.rounds.unwrap_or(if args.quick { 3 } else { 5 }).max(1);
        let mut workload: Vec<OsString> = vec![exe.into(), "churn".into()];
        for (flag, value) in [
            ("--size", size.to_string()),
            ("--iterations", iterations.to_string()),
            ("--workers", args.workers.to_string()),
            ("--tag", tag.to_owned()),
        ] {
            workload.push(flag.into());
            workload.push(value.into());
        }
        let mut extras = String::new();
        if args.write_call {
            workload.push("--write-call".into());
            extras += ", with write(2)";
        }
        if args.fill {
            workload.push("--fill".into());
            extras += ", filling each mapping";
        }
        let plural = |n: u64, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        Case {
            title: format!(
                "{} objects × {iterations} per worker, {}, {}{extras}",
                human_size(size),
                plural(args.workers as u64, "worker"),
                plural(rounds as u64, "round"),
            ),
            size,
            iterations,
            rounds,
            objects: iterations * args.workers as u64,
            tag: tag.to_owned(),
            workload,
        }
    }
}

/// Runs every available variant once a round, in an order that rotates each round.
fn run_rounds(
    case: &Case,
    setup: &Setup,
    selected: &[&'static Variant],
    unavailable: &[Option<String>],
    others: &mut BTreeMap<u32, String>,
) -> Result<Vec<VariantResult>> {
    let mut results: Vec<VariantResult> = selected
        .iter()
        .zip(unavailable)
        .map(|(variant, unavailable)| VariantResult {
            variant,
            outcomes: Vec::new(),
            rounds: Vec::new(),
            errors: Vec::new(),
            unavailable: unavailable.clone(),
        })
        .collect();
    // A discarded warm-up: the first run pays for cold caches and /dev/shm growth.
    let _ = Variant::run(&variants::ALL[0], setup, &case.workload);
    churn::remove_leftovers(&case.tag);
    for round in 0..case.rounds {
        others.extend(neighbours::foreign_bpf_holders());
        eprint!("round {}/{}:", round + 1, case.rounds);
        let n = results.len();
        for k in 0..n {
            // Rotate the order each round, so no variant always follows the same one.
            let result = &mut results[(k + round as usize) % n];
            if result.unavailable.is_some() {
                continue;
            }
            if INTERRUPTED.load(Ordering::SeqCst) {
                bail!("interrupted");
            }
            eprint!(" {}", result.variant.name);
            match result.variant.run(setup, &case.workload) {
                Ok(outcome) => {
                    result.outcomes.push(outcome);
                    result.rounds.push(round);
                }
                Err(error) => result.errors.push(format!("{error:#}")),
            }
            churn::remove_leftovers(&case.tag);
        }
        eprintln!();
    }
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(results)
}

/// Runs and prints the paired measurement. Returns its table for `--save`, and the per-object
/// times of the run with shmtrace's defaults, the best reference for the probe costs.
fn paired(setup: &Setup, case: &Case, quick: bool) -> (String, Option<table::Reference>) {
    let block = pairs::default_block(case.size);
    println!("### Paired: workers A and B take turns, {block} objects a turn; only A is traced\n");
    // --quick skips the --failed run; the control (nothing traced) costs no shmtrace start.
    let modes = if quick {
        &pairs::MODES[..2]
    } else {
        &pairs::MODES[..]
    };
    let outcomes: Vec<(&pairs::PairMode, Result<pairs::PairOutcome>)> = modes
        .iter()
        .map(|mode| {
            eprintln!("paired: {}", mode.label);
            let outcome = pairs::measure(setup, mode, &case.workload, block);
            churn::remove_leftovers(&case.tag);
            (mode, outcome)
        })
        .collect();
    let text = table::pairs(&outcomes);
    println!("{text}");
    let reference = outcomes.iter().find_map(|(mode, outcome)| {
        let o = outcome
            .as_ref()
            .ok()
            .filter(|_| mode.is_default_shmtrace())?;
        Some(table::Reference {
            source: format!("Paired run ({}, median of turns)", mode.label),
            untraced_us: o.b_object_seconds * 1e6,
            traced_us: o.b_object_seconds * o.ratio_median * 1e6,
        })
    });
    (text, reference)
}

/// Runs and prints the per-probe analysis; returns its text for `--save`. Its figures are set
/// against `reference`, or else against the medians of the timed rounds.
fn probe_costs(
    setup: &Setup,
    case: &Case,
    results: &[VariantResult],
    reference: Option<table::Reference>,
    with_failed: bool,
) -> String {
    let (workload, objects) = (&case.workload, case.objects);
    println!("### Where shmtrace's time goes (BPF run-time statistics, from extra runs)\n");
    let median_loop = |name: &str| {
        results
            .iter()
            .find(|r| r.variant.name == name)
            .and_then(VariantResult::loop_times)
            .map(|s| s.median / objects as f64 * 1e6)
    };
    let reference = reference.or_else(|| {
        let (label, traced_us) = ["shmtrace", "shmtrace-null", "shmtrace-json"]
            .iter()
            .find_map(|name| {
                let label = variants::ALL.iter().find(|v| v.name == *name)?.label;
                Some((label, median_loop(name)?))
            })?;
        Some(table::Reference {
            source: format!("Medians of the timed rounds (untraced, {label})"),
            untraced_us: median_loop("untraced")?,
            traced_us,
        })
    });
    let full = probes::measure(setup, &[], workload, objects);
    churn::remove_leftovers(&case.tag);
    let failed = with_failed.then(|| probes::measure(setup, &["--failed"], workload, objects));
    churn::remove_leftovers(&case.tag);
    let text = match (full, failed) {
        (Ok(full), failed) => {
            let failed_report = failed.as_ref().and_then(|f| f.as_ref().ok());
            let mut text = table::probes(&full, failed_report, reference.as_ref());
            if let Some(Err(error)) = failed {
                text += &format!("The --failed run failed: {error:#}\n");
            }
            text
        }
        (Err(error), _) => format!("Not measured: {error:#}\n"),
    };
    println!("{text}");
    text
}

fn raw_runs(results: &[VariantResult]) -> serde_json::Value {
    results
        .iter()
        .map(|r| {
            json!({
                "variant": r.variant.name,
                "unavailable": r.unavailable,
                "errors": r.errors,
                "runs": r.outcomes.iter().map(|o| json!({
                    "loop_seconds": o.workload.loop_seconds,
                    "wall_seconds": o.top.wall_seconds,
                    "workload_cpu_seconds": o.workload.cpu_seconds,
                    "tracer_cpu_seconds": o.tracer.as_ref().map(|t| t.cpu_seconds),
                    "tracer_peak_rss_kb": o.tracer.as_ref().map(|t| t.peak_rss_kb),
                    "events": o.reported.events,
                    "lost": o.reported.lost,
                    "per_call": o.reported.per_call,
                    "calls": o.workload.calls,
                    "mismatch": o.mismatch(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// --quick keeps what issue 12's targets need: the floor, shmtrace, and its cost to others.
const QUICK_VARIANTS: [&str; 4] = ["floor", "shmtrace-null", "shmtrace-idle", "shmtrace-all"];

fn select_variants(names: &[String], quick: bool) -> Result<Vec<&'static Variant>> {
    let names: Vec<String> = match (names.is_empty(), quick) {
        (false, _) => names.to_vec(),
        (true, true) => QUICK_VARIANTS.map(String::from).to_vec(),
        (true, false) => return Ok(variants::ALL.iter().collect()),
    };
    let mut selected: Vec<&'static Variant> = Vec::new();
    // Untraced always runs: every ratio is to it.
    selected.push(&variants::ALL[0]);
    for name in names {
        let Some(variant) = variants::ALL.iter().find(|v| v.name == name) else {
            let known: Vec<&str> = variants::ALL.iter().map(|v| v.name).collect();
            bail!("no variant {name:?}; known: {}", known.join(", "));
        };
        if !selected.iter().any(|s| s.name == variant.name) {
            selected.push(variant);
        }
    }
    Ok(selected)
}

/// Enough objects for a run to last a second or two untraced (about 3 GiB worth, at most
/// 30000: strace takes ten times as long); a sixth of that for --quick.
fn default_iterations(size: u64, quick: bool) -> u64 {
    let (bytes, low, high) = if quick {
        (512u64 << 20, 300, 5_000)
    } else {
        (3u64 << 30, 2_000, 30_000)
    };
    (bytes / size.max(1)).clamp(low, high)
}

/// The workload holds at most one object per worker at a time.
fn check_room(size: u64, workers: u32) -> Result<()> {
    // SAFETY: an all-zero statvfs is valid; statvfs fills it.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    if unsafe { libc::statvfs(c"/dev/shm".as_ptr(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error()).context("statvfs /dev/shm");
    }
    let free = fs.f_bavail as u64 * fs.f_frsize as u64;
    let needed = size * workers as u64;
    if free < needed * 2 {
        bail!(
            "/dev/shm has {} free; the workload needs {} at a time",
            human_size(free),
            human_size(needed)
        );
    }
    Ok(())
}

fn machine_description(setup: &Setup) -> String {
    let read = |path: &str| {
        fs::read_to_string(path)
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let first_line = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .map(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.lines().next().unwrap_or("").trim().to_owned()
            })
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| format!("{program}: not found"))
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "Machine: {cores} cores ({cpu}), Linux {}, Debian {}. Load average at the start: {}. \
         Benchmark processes run at nice {NICE}.\n\
         Tools: {}; {}; {}.",
        read("/proc/sys/kernel/osrelease"),
        read("/etc/debian_version"),
        load_average(),
        first_line(&setup.shmtrace.to_string_lossy(), &["--version"]),
        first_line("strace", &["-V"]),
        first_line("perf", &["version"]),
    )
}

/// `123 (cmd args), 456 (...)`, each command cut to 60 characters.
fn describe(processes: &BTreeMap<u32, String>) -> String {
    const WIDTH: usize = 60;
    processes
        .iter()
        .map(|(pid, cmd)| {
            let mut short: String = cmd.chars().take(WIDTH).collect();
            if cmd.chars().count() > WIDTH {
                short.push('…');
            }
            format!("{pid} ({short})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// `1M`, `4K`, `4096`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'K' | 'k')) => (&text[..i], 10),
        Some((i, 'M' | 'm')) => (&text[..i], 20),
        Some((i, 'G' | 'g')) => (&text[..i], 30),
        _ => (text, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{text:?} is not a size like 1M, 4K or 4096"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("big").is_err());
        assert_eq!(human_size(4096), "4 KiB");
        assert_eq!(human_size(1 << 20), "1 MiB");
        assert_eq!(human_size(1000), "1000 B");
    }

    #[test]
    fn default_iterations_stay_in_range() {
        assert_eq!(default_iterations(1 << 20, false), 3072);
        assert_eq!(default_iterations(4096, false), 30_000);
        assert_eq!(default_iterations(1 << 30, false), 2_000);
        assert_eq!(default_iterations(4096, true), 5_000);
    }
}
