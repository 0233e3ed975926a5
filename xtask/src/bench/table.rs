//! Rendering results as Markdown tables, readable in a terminal and pasteable into
//! docs/BENCHMARKS.md as they are.
use super::{
    VariantResult,
    pairs::{PairMode, PairOutcome},
    probes::{ProbeCost, ProbeReport, percent_of},
    stats::Spread,
    variants::Outcome,
};

/// Pads cells so columns line up; the first row is the header.
pub fn markdown(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
                .max(3)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let mut row = row.clone();
        row.resize(columns, String::new());
        out += &line(row);
        if i == 0 {
            out += &line(widths.iter().map(|w| "-".repeat(*w)).collect());
        }
    }
    out
}

/// The main table of one case: every variant against the untraced runs.
pub fn variants(results: &[VariantResult]) -> (String, Vec<String>) {
    let base = results.iter().find(|r| !r.variant.traced());
    let ratio = |result: &VariantResult, value: fn(&Outcome) -> f64| -> String {
        base.and_then(|b| result.paired_ratio(b, value))
            .map_or("-".into(), |r| format!("{r:.3}"))
    };
    let mut rows = vec![
        [
            "variant",
            "workload loop",
            "× untraced",
            "end to end",
            "× untraced",
            "workload CPU ×",
            "tracer CPU",
            "tracer peak RSS",
            "events",
            "lost",
            "calls seen",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let mut notes = Vec::new();
    for result in results {
        let label = result.variant.label.to_owned();
        if let Some(reason) = &result.unavailable {
            notes.push(format!("{label}: not run: {reason}"));
            let mut row = vec![label, "not run (see below)".into()];
            row.resize(11, "-".into());
            rows.push(row);
            continue;
        }
        if let Some(error) = result.errors.first() {
            notes.push(format!(
                "{label}: {} of {} runs failed; first: {error}",
                result.errors.len(),
                result.errors.len() + result.outcomes.len()
            ));
        }
        if result.outcomes.is_empty() {
            let mut row = vec![label, "failed (see below)".into()];
            row.resize(11, "-".into());
            rows.push(row);
            continue;
        }
        let tracer = result.variant.traced();
        rows.push(vec![
            label,
            timed(result.loop_times()),
            ratio(result, |o| o.workload.loop_seconds),
            timed(result.wall_times()),
            ratio(result, |o| o.top.wall_seconds),
            ratio(result, |o| o.workload.cpu_seconds),
            if tracer {
                result
                    .tracer_cpu()
                    .map_or("-".into(), |s| format!("{:.2} s", s.median))
            } else {
                "-".into()
            },
            result
                .tracer_peak_rss_kb()
                .map_or("-".into(), |kb| format!("{:.0} MiB", kb as f64 / 1024.0)),
            result.events().map_or("-".into(), |e| e.to_string()),
            result.lost().map_or("-".into(), |l| l.to_string()),
            result.calls_seen(),
        ]);
    }
    (markdown(&rows), notes)
}

fn timed(spread: Option<Spread>) -> String {
    spread.map_or("-".into(), |s| {
        format!("{:.3} s ±{:.1}%", s.median, s.half_range_percent())
    })
}

/// Per-object times, untraced and traced, that the probes' cost is set against.
pub struct Reference {
    /// Where the figures come from.
    pub source: String,
    pub untraced_us: f64,
    pub traced_us: f64,
}

/// Per-probe costs, and how much of the measured overhead they explain. `failed` is the same
/// run with `--failed`, whose data-path exits emit no record: the difference is what emitting
/// costs.
pub fn probes(
    report: &ProbeReport,
    failed: Option<&ProbeReport>,
    reference: Option<&Reference>,
) -> String {
    let objects = report.objects.max(1) as f64;
    let total_ns = report.total_ns().max(1) as f64;
    let per_run = |p: &ProbeCost| p.run_ns as f64 / p.runs.max(1) as f64;
    let mut rows = vec![
        [
            "probe",
            "runs in loop",
            "runs per object",
            "ns per run",
            "ns per object",
            "share",
            "--failed: ns per run",
            "--failed: ns per object",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let columns = if failed.is_some() { 8 } else { 6 };
    let with_failed = |name: &str| -> (String, String) {
        match failed.and_then(|f| f.probe(name)) {
            Some(p) if p.runs > 0 => (
                format!("{:.0}", per_run(p)),
                format!("{:.0}", p.run_ns as f64 / objects),
            ),
            _ => ("-".into(), "-".into()),
        }
    };
    for probe in report.probes.iter().filter(|p| p.runs > 0) {
        let (failed_run, failed_object) = with_failed(&probe.name);
        rows.push(vec![
            probe.name.clone(),
            probe.runs.to_string(),
            format!("{:.2}", probe.runs as f64 / objects),
            format!("{:.0}", per_run(probe)),
            format!("{:.0}", probe.run_ns as f64 / objects),
            format!("{:.1}%", probe.run_ns as f64 / total_ns * 100.0),
            failed_run,
            failed_object,
        ]);
    }
    let total_runs: u64 = report.probes.iter().map(|p| p.runs).sum();
    rows.push(vec![
        "all programs".into(),
        total_runs.to_string(),
        format!("{:.2}", total_runs as f64 / objects),
        format!("{:.0}", total_ns / total_runs.max(1) as f64),
        format!("{:.0}", total_ns / objects),
        "100%".into(),
        failed.map_or("-".into(), |f| {
            let runs: u64 = f.probes.iter().map(|p| p.runs).sum();
            format!("{:.0}", f.total_ns() as f64 / runs.max(1) as f64)
        }),
        failed.map_or("-".into(), |f| {
            format!("{:.0}", f.total_ns() as f64 / objects)
        }),
    ]);
    for row in &mut rows {
        row.truncate(columns);
    }
    let mut out = markdown(&rows);
    let bpf_us = total_ns / objects / 1000.0;
    let side_us = |prefix: &str| {
        report
            .probes
            .iter()
            .filter(|p| p.name.starts_with(prefix))
            .map(|p| p.run_ns as f64)
            .sum::<f64>()
            / objects
            / 1000.0
    };
    out += &format!(
        "\nPer object: syscall entry probes {:.2} µs, exit probes (where records are written) \
         {:.2} µs, others {:.2} µs.",
        side_us("sys_enter_"),
        // One program, `sys_exit`, on every `sys_exit_*` tracepoint.
        side_us("sys_exit"),
        bpf_us - side_us("sys_enter_") - side_us("sys_exit"),
    );
    out += &format!(
        " In BPF programs: {bpf_us:.2} µs per object ({} with --failed). This run's loop, with \
         statistics on: {:.2} µs per object.",
        failed.map_or("not measured".into(), |f| format!(
            "{:.2} µs",
            f.total_ns() as f64 / objects / 1000.0
        )),
        report.loop_seconds / objects * 1e6,
    );
    if let Some(woken) = report.tracer_nvcsw {
        out += &format!(
            " shmtrace went to sleep {woken} times ({:.2} per object): each time, a later record \
             had to wake it.",
            woken as f64 / objects,
        );
    }
    out += "\n";
    if let Some(r) = reference {
        let overhead = r.traced_us - r.untraced_us;
        out += &format!(
            "{}: untraced {:.2} µs per object, traced {:.2} µs: {overhead:+.2} µs ({:+.1}%). BPF \
             programs account for {bpf_us:.2} µs of it; the other {:+.2} µs is outside them \
             (tracepoint dispatch, handling ring buffer wake-ups, the tracer competing for CPU \
             and cache, noise).\n",
            r.source,
            r.untraced_us,
            r.traced_us,
            overhead / r.untraced_us * 100.0,
            overhead - bpf_us,
        );
    }
    out
}

/// shmtrace's programs per traced object set against the record floor's (one empty record per
/// call exit): the part of shmtrace's work that a tracer reporting every call could still shed.
pub fn above_record_floor(
    traced: &ProbeReport,
    floor: &ProbeReport,
    untraced_us: Option<f64>,
) -> String {
    let above = traced.ns_per_object() - floor.ns_per_object();
    format!(
        "\nThe record floor (an empty record reserved and submitted for every call, where shmtrace \
         reports it, for every process) spends {:.0} ns per object in {:.2} program runs; \
         shmtrace's programs, {:.0} ns in {:.2}: {above:.0} ns more per traced object{}.\n",
        floor.ns_per_object(),
        floor.runs_per_object(),
        traced.ns_per_object(),
        traced.runs_per_object(),
        untraced_us.map_or(String::new(), |us| format!(
            ", {:.2}% of an untraced object ({us:.2} µs)",
            percent_of(above, us)
        )),
    )
}

/// What programs cost a workload they do not trace: shmtrace tracing another process, beside
/// the floor's empty programs. Only the difference is shmtrace's doing; both pay the same
/// tracepoint dispatch, which run-time statistics do not count.
pub fn cost_to_others(
    idle: &ProbeReport,
    floor: Option<&ProbeReport>,
    untraced_us: Option<f64>,
) -> String {
    let share =
        |ns: f64| untraced_us.map_or("-".into(), |us| format!("{:.2}%", percent_of(ns, us)));
    let row = |label: &str, report: &ProbeReport| {
        let objects = report.objects.max(1) as f64;
        let runs: u64 = report.probes.iter().map(|p| p.runs).sum();
        let ns = report.total_ns() as f64;
        vec![
            label.to_owned(),
            format!("{:.2}", runs as f64 / objects),
            format!("{:.0}", ns / runs.max(1) as f64),
            format!("{:.0}", ns / objects),
            share(ns / objects),
        ]
    };
    let mut rows = vec![
        [
            "programs, the workload untraced",
            "runs per object",
            "ns per run",
            "ns per object",
            "of an untraced object",
        ]
        .map(String::from)
        .to_vec(),
        row("shmtrace --pid OTHER", idle),
    ];
    if let Some(floor) = floor {
        rows.push(row("empty programs (floor)", floor));
    }
    let mut out = markdown(&rows);
    if let Some(floor) = floor {
        let above = idle.ns_per_object() - floor.ns_per_object();
        out += &format!(
            "\nAbove the floor, shmtrace's programs cost a process they do not trace {above:.0} ns \
             per object ({} of its loop{}).\n",
            share(above),
            untraced_us.map_or(String::new(), |us| format!(
                ", untraced {us:.2} µs per object"
            )),
        );
    }
    out
}

/// The paired measurement: A's time over B's for each mode.
pub fn pairs(outcomes: &[(&PairMode, anyhow::Result<PairOutcome>)]) -> String {
    let mut rows = vec![
        [
            "A traced by",
            "pairs",
            "A/B per turn: median",
            "A/B per turn: quartiles",
            "A/B total",
            "A/B CPU",
            "tracer CPU",
            "events",
            "lost",
            "calls seen",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let mut notes = String::new();
    for (mode, outcome) in outcomes {
        match outcome {
            Ok(o) => rows.push(vec![
                mode.label.to_owned(),
                o.pairs.to_string(),
                format!("{:.3}", o.ratio_median),
                format!("{:.3} – {:.3}", o.ratio_q1, o.ratio_q3),
                format!("{:.3}", o.ratio_total),
                format!("{:.3}", o.cpu_ratio),
                o.tracer_cpu_seconds
                    .map_or("-".into(), |s| format!("{s:.2} s")),
                o.reported
                    .as_ref()
                    .and_then(|r| r.events)
                    .map_or("-".into(), |e| e.to_string()),
                o.reported
                    .as_ref()
                    .and_then(|r| r.lost)
                    .map_or("-".into(), |l| l.to_string()),
                o.reported.as_ref().map_or("-".into(), |r| {
                    r.mismatch(&o.a_calls).unwrap_or_else(|| "ok".into())
                }),
            ]),
            Err(error) => {
                let mut row = vec![mode.label.to_owned(), "failed (see below)".into()];
                row.resize(10, "-".into());
                rows.push(row);
                notes += &format!("- {}: {error:#}\n", mode.label);
            }
        }
    }
    let mut out = markdown(&rows);
    if !notes.is_empty() {
        out += "\n";
        out += &notes;
    }
    out
}
