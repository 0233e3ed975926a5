//! `daemon-idle`: what `shmtrace daemon` costs a node where nothing fails. The daemon runs as
//! it would under a DaemonSet (host-wide probes, a survey of the container runtimes and a
//! /dev/shm measurement every 2 s, a Prometheus scrape every 15 s); its own CPU time
//! (utime + stime from /proc/PID/stat) over the window, as a share of one core, is the figure.
//! The events it handled in that window are reported beside it: "idle" is whatever else the
//! machine was doing. On a shared machine that is rarely nothing, so the window is cut into
//! slices of a few seconds and CPU is fitted against events (least squares): the intercept is
//! the cost with no event, the slope the cost per event.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::daemon::{Daemon, sample, status_kib};

/// Start-up (loading the probes, the first survey) is not what a node pays day after day.
const WARM_UP: Duration = Duration::from_secs(5);
const SCRAPE_EVERY: Duration = Duration::from_secs(15);
const SLICE: Duration = Duration::from_secs(5);

pub struct Figures {
    pub seconds: f64,
    pub cpu_percent: f64,
    pub rss_kib: u64,
    pub events: f64,
    pub containers: f64,
    /// The fit over slices: CPU with no event (% of one core), and per event (µs).
    pub idle_percent: Option<f64>,
    pub per_event_us: Option<f64>,
    pub slices: usize,
}

/// Runs the daemon for `seconds` after a warm-up and measures it.
pub fn measure(shmtrace: &Path, scratch: &Path, seconds: u64) -> Result<Figures> {
    let daemon = Daemon::start(shmtrace, scratch, "daemon-idle")?;
    let pid = daemon.pid();
    let result = (|| {
        std::thread::sleep(WARM_UP);
        let events_before = sample(&daemon.metrics()?, "shmtrace_events_total");
        let ticks_before = cpu_ticks(pid)?;
        let window = Instant::now();
        let length = Duration::from_secs(seconds);
        let mut next_scrape = Duration::ZERO;
        let mut last = String::new();
        // (seconds, CPU seconds, events) per slice.
        let mut slices = Vec::new();
        let mut slice_start = (Instant::now(), ticks_before, events_before);
        while window.elapsed() < length {
            if window.elapsed() >= next_scrape {
                last = daemon.metrics()?;
                next_scrape += SCRAPE_EVERY;
            }
            std::thread::sleep(Duration::from_millis(200));
            if slice_start.0.elapsed() >= SLICE {
                let ticks = cpu_ticks(pid)?;
                let events = sample(&daemon.metrics()?, "shmtrace_events_total");
                slices.push((
                    slice_start.0.elapsed().as_secs_f64(),
                    (ticks - slice_start.1) as f64,
                    events - slice_start.2,
                ));
                slice_start = (Instant::now(), ticks, events);
            }
        }
        let ticks = cpu_ticks(pid)? - ticks_before;
        let elapsed = window.elapsed().as_secs_f64();
        let now = daemon.metrics().unwrap_or(last);
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let (idle, per_event) = fit(&slices, per_second);
        Ok(Figures {
            idle_percent: idle,
            per_event_us: per_event,
            slices: slices.len(),
            seconds: elapsed,
            cpu_percent: ticks as f64 / per_second / elapsed * 100.0,
            rss_kib: status_kib(pid, "VmRSS")?,
            events: sample(&now, "shmtrace_events_total") - events_before,
            containers: sample(&now, "shmtrace_containers_followed"),
        })
    })();
    drop(daemon);
    result
}

/// The section of the benchmark's report.
pub fn report(figures: &Figures) -> (String, Value) {
    let fitted = match (figures.idle_percent, figures.per_event_us) {
        (Some(idle), Some(per_event)) => format!("{idle:.2}% | {per_event:.1} µs"),
        _ => "n/a | n/a".to_owned(),
    };
    let text = format!(
        "## daemon-idle\n\n\
         | seconds | CPU (% of one core) | events handled | CPU with no event (fit over {} slices) | per event | RSS | containers followed |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n\
         | {:.0} | {:.2}% | {:.0} ({:.0}/s) | {fitted} | {:.1} MiB | {:.0} |\n",
        figures.slices,
        figures.seconds,
        figures.cpu_percent,
        figures.events,
        figures.events / figures.seconds,
        figures.rss_kib as f64 / 1024.0,
        figures.containers
    );
    let saved = json!({
        "seconds": figures.seconds,
        "cpu_percent": figures.cpu_percent,
        "rss_kib": figures.rss_kib,
        "events": figures.events,
        "containers": figures.containers,
        "idle_percent": figures.idle_percent,
        "per_event_us": figures.per_event_us,
        "slices": figures.slices,
    });
    (text, saved)
}

/// Least squares of CPU share against event rate over the slices: (intercept in % of one core,
/// slope in µs per event). `None` when the event rate did not vary enough to tell them apart.
fn fit(slices: &[(f64, f64, f64)], ticks_per_second: f64) -> (Option<f64>, Option<f64>) {
    let points: Vec<(f64, f64)> = slices
        .iter()
        .map(|(seconds, ticks, events)| (events / seconds, ticks / ticks_per_second / seconds))
        .collect();
    let n = points.len() as f64;
    if points.len() < 3 {
        return (None, None);
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if sxx <= f64::EPSILON * n {
        // No events at all in any slice: the mean is the idle cost.
        return if mean_x == 0.0 {
            (Some(mean_y * 100.0), None)
        } else {
            (None, None)
        };
    }
    let slope = sxy / sxx;
    let intercept = mean_y - slope * mean_x;
    (Some(intercept * 100.0), Some(slope * 1e6))
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which may hold spaces and parentheses.
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; `rest` starts at field 3.
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}
