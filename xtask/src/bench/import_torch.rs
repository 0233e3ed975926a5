//! A Python start-up that imports torch (thousands of opens, each stopping a ptrace-traced
//! program), untraced, under shmtrace's ptrace source and under `strace -f`, interleaved round
//! by round. It measures; `targets` reports (there is no target, only the figures).
use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use super::{stats::Spread, variants::Setup};

/// The venv the tests install PyTorch into (tests/src/pytorch.rs, .ci/run).
const PYTHON: &str = "/opt/shmtrace-venv/bin/python";

/// Wall seconds of each way, `rounds` runs each: untraced, ptrace, strace -f.
pub fn measure(setup: &Setup, rounds: u32) -> Result<Vec<(&'static str, Spread)>> {
    if !Path::new(PYTHON).exists() {
        bail!("{PYTHON} is missing: .ci/run installs the PyTorch venv");
    }
    let import = ["-c", "import torch"];
    let ways: [(&str, Box<dyn Fn() -> Command>); 3] = [
        (
            "untraced",
            Box::new(|| {
                let mut c = Command::new(PYTHON);
                c.args(import);
                c
            }),
        ),
        (
            "shmtrace --backend ptrace",
            Box::new(|| {
                let mut c = Command::new(&setup.shmtrace);
                c.args(["--backend", "ptrace", "-o", "/dev/null", "--", PYTHON])
                    .args(import);
                c
            }),
        ),
        (
            "strace -f",
            Box::new(|| {
                let mut c = Command::new("strace");
                c.args(["-f", "-qq", "-o", "/dev/null", "--", PYTHON])
                    .args(import);
                c
            }),
        ),
    ];
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    // Once first, untimed: the files it reads come into the page cache.
    let _ = (ways[0].1)().stdout(Stdio::null()).status();
    for _ in 0..rounds {
        for (i, (name, command)) in ways.iter().enumerate() {
            let started = Instant::now();
            let status = command()
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .with_context(|| format!("running {name}"))?;
            if !status.success() {
                bail!("import torch {name} ended with {status}");
            }
            seconds[i].push(started.elapsed().as_secs_f64());
        }
    }
    Ok(ways
        .iter()
        .zip(seconds)
        .filter_map(|((name, _), s)| Some((*name, Spread::of(&s)?)))
        .collect())
}
