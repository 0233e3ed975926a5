//! `container-soak`: `shmtrace daemon`'s memory through a long churn of short-lived Docker
//! containers, the node agent's everyday load: `docker run --rm` after `docker run --rm`, names
//! reused, each one either failing in its 1 MiB /dev/shm (`dd` past its end, then its shell
//! exits 1) or using a 64 MiB one without failing. The daemon's resident memory is read every
//! 30 s; the figure judged is how much it grew from the end of the warm-up to the end, and the
//! highest it reached. The counts are checked at the end, each failure under its own container:
//! the daemon's JSON lines have each failing container's ENOSPC and its diagnosis once, naming
//! that container (by its id, as `docker run --cidfile` told it), and none of a container that
//! cannot fail; the metric series of the failing containers' names have every failure that ran
//! (the names are reused every few seconds, well within `--retain`, so their series never
//! retire); nothing is counted for `runtime="unknown"` or as unrecorded with nothing lost.
use std::{
    collections::HashMap,
    io::BufRead,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{
    daemon::{Daemon, status_kib, sum_of},
    target::Row,
    target_list,
};

/// Names reused by the containers: a failing and a healthy one each.
const NAMES: usize = 3;
/// RSS is judged from here: start-up, the first surveys and the caches filling are not what a
/// node pays day after day.
const WARM_UP: Duration = Duration::from_secs(300);
const SAMPLE_EVERY: Duration = Duration::from_secs(30);

pub struct Figures {
    pub minutes: f64,
    pub containers: u64,
    pub failing: u64,
    /// RSS (KiB) at the end of the warm-up, at the end, and the highest.
    pub rss_after_warm_up: u64,
    pub rss_end: u64,
    pub rss_max: u64,
    /// (minutes, RSS KiB, processes, objects held) every [`SAMPLE_EVERY`].
    pub samples: Vec<(f64, u64, f64, f64)>,
    /// What the JSON lines say: failing containers whose ENOSPC has exactly one line and one
    /// diagnosis, naming it; and the ENOSPC lines of the soak's containers that are not that (a
    /// second one, one of a healthy container, one naming no container or another one).
    pub failures_lined: u64,
    pub lines_amiss: u64,
    /// Examples of what was amiss, for the report.
    pub amiss: Vec<String>,
    /// What the metrics say, at the end.
    pub failures_counted: f64,
    pub failures_of_healthy: f64,
    pub unknown: f64,
    pub unrecorded: f64,
    pub lost: f64,
}

/// Runs the churn beside a daemon for `minutes`.
pub fn measure(shmtrace: &Path, scratch: &Path, minutes: u64) -> Result<Figures> {
    let image = image(scratch)?;
    let daemon = Daemon::start(shmtrace, scratch, "container-soak")?;
    let pid = daemon.pid();
    let length = Duration::from_secs(minutes * 60);
    let started = Instant::now();
    let mut figures = Figures {
        minutes: 0.0,
        containers: 0,
        failing: 0,
        rss_after_warm_up: 0,
        rss_end: 0,
        rss_max: 0,
        samples: Vec::new(),
        failures_lined: 0,
        lines_amiss: 0,
        amiss: Vec::new(),
        failures_counted: 0.0,
        failures_of_healthy: 0.0,
        unknown: 0.0,
        unrecorded: 0.0,
        lost: 0.0,
    };
    let mut next_sample = Duration::ZERO;
    let tag = std::process::id();
    // Each container's id (its name, whether it fails), as Docker gave it.
    let mut ran: HashMap<String, (String, bool)> = HashMap::new();
    let cidfile = scratch.join("container-soak.cid");
    while started.elapsed() < length
        && !super::INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
    {
        let k = figures.containers as usize % NAMES;
        let fails = figures.containers.is_multiple_of(2);
        let (name, shm, script) = if fails {
            (
                format!("soak-fail{k}-{tag}"),
                "1m",
                "dd if=/dev/zero of=/dev/shm/fill bs=64k count=32 2>/dev/null; exit 1",
            )
        } else {
            (
                format!("soak-fine{k}-{tag}"),
                "64m",
                "dd if=/dev/zero of=/dev/shm/fill bs=64k count=16 2>/dev/null",
            )
        };
        let _ = std::fs::remove_file(&cidfile);
        let status = Command::new("docker")
            .args(["run", "--rm", "--network", "none", "--name", &name])
            .arg("--cidfile")
            .arg(&cidfile)
            .args(["--shm-size", shm, &image, "sh", "-c", script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("docker run")?;
        if status.code() != Some(if fails { 1 } else { 0 }) {
            bail!("{name} ended with {status}, not as planned");
        }
        let id = std::fs::read_to_string(&cidfile)
            .with_context(|| format!("{name}'s id in {}", cidfile.display()))?;
        ran.insert(id.trim().to_owned(), (name, fails));
        figures.containers += 1;
        figures.failing += u64::from(fails);
        if started.elapsed() >= next_sample {
            next_sample += SAMPLE_EVERY;
            let rss = status_kib(pid, "VmRSS")?;
            let metrics = daemon.metrics()?;
            let state = |kind: &str| {
                metrics
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix(&format!("shmtrace_state_entries{{kind=\"{kind}\"}} "))?
                            .parse::<f64>()
                            .ok()
                    })
                    .unwrap_or(0.0)
            };
            figures.samples.push((
                started.elapsed().as_secs_f64() / 60.0,
                rss,
                state("process"),
                state("object"),
            ));
            if started.elapsed() >= WARM_UP && figures.rss_after_warm_up == 0 {
                figures.rss_after_warm_up = rss;
            }
            figures.rss_max = figures.rss_max.max(rss);
        }
    }
    figures.minutes = started.elapsed().as_secs_f64() / 60.0;
    let metrics = daemon.settle(Duration::from_secs(30))?;
    figures.rss_end = status_kib(pid, "VmRSS")?;
    figures.rss_max = figures.rss_max.max(figures.rss_end);
    if figures.rss_after_warm_up == 0 {
        figures.rss_after_warm_up = figures.samples.first().map_or(0, |s| s.1);
    }
    let of = |prefix: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("shmtrace_shm_failures_total{"))
            .filter(|l| l.contains(&format!("container=\"{prefix}")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
            // An empty sum is -0.
            + 0.0
    };
    figures.failures_counted = of("soak-fail");
    figures.failures_of_healthy = of("soak-fine");
    figures.unknown = metrics
        .lines()
        .filter(|l| {
            l.starts_with("shmtrace_shm_failures_total{") && l.contains("runtime=\"unknown\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>()
        + 0.0;
    figures.unrecorded = sum_of(&metrics, "shmtrace_unrecorded_total");
    figures.lost = sum_of(&metrics, "shmtrace_events_lost_total");
    // Stopped, the daemon has written every line it held.
    drop(daemon);
    let lines = scratch.join("container-soak.jsonl");
    judge_lines(&lines, &ran, tag, &mut figures)
        .with_context(|| format!("reading the daemon's lines in {}", lines.display()))?;
    Ok(figures)
}

/// Checks the daemon's ENOSPC lines of the soak's containers against the containers that ran.
fn judge_lines(
    path: &Path,
    ran: &HashMap<String, (String, bool)>,
    tag: u32,
    figures: &mut Figures,
) -> Result<()> {
    // (id, whether a diagnosis): lines.
    let mut lines_of: HashMap<(&str, bool), u64> = HashMap::new();
    let file = std::fs::File::open(path)?;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        let Ok(value) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        // dd's failed write, and its diagnosis (of a /dev/shm full).
        let diagnosis = value["event"] == "diagnosis";
        let of_enospc = if diagnosis {
            value["cause"] == "shm_full"
        } else {
            value["failure"] == true && value["errno"] == "ENOSPC"
        };
        if !of_enospc || value["comm"] != "dd" {
            continue;
        }
        let id = value["container"]["id"].as_str();
        let name = value["container"]["name"].as_str();
        match id.and_then(|id| ran.get_key_value(id)) {
            Some((id, (ran_as, true))) if name == Some(ran_as.as_str()) => {
                *lines_of.entry((id.as_str(), diagnosis)).or_default() += 1;
            }
            Some(_) => amiss(figures, line),
            // One of the soak's names, with an id none of its containers had.
            None if name.is_some_and(|n| n.ends_with(&format!("-{tag}"))) => amiss(figures, line),
            // Unnamed: it may be the soak's, whose dd writes /dev/shm/fill.
            None if (value["container_unnamed"].is_string() || id.is_none())
                && value["path"] == "/dev/shm/fill" =>
            {
                amiss(figures, line)
            }
            // Another dd on the machine.
            None => {}
        }
    }
    for (id, (name, fails)) in ran {
        if !fails {
            continue;
        }
        let failures = lines_of.get(&(id.as_str(), false)).copied().unwrap_or(0);
        let diagnoses = lines_of.get(&(id.as_str(), true)).copied().unwrap_or(0);
        if (failures, diagnoses) == (1, 1) {
            figures.failures_lined += 1;
        } else {
            amiss(
                figures,
                format!("{failures} ENOSPC lines and {diagnoses} diagnoses for {name} ({id})"),
            );
        }
    }
    Ok(())
}

fn amiss(figures: &mut Figures, what: String) {
    figures.lines_amiss += 1;
    if figures.amiss.len() < 5 {
        figures.amiss.push(what);
    }
}

/// Copies the daemon's JSON lines and log out of the scratch directory, which goes when the
/// benchmark ends, into a directory of their own under target/; returns it.
pub fn keep_evidence(scratch: &Path, tag: &str) -> Result<PathBuf> {
    let kept = crate::root()
        .join("target")
        .join(format!("container-soak-{tag}"));
    // A new directory: nothing in it can be a symlink someone else made.
    std::fs::create_dir(&kept).with_context(|| format!("creating {}", kept.display()))?;
    for file in ["container-soak.jsonl", "container-soak.log"] {
        std::fs::copy(scratch.join(file), kept.join(file))
            .with_context(|| format!("keeping {file} in {}", kept.display()))?;
    }
    Ok(kept)
}

/// A busybox image of the host's static busybox, made with `docker import` (no registry).
fn image(scratch: &Path) -> Result<String> {
    let tag = "shmtrace-bench-soak:1".to_owned();
    let known = Command::new("docker")
        .args(["image", "inspect", &tag])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("docker (apt-get install docker.io, and start dockerd)")?;
    if known.success() {
        return Ok(tag);
    }
    let root = scratch.join("soak-rootfs");
    std::fs::create_dir_all(root.join("bin"))?;
    std::fs::create_dir_all(root.join("dev/shm"))?;
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .context("/bin/busybox (apt-get install busybox-static)")?;
    for applet in ["sh", "dd"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet))?;
    }
    let imported = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -C {} -c . | docker import - {tag} >/dev/null",
            root.display()
        ))
        .status()?;
    if !imported.success() {
        bail!("docker import of the soak's image failed");
    }
    Ok(tag)
}

/// The section of the benchmark's report, its targets' rows, and what to save.
pub fn report(figures: &Figures) -> (String, Vec<Row>, Value) {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let growth = mib(figures.rss_end.saturating_sub(figures.rss_after_warm_up));
    let mut text = format!(
        "## container-soak\n\n{:.0} minutes, {} containers (`docker run --rm`), {} of them \
         failing. RSS: {:.1} MiB after the warm-up ({} min), {:.1} MiB at the end, {:.1} MiB at \
         most. The daemon's JSON lines: {} of the failing containers have their ENOSPC and its \
         diagnosis once, naming them; {} amiss. Its metrics: {:.0} failures for the failing containers' names \
         ({} ran), {:.0} for the healthy ones', {:.0} under `runtime=\"unknown\"`; {:.0} \
         records lost, {:.0} unrecorded.\n\n{}\
         | minute | RSS (MiB) | processes held | /dev/shm objects held |\n|---:|---:|---:|---:|\n",
        figures.minutes,
        figures.containers,
        figures.failing,
        mib(figures.rss_after_warm_up),
        WARM_UP.as_secs() / 60,
        mib(figures.rss_end),
        mib(figures.rss_max),
        figures.failures_lined,
        figures.lines_amiss,
        figures.failures_counted,
        figures.failing,
        figures.failures_of_healthy,
        figures.unknown,
        figures.lost,
        figures.unrecorded,
        figures
            .amiss
            .iter()
            .map(|a| format!("Amiss: `{a}`\n\n"))
            .collect::<String>(),
    );
    for (minute, rss, processes, objects) in &figures.samples {
        text.push_str(&format!(
            "| {minute:.1} | {:.1} | {processes:.0} | {objects:.0} |\n",
            mib(*rss)
        ));
    }
    let rows = vec![
        target_list::CONTAINER_SOAK_GROWTH.judge(
            "container-soak",
            growth,
            format!("{growth:.1} MiB over {:.0} min", figures.minutes),
        ),
        target_list::CONTAINER_SOAK_PEAK.judge(
            "container-soak",
            mib(figures.rss_max),
            format!("{:.1} MiB", mib(figures.rss_max)),
        ),
        target_list::CONTAINER_SOAK_COUNTS.judge(
            "container-soak",
            f64::from(
                figures.failures_counted != figures.failing as f64
                    || figures.failures_lined != figures.failing
                    || figures.lines_amiss > 0
                    || figures.failures_of_healthy > 0.0
                    || (figures.lost == 0.0 && figures.unrecorded > 0.0),
            ),
            format!(
                "lines: {} of {} failing containers once, {} amiss; metrics: {:.0} of {} \
                 under their names, {:.0} for healthy containers",
                figures.failures_lined,
                figures.failing,
                figures.lines_amiss,
                figures.failures_counted,
                figures.failing,
                figures.failures_of_healthy
            ),
        ),
    ];
    let saved = json!({
        "minutes": figures.minutes,
        "containers": figures.containers,
        "failing": figures.failing,
        "rss_after_warm_up_kib": figures.rss_after_warm_up,
        "rss_end_kib": figures.rss_end,
        "rss_max_kib": figures.rss_max,
        "samples": figures.samples,
        "failures_lined": figures.failures_lined,
        "lines_amiss": figures.lines_amiss,
        "failures_counted": figures.failures_counted,
        "failures_of_healthy": figures.failures_of_healthy,
        "unknown": figures.unknown,
        "unrecorded": figures.unrecorded,
        "lost": figures.lost,
    });
    (text, rows, saved)
}
