//! Replay: how fast `shmtrace show --json` decodes a recorded 4 KiB churn on one core, and how
//! `shmtrace report`'s time grows with the processes of a recorded fork storm. It measures;
//! `verdicts` judges.
use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use super::variants::Setup;

/// Records a 4 KiB churn of `iterations` objects, then times `shmtrace show --json` over it on
/// one core: the lines it wrote, and its seconds.
pub fn throughput(setup: &Setup, exe: &Path, tag: &str, iterations: u64) -> Result<(u64, f64)> {
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
    result
}

/// The seconds `shmtrace report` takes on one core over a recorded storm of each of
/// `processes` (each forks, opens a /dev/shm file and dies).
pub fn report_times<const N: usize>(
    setup: &Setup,
    exe: &Path,
    tag: &str,
    processes: [u64; N],
) -> Result<[f64; N]> {
    let mut seconds = [0.0; N];
    for (processes, seconds) in processes.iter().zip(&mut seconds) {
        *seconds = report_time(setup, exe, tag, *processes)?;
    }
    Ok(seconds)
}

fn report_time(setup: &Setup, exe: &Path, tag: &str, processes: u64) -> Result<f64> {
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
