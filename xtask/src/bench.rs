//! `cargo xtask bench`: what tracing costs a PyTorch-like /dev/shm workload, for shmtrace
//! against strace and perf trace, in one run (method: docs/BENCHMARKS.md).
//!
//! For each case (object size), every variant (untraced, or a tracer running the workload)
//! runs several times, interleaved round by round so that drifting machine load spreads over
//! all of them. Then a table of medians and ratios to untraced, and where shmtrace's own time
//! goes, probe by probe.
//!
//! Its modules:
//! - the workloads, run as `cargo xtask` subcommands of this same binary: `churn` (the
//!   /dev/shm churn every variant runs), `storm` (a fork storm, and a clock stamp for
//!   start-up), and the bystanders' loops (in `bystanders`);
//! - running them: `case` (one object size, its timed rounds and each variant's results),
//!   `variants` (untraced, or under one tracer or another), `reported` (what each tracer
//!   reports back), `measure` (one process's wall time, CPU, context switches and peak
//!   memory), `daemon` (`shmtrace daemon` on a free port, its metrics read over HTTP);
//! - the floors: `floor` (empty programs on shmtrace's hooks, or one record per call),
//!   `floor_ring` (the record floor's drained ring), `bpf_syscall` (the raw `bpf(2)` call they
//!   make, sharing no code with shmtrace), `ptrace_floor` (the ptrace source's stops, with
//!   nothing done at them);
//! - the measurements beyond the timed rounds: `pairs` (two workers taking turns, one traced,
//!   that machine noise cannot swamp), `probes` (BPF run-time statistics per program),
//!   `bystanders` (what host-wide tracing costs calls that do not concern /dev/shm),
//!   `server` (a real server's throughput beside the daemon), `beside` (the tracers those
//!   two run beside),
//!   `beside_storms` (tracers beside fork storms), `startup` (start-up and teardown),
//!   `replay` (replay throughput and `report`'s scaling), `daemon_idle` (an idle daemon's
//!   CPU), `container_soak` (the daemon's memory through an hour of short-lived containers),
//!   `import_torch` (a Python start-up importing torch, untraced, under the ptrace source
//!   and under `strace -f`);
//! - judging and reporting: `target` (what a target is, and a verdict on it), `target_list`
//!   (every target and its bound), `verdicts` (each measurement's figures judged), `stats`
//!   (medians and spreads), `table` (the printed tables), `machine` (the machine and its
//!   load), `neighbours` (other BPF users on the machine, which would skew the results),
//!   `benchmarks_doc` (docs/BENCHMARKS.md's targets and latest full run, `--save`).
mod benchmarks_doc;
mod beside;
mod beside_storms;
mod bpf_syscall;
mod bystanders;
mod case;
mod churn;
mod container_soak;
mod daemon;
mod daemon_idle;
mod floor;
mod floor_ring;
mod import_torch;
mod machine;
mod measure;
mod neighbours;
mod pairs;
mod probes;
mod ptrace_floor;
mod replay;
mod reported;
mod server;
mod startup;
mod stats;
mod storm;
mod table;
mod target;
mod target_list;
mod variants;
mod verdicts;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use anyhow::{Context, Result, bail};
use serde_json::json;

use self::{
    case::{Case, VariantResult, check_room, raw_runs, run_rounds},
    machine::{describe, load_average, machine_description},
    probes::Subject,
    variants::{Setup, Variant},
};
use crate::{cargo, root, run as run_command};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// A short run (fewer objects and rounds), well under a minute.
    #[arg(long)]
    quick: bool,
    /// Object sizes, one case each (suffixes K, M, G) [default: 1M,256K,4K].
    #[arg(long, value_delimiter = ',', value_parser = shmtrace_core::units::parse)]
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
    /// Variants to run, by name [default: all; with --quick: untraced, floor, floor-records,
    /// shmtrace-null, shmtrace-idle, shmtrace-all]: untraced, floor, floor-records, shmtrace,
    /// shmtrace-json, shmtrace-null, shmtrace-failed, shmtrace-ptrace, shmtrace-ptrace-one-cpu,
    /// ptrace-floor, ptrace-floor-one-cpu, shmtrace-idle, shmtrace-all, strace, strace-seccomp,
    /// perf-trace.
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Also write(2) a header into each object (exercises the write probe).
    #[arg(long)]
    write_call: bool,
    /// Write every byte of each mapping (a tensor copy), not one byte per page.
    #[arg(long)]
    fill: bool,
    /// Skip the per-probe cost analysis (five extra runs per case, four with --quick: shmtrace
    /// tracing the workload, with --failed, tracing another process; the floor, the record
    /// floor).
    #[arg(long)]
    no_probe_costs: bool,
    /// Skip the paired measurement (three extra runs per case, two with --quick).
    #[arg(long)]
    no_pairs: bool,
    /// Skip the fork storm, start-up and replay measurements of the targets.
    #[arg(long)]
    no_targets: bool,
    /// Only the replay targets (record a 4 KiB churn, time `show --json` of it on one core,
    /// measured --rounds times [default: once]; then `report` of a recorded fork storm of 100k
    /// processes against one of 1M, 10k and 100k with --quick).
    #[arg(long)]
    only_replay: bool,
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
    /// Only the fork storms (tracer CPU; `--all` and the daemon beside 10k, then 4 × 50k processes).
    #[arg(long)]
    only_fork_storm: bool,
    /// Only the bystanders: what `--all` and the daemon cost calls that do not concern
    /// /dev/shm, per program and timed.
    #[arg(long)]
    only_bystanders: bool,
    /// Skip the bystanders.
    #[arg(long)]
    no_bystanders: bool,
    /// Only the container soak: `shmtrace daemon`'s memory and counts through a churn of
    /// short-lived Docker containers, for --soak-minutes (not in the full run: an hour).
    #[arg(long)]
    only_container_soak: bool,
    /// Minutes of the container soak.
    #[arg(long, value_name = "MINUTES", default_value_t = 60)]
    soak_minutes: u64,
    /// Only start-up and teardown, after a pause and back to back (--rounds runs of each)
    /// [default: 15, or 5 with --quick].
    #[arg(long)]
    only_startup: bool,
    /// Only the ptrace source's figures: the churn (256 KiB objects unless --sizes) untraced,
    /// with `--backend ptrace` (alone, and on one CPU), under the ptrace floor (alone, and on
    /// one CPU) and under `strace -f`; a Python start-up importing torch untraced, with
    /// `--backend ptrace` and under `strace -f`; and the start-up to the command's first
    /// instruction.
    #[arg(long)]
    only_ptrace: bool,
    /// Also write every measurement to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write this run into docs/BENCHMARKS.md as its latest full run, and the targets' table
    /// with it (a full run only: no option that changes what is measured).
    #[arg(long)]
    save: bool,
}

impl BenchArgs {
    /// Whether the run measures everything a full run does, the way it does.
    fn is_full(&self) -> bool {
        !self.quick
            && self.sizes.is_empty()
            && self.iterations.is_none()
            && self.workers == 1
            && self.rounds.is_none()
            && self.variants.is_empty()
            && !self.write_call
            && !self.fill
            && !self.no_probe_costs
            && !self.no_pairs
            && !self.no_targets
            && !self.only_replay
            && self.shmtrace.is_none()
            && self.daemon_idle.is_none()
            && !self.only_daemon_idle
            && !self.only_fork_storm
            && !self.only_bystanders
            && !self.no_bystanders
            && !self.only_startup
            && !self.only_container_soak
    }
}

/// Options of the workload (`cargo xtask churn`), which `bench` runs under each tracer.
#[derive(clap::Args, Clone, Debug)]
pub struct ChurnArgs {
    /// Bytes per object (suffixes K, M, G).
    #[arg(long, default_value = "1M", value_parser = shmtrace_core::units::parse)]
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
    churn::check_args(args)?;
    if args.pair_block > 0 {
        pairs::workload(args)
    } else {
        churn::run(args)
    }
}

pub use self::bystanders::BystanderArgs;

pub fn bystander(args: &BystanderArgs) -> Result<()> {
    bystanders::run_loop(args)
}

pub fn floor(command: &[String], records: bool) -> Result<()> {
    floor::run(command, records)
}

pub fn ptrace_floor(command: &[String]) -> Result<()> {
    ptrace_floor::run(command)
}

pub fn storm(processes: u64, tag: &str) -> Result<()> {
    storm::run(processes, tag)
}

pub fn stamp() {
    storm::stamp()
}

/// The benchmark's scheduling priority, and so its children's.
const NICE: libc::c_int = -10;

/// The report as printed so far: what `--save` writes into docs/BENCHMARKS.md.
static REPORT: Mutex<String> = Mutex::new(String::new());

/// Prints a part of the report (Markdown, on stdout; progress goes to stderr) and keeps it.
macro_rules! report {
    ($($arg:tt)*) => {{
        let text = format!($($arg)*);
        println!("{text}");
        let mut kept = REPORT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        kept.push_str(&text);
        kept.push('\n');
    }};
}

fn report_text() -> String {
    REPORT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

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
    if args.save && !args.is_full() {
        bail!(
            "--save writes docs/BENCHMARKS.md's latest full run: run without options that change \
             what is measured (--json FILE keeps any run's figures)"
        );
    }
    let started = Instant::now();
    // Ahead of unrelated work on the machine (builds, other tests), which would otherwise add
    // more noise than the differences measured. Children inherit it.
    // SAFETY: setpriority has no memory-safety preconditions.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICE) };
    let selected = select_variants(&args.variants, args.quick)?;
    let sizes = if args.sizes.is_empty() {
        // A small batch; the objects of a 256 KiB batch loop, against which the overhead
        // targets were set; and the worst case, where the calls are nearly all the work.
        vec![1 << 20, 256 << 10, 4 << 10]
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
    if args.only_replay {
        return replay_only(args, &setup, &exe, &tag);
    }
    if args.only_startup {
        let runs = args.rounds.unwrap_or(if args.quick { 5 } else { 15 });
        let rows = measure_startup(&setup, &exe, runs);
        report!("## Start-up and teardown\n\n{}", target::table(&rows));
        return Ok(());
    }
    if args.only_container_soak {
        report!("# shmtrace benchmark: container soak\n");
        report!("{}\n", machine_description(&setup));
        let figures = container_soak::measure(&setup.shmtrace, &setup.scratch, args.soak_minutes)?;
        let (text, rows, saved) = container_soak::report(&figures);
        report!(
            "{text}\n## Targets, measured in this run\n\n{}",
            target::table(&rows)
        );
        if rows.iter().any(|row| row.met == Some(false)) {
            // The scratch directory goes when the benchmark ends; what the daemon said is
            // what explains a missed target, so it is kept.
            let kept = container_soak::keep_evidence(&setup.scratch, &tag)?;
            report!(
                "A target was missed: the daemon's lines and log are kept in {}.",
                kept.display()
            );
        }
        report!("Load average at the end: {}.", load_average());
        if let Some(path) = &args.json {
            fs::write(path, serde_json::to_string_pretty(&saved)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    if args.only_ptrace {
        return ptrace_only(args, &setup, &exe, &tag);
    }
    if args.only_bystanders {
        report!("# shmtrace benchmark: bystanders\n");
        report!("{}\n", machine_description(&setup));
        let (saved, rows) = bystanders_section(&setup, &exe, args.quick)?;
        report!(
            "## Targets, measured in this run\n\n{}",
            target::table(&rows)
        );
        if let Some(path) = &args.json {
            fs::write(path, serde_json::to_string_pretty(&saved)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }

    report!("# shmtrace benchmark\n");
    report!("{}\n", machine_description(&setup));
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
    let sizes = if args.only_daemon_idle || args.only_fork_storm {
        Vec::new()
    } else {
        sizes
    };
    for size in sizes {
        let case = Case::new(args, size, &exe, &tag);
        check_room(size, args.workers)?;
        report!("## {}\n", case.title);
        let mut others = BTreeMap::new();
        let results = run_rounds(&case, &setup, &selected, &unavailable, &mut others)?;
        target_rows.extend(verdicts::from_case(
            &shmtrace_core::units::human(size),
            &results,
        ));
        target_rows.extend(verdicts::ptrace(
            &shmtrace_core::units::human(size),
            &results,
        ));
        let (text, notes) = table::variants(&results);
        report!("{text}");
        for note in &notes {
            report!("- {note}");
        }
        if !notes.is_empty() {
            report!("");
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
        let probes = (!args.no_probe_costs).then(|| {
            let (text, rows) = probe_costs(&setup, &case, &results, reference, !args.quick);
            target_rows.extend(rows);
            text
        });
        others.extend(neighbours::foreign_bpf_holders());
        if !others.is_empty() {
            report!(
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
        // A storm five times longer shows whether --all's memory grows with the run.
        let long_storm = !args.quick || args.only_fork_storm;
        let storms = beside_storms::measure(&setup, &exe, &tag, rounds, long_storm);
        target_rows.extend(verdicts::fork_storms(&storms));
        churn::remove_leftovers(&tag);
    }
    if !args.no_targets
        && !args.only_daemon_idle
        && !args.only_fork_storm
        && !INTERRUPTED.load(Ordering::SeqCst)
    {
        let runs = if args.quick { 5 } else { 15 };
        target_rows.extend(measure_startup(&setup, &exe, runs));
        if !args.quick {
            target_rows.extend(verdicts::import_torch(&import_torch::measure(&setup, 3)));
        }
        let replayed = if args.quick { 20_000 } else { 100_000 };
        target_rows.push(verdicts::replay(&replay::throughput(
            &setup, &exe, &tag, replayed,
        )));
        churn::remove_leftovers(&tag);
        let storm = if args.quick { 10_000 } else { 100_000 };
        let seconds = replay::report_times(&setup, &exe, &tag, [storm, storm * 10]);
        target_rows.push(verdicts::report_scaling(storm, &seconds));
        churn::remove_leftovers(&tag);
    }
    if !args.no_bystanders
        && !args.only_daemon_idle
        && !args.only_fork_storm
        && !INTERRUPTED.load(Ordering::SeqCst)
    {
        let (bystanders, rows) = bystanders_section(&setup, &exe, args.quick)?;
        target_rows.extend(rows);
        saved.push(json!({ "case": "bystanders", "bystanders": bystanders }));
    }
    let idle_seconds = match args.only_fork_storm {
        true => 0,
        false => args.daemon_idle.unwrap_or(if args.quick { 20 } else { 60 }),
    };
    if idle_seconds > 0 {
        let figures = daemon_idle::measure(&setup.shmtrace, &setup.scratch, idle_seconds)?;
        let (text, json) = daemon_idle::report(&figures);
        report!("{text}");
        saved.push(json!({ "case": "daemon-idle", "daemon_idle": json }));
        target_rows.push(verdicts::daemon_idle(figures.cpu_percent, figures.seconds));
    }
    let targets_text = target::table(&target_rows);
    report!("## Targets, measured in this run\n\n{targets_text}");
    let elapsed = started.elapsed().as_secs_f64();
    report!(
        "Benchmark took {elapsed:.0} s. Load average at the end: {}.",
        load_average()
    );
    if args.save && !INTERRUPTED.load(Ordering::SeqCst) {
        benchmarks_doc::save(&report_text())?;
    }
    if let Some(path) = &args.json {
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

/// Start-up and teardown, `runs` times after a pause and `runs` times back to back, judged.
fn measure_startup(setup: &Setup, exe: &Path, runs: u32) -> Vec<target::Row> {
    let paused = startup::measure(setup, exe, runs, false, &[]);
    let back_to_back = startup::measure(setup, exe, runs, true, &[]);
    let mut rows = verdicts::startup(&paused, &back_to_back);
    let ptrace = startup::measure(setup, exe, runs, true, &["--backend", "ptrace"]);
    rows.push(verdicts::ptrace_startup(&ptrace));
    rows
}

/// `--only-ptrace`: the ptrace source's rows, beside untraced and `strace -f`.
fn ptrace_only(args: &BenchArgs, setup: &Setup, exe: &Path, tag: &str) -> Result<()> {
    println!("# shmtrace benchmark: the ptrace source\n");
    println!("{}\n", machine_description(setup));
    let selected = select_variants(
        &[
            "untraced",
            "shmtrace-ptrace",
            "shmtrace-ptrace-one-cpu",
            "ptrace-floor",
            "ptrace-floor-one-cpu",
            "strace",
        ]
        .map(String::from),
        false,
    )?;
    let unavailable: Vec<Option<String>> = selected
        .iter()
        .map(|v| v.available(setup).err().map(|e| format!("{e:#}")))
        .collect();
    let sizes = match args.sizes.is_empty() {
        true => vec![256 << 10],
        false => args.sizes.clone(),
    };
    let mut rows = Vec::new();
    for size in sizes {
        let case = Case::new(args, size, exe, tag);
        check_room(size, args.workers)?;
        println!("## {}\n", case.title);
        let mut others = BTreeMap::new();
        let results = run_rounds(&case, setup, &selected, &unavailable, &mut others)?;
        rows.extend(verdicts::ptrace(
            &shmtrace_core::units::human(size),
            &results,
        ));
        let (text, notes) = table::variants(&results);
        println!("{text}");
        for note in &notes {
            println!("- {note}");
        }
        println!();
        churn::remove_leftovers(tag);
    }
    let rounds = args.rounds.unwrap_or(if args.quick { 3 } else { 5 });
    rows.extend(verdicts::import_torch(&import_torch::measure(
        setup, rounds,
    )));
    let runs = if args.quick { 5 } else { 15 };
    rows.push(verdicts::ptrace_startup(&startup::measure(
        setup,
        exe,
        runs,
        true,
        &["--backend", "ptrace"],
    )));
    println!(
        "## Targets, measured in this run\n\n{}",
        target::table(&rows)
    );
    println!("Load average at the end: {}.", load_average());
    Ok(())
}

/// Measures and prints the bystanders' section; returns what to save and its targets' rows.
fn bystanders_section(
    setup: &Setup,
    exe: &Path,
    quick: bool,
) -> Result<(serde_json::Value, Vec<target::Row>)> {
    let (text, mut rows, saved) = bystanders::measure(setup, exe, quick)?;
    report!("{text}");
    let (server_text, server_rows, server_saved) = server::measure(setup, exe, quick)?;
    report!("{server_text}");
    rows.extend(server_rows);
    Ok((json!({ "loops": saved, "server": server_saved }), rows))
}

/// `--only-replay`: the replay target alone, --rounds times, each a row of the table; then
/// report's scaling.
fn replay_only(args: &BenchArgs, setup: &Setup, exe: &Path, tag: &str) -> Result<()> {
    report!("# shmtrace benchmark: replay only\n");
    report!("{}\n", machine_description(setup));
    let replayed = if args.quick { 20_000 } else { 100_000 };
    let mut rows = Vec::new();
    for _ in 0..args.rounds.unwrap_or(1) {
        if INTERRUPTED.load(Ordering::SeqCst) {
            break;
        }
        rows.push(verdicts::replay(&replay::throughput(
            setup, exe, tag, replayed,
        )));
        churn::remove_leftovers(tag);
    }
    if !INTERRUPTED.load(Ordering::SeqCst) {
        let storm = if args.quick { 10_000 } else { 100_000 };
        let seconds = replay::report_times(setup, exe, tag, [storm, storm * 10]);
        rows.push(verdicts::report_scaling(storm, &seconds));
        churn::remove_leftovers(tag);
    }
    report!("{}", target::table(&rows));
    report!("Load average at the end: {}.", load_average());
    Ok(())
}

/// Runs and prints the paired measurement. Returns its table for `--json`, and the per-object
/// times of the run with shmtrace's defaults, the best reference for the probe costs.
fn paired(setup: &Setup, case: &Case, quick: bool) -> (String, Option<table::Reference>) {
    let block = pairs::default_block(case.size);
    report!("### Paired: workers A and B take turns, {block} objects a turn; only A is traced\n");
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
    report!("{text}");
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

/// Runs and prints the per-probe analysis; returns its text for `--json`. Its figures are set
/// against `reference`, or else against the medians of the timed rounds.
fn probe_costs(
    setup: &Setup,
    case: &Case,
    results: &[VariantResult],
    reference: Option<table::Reference>,
    with_failed: bool,
) -> (String, Vec<target::Row>) {
    let (workload, objects) = (&case.workload, case.objects);
    report!("### Where shmtrace's time goes (BPF run-time statistics, from extra runs)\n");
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
    let full = probes::measure(setup, Subject::Traced(&[]), workload, objects);
    churn::remove_leftovers(&case.tag);
    let failed = with_failed
        .then(|| probes::measure(setup, Subject::Traced(&["--failed"]), workload, objects));
    churn::remove_leftovers(&case.tag);
    let record_floor = probes::measure(setup, Subject::Floor { records: true }, workload, objects);
    churn::remove_leftovers(&case.tag);
    let mut rows = Vec::new();
    let mut text = match (full, failed) {
        (Ok(full), failed) => {
            let failed_report = failed.as_ref().and_then(|f| f.as_ref().ok());
            let mut text = table::probes(&full, failed_report, reference.as_ref());
            if let Some(Err(error)) = failed {
                text += &format!("The --failed run failed: {error:#}\n");
            }
            match &record_floor {
                Ok(floor) => {
                    text += &table::above_record_floor(&full, floor, median_loop("untraced"));
                    rows.push(verdicts::traced_programs(
                        &shmtrace_core::units::human(case.size),
                        &full,
                        floor,
                        median_loop("untraced"),
                    ));
                }
                Err(error) => text += &format!("The record floor's run failed: {error:#}\n"),
            }
            text
        }
        (Err(error), _) => format!("Not measured: {error:#}\n"),
    };
    report!("{text}");
    let (others, row) = cost_to_others(setup, case, median_loop("untraced"));
    report!("{others}");
    rows.extend(row);
    text += "\n";
    text += &others;
    (text, rows)
}

/// Times shmtrace's programs, then the floor's, while the workload runs untraced beside them.
fn cost_to_others(
    setup: &Setup,
    case: &Case,
    untraced_us: Option<f64>,
) -> (String, Option<target::Row>) {
    let (workload, objects) = (&case.workload, case.objects);
    report!("### What shmtrace's programs cost a process they do not trace\n");
    let idle = probes::measure(setup, Subject::BesideIdle, workload, objects);
    churn::remove_leftovers(&case.tag);
    let floor = probes::measure(setup, Subject::Floor { records: false }, workload, objects);
    churn::remove_leftovers(&case.tag);
    match (idle, floor) {
        (Ok(idle), floor) => {
            let mut text = table::cost_to_others(&idle, floor.as_ref().ok(), untraced_us);
            if let Err(error) = &floor {
                text += &format!("The floor's run failed: {error:#}\n");
            }
            let row = floor.ok().map(|floor| {
                verdicts::idle_programs(
                    &shmtrace_core::units::human(case.size),
                    &idle,
                    &floor,
                    untraced_us,
                )
            });
            (text, row)
        }
        (Err(error), _) => (format!("Not measured: {error:#}\n"), None),
    }
}

/// --quick keeps what the overhead targets need: the floors, shmtrace, and its cost to others.
const QUICK_VARIANTS: [&str; 5] = [
    "floor",
    "floor-records",
    "shmtrace-null",
    "shmtrace-idle",
    "shmtrace-all",
];

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

#[cfg(test)]
mod tests {
    /// The module index at the top of this file names every module it declares.
    #[test]
    fn the_module_index_names_every_module() {
        let text = include_str!("bench.rs");
        let index: String = text
            .lines()
            .take_while(|line| line.starts_with("//!"))
            .collect::<Vec<_>>()
            .join(" ");
        let declared: Vec<&str> = text
            .lines()
            .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        assert!(declared.len() >= 20, "{declared:?}");
        let missing: Vec<&&str> = declared
            .iter()
            .filter(|module| !index.contains(&format!("`{module}`")))
            .collect();
        assert!(missing.is_empty(), "not in bench.rs's index: {missing:?}");
    }
}
