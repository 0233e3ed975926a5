//! A paired measurement that machine noise cannot swamp: two workers, A and B, take turns
//! making a block of objects each (a few milliseconds), with only A traced. Each pair of
//! blocks runs under the same conditions, so the median of A's time over B's, block by block,
//! shows the tracing overhead even on a busy machine, where whole runs vary by ±25%.
//!
//! The workload side is `churn --pair-block N`; the benchmark side starts `shmtrace --pid A`
//! once the workers exist and lets them go once it has attached.
use std::{
    ffi::OsString,
    fs::File,
    io::Read,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::{
    ChurnArgs,
    churn::{self, Counts},
    measure::Running,
    reported::{self, Reported},
    variants::{self, Setup},
};

// ---- The workload side ----

/// One worker's turns, as it reports them to the parent.
struct Turns {
    counts: Counts,
    cpu_seconds: f64,
    block_seconds: Vec<f64>,
}

pub fn workload(args: &ChurnArgs) -> Result<()> {
    let block = args.pair_block;
    let blocks = args.iterations.div_ceil(block);
    let (to_a_read, to_a_write) = pipe()?;
    let (to_b_read, to_b_write) = pipe()?;
    let (from_a_read, from_a_write) = pipe()?;
    let (from_b_read, from_b_write) = pipe()?;
    let every = [
        &to_a_read,
        &to_a_write,
        &to_b_read,
        &to_b_write,
        &from_a_read,
        &from_a_write,
        &from_b_read,
        &from_b_write,
    ]
    .map(|fd| fd.as_raw_fd());
    let a = fork_turn_taker(
        args,
        blocks,
        [&to_a_read, &to_b_write, &from_a_write],
        &every,
    )?;
    let b = fork_turn_taker(
        args,
        blocks,
        [&to_b_read, &to_a_write, &from_b_write],
        &every,
    )?;
    drop((from_a_write, from_b_write));
    println!("{}", json!({ "pair_pids": [a, b] }));
    churn::wait_for_go()?;

    let started = Instant::now();
    write_token(to_a_write.as_raw_fd())?;
    // From now on only the workers hold the write ends, so a worker that dies ends the other's
    // wait. The read ends stay open here, so the last token passed never meets a closed pipe.
    drop((to_a_write, to_b_write));
    let turns_a = read_turns(from_a_read);
    let turns_b = read_turns(from_b_read);
    let failed = [a, b].iter().filter(|pid| !reap(**pid)).count();
    let seconds = started.elapsed().as_secs_f64();
    if failed > 0 {
        bail!("{failed} of the two workers failed");
    }
    let (a_turns, b_turns) = (turns_a?, turns_b?);
    let mut ratios: Vec<f64> = a_turns
        .block_seconds
        .iter()
        .zip(&b_turns.block_seconds)
        .map(|(a, b)| a / b)
        .collect();
    ratios.sort_by(f64::total_cmp);
    let quantile = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    let mut calls = a_turns.counts;
    calls.add(&b_turns.counts);
    let a_seconds: f64 = a_turns.block_seconds.iter().sum();
    let b_seconds: f64 = b_turns.block_seconds.iter().sum();
    println!(
        "{}",
        json!({
            "seconds": seconds,
            "cpu_seconds": a_turns.cpu_seconds + b_turns.cpu_seconds,
            "calls": calls.to_json(),
            "pair": {
                "block": block,
                "iterations": args.iterations,
                "pairs": ratios.len(),
                "a_seconds": a_seconds,
                "b_seconds": b_seconds,
                "a_cpu_seconds": a_turns.cpu_seconds,
                "b_cpu_seconds": b_turns.cpu_seconds,
                "a_calls": a_turns.counts.to_json(),
                "ratio_median": quantile(0.5),
                "ratio_q1": quantile(0.25),
                "ratio_q3": quantile(0.75),
            },
        })
    );
    Ok(())
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    // SAFETY: two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks a worker that, `blocks` times, waits for the token on `mine`, makes a block of
/// objects, and passes the token on to `next`; then reports on `report`. It closes every other
/// end in `every`, so that the pipes end when their last user is gone.
fn fork_turn_taker(
    args: &ChurnArgs,
    blocks: u64,
    [mine, next, report]: [&OwnedFd; 3],
    every: &[RawFd],
) -> Result<libc::pid_t> {
    let keep = [mine.as_raw_fd(), next.as_raw_fd(), report.as_raw_fd()];
    // SAFETY: this process is single-threaded, so the child may allocate; it leaves with
    // `_exit`, running no destructors or exit handlers of the parent's state.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()).context("fork"),
        0 => {
            churn::die_with_parent();
            for fd in every.iter().filter(|fd| !keep.contains(fd)) {
                // SAFETY: the child's copies, which it never uses.
                unsafe { libc::close(*fd) };
            }
            let status = match take_turns(args, blocks, keep) {
                Ok(()) => 0,
                Err(error) => {
                    eprintln!("churn pair worker: {error:#}");
                    1
                }
            };
            // SAFETY: leaving the child without unwinding into the parent's code.
            unsafe { libc::_exit(status) }
        }
        pid => Ok(pid),
    }
}

fn take_turns(args: &ChurnArgs, blocks: u64, [mine, next, report]: [RawFd; 3]) -> Result<()> {
    let mut counts = Counts::default();
    let mut block_seconds = Vec::with_capacity(blocks as usize);
    for i in 0..blocks {
        let mut token = [0u8; 1];
        // SAFETY: reading one byte into a local buffer.
        if unsafe { libc::read(mine, token.as_mut_ptr().cast(), 1) } != 1 {
            bail!("the other worker is gone");
        }
        let first = i * args.pair_block;
        let last = (first + args.pair_block).min(args.iterations);
        let started = Instant::now();
        churn::make_objects(args, first..last, &mut counts)?;
        block_seconds.push(started.elapsed().as_secs_f64());
        write_token(next)?;
    }
    let mut bytes = counts.to_bytes();
    bytes.extend(churn::own_cpu_seconds().to_ne_bytes());
    bytes.extend(block_seconds.iter().flat_map(|s| s.to_ne_bytes()));
    // SAFETY: the report descriptor is ours; File takes ownership and closes it.
    let mut file = unsafe { File::from_raw_fd(report) };
    std::io::Write::write_all(&mut file, &bytes).context("reporting to the parent")
}

fn write_token(fd: RawFd) -> Result<()> {
    // SAFETY: writing one byte from a local buffer.
    if unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) } != 1 {
        return Err(std::io::Error::last_os_error()).context("passing the token");
    }
    Ok(())
}

fn read_turns(pipe: OwnedFd) -> Result<Turns> {
    let mut bytes = Vec::new();
    File::from(pipe).read_to_end(&mut bytes)?;
    if bytes.len() < Counts::BYTES + 8 || !(bytes.len() - Counts::BYTES - 8).is_multiple_of(8) {
        bail!("a worker's report is truncated ({} bytes)", bytes.len());
    }
    let (counts, rest) = bytes.split_at(Counts::BYTES);
    let number = |chunk: &[u8]| f64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
    Ok(Turns {
        counts: Counts::from_bytes(counts),
        cpu_seconds: number(&rest[..8]),
        block_seconds: rest[8..].chunks_exact(8).map(number).collect(),
    })
}

fn reap(pid: libc::pid_t) -> bool {
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

// ---- The benchmark side ----

/// What traces worker A.
pub struct PairMode {
    pub label: &'static str,
    /// shmtrace's flags, or `None` for the control run: nothing traced, which shows how
    /// far from 1.000 the method itself lands.
    shmtrace_flags: Option<&'static [&'static str]>,
}

impl PairMode {
    /// shmtrace with no flags: what the probe costs are set against.
    pub fn is_default_shmtrace(&self) -> bool {
        self.shmtrace_flags.is_some_and(|f| f.is_empty())
    }
}

pub const MODES: [PairMode; 3] = [
    PairMode {
        label: "nothing (control)",
        shmtrace_flags: None,
    },
    PairMode {
        label: "shmtrace -o FILE --pid A",
        shmtrace_flags: Some(&[]),
    },
    PairMode {
        label: "shmtrace --failed -o FILE --pid A",
        shmtrace_flags: Some(&["--failed"]),
    },
];

pub struct PairOutcome {
    pub pairs: u64,
    pub ratio_median: f64,
    /// Worker B's (untraced) time per object.
    pub b_object_seconds: f64,
    pub ratio_q1: f64,
    pub ratio_q3: f64,
    /// A's total block time over B's.
    pub ratio_total: f64,
    pub cpu_ratio: f64,
    pub tracer_cpu_seconds: Option<f64>,
    pub reported: Option<Reported>,
    /// What worker A made, to check the tracer's counts against.
    pub a_calls: std::collections::BTreeMap<String, u64>,
}

/// Runs the paired workload once with `mode` tracing worker A.
pub fn measure(
    setup: &Setup,
    mode: &PairMode,
    workload: &[OsString],
    block: u64,
) -> Result<PairOutcome> {
    let output = setup.scratch.join("pair.out");
    let mut command = Command::new(&workload[0]);
    command
        .args(&workload[1..])
        .args(["--pair-block", &block.to_string()]);
    let mut churn = Running::spawn(&mut command, true)?;
    let result = (|| {
        let pids = churn
            .wait_for_line(|l| l.contains("pair_pids"))
            .context("the paired workload did not start")?;
        let pids: serde_json::Value = serde_json::from_str(&pids)?;
        let a = pids["pair_pids"][0]
            .as_u64()
            .context("no pid for worker A")?;
        let tracer = match mode.shmtrace_flags {
            None => None,
            Some(flags) => {
                let tracer = Running::spawn(
                    Command::new(&setup.shmtrace)
                        .args(flags)
                        .arg("-o")
                        .arg(&output)
                        .args(["--pid", &a.to_string()]),
                    false,
                )?;
                variants::wait_tracing(&tracer)?;
                Some(tracer)
            }
        };
        churn.send_line("go")?;
        Ok(tracer)
    })();
    let tracer = match result {
        Ok(tracer) => tracer,
        Err(error) => {
            churn.kill();
            let _ = churn.finish();
            return Err(error);
        }
    };
    let finished = churn.finish()?;
    // shmtrace ends by itself once worker A, its only target, has exited.
    let tracer = tracer.map(Running::finish).transpose()?;
    if !finished.success() {
        bail!(
            "the paired workload ended with {}",
            finished.describe_status()
        );
    }
    let report: serde_json::Value = finished
        .stdout
        .iter()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v.get("pair").is_some())
        })
        .context("the paired workload printed no report")?;
    let pair = &report["pair"];
    let number = |key: &str| {
        pair[key]
            .as_f64()
            .with_context(|| format!("no {key} in the report"))
    };
    let reported = match (&tracer, mode.shmtrace_flags) {
        (Some(tracer), Some(flags)) => {
            if !tracer.success() {
                bail!("shmtrace ended with {}", tracer.describe_status());
            }
            Some(reported::read_shmtrace_file(
                &output,
                false,
                flags.contains(&"--failed"),
            )?)
        }
        _ => None,
    };
    let _ = std::fs::remove_file(&output);
    Ok(PairOutcome {
        pairs: number("pairs")? as u64,
        ratio_median: number("ratio_median")?,
        b_object_seconds: number("b_seconds")? / number("iterations")?,
        ratio_q1: number("ratio_q1")?,
        ratio_q3: number("ratio_q3")?,
        ratio_total: number("a_seconds")? / number("b_seconds")?,
        cpu_ratio: number("a_cpu_seconds")? / number("b_cpu_seconds")?,
        tracer_cpu_seconds: tracer.map(|t| t.own_cpu_seconds),
        reported,
        a_calls: pair["a_calls"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
            .collect(),
    })
}

/// Objects per turn: about 4 MiB worth, 2 to 3 ms of work. Short turns make many pairs, and
/// the median of many pairs shrugs off the bursts of other work on the machine.
pub fn default_block(size: u64) -> u64 {
    ((4u64 << 20) / size.max(1)).clamp(2, 200)
}
