//! Issue 12's targets, each measured in this run and judged: met, not met, or not measured.
//!
//! Overheads come from the timed rounds (ratios round by round, then their median); the fork
//! storm, start-up, teardown and replay figures from runs made here for the purpose.
use std::{
    ffi::OsString,
    fs,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{
    VariantResult,
    daemon::{Daemon, sample, status_kib, sum_of},
    measure::{self, Running},
    probes::{ProbeReport, percent_of},
    reported,
    stats::Spread,
    storm,
    table::markdown,
    variants::{self, Outcome, Setup},
};

/// One target: what it asks, what was measured, and whether that meets it.
pub struct Row {
    pub target: String,
    pub measured: String,
    pub met: Option<bool>,
}

impl Row {
    pub(super) fn new(target: &str, measured: String, met: Option<bool>) -> Row {
        Row {
            target: target.to_owned(),
            measured,
            met,
        }
    }

    fn failed(target: &str, error: &anyhow::Error) -> Row {
        Row::new(target, format!("not measured: {error:#}"), None)
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
        let verdict = (f > 0.0).then_some(t <= 1.5 * f);
        let note = if f > 0.0 {
            format!("{:.2}× the floor's overhead", t / f)
        } else {
            "floor overhead not above noise".into()
        };
        rows.push(Row::new(
            &format!("{case}: traced overhead ≤ 1.5× the floor's"),
            format!(
                "shmtrace {}, floor {}: {note}",
                describe(traced),
                describe(floor)
            ),
            verdict,
        ));
    }
    let record_floor = find(results, "floor-records").and_then(|r| ratios(r, base));
    if let (Some(record_floor), Some(traced)) = (&record_floor, &traced) {
        let (f, t) = (record_floor.median - 1.0, traced.median - 1.0);
        let note = if f > 0.0 {
            format!("{:.2}× the record floor's overhead", t / f)
        } else {
            "record floor's overhead not above noise".into()
        };
        rows.push(Row::new(
            &format!("{case}: (not a target) traced overhead against the record floor's"),
            format!(
                "shmtrace {}, record floor {}: {note}",
                describe(traced),
                describe(record_floor)
            ),
            None,
        ));
    }
    for (name, target, limit) in [
        (
            "shmtrace-all",
            "untraced process while --all runs ≤ 1.08×",
            1.08,
        ),
        (
            "shmtrace-idle",
            "untraced process while --pid OTHER runs ≤ 1.02×",
            1.02,
        ),
    ] {
        if let Some(spread) = find(results, name).and_then(|r| ratios(r, base)) {
            rows.push(Row::new(
                &format!("{case}: {target}"),
                describe(&spread),
                Some(spread.median <= limit),
            ));
        }
    }
    if let Some(result) = find(results, "shmtrace-null").or_else(|| find(results, "shmtrace")) {
        let peak = result.tracer_peak_rss_kb().unwrap_or(0);
        rows.push(Row::new(
            &format!("{case}: peak RSS of a live trace ≤ 32 MiB"),
            format!("{:.1} MiB ({})", peak as f64 / 1024.0, result.variant.label),
            Some(peak <= 32 * 1024),
        ));
    }
    if let Some(result) = find(results, "shmtrace-all") {
        let stop = result
            .outcomes
            .iter()
            .filter_map(|o| o.tracer.as_ref()?.stop_seconds)
            .fold(0.0, f64::max);
        rows.push(Row::new(
            &format!("{case}: SIGINT to exit < 1 s (--all)"),
            format!("{:.0} ms at most", stop * 1e3),
            Some(stop < 1.0),
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
    rows.push(Row::new(
        &format!("{case}: no loss with the default buffer"),
        format!(
            "{lost} events lost to a full ring buffer over every shmtrace run; {failed_reads} \
             probe reads failed (--all: host-wide, shown, not counted here)"
        ),
        Some(lost == 0),
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
    Row::new(
        &format!("{case}: (not a target) --pid OTHER: shmtrace's programs above the floor's"),
        format!("{above:.0} ns per object{share} (BPF run-time statistics)"),
        None,
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
    Row::new(
        &format!("{case}: (not a target) traced: shmtrace's programs above the record floor's"),
        format!(
            "{:.0} ns per object against {:.0}: {above:.0} ns more{share} (BPF run-time \
             statistics)",
            traced.ns_per_object(),
            record_floor.ns_per_object()
        ),
        None,
    )
}

/// The 10k storm's peak under `--all` alone varied by 2.2 MiB over four runs (28.1-30.3 MiB):
/// how far apart two peaks of the same bounded memory land.
const RSS_NOISE_KB: u64 = 2 * 1024;

/// The fork storm: shmtrace's CPU for 1k and for 10k processes (traced command), and
/// `--all` beside a 10k storm: its memory, losses and time from SIGINT to exit; with
/// `long_storm`, `--all` beside [`PLATEAU_STORMS`] too, whose memory must stop growing; then
/// the same for the daemon.
pub fn fork_storm(setup: &Setup, exe: &Path, tag: &str, rounds: u32, long_storm: bool) -> Vec<Row> {
    let workload = |n: u64| -> Vec<OsString> {
        vec![
            exe.into(),
            "storm".into(),
            "--processes".into(),
            n.to_string().into(),
            "--tag".into(),
            tag.into(),
        ]
    };
    let traced = variants::ALL
        .iter()
        .find(|v| v.name == "shmtrace-null")
        .expect("a known variant");
    let all = variants::ALL
        .iter()
        .find(|v| v.name == "shmtrace-all")
        .expect("a known variant");
    let mut rows = Vec::new();
    let cpu = |n: u64| -> Result<(f64, u64)> {
        let mut seconds = Vec::new();
        let mut lost = 0;
        for _ in 0..rounds {
            eprintln!("fork storm: {n} processes under shmtrace");
            let outcome = traced.run(setup, &workload(n))?;
            lost += outcome.reported.lost.unwrap_or(0);
            seconds.push(outcome.tracer.context("no tracer figures")?.cpu_seconds);
        }
        Ok((Spread::of(&seconds).context("no runs")?.median, lost))
    };
    match cpu(1_000).and_then(|small| Ok((small, cpu(10_000)?))) {
        Ok(((small, lost_small), (large, lost_large))) => {
            let ratio = large / small.max(0.001);
            rows.push(Row::new(
                "fork storm: tracer CPU for 10k processes ≤ 10× that for 1k",
                format!("{large:.2} s / {small:.2} s = {ratio:.1}×"),
                Some(ratio <= 10.0),
            ));
            rows.push(Row::new(
                "fork storm: no loss with the default buffer (traced command)",
                format!("{} events lost", lost_small + lost_large),
                Some(lost_small + lost_large == 0),
            ));
        }
        Err(error) => rows.push(Row::failed("fork storm: tracer CPU, 10k vs 1k", &error)),
    }
    eprintln!("fork storm: 10000 processes beside shmtrace --all");
    match all.run(setup, &workload(10_000)) {
        Ok(Outcome {
            tracer: Some(tracer),
            reported,
            ..
        }) => {
            let stop = tracer.stop_seconds.unwrap_or(f64::NAN);
            rows.push(Row::new(
                "SIGINT to exit < 1 s after a 10k storm (--all)",
                format!("{:.0} ms", stop * 1e3),
                Some(stop < 1.0),
            ));
            rows.push(Row::new(
                "peak RSS of --all bounded (10k storm)",
                format!("{:.1} MiB", tracer.peak_rss_kb as f64 / 1024.0),
                Some(tracer.peak_rss_kb <= 32 * 1024),
            ));
            let lost = reported.lost.unwrap_or(0);
            rows.push(Row::new(
                "fork storm: no loss with the default buffer (--all)",
                format!(
                    "{lost} events lost to a full ring buffer; {} probe reads failed host-wide \
                     (shown, not counted here)",
                    reported.failed_reads.unwrap_or(0)
                ),
                Some(lost == 0),
            ));
        }
        Ok(_) => {}
        Err(error) => rows.push(Row::failed("fork storm beside --all", &error)),
    }
    if long_storm {
        rows.push(match all_through_storms(setup, &workload) {
            Ok(plateau) => plateau.row("--all"),
            Err(error) => Row::failed("--all beside storms in a row", &error),
        });
    }
    rows.extend(daemon_storms(setup, &workload, long_storm));
    rows
}

/// `shmtrace daemon` beside a 10k storm, which it must handle without losing records; with
/// `long_storm`, a fresh daemon beside storms in a row, whose memory must stop growing.
fn daemon_storms(
    setup: &Setup,
    workload: &dyn Fn(u64) -> Vec<OsString>,
    long_storm: bool,
) -> Vec<Row> {
    eprintln!("fork storm: 10000 processes beside shmtrace daemon");
    let mut rows = vec![match daemon_beside_storms(setup, workload, &[10_000]) {
        Ok(plateau) => Row::new(
            "fork storm: no loss with the default buffer (daemon, 10k storm)",
            format!(
                "{} events lost of {}; peak RSS {:.1} MiB",
                plateau.lost,
                plateau.events.unwrap_or(0),
                mib(plateau.peaks_kib[0])
            ),
            Some(plateau.lost == 0),
        ),
        Err(error) => Row::failed("fork storm of 10000 beside the daemon", &error),
    }];
    if long_storm {
        rows.push(
            match daemon_beside_storms(setup, workload, &PLATEAU_STORMS) {
                Ok(plateau) => plateau.row("the daemon"),
                Err(error) => Row::failed("the daemon beside storms in a row", &error),
            },
        );
    }
    rows
}

/// Storms run one after the other beside one tracer, for whether its memory stops growing
/// whatever the run's length. The first ones bring it to its working size: its maps grow to
/// the processes a linger holds, and a peak may step up 4 MiB once (in one `--all` run of
/// three, after its first storm; most likely a map rebuilt at twice its size). After
/// [`WARM_UP_STORMS`], more processes must not raise its peak by more than [`RSS_NOISE_KB`].
/// A tracer compared fresh, one storm against a longer one, measures where it starts as much
/// as where it ends.
const PLATEAU_STORMS: [u64; 4] = [50_000; 4];
const WARM_UP_STORMS: usize = 2;

/// A tracer's memory through storms in a row, and what it lost.
struct Plateau {
    /// Peak RSS (VmHWM) after each storm.
    peaks_kib: Vec<u64>,
    /// Events handled, where the tracer tells (the daemon's metrics).
    events: Option<u64>,
    lost: u64,
}

impl Plateau {
    fn row(&self, tracer: &str) -> Row {
        let warm = self.peaks_kib[WARM_UP_STORMS - 1];
        let last = *self.peaks_kib.last().expect("a storm ran");
        let thousands = |storms: &[u64]| storms.iter().sum::<u64>() / 1000;
        let peaks: Vec<String> = self
            .peaks_kib
            .iter()
            .map(|&kib| format!("{:.1}", mib(kib)))
            .collect();
        let of_events = self
            .events
            .map(|events| format!(" of {events}"))
            .unwrap_or_default();
        Row::new(
            &format!(
                "memory of {tracer} bounded: {}k processes more, after the first {}k, raise \
                 its peak ≤ 2 MiB",
                thousands(&PLATEAU_STORMS[WARM_UP_STORMS..]),
                thousands(&PLATEAU_STORMS[..WARM_UP_STORMS]),
            ),
            format!(
                "{} MiB after each storm of {}k; {} events lost{of_events}",
                peaks.join(" / "),
                PLATEAU_STORMS[0] / 1000,
                self.lost
            ),
            Some(last <= warm + RSS_NOISE_KB && self.lost == 0),
        )
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Runs a storm of each size in `storms`, untraced, one after the other; `after_each` is
/// called once each has ended.
fn storms_in_a_row(
    workload: &dyn Fn(u64) -> Vec<OsString>,
    storms: &[u64],
    mut after_each: impl FnMut() -> Result<()>,
) -> Result<()> {
    for &n in storms {
        eprintln!("fork storm: {n} processes");
        let storm = Running::spawn(&mut variants::direct(&workload(n)), false)?.finish()?;
        if !storm.success() {
            bail!(
                "the storm ended with {}: {}",
                storm.describe_status(),
                variants::last_lines(&storm.stderr, 3)
            );
        }
        after_each()?;
    }
    Ok(())
}

/// `shmtrace --all -o /dev/null` beside [`PLATEAU_STORMS`], then stopped with SIGINT.
fn all_through_storms(setup: &Setup, workload: &dyn Fn(u64) -> Vec<OsString>) -> Result<Plateau> {
    eprintln!("fork storms in a row beside shmtrace --all");
    let (peaks_kib, tracer) = variants::beside_shmtrace_all(setup, |pid| {
        let mut peaks_kib = Vec::new();
        storms_in_a_row(workload, &PLATEAU_STORMS, || {
            // What the storm left in the ring is read within a tick.
            std::thread::sleep(Duration::from_secs(1));
            peaks_kib.push(status_kib(pid, "VmHWM")?);
            Ok(())
        })?;
        Ok(peaks_kib)
    })?;
    Ok(Plateau {
        peaks_kib,
        events: None,
        lost: reported::lost_from_notices(&tracer.finished.stderr),
    })
}

/// A fresh `shmtrace daemon` (it traces every process on the host) beside `storms` in a row,
/// each handled before the next starts.
fn daemon_beside_storms(
    setup: &Setup,
    workload: &dyn Fn(u64) -> Vec<OsString>,
    storms: &[u64],
) -> Result<Plateau> {
    let daemon = Daemon::start(&setup.shmtrace, &setup.scratch, "daemon-storm")?;
    let events = |text: &str| sample(text, "shmtrace_events_total") as u64;
    let before = events(&daemon.metrics()?);
    let mut peaks_kib = Vec::new();
    let mut last = String::new();
    storms_in_a_row(workload, storms, || {
        last = daemon.settle(Duration::from_secs(10))?;
        peaks_kib.push(status_kib(daemon.pid(), "VmHWM")?);
        Ok(())
    })?;
    Ok(Plateau {
        peaks_kib,
        events: Some(events(&last) - before),
        lost: sum_of(&last, "shmtrace_events_lost_total") as u64,
    })
}

/// How long `shmtrace -o /dev/null -- CMD` takes to start CMD, and to exit once CMD has.
pub fn startup(setup: &Setup, exe: &Path, runs: u32) -> Vec<Row> {
    let mut rows = startup_rows(setup, exe, runs, false);
    rows.extend(startup_rows(setup, exe, runs, true));
    rows
}

/// Start-up and teardown, `runs` times: after the previous run's probes are released, or with
/// `back_to_back`, at once, as a loop or a CI job running `shmtrace size` per workload would.
fn startup_rows(setup: &Setup, exe: &Path, runs: u32, back_to_back: bool) -> Vec<Row> {
    let mut releases = Vec::new();
    let mut measure = || -> Result<(f64, f64)> {
        let before = storm::monotonic_ns();
        let out = Command::new(&setup.shmtrace)
            .args(["-o", "/dev/null", "--"])
            .arg(exe)
            .arg("stamp")
            .stderr(Stdio::null())
            .output()
            .context("running shmtrace")?;
        let after = storm::monotonic_ns();
        if !out.status.success() {
            bail!("shmtrace -- stamp failed: {}", out.status);
        }
        // The kernel lets go of the probes in the background after shmtrace has exited; the
        // next run's start-up would wait for it.
        if !back_to_back {
            releases.push(measure::wait_for_background_detach()?.as_secs_f64());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let stamp: serde_json::Value = text
            .lines()
            .find_map(|l| serde_json::from_str(l).ok())
            .context("the stamp printed nothing")?;
        let at = stamp["monotonic_ns"].as_u64().context("no monotonic_ns")?;
        Ok(((at - before) as f64 / 1e9, (after - at) as f64 / 1e9))
    };
    let mut starts = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..runs {
        match measure() {
            Ok((start, stop)) => {
                starts.push(start);
                stops.push(stop);
            }
            Err(error) => return vec![Row::failed("start-up and teardown", &error)],
        }
    }
    if back_to_back {
        // Let the last run's release end before whatever is measured next.
        let _ = measure::wait_for_background_detach();
        let Some(start) = Spread::of(&starts) else {
            return Vec::new();
        };
        return vec![Row::new(
            "traced command starts ≤ 200 ms after shmtrace, back to back",
            format!(
                "{:.0} ms median ({:.0}–{:.0}, {runs} runs)",
                start.median * 1e3,
                start.min * 1e3,
                start.max * 1e3
            ),
            Some(start.median <= 0.2),
        )];
    }
    let (Some(start), Some(stop), Some(release)) = (
        Spread::of(&starts),
        Spread::of(&stops),
        Spread::of(&releases),
    ) else {
        return Vec::new();
    };
    let ms = |s: &Spread| {
        format!(
            "{:.0} ms median ({:.0}–{:.0}, {runs} runs)",
            s.median * 1e3,
            s.min * 1e3,
            s.max * 1e3
        )
    };
    vec![
        Row::new(
            "traced command starts ≤ 200 ms after shmtrace",
            ms(&start),
            Some(start.median <= 0.2),
        ),
        Row::new(
            "teardown < 200 ms after the command ends",
            ms(&stop),
            Some(stop.median < 0.2),
        ),
        Row::new(
            "(not a target) probes released by `shmtrace-detach`, after shmtrace's exit",
            ms(&release),
            None,
        ),
    ]
}

/// Records a 4 KiB churn to a file, then times `shmtrace show --json` over it on one core.
/// Issue 25's target: `report` of a file of `large` processes (each forks, opens a /dev/shm
/// file and dies: a fork storm, recorded) takes at most 10x the time of one of `small`, for
/// `large` = 10 x `small`: replay is linear in processes, as live tracing is.
pub fn report_scale(setup: &Setup, exe: &Path, tag: &str, small: u64) -> Vec<Row> {
    let large = small * 10;
    let target = format!(
        "report of a {}-process trace ≤ 10× that of a {}-process one",
        count_words(large),
        count_words(small)
    );
    let timed = |processes: u64| -> Result<f64> {
        let file = setup.scratch.join(format!("storm-{processes}.shmtrace"));
        let processes_arg = processes.to_string();
        record(
            setup,
            &file,
            &["--compress"],
            exe,
            &["storm", "--processes", &processes_arg, "--tag", tag],
        )?;
        let started = Instant::now();
        let status = Command::new("taskset")
            .args(["-c", "0"])
            .arg(&setup.shmtrace)
            .arg("report")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running taskset -c 0 shmtrace report")?;
        let seconds = started.elapsed().as_secs_f64();
        let _ = fs::remove_file(&file);
        if !status.success() {
            bail!("shmtrace report failed: {status}");
        }
        Ok(seconds)
    };
    match timed(small).and_then(|a| Ok((a, timed(large)?))) {
        Ok((a, b)) => vec![Row::new(
            &target,
            format!("{b:.2} s / {a:.2} s = {:.1}×", b / a),
            Some(b <= 10.0 * a),
        )],
        Err(error) => vec![Row::failed(&target, &error)],
    }
}

/// `shmtrace record -o FILE OPTIONS -- EXE WORKLOAD`, quietly.
fn record(
    setup: &Setup,
    file: &Path,
    options: &[&str],
    exe: &Path,
    workload: &[&str],
) -> Result<()> {
    let status = Command::new(&setup.shmtrace)
        .arg("record")
        .arg("-o")
        .arg(file)
        .args(options)
        .arg("--")
        .arg(exe)
        .args(workload)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running shmtrace record")?;
    if !status.success() {
        bail!("shmtrace record failed: {status}");
    }
    Ok(())
}

/// `100k`, `1M`.
fn count_words(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

pub fn replay(setup: &Setup, exe: &Path, tag: &str, iterations: u64) -> Vec<Row> {
    let target = "replay: decode + JSON ≥ 1M events/s on one core";
    let file = setup.scratch.join("replay.shmtrace");
    let result = (|| -> Result<(u64, f64)> {
        let iterations_arg = iterations.to_string();
        record(
            setup,
            &file,
            &[],
            exe,
            &[
                "churn",
                "--size",
                "4K",
                "--iterations",
                &iterations_arg,
                "--tag",
                tag,
            ],
        )?;
        let show = || {
            let mut show = Command::new("taskset");
            show.args(["-c", "0"])
                .arg(&setup.shmtrace)
                .arg("show")
                .arg("--json")
                .arg(&file)
                .stderr(Stdio::null());
            show
        };
        // Timed to /dev/null: a reader on the other core would be measured too (this debug
        // build counts 277 MB of lines slower than shmtrace writes them).
        let started = Instant::now();
        let status = show()
            .stdout(Stdio::null())
            .status()
            .context("running taskset -c 0 shmtrace show --json")?;
        let seconds = started.elapsed().as_secs_f64();
        if !status.success() {
            bail!("shmtrace show failed: {status}");
        }
        // The lines counted by a second, untimed run, through `wc -l`.
        let mut again = show()
            .stdout(Stdio::piped())
            .spawn()
            .context("running shmtrace show --json again")?;
        let lines = Command::new("wc")
            .arg("-l")
            .stdin(again.stdout.take().context("shmtrace show's output")?)
            .output()
            .context("running wc -l")?;
        again.wait().context("waiting for shmtrace show")?;
        let events: u64 = String::from_utf8_lossy(&lines.stdout)
            .trim()
            .parse()
            .context("wc -l's count")?;
        Ok((events, seconds))
    })();
    let _ = fs::remove_file(&file);
    match result {
        Ok((events, seconds)) => {
            let rate = events as f64 / seconds;
            vec![Row::new(
                target,
                format!(
                    "{:.2}M events/s ({events} lines in {seconds:.3} s, process start included)",
                    rate / 1e6
                ),
                Some(rate >= 1e6),
            )]
        }
        Err(error) => vec![Row::failed(target, &error)],
    }
}
