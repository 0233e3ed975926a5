//! A Python start-up that imports torch (thousands of opens, each stopping a ptrace-traced
//! program), untraced, under shmtrace's ptrace source and under `strace -f`, interleaved round
//! by round. It measures; `verdicts` reports (there is no target, only the figures).
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
    let command = |way: Way| {
        let mut c = match way {
            Way::Untraced => Command::new(PYTHON),
            Way::Ptrace => {
                let mut c = Command::new(&setup.shmtrace);
                c.args(["--backend", "ptrace", "-o", "/dev/null", "--", PYTHON]);
                c
            }
            Way::Strace => {
                let mut c = Command::new("strace");
                c.args(["-f", "-qq", "-o", "/dev/null", "--", PYTHON]);
                c
            }
        };
        c.args(import);
        c
    };
    let ways = [
        (Way::Untraced, "untraced"),
        (Way::Ptrace, "shmtrace --backend ptrace"),
        (Way::Strace, "strace -f"),
    ];
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    // Once first, untimed: the files it reads come into the page cache.
    let _ = command(Way::Untraced).stdout(Stdio::null()).status();
    for _ in 0..rounds {
        for (i, (way, name)) in ways.iter().enumerate() {
            let started = Instant::now();
            let status = command(*way)
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
        .filter_map(|((_, name), s)| Some((*name, Spread::of(&s)?)))
        .collect())
}

#[derive(Clone, Copy)]
enum Way {
    Untraced,
    Ptrace,
    Strace,
}
