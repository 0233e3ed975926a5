//! Start-up and teardown: how long `shmtrace -o /dev/null -- CMD` takes to start CMD (`cargo
//! xtask stamp`, which prints the monotonic clock), and to exit once CMD has; after the
//! previous run's probes are released, or back to back, as a loop or a CI job running
//! `shmtrace size` per workload would. It measures; `verdicts` judges.
use std::{
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::{measure, storm, variants::Setup};

/// Seconds, one figure a run.
pub struct StartupFigures {
    /// From shmtrace's start to the command's.
    pub starts: Vec<f64>,
    /// From the command's end to shmtrace's exit.
    pub stops: Vec<f64>,
    /// From shmtrace's exit until the kernel has let go of its probes (`shmtrace-detach`);
    /// empty back to back, where nothing waits for it.
    pub releases: Vec<f64>,
}

/// Start-up and teardown, `runs` times: after the previous run's probes are released, or with
/// `back_to_back`, at once. `flags` go before shmtrace's others (`--backend ptrace`).
pub fn measure(
    setup: &Setup,
    exe: &Path,
    runs: u32,
    back_to_back: bool,
    flags: &[&str],
) -> Result<StartupFigures> {
    let mut figures = StartupFigures {
        starts: Vec::new(),
        stops: Vec::new(),
        releases: Vec::new(),
    };
    for _ in 0..runs {
        let before = storm::monotonic_ns();
        let out = Command::new(&setup.shmtrace)
            .args(flags)
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
            figures
                .releases
                .push(measure::wait_for_background_detach()?.as_secs_f64());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let stamp: serde_json::Value = text
            .lines()
            .find_map(|l| serde_json::from_str(l).ok())
            .context("the stamp printed nothing")?;
        let at = stamp["monotonic_ns"].as_u64().context("no monotonic_ns")?;
        figures.starts.push((at - before) as f64 / 1e9);
        figures.stops.push((after - at) as f64 / 1e9);
    }
    if back_to_back {
        // Let the last run's release end before whatever is measured next.
        let _ = measure::wait_for_background_detach();
    }
    Ok(figures)
}
