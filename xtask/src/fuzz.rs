//! `cargo xtask fuzz --seconds N`: runs each coverage-guided fuzz target of `fuzz/` for a fixed
//! time from its committed seed corpus, and reports executions and crashes per target.
//!
//! The corpus grows in a scratch copy, so a run leaves the committed seeds as they are. A crash
//! fails the task, naming the target and the input libFuzzer saved (`fuzz/artifacts/TARGET/`).
use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::{root, run};

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Seconds to run each target.
    #[arg(long, default_value_t = 20)]
    seconds: u32,
    /// Only these targets (default: every one in fuzz/Cargo.toml).
    #[arg(long, value_delimiter = ',')]
    target: Vec<String>,
}

pub fn run_all(args: &FuzzArgs) -> Result<()> {
    let fuzz = root().join("fuzz");
    let targets = if args.target.is_empty() {
        list_targets(&fuzz)?
    } else {
        args.target.clone()
    };
    // One build for every target. No sanitizer: the code under test is safe Rust, where
    // libFuzzer finds panics, overflows and hangs without one, and AddressSanitizer would make
    // the build of the whole dependency tree (tokio, aya, tonic) several times slower in CI.
    run(Command::new("cargo").current_dir(&fuzz).args([
        "+nightly",
        "fuzz",
        "build",
        "-O",
        "--sanitizer",
        "none",
    ]))?;
    let scratch = std::env::temp_dir().join(format!("shmtrace-fuzz-{}", std::process::id()));
    let mut failed = Vec::new();
    println!(
        "{:<16} {:>12} {:>8}  result",
        "target", "executions", "corpus"
    );
    for target in &targets {
        let corpus = scratch.join(target);
        std::fs::create_dir_all(&corpus)?;
        let seeds = fuzz.join("corpus").join(target);
        let output = Command::new("cargo")
            .current_dir(&fuzz)
            .args([
                "+nightly",
                "fuzz",
                "run",
                "-O",
                "--sanitizer",
                "none",
                target,
            ])
            .arg(&corpus)
            .arg(&seeds)
            .args(["--", &format!("-max_total_time={}", args.seconds)])
            .args(["-print_final_stats=1", "-rss_limit_mb=2048", "-timeout=10"])
            .output()
            .with_context(|| format!("running fuzz target {target}"))?;
        let log = String::from_utf8_lossy(&output.stderr);
        let executions = stat(&log, "stat::number_of_executed_units:").unwrap_or(0);
        let entries = std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
        let result = if output.status.success() {
            "no crash".to_owned()
        } else {
            failed.push(target.clone());
            let artifact = log
                .lines()
                .find(|l| l.contains("Test unit written to"))
                .unwrap_or("see the log above");
            eprintln!("{log}");
            format!("CRASH: {artifact}")
        };
        println!("{target:<16} {executions:>12} {entries:>8}  {result}");
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if !failed.is_empty() {
        bail!("fuzz targets crashed: {}", failed.join(", "));
    }
    Ok(())
}

/// The `[[bin]]` names of fuzz/Cargo.toml.
fn list_targets(fuzz: &Path) -> Result<Vec<String>> {
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml"))?;
    let mut targets = Vec::new();
    let mut in_bin = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(name) = line.strip_prefix("name = ") {
            targets.push(name.trim_matches('"').to_owned());
        }
    }
    if targets.is_empty() {
        bail!("no fuzz targets in {}", fuzz.join("Cargo.toml").display());
    }
    Ok(targets)
}

/// A number from libFuzzer's final stats (`-print_final_stats=1`).
fn stat(log: &str, name: &str) -> Option<u64> {
    log.lines()
        .find_map(|line| line.trim().strip_prefix(name))
        .and_then(|value| value.trim().parse().ok())
}
