//! Tracers beside fork storms (`cargo xtask storm`: each child creates and unlinks one
//! /dev/shm object and exits): shmtrace's CPU for 1k and for 10k processes of a traced
//! command; `shmtrace --all` beside a 10k storm (memory, losses, time from SIGINT to exit)
//! and beside [`PLATEAU_STORMS`] in a row; the daemon beside the same. It measures;
//! `verdicts` judges.
use std::{ffi::OsString, path::Path, time::Duration};

use anyhow::{Context, Result, bail};

use super::{
    daemon::{Daemon, sample, status_kib, sum_of},
    measure::Running,
    reported,
    stats::Spread,
    variants::{self, Outcome, Setup},
};

/// Storms run one after the other beside one tracer, for whether its memory stops growing
/// whatever the run's length. The first ones bring it to its working size: its maps grow to
/// the processes a linger holds, and a peak may step up 4 MiB once (in one `--all` run of
/// three, after its first storm; most likely a map rebuilt at twice its size). After
/// [`WARM_UP_STORMS`], more processes must not raise its peak by more than the bound. A
/// tracer compared fresh, one storm against a longer one, measures where it starts as much
/// as where it ends.
pub const PLATEAU_STORMS: [u64; 4] = [50_000; 4];
pub const WARM_UP_STORMS: usize = 2;

/// The storms' sizes for the CPU figure: a small one and one ten times larger.
pub const CPU_STORMS: [u64; 2] = [1_000, 10_000];

/// What a run of the storms measured; each part failed on its own or not.
pub struct StormFigures {
    /// shmtrace's median CPU seconds for each of [`CPU_STORMS`], and the events it lost.
    pub traced_cpu: Result<([f64; 2], u64)>,
    /// `--all` beside a storm of the larger size.
    pub beside_all: Result<BesideAll>,
    /// `--all` beside [`PLATEAU_STORMS`], when asked for.
    pub all_plateau: Option<Result<Plateau>>,
    /// A fresh daemon beside one storm of the larger size.
    pub beside_daemon: Result<Plateau>,
    /// A fresh daemon beside [`PLATEAU_STORMS`], when asked for.
    pub daemon_plateau: Option<Result<Plateau>>,
}

/// `shmtrace --all -o /dev/null` beside one storm, then stopped with SIGINT.
pub struct BesideAll {
    pub stop_seconds: f64,
    pub peak_rss_kb: u64,
    pub lost: u64,
    pub failed_reads: u64,
}

/// A tracer's memory through storms in a row, and what it lost.
pub struct Plateau {
    /// Peak RSS (VmHWM) after each storm.
    pub peaks_kib: Vec<u64>,
    /// Events handled, where the tracer tells (the daemon's metrics).
    pub events: Option<u64>,
    pub lost: u64,
}

/// Runs every storm: each of [`CPU_STORMS`] `rounds` times under shmtrace, the larger beside
/// `--all` and beside the daemon; with `long_storm`, [`PLATEAU_STORMS`] beside each.
pub fn measure(
    setup: &Setup,
    exe: &Path,
    tag: &str,
    rounds: u32,
    long_storm: bool,
) -> StormFigures {
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
    let [small, large] = CPU_STORMS;
    let traced_cpu =
        cpu(small).and_then(|(a, lost_a)| cpu(large).map(|(b, lost_b)| ([a, b], lost_a + lost_b)));
    eprintln!("fork storm: {large} processes beside shmtrace --all");
    let beside_all = match all.run(setup, &workload(large)) {
        Ok(Outcome {
            tracer: Some(tracer),
            reported,
            ..
        }) => Ok(BesideAll {
            stop_seconds: tracer.stop_seconds.unwrap_or(f64::NAN),
            peak_rss_kb: tracer.peak_rss_kb,
            lost: reported.lost.unwrap_or(0),
            failed_reads: reported.failed_reads.unwrap_or(0),
        }),
        Ok(_) => Err(anyhow::anyhow!("no tracer figures")),
        Err(error) => Err(error),
    };
    let all_plateau = long_storm.then(|| all_through_storms(setup, &workload));
    eprintln!("fork storm: {large} processes beside shmtrace daemon");
    let beside_daemon = daemon_beside_storms(setup, &workload, &[large]);
    let daemon_plateau =
        long_storm.then(|| daemon_beside_storms(setup, &workload, &PLATEAU_STORMS));
    StormFigures {
        traced_cpu,
        beside_all,
        all_plateau,
        beside_daemon,
        daemon_plateau,
    }
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
