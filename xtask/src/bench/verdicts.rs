//! The verdicts on what a run measured: each measurement's figures turned into rows of the
//! targets' table, judged against its target in `target_list`, or shown as context that no
//! target judges. The measuring is elsewhere: the timed rounds (`case`), the storms
//! (`beside_storms`), start-up (`startup`), replay (`replay`), the bystanders (`bystanders`)
//! and the BPF run-time statistics (`probes`).
use anyhow::Result;

use super::{
    VariantResult,
    beside_storms::{self, BesideAll, PLATEAU_STORMS, Plateau, StormFigures, WARM_UP_STORMS},
    probes::{ProbeReport, percent_of},
    startup::StartupFigures,
    stats::Spread,
    target::{Row, Target},
    target_list::{
        BESIDE_ALL, BESIDE_OTHER, BYSTANDER_TIMED, DAEMON_IDLE, MEMORY_PLATEAU, NO_LOSS, PEAK_RSS,
        PTRACE_AGAINST_STRACE, PTRACE_CHURN, PTRACE_STARTUP, REPLAY_RATE, REPORT_SCALING,
        SERVER_LOSS, SIGINT_TO_EXIT, STARTUP, STORM_CPU, TEARDOWN, TRACED_OVERHEAD,
    },
};

fn find<'a>(results: &'a [VariantResult], name: &str) -> Option<&'a VariantResult> {
    results
        .iter()
        .find(|r| r.variant.name == name && !r.outcomes.is_empty())
}

/// Ratios to untraced, round by round: the median and the range.
fn ratios(result: &VariantResult, base: &VariantResult) -> Option<Spread> {
    let values: Vec<f64> = result
        .beside(base)
        .map(|(outcome, base)| outcome.workload.loop_seconds / base.workload.loop_seconds)
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
    // What the stops cost: shmtrace held on one CPU with the command (no stop wakes another
    // CPU), and the floor, the same stops with nothing done at them, across CPUs and on one.
    for (name, what) in [
        (
            "shmtrace-ptrace-one-cpu",
            "ptrace source with the command and shmtrace on one CPU",
        ),
        (
            "ptrace-floor",
            "ptrace floor (the same stops, nothing done at them)",
        ),
        ("ptrace-floor-one-cpu", "ptrace floor on one CPU"),
    ] {
        if let Some(spread) = find(results, name).and_then(|r| ratios(r, base)) {
            rows.push(Row::context(
                &format!("{case}: {what}, × untraced"),
                describe(&spread),
            ));
        }
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
        .beside(base)
        .filter_map(|(outcome, base)| {
            let tracer = outcome.tracer.as_ref()?.cpu_seconds;
            Some((outcome.workload.cpu_seconds + tracer) / base.workload.cpu_seconds)
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

/// A bystander's call against its target (one of `target_list`'s `BYSTANDER_CALL`,
/// `OPEN_CALL`, `HOLDER_CALL`, `GROWN_TABLE_CALL`): the worse of shmtrace's programs on `call` under
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

/// `100k`, `1M`.
pub fn count_words(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}
