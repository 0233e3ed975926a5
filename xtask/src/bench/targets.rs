//! The benchmark's targets, each named for what it bounds, and the verdict on what a run
//! measured: met, not met, or not measured (never assumed). The measuring is elsewhere: the
//! timed rounds (`case`), the storms (`beside_storms`), start-up (`startup`), replay
//! (`replay`), the bystanders (`bystanders`) and the BPF run-time statistics (`probes`).
//!
//! [`TARGETS`] is the one list of them; docs/BENCHMARKS.md's targets table is checked against
//! it.
use anyhow::Result;

use super::{
    VariantResult,
    beside_storms::{self, BesideAll, PLATEAU_STORMS, Plateau, StormFigures, WARM_UP_STORMS},
    probes::{ProbeReport, percent_of},
    startup::StartupFigures,
    stats::Spread,
    table::markdown,
};

/// Which side of its limit a figure must be on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    AtMost,
    Below,
    AtLeast,
}

/// One target: what it bounds, and the bound.
#[derive(Debug)]
pub struct Target {
    /// What it bounds, as the targets table names it.
    pub bounds: &'static str,
    /// The bound in words; it names [`Target::limit`].
    pub bound: &'static str,
    pub side: Side,
    /// In the unit `bound` names.
    pub limit: f64,
    /// How the figure is measured and judged, for docs/BENCHMARKS.md's table.
    pub how: &'static str,
}

impl Target {
    /// Whether `figure`, in the unit of [`Target::bound`], meets it.
    pub fn met_by(&self, figure: f64) -> bool {
        match self.side {
            Side::AtMost => figure <= self.limit,
            Side::Below => figure < self.limit,
            Side::AtLeast => figure >= self.limit,
        }
    }

    /// The row of `figure` for this target, `case` saying where it was measured.
    pub fn judge(&self, case: &str, figure: f64, measured: String) -> Row {
        Row {
            target: self.label(case),
            measured,
            met: Some(self.met_by(figure)),
        }
    }

    fn failed(&self, case: &str, error: &anyhow::Error) -> Row {
        Row {
            target: self.label(case),
            measured: format!("not measured: {error:#}"),
            met: None,
        }
    }

    fn label(&self, case: &str) -> String {
        let label = format!("{} {}", self.bounds, self.bound);
        match case {
            "" => label,
            case => format!("{case}: {label}"),
        }
    }
}

/// A traced workload's overhead (its median ratio to untraced, minus one) against the floor's
/// (empty programs on the same hooks): not judged when the floor's is not above noise.
pub const TRACED_OVERHEAD: Target = Target {
    bounds: "traced overhead",
    bound: "≤ 1.5× the floor's",
    side: Side::AtMost,
    limit: 1.5,
    how: "`shmtrace -o /dev/null` against the floor, each a median of round-by-round ratios to untraced over the timed rounds of a case: (traced − 1) ≤ 1.5 × (floor − 1); not judged when the floor's median is not above 1",
};
/// An untraced process while `shmtrace --all` runs (`-o /dev/null`), as a ratio to untraced.
pub const BESIDE_ALL: Target = Target {
    bounds: "untraced process while --all runs",
    bound: "≤ 1.08×",
    side: Side::AtMost,
    limit: 1.08,
    how: "the workload untraced while `shmtrace --all -o /dev/null` runs, median of round-by-round ratios to untraced, per case",
};
/// An untraced process while shmtrace traces another (`--pid OTHER`).
pub const BESIDE_OTHER: Target = Target {
    bounds: "untraced process while --pid OTHER runs",
    bound: "≤ 1.02×",
    side: Side::AtMost,
    limit: 1.02,
    how: "the workload untraced while `shmtrace --pid SLEEPER` runs, median of round-by-round ratios to untraced, per case",
};
/// shmtrace's peak RSS, tracing the workload or beside a storm.
pub const PEAK_RSS: Target = Target {
    bounds: "peak RSS of a live trace",
    bound: "≤ 32 MiB",
    side: Side::AtMost,
    limit: 32.0,
    how: "shmtrace's own `VmHWM` (largest over a case's runs of `shmtrace -o /dev/null`; beside a 10k storm for `--all`)",
};
/// SIGINT to exit, the slowest run.
pub const SIGINT_TO_EXIT: Target = Target {
    bounds: "SIGINT to exit",
    bound: "< 1000 ms",
    side: Side::Below,
    limit: 1000.0,
    how: "from SIGINT to `shmtrace --all`'s exit, the slowest run of a case, and after a 10k storm",
};
/// Events lost to a full ring buffer of the default size.
pub const NO_LOSS: Target = Target {
    bounds: "events lost with the default buffer",
    bound: "= 0",
    side: Side::AtMost,
    limit: 0.0,
    how: "records dropped because the ring buffer was full, over every shmtrace run of a case and each storm (failed probe reads are shown apart)",
};
/// shmtrace's CPU for a storm of ten times the processes.
pub const STORM_CPU: Target = Target {
    bounds: "tracer CPU for 10k processes against 1k",
    bound: "≤ 10×",
    side: Side::AtMost,
    limit: 10.0,
    how: "shmtrace's user + system time tracing a fork storm of 10 000 processes over one of 1 000 (medians of 3 rounds)",
};
/// A tracer's peak RSS through storms in a row: how much the later storms raise it. The limit
/// is how far apart two peaks of the same bounded memory land: the 10k storm's peak under
/// `--all` alone varied by 2.2 MiB over four runs (28.1-30.3 MiB).
pub const MEMORY_PLATEAU: Target = Target {
    bounds: "peak RSS raised by 100k processes more, after the first 100k, with no loss",
    bound: "≤ 2 MiB",
    side: Side::AtMost,
    limit: 2.0,
    how: "a fresh `--all`, and a fresh daemon, each beside four 50 000-process storms in a row: the peak after the fourth over the peak after the second, and no record lost",
};
/// From shmtrace's start to the traced command's (median).
pub const STARTUP: Target = Target {
    bounds: "traced command starts after shmtrace",
    bound: "≤ 200 ms",
    side: Side::AtMost,
    limit: 200.0,
    how: "`shmtrace -o /dev/null -- xtask stamp`, the stamp's clock minus the time just before shmtrace was spawned; median of 15 runs, after the last run's probes are released and back to back",
};
/// From the command's end to shmtrace's exit (median).
pub const TEARDOWN: Target = Target {
    bounds: "teardown after the command ends",
    bound: "< 200 ms",
    side: Side::Below,
    limit: 200.0,
    how: "shmtrace's exit minus the stamp's clock, median of the same runs",
};
/// `shmtrace show --json` of a recorded churn on one core, in millions of events a second.
pub const REPLAY_RATE: Target = Target {
    bounds: "replay: decode + JSON on one core",
    bound: "≥ 1M events/s",
    side: Side::AtLeast,
    limit: 1.0,
    how: "`taskset -c 0 shmtrace show --json` of a recorded 4 KiB churn of 100 000 objects to /dev/null, lines over seconds from spawn to exit",
};
/// `shmtrace report`'s time over a trace of ten times the processes: replay is linear.
pub const REPORT_SCALING: Target = Target {
    bounds: "report of a trace of 10× the processes",
    bound: "≤ 10× the time",
    side: Side::AtMost,
    limit: 10.0,
    how: "`taskset -c 0 shmtrace report` of a recorded fork storm of 1M processes over one of 100k (`--only-replay`)",
};
/// shmtrace's programs on a `write`, `close`, `mmap` or `munmap` of a process that holds no
/// /dev/shm file, under `--all` and the daemon, against an empty program on the same hook (the
/// worse of the two).
pub const BYSTANDER_CALL: Target = Target {
    bounds: "programs on a write, close, mmap or munmap of a process holding nothing, under --all and the daemon",
    bound: "≤ 1.5× an empty program",
    side: Side::AtMost,
    limit: 1.5,
    how: "BPF run-time statistics, nanoseconds per run of the program a call of a bystander loop runs, the worse of beside `--all` and beside the daemon, over an empty program's on the same hook",
};
/// The open of a file that is not on /dev/shm, judged at its exit by the file it made, by a
/// process whose descriptor table has not grown (≤ 64 descriptors).
pub const OPEN_CALL: Target = Target {
    bounds: "programs on an open of a file not on /dev/shm, ≤ 64 descriptors, under --all and the daemon",
    bound: "≤ 2× an empty program",
    side: Side::AtMost,
    limit: 2.0,
    how: "the same, for the open of the open and close loop",
};
/// A holder's `write`, `close` or `mmap` on a descriptor that is not /dev/shm.
pub const HOLDER_CALL: Target = Target {
    bounds: "programs on a write, close or mmap of a process holding /dev/shm, on another file, under --all and the daemon",
    bound: "≤ 2.0× an empty program",
    side: Side::AtMost,
    limit: 2.0,
    how: "the same, for the loops of a process holding an open, mapped /dev/shm file",
};
/// The open and the holder's calls of a process whose descriptor table has grown past 64
/// slots, whose file is read at its address.
pub const GROWN_TABLE_CALL: Target = Target {
    bounds: "programs on an open, or a holder's write, close or mmap, with a grown descriptor table, under --all and the daemon",
    bound: "≤ 4× an empty program",
    side: Side::AtMost,
    limit: 4.0,
    how: "the same, for the loops holding 100 more descriptors",
};
/// A bystander loop's wall time beside the daemon, against beside the floor.
pub const BYSTANDER_TIMED: Target = Target {
    bounds: "bystander loop's time beside the daemon, against beside empty programs",
    bound: "≤ 1.02×",
    side: Side::AtMost,
    limit: 1.02,
    how: "a bystander loop's median wall time beside the daemon over that beside empty programs, interleaved rounds",
};
/// A real server's throughput beside the daemon, against beside empty programs.
pub const SERVER_LOSS: Target = Target {
    bounds: "Redis on loopback's throughput lost beside the daemon",
    bound: "≤ 1% of beside empty programs",
    side: Side::AtMost,
    limit: 1.0,
    how: "`redis-benchmark` against `redis-server` on loopback, median requests a second beside the daemon against beside empty programs, interleaved rounds",
};

/// An idle `shmtrace daemon`'s CPU, as a share of one core.
pub const DAEMON_IDLE: Target = Target {
    bounds: "an idle daemon's CPU",
    bound: "≤ 1% of one core",
    side: Side::AtMost,
    limit: 1.0,
    how: "`shmtrace daemon` as a node agent (host-wide probes, a survey and a /dev/shm measurement every 2 s, `/metrics` scraped every 15 s) on a machine where nothing fails, its own CPU over 60 s after 5 s of warm-up",
};

/// `shmtrace daemon`'s resident memory through an hour of short-lived containers: its growth
/// from the end of the warm-up to the end (what weeks of churn would add), and its highest.
pub const CONTAINER_SOAK_GROWTH: Target = Target {
    bounds: "daemon RSS growth over an hour of container churn, after a 5-minute warm-up",
    bound: "≤ 16 MiB",
    side: Side::AtMost,
    limit: 16.0,
    how: "`cargo xtask bench --only-container-soak` (not in a full run): `shmtrace daemon` beside `docker run --rm` after `docker run --rm` for 60 min, names reused, every other container failing in a 1 MiB /dev/shm; its VmRSS at the end less that after 5 min",
};
pub const CONTAINER_SOAK_PEAK: Target = Target {
    bounds: "daemon RSS at most, through an hour of container churn",
    bound: "≤ 96 MiB",
    side: Side::AtMost,
    limit: 96.0,
    how: "the same soak: the highest VmRSS read, every 30 s and at the end",
};
/// Every failure of the soak's containers counted under its own name, none for a container that
/// cannot fail, none made up for records that were not lost (1 for a run that miscounted).
pub const CONTAINER_SOAK_COUNTS: Target = Target {
    bounds: "container churn's counts: each under its container, none made up",
    bound: "= 0 miscounted runs",
    side: Side::AtMost,
    limit: 0.0,
    how: "the same soak, at its end: the failing containers' names have exactly the failures that ran, the healthy ones' none, and nothing is unrecorded unless records were lost",
};
/// The ptrace source (no privilege) tracing the 256 KiB churn, as a ratio to untraced.
pub const PTRACE_CHURN: Target = Target {
    bounds: "ptrace source: traced churn",
    bound: "≤ 1.3× untraced",
    side: Side::AtMost,
    limit: 1.3,
    how: "`shmtrace --backend ptrace -o FILE` running the churn, median of round-by-round ratios to untraced over the timed rounds of the 256 KiB case (`--only-ptrace`, or a full run)",
};
/// Its overhead (ratio − 1) against `strace -f`'s on the same work.
pub const PTRACE_AGAINST_STRACE: Target = Target {
    bounds: "ptrace source: overhead",
    bound: "≤ 0.5× strace -f's",
    side: Side::AtMost,
    limit: 0.5,
    how: "(ptrace − 1) against (`strace -f -o /dev/null` − 1), each the median of its round-by-round ratios to untraced, in the same rounds",
};
/// From `shmtrace --backend ptrace`'s start to the traced command's first instruction (median).
pub const PTRACE_STARTUP: Target = Target {
    bounds: "ptrace source: command starts after shmtrace",
    bound: "≤ 100 ms",
    side: Side::AtMost,
    limit: 100.0,
    how: "from starting `shmtrace --backend ptrace -o /dev/null -- xtask stamp` to the monotonic clock the stamp prints first thing, median of 15 runs back to back",
};

/// Every target, in the order docs/BENCHMARKS.md lists them.
pub const TARGETS: [&Target; 25] = [
    &TRACED_OVERHEAD,
    &BESIDE_ALL,
    &BESIDE_OTHER,
    &PEAK_RSS,
    &SIGINT_TO_EXIT,
    &NO_LOSS,
    &STORM_CPU,
    &MEMORY_PLATEAU,
    &STARTUP,
    &TEARDOWN,
    &REPLAY_RATE,
    &REPORT_SCALING,
    &BYSTANDER_CALL,
    &OPEN_CALL,
    &HOLDER_CALL,
    &GROWN_TABLE_CALL,
    &BYSTANDER_TIMED,
    &SERVER_LOSS,
    &DAEMON_IDLE,
    &CONTAINER_SOAK_GROWTH,
    &CONTAINER_SOAK_PEAK,
    &CONTAINER_SOAK_COUNTS,
    &PTRACE_CHURN,
    &PTRACE_AGAINST_STRACE,
    &PTRACE_STARTUP,
];

/// One target as a run found it: what it asks, what was measured, and whether that meets it.
pub struct Row {
    pub target: String,
    pub measured: String,
    pub met: Option<bool>,
}

impl Row {
    /// Context beside the targets, judged by none.
    fn context(what: &str, measured: String) -> Row {
        Row {
            target: format!("(not a target) {what}"),
            measured,
            met: None,
        }
    }
}

pub fn table(rows: &[Row]) -> String {
    let mut cells = vec![vec!["target".into(), "measured".into(), "met".into()]];
    for row in rows {
        let met = match row.met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        cells.push(vec![row.target.clone(), row.measured.clone(), met.into()]);
    }
    markdown(&cells)
}

fn find<'a>(results: &'a [VariantResult], name: &str) -> Option<&'a VariantResult> {
    results
        .iter()
        .find(|r| r.variant.name == name && !r.outcomes.is_empty())
}

/// Ratios to untraced, round by round: the median and the range.
fn ratios(result: &VariantResult, base: &VariantResult) -> Option<Spread> {
    let values: Vec<f64> = result
        .rounds
        .iter()
        .zip(&result.outcomes)
        .filter_map(|(round, outcome)| {
            let i = base.rounds.iter().position(|r| r == round)?;
            Some(outcome.workload.loop_seconds / base.outcomes[i].workload.loop_seconds)
        })
        .collect();
    Spread::of(&values)
}

fn describe(spread: &Spread) -> String {
    format!(
        "{:.3}× (rounds {:.3}–{:.3})",
        spread.median, spread.min, spread.max
    )
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The targets the timed rounds of one case answer.
pub fn from_case(case: &str, results: &[VariantResult]) -> Vec<Row> {
    let mut rows = Vec::new();
    let Some(base) = find(results, "untraced") else {
        return rows;
    };
    let floor = find(results, "floor").and_then(|r| ratios(r, base));
    let traced = find(results, "shmtrace-null")
        .or_else(|| find(results, "shmtrace"))
        .and_then(|r| ratios(r, base));
    if let (Some(floor), Some(traced)) = (&floor, &traced) {
        let (f, t) = (floor.median - 1.0, traced.median - 1.0);
        let measured = |note: String| {
            format!(
                "shmtrace {}, floor {}: {note}",
                describe(traced),
                describe(floor)
            )
        };
        rows.push(if f > 0.0 {
            TRACED_OVERHEAD.judge(
                case,
                t / f,
                measured(format!("{:.2}× the floor's overhead", t / f)),
            )
        } else {
            Row {
                met: None,
                ..TRACED_OVERHEAD.judge(
                    case,
                    0.0,
                    measured("floor overhead not above noise".into()),
                )
            }
        });
    }
    let record_floor = find(results, "floor-records").and_then(|r| ratios(r, base));
    if let (Some(record_floor), Some(traced)) = (&record_floor, &traced) {
        let (f, t) = (record_floor.median - 1.0, traced.median - 1.0);
        let note = if f > 0.0 {
            format!("{:.2}× the record floor's overhead", t / f)
        } else {
            "record floor's overhead not above noise".into()
        };
        rows.push(Row::context(
            &format!("{case}: traced overhead against the record floor's"),
            format!(
                "shmtrace {}, record floor {}: {note}",
                describe(traced),
                describe(record_floor)
            ),
        ));
    }
    for (name, target) in [
        ("shmtrace-all", &BESIDE_ALL),
        ("shmtrace-idle", &BESIDE_OTHER),
    ] {
        if let Some(spread) = find(results, name).and_then(|r| ratios(r, base)) {
            rows.push(target.judge(case, spread.median, describe(&spread)));
        }
    }
    if let Some(result) = find(results, "shmtrace-null").or_else(|| find(results, "shmtrace")) {
        let peak = mib(result.tracer_peak_rss_kb().unwrap_or(0));
        rows.push(PEAK_RSS.judge(
            case,
            peak,
            format!("{peak:.1} MiB ({})", result.variant.label),
        ));
    }
    if let Some(result) = find(results, "shmtrace-all") {
        let stop_ms = result
            .outcomes
            .iter()
            .filter_map(|o| o.tracer.as_ref()?.stop_seconds)
            .fold(0.0, f64::max)
            * 1e3;
        rows.push(SIGINT_TO_EXIT.judge(
            &format!("{case}, --all"),
            stop_ms,
            format!("{stop_ms:.0} ms at most"),
        ));
    }
    let lost: u64 = results
        .iter()
        .filter(|r| r.variant.name.starts_with("shmtrace"))
        .filter_map(VariantResult::lost)
        .sum();
    let failed_reads: u64 = results
        .iter()
        .flat_map(|r| &r.outcomes)
        .filter_map(|o| o.reported.failed_reads)
        .sum();
    rows.push(NO_LOSS.judge(
        case,
        lost as f64,
        format!(
            "{lost} events lost to a full ring buffer over every shmtrace run; {failed_reads} \
             probe reads failed (--all: host-wide, shown, not counted here)"
        ),
    ));
    rows
}

/// ", N% of an untraced object", when the untraced object's time is known.
fn share_of_untraced(ns: f64, untraced_us: Option<f64>) -> String {
    untraced_us.map_or(String::new(), |us| {
        format!(", {:.2}% of an untraced object", percent_of(ns, us))
    })
}

/// Not a target of its own: the part of what `--pid OTHER` costs an untraced process that is
/// shmtrace's own work, from run-time statistics. It is exact where the timed ratio above is
/// lost in this machine's noise; the rest is the tracepoints' dispatch, which the floor pays
/// too.
pub fn idle_programs(
    case: &str,
    idle: &ProbeReport,
    floor: &ProbeReport,
    untraced_us: Option<f64>,
) -> Row {
    let above = idle.ns_per_object() - floor.ns_per_object();
    let share = share_of_untraced(above, untraced_us);
    Row::context(
        &format!("{case}: --pid OTHER: shmtrace's programs above the floor's"),
        format!("{above:.0} ns per object{share} (BPF run-time statistics)"),
    )
}

/// Not a target of its own: shmtrace's programs per traced object, above the record floor's
/// (one empty record per call, for every process): what shmtrace does beyond what any
/// tracer that reports every call must, exactly, where the timed rounds cannot resolve it.
pub fn traced_programs(
    case: &str,
    traced: &ProbeReport,
    record_floor: &ProbeReport,
    untraced_us: Option<f64>,
) -> Row {
    let above = traced.ns_per_object() - record_floor.ns_per_object();
    let share = share_of_untraced(above, untraced_us);
    Row::context(
        &format!("{case}: traced: shmtrace's programs above the record floor's"),
        format!(
            "{:.0} ns per object against {:.0}: {above:.0} ns more{share} (BPF run-time \
             statistics)",
            traced.ns_per_object(),
            record_floor.ns_per_object()
        ),
    )
}

/// The targets the fork storms answer.
pub fn fork_storms(figures: &StormFigures) -> Vec<Row> {
    let mut rows = Vec::new();
    let [small, large] = beside_storms::CPU_STORMS;
    let storm = |n: u64| format!("fork storm of {}", count_words(n));
    match &figures.traced_cpu {
        Ok(([a, b], lost)) => {
            let ratio = b / a.max(0.001);
            rows.push(STORM_CPU.judge(
                "fork storm",
                ratio,
                format!("{b:.2} s / {a:.2} s = {ratio:.1}×"),
            ));
            rows.push(NO_LOSS.judge(
                &format!(
                    "{} and {}, traced command",
                    storm(small),
                    count_words(large)
                ),
                *lost as f64,
                format!("{lost} events lost"),
            ));
        }
        Err(error) => rows.push(STORM_CPU.failed("fork storm", error)),
    }
    let beside_all = format!("{}, --all", storm(large));
    match &figures.beside_all {
        Ok(BesideAll {
            stop_seconds,
            peak_rss_kb,
            lost,
            failed_reads,
        }) => {
            let stop_ms = stop_seconds * 1e3;
            rows.push(SIGINT_TO_EXIT.judge(&beside_all, stop_ms, format!("{stop_ms:.0} ms")));
            let peak = mib(*peak_rss_kb);
            rows.push(PEAK_RSS.judge(&beside_all, peak, format!("{peak:.1} MiB")));
            rows.push(NO_LOSS.judge(
                &beside_all,
                *lost as f64,
                format!(
                    "{lost} events lost to a full ring buffer; {failed_reads} probe reads failed \
                     host-wide (shown, not counted here)"
                ),
            ));
        }
        Err(error) => rows.push(NO_LOSS.failed(&beside_all, error)),
    }
    if let Some(plateau) = &figures.all_plateau {
        rows.push(memory_plateau("--all", plateau));
    }
    let beside_daemon = format!("{}, daemon", storm(large));
    rows.push(match &figures.beside_daemon {
        Ok(plateau) => NO_LOSS.judge(
            &beside_daemon,
            plateau.lost as f64,
            format!(
                "{} events lost of {}; peak RSS {:.1} MiB",
                plateau.lost,
                plateau.events.unwrap_or(0),
                mib(plateau.peaks_kib[0])
            ),
        ),
        Err(error) => NO_LOSS.failed(&beside_daemon, error),
    });
    if let Some(plateau) = &figures.daemon_plateau {
        rows.push(memory_plateau("the daemon", plateau));
    }
    rows
}

/// [`MEMORY_PLATEAU`] for `tracer`; it fails on any loss too.
fn memory_plateau(tracer: &str, plateau: &Result<Plateau>) -> Row {
    let case = format!(
        "{tracer} beside {} storms of {}",
        PLATEAU_STORMS.len(),
        count_words(PLATEAU_STORMS[0])
    );
    let plateau = match plateau {
        Ok(plateau) => plateau,
        Err(error) => return MEMORY_PLATEAU.failed(&case, error),
    };
    let warm = plateau.peaks_kib[WARM_UP_STORMS - 1];
    let last = *plateau.peaks_kib.last().expect("a storm ran");
    let peaks: Vec<String> = plateau
        .peaks_kib
        .iter()
        .map(|&kib| format!("{:.1}", mib(kib)))
        .collect();
    let of_events = plateau
        .events
        .map(|events| format!(" of {events}"))
        .unwrap_or_default();
    let growth = mib(last.saturating_sub(warm));
    let mut row = MEMORY_PLATEAU.judge(
        &case,
        growth,
        format!(
            "{} MiB after each storm; {} events lost{of_events}",
            peaks.join(" / "),
            plateau.lost
        ),
    );
    row.met = row.met.map(|met| met && plateau.lost == 0);
    row
}

/// The targets start-up and teardown answer, after a pause (`figures`) and back to back.
pub fn startup(
    figures: &Result<StartupFigures>,
    back_to_back: &Result<StartupFigures>,
) -> Vec<Row> {
    let ms = |s: &Spread, runs: usize| {
        format!(
            "{:.0} ms median ({:.0}–{:.0}, {runs} runs)",
            s.median * 1e3,
            s.min * 1e3,
            s.max * 1e3
        )
    };
    let mut rows = Vec::new();
    match figures {
        Ok(figures) => {
            let runs = figures.starts.len();
            if let Some(start) = Spread::of(&figures.starts) {
                rows.push(STARTUP.judge("", start.median * 1e3, ms(&start, runs)));
            }
            if let Some(stop) = Spread::of(&figures.stops) {
                rows.push(TEARDOWN.judge("", stop.median * 1e3, ms(&stop, runs)));
            }
            if let Some(release) = Spread::of(&figures.releases) {
                rows.push(Row::context(
                    "probes released by `shmtrace-detach`, after shmtrace's exit",
                    ms(&release, runs),
                ));
            }
        }
        Err(error) => rows.push(STARTUP.failed("", error)),
    }
    match back_to_back {
        Ok(figures) => {
            if let Some(start) = Spread::of(&figures.starts) {
                rows.push(STARTUP.judge(
                    "back to back",
                    start.median * 1e3,
                    ms(&start, figures.starts.len()),
                ));
            }
        }
        Err(error) => rows.push(STARTUP.failed("back to back", error)),
    }
    rows
}

/// The ptrace source's targets the timed rounds of one case answer: against untraced, and
/// against `strace -f`.
pub fn ptrace(case: &str, results: &[VariantResult]) -> Vec<Row> {
    let mut rows = Vec::new();
    let Some(base) = find(results, "untraced") else {
        return rows;
    };
    let Some(traced) = find(results, "shmtrace-ptrace").and_then(|r| ratios(r, base)) else {
        return rows;
    };
    rows.push(PTRACE_CHURN.judge(case, traced.median, describe(&traced)));
    if let Some(strace) = find(results, "strace").and_then(|r| ratios(r, base)) {
        let (t, s) = (traced.median - 1.0, strace.median - 1.0);
        let measured = format!(
            "ptrace {}, strace -f {}: {:.2}× its overhead",
            describe(&traced),
            describe(&strace),
            t / s
        );
        rows.push(PTRACE_AGAINST_STRACE.judge(case, t / s, measured));
    }
    // Wall time on a loaded machine favours the traced runs (a program that stops often is
    // let run first when it wakes); the CPU the work took, the tracer's included, does not.
    let cpu: Vec<String> = ["shmtrace-ptrace", "strace"]
        .into_iter()
        .filter_map(|name| {
            let spread = find(results, name).and_then(|r| cpu_ratios(r, base))?;
            Some(format!("{name} {}", describe(&spread)))
        })
        .collect();
    if !cpu.is_empty() {
        rows.push(Row::context(
            &format!("{case}: CPU of the traced churn and its tracer, × untraced"),
            cpu.join(", "),
        ));
    }
    rows
}

/// Round by round, the CPU the workload and its tracer used, over the untraced workload's.
fn cpu_ratios(result: &VariantResult, base: &VariantResult) -> Option<Spread> {
    let values: Vec<f64> = result
        .rounds
        .iter()
        .zip(&result.outcomes)
        .filter_map(|(round, outcome)| {
            let i = base.rounds.iter().position(|r| r == round)?;
            let tracer = outcome.tracer.as_ref()?.cpu_seconds;
            Some((outcome.workload.cpu_seconds + tracer) / base.outcomes[i].workload.cpu_seconds)
        })
        .collect();
    Spread::of(&values)
}

/// [`PTRACE_STARTUP`] from start-ups with `--backend ptrace`.
pub fn ptrace_startup(figures: &Result<StartupFigures>) -> Row {
    match figures {
        Ok(figures) => match Spread::of(&figures.starts) {
            Some(start) => PTRACE_STARTUP.judge(
                "",
                start.median * 1e3,
                format!(
                    "{:.0} ms median ({:.0}–{:.0}, {} runs)",
                    start.median * 1e3,
                    start.min * 1e3,
                    start.max * 1e3,
                    figures.starts.len()
                ),
            ),
            None => PTRACE_STARTUP.failed("", &anyhow::anyhow!("no run")),
        },
        Err(error) => PTRACE_STARTUP.failed("", error),
    }
}

/// Context: a Python start-up importing torch, untraced and traced, as medians.
pub fn import_torch(seconds: &Result<Vec<(&'static str, Spread)>>) -> Vec<Row> {
    match seconds {
        Ok(rows) => {
            let base = rows
                .iter()
                .find(|(name, _)| *name == "untraced")
                .map(|(_, s)| s.median);
            rows.iter()
                .map(|(name, spread)| {
                    let ratio =
                        base.map_or(String::new(), |b| format!(", {:.2}×", spread.median / b));
                    Row::context(
                        &format!("Python start-up importing torch, {name}"),
                        format!(
                            "{:.2} s median ({:.2}–{:.2}){ratio}",
                            spread.median, spread.min, spread.max
                        ),
                    )
                })
                .collect()
        }
        Err(error) => vec![Row::context(
            "Python start-up importing torch",
            format!("not measured: {error:#}"),
        )],
    }
}

/// [`REPLAY_RATE`] from the lines `show --json` wrote and its seconds.
pub fn replay(measured: &Result<(u64, f64)>) -> Row {
    match measured {
        Ok((events, seconds)) => {
            let millions = *events as f64 / seconds / 1e6;
            REPLAY_RATE.judge(
                "",
                millions,
                format!(
                    "{millions:.2}M events/s ({events} lines in {seconds:.3} s, process start \
                     included)"
                ),
            )
        }
        Err(error) => REPLAY_RATE.failed("", error),
    }
}

/// [`REPORT_SCALING`] from the seconds `report` took over a storm of `processes` and over one
/// of ten times as many.
pub fn report_scaling(processes: u64, seconds: &Result<[f64; 2]>) -> Row {
    let case = format!(
        "{} processes against {}",
        count_words(processes * 10),
        count_words(processes)
    );
    match seconds {
        Ok([a, b]) => {
            REPORT_SCALING.judge(&case, b / a, format!("{b:.2} s / {a:.2} s = {:.1}×", b / a))
        }
        Err(error) => REPORT_SCALING.failed(&case, error),
    }
}

/// A bystander's call against its target (one of [`BYSTANDER_CALL`], [`OPEN_CALL`],
/// [`HOLDER_CALL`], [`GROWN_TABLE_CALL`]): the worse of shmtrace's programs on `call` under
/// `--all` and the daemon, against the floor's, in nanoseconds a run.
pub fn bystander_call(target: &Target, call: &str, worst_ns: f64, floor_ns: f64) -> Row {
    let ratio = worst_ns / floor_ns;
    target.judge(
        call,
        ratio,
        format!("{worst_ns:.0} ns against {floor_ns:.0} ({ratio:.2}×)"),
    )
}

/// [`BYSTANDER_TIMED`]: a loop's median time beside the daemon over that beside the floor.
pub fn bystander_timed(workload: &str, ratio: f64, rounds: u32) -> Row {
    BYSTANDER_TIMED.judge(
        workload,
        ratio,
        format!("{ratio:.3}× (medians of {rounds} rounds)"),
    )
}

/// [`SERVER_LOSS`]: the share of the server's throughput lost beside the daemon, in percent.
pub fn server_loss(loss_percent: f64, rounds: u32) -> Row {
    SERVER_LOSS.judge(
        "",
        loss_percent,
        format!("{loss_percent:.2}% (medians of {rounds} rounds)"),
    )
}

/// [`DAEMON_IDLE`] from the daemon's share of one core.
pub fn daemon_idle(cpu_percent: f64, seconds: f64) -> Row {
    DAEMON_IDLE.judge(
        "",
        cpu_percent,
        format!("{cpu_percent:.2}% over {seconds:.0} s"),
    )
}

/// docs/BENCHMARKS.md's table of the targets: what each bounds, its bound, and how it is
/// measured.
pub fn catalogue() -> String {
    let mut cells = vec![vec![
        "target".to_owned(),
        "bound".to_owned(),
        "measured".to_owned(),
    ]];
    for target in TARGETS {
        cells.push(vec![
            target.bounds.to_owned(),
            target.bound.to_owned(),
            target.how.to_owned(),
        ]);
    }
    markdown(&cells)
}

/// `100k`, `1M`.
pub fn count_words(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bound's words and its number are one fact: the words name the number, and the sign
    /// is the side.
    #[test]
    fn each_bound_names_its_limit() {
        for target in TARGETS {
            let number = if target.limit.fract() == 0.0 {
                format!("{:.0}", target.limit)
            } else {
                format!("{}", target.limit)
            };
            assert!(
                target.bound.contains(&number),
                "{target:?}: the bound does not name {number}"
            );
            let sign = match target.side {
                Side::AtMost if target.limit == 0.0 => "= ",
                Side::AtMost => "≤ ",
                Side::Below => "< ",
                Side::AtLeast => "≥ ",
            };
            assert!(target.bound.starts_with(sign), "{target:?}");
        }
    }

    /// A target is named for what it bounds, never for the issue that set it: an issue's
    /// number means nothing to a reader of the table.
    #[test]
    fn targets_are_named_for_what_they_bound() {
        for target in TARGETS {
            for text in [target.bounds, target.bound, target.how] {
                assert!(
                    !text.to_lowercase().contains("issue"),
                    "{target:?} cites an issue"
                );
            }
        }
    }

    #[test]
    fn verdicts_follow_the_side() {
        assert!(STARTUP.met_by(200.0) && !STARTUP.met_by(200.1));
        assert!(!TEARDOWN.met_by(200.0) && TEARDOWN.met_by(199.9));
        assert!(REPLAY_RATE.met_by(1.0) && !REPLAY_RATE.met_by(0.99));
        assert!(NO_LOSS.met_by(0.0) && !NO_LOSS.met_by(1.0));
    }
}
