//! Where shmtrace's overhead goes: run time of each BPF program during the workload's loop.
//!
//! The kernel counts run time per program while statistics are enabled (`BPF_ENABLE_STATS`,
//! the same switch as `sysctl kernel.bpf_stats_enabled=1`, but tied to a descriptor, so it
//! turns itself off if the benchmark dies). Each loaded program's `/proc/PID/fdinfo` entry
//! shows `run_time_ns` and `run_cnt`; the workload pauses before and after its loop
//! (`churn --hold`) so the counters are read exactly around it. Besides shmtrace tracing the
//! workload, this times shmtrace tracing another process, and the floor's empty programs, while
//! the workload runs: the part of what everyone else pays that is shmtrace's own work.
use std::{
    collections::BTreeMap,
    ffi::OsString,
    fs,
    os::fd::{FromRawFd, OwnedFd},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::{
    measure::Running,
    variants::{self, Setup},
};

/// One program's work during the loop.
pub struct ProbeCost {
    pub name: String,
    pub runs: u64,
    pub run_ns: u64,
}

pub struct ProbeReport {
    /// Sorted by total run time, largest first.
    pub probes: Vec<ProbeCost>,
    /// Objects made in the loop (iterations × workers).
    pub objects: u64,
    /// The loop's time in this run (statistics add a little to every program run).
    pub loop_seconds: f64,
    /// shmtrace's voluntary context switches over the whole run, when it traced the workload:
    /// roughly, how often the ring buffer woke it.
    pub tracer_nvcsw: Option<i64>,
}

impl ProbeReport {
    pub fn total_ns(&self) -> u64 {
        self.probes.iter().map(|p| p.run_ns).sum()
    }

    pub fn probe(&self, name: &str) -> Option<&ProbeCost> {
        self.probes.iter().find(|p| p.name == name)
    }

    /// Nanoseconds in all programs per object of the loop.
    pub fn ns_per_object(&self) -> f64 {
        self.total_ns() as f64 / self.objects.max(1) as f64
    }

    pub fn runs_per_object(&self) -> f64 {
        self.probes.iter().map(|p| p.runs).sum::<u64>() as f64 / self.objects.max(1) as f64
    }
}

/// `ns` as a percentage of an object that takes `untraced_us` untraced.
pub fn percent_of(ns: f64, untraced_us: f64) -> f64 {
    ns / 10.0 / untraced_us
}

/// Whose programs are timed, and how the workload runs beside them.
#[derive(Clone, Copy)]
pub enum Subject<'a> {
    /// `shmtrace FLAGS -o /dev/null -- WORKLOAD`: the workload traced.
    Traced(&'a [&'a str]),
    /// `shmtrace --pid SLEEPER -o /dev/null` attached, the workload run untraced beside it:
    /// what shmtrace's programs cost every other process on the host.
    BesideIdle,
    /// Empty programs on the same hooks (`xtask floor -- WORKLOAD`): what any program there
    /// costs, the least of it. With `records`, one record per call: the least a tracer
    /// that reports every call costs.
    Floor { records: bool },
}

/// Runs the workload with `--hold` once, as `subject` says, with statistics on.
pub fn measure(
    setup: &Setup,
    subject: Subject<'_>,
    workload: &[OsString],
    objects: u64,
) -> Result<ProbeReport> {
    let _stats = enable_stats()?;
    match subject {
        Subject::Traced(flags) => {
            let mut command = Command::new(&setup.shmtrace);
            command
                .args(flags)
                .args(["-o", "/dev/null", "--"])
                .args(workload)
                .arg("--hold");
            measure_wrapped(command, objects, true)
        }
        Subject::Floor { records } => {
            let mut command = variants::floor_command(workload, records);
            command.arg("--hold");
            measure_wrapped(command, objects, false)
        }
        Subject::BesideIdle => measure_beside_idle(setup, workload, objects),
    }
}

/// The programs' holder runs the workload as its child, which passes its standard streams on.
fn measure_wrapped(mut command: Command, objects: u64, tracer: bool) -> Result<ProbeReport> {
    let mut holder = Running::spawn(&mut command, true)?;
    let pid = holder.pid();
    let timed = time_loop(&mut holder, pid);
    holder.close_stdin();
    let finished = holder.finish()?;
    let timed = timed?;
    if !finished.success() {
        bail!("{command:?} ended with {}", finished.describe_status());
    }
    // Its own switches: the workload's are counted with it, as a waited-for child.
    let tracer_nvcsw = tracer.then(|| finished.nvcsw - timed.workload_nvcsw);
    Ok(timed.report(objects, tracer_nvcsw))
}

/// Runs the workload untraced beside shmtrace tracing a sleeping process.
fn measure_beside_idle(setup: &Setup, workload: &[OsString], objects: u64) -> Result<ProbeReport> {
    let idle = variants::IdleShmtrace::start(setup)?;
    let mut command = variants::direct(workload);
    let mut held = Running::spawn(command.arg("--hold"), true)?;
    let timed = time_loop(&mut held, idle.pid());
    held.close_stdin();
    let finished = held.finish()?;
    idle.stop()?;
    let timed = timed?;
    if !finished.success() {
        bail!("the workload ended with {}", finished.describe_status());
    }
    Ok(timed.report(objects, None))
}

type Snapshot = BTreeMap<u64, (u64, u64)>;

/// The counters of one holder's programs, read around the workload's loop.
struct Timed {
    before: Snapshot,
    after: Snapshot,
    names: BTreeMap<u64, String>,
    loop_seconds: f64,
    workload_nvcsw: i64,
}

/// Waits for the held workload to be ready, and reads `holder`'s counters before and after
/// its loop.
fn time_loop(workload: &mut Running, holder: u32) -> Result<Timed> {
    workload
        .wait_for_line(|l| l.contains("\"ready\""))
        .context("the workload did not start")?;
    let before = snapshot(holder)?;
    workload.send_line("go")?;
    let report = workload
        .wait_for_line(|l| l.contains("\"seconds\""))
        .context("the workload did not finish its loop")?;
    let after = snapshot(holder)?;
    let report: serde_json::Value = serde_json::from_str(&report)?;
    Ok(Timed {
        before,
        after,
        names: program_names()?,
        loop_seconds: report["seconds"].as_f64().unwrap_or(f64::NAN),
        workload_nvcsw: report["nvcsw"].as_i64().unwrap_or(0),
    })
}

impl Timed {
    fn report(self, objects: u64, tracer_nvcsw: Option<i64>) -> ProbeReport {
        let mut probes: Vec<ProbeCost> = self
            .after
            .iter()
            .map(|(id, (ns, runs))| {
                let (ns0, runs0) = self.before.get(id).copied().unwrap_or((0, 0));
                ProbeCost {
                    name: self
                        .names
                        .get(id)
                        .cloned()
                        .unwrap_or_else(|| format!("program id {id}")),
                    runs: runs - runs0,
                    run_ns: ns - ns0,
                }
            })
            .collect();
        probes.sort_by(|a, b| b.run_ns.cmp(&a.run_ns).then(a.name.cmp(&b.name)));
        ProbeReport {
            probes,
            objects,
            loop_seconds: self.loop_seconds,
            tracer_nvcsw,
        }
    }
}

/// Turns on run-time statistics for as long as the returned descriptor is open.
pub(super) fn enable_stats() -> Result<OwnedFd> {
    const BPF_ENABLE_STATS: libc::c_long = 32;
    const BPF_STATS_RUN_TIME: u32 = 0;
    let attr = [BPF_STATS_RUN_TIME, 0u32];
    // SAFETY: `attr` is a valid `bpf_attr` prefix for this command, of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_ENABLE_STATS,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("enabling BPF run-time statistics");
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `prog_id -> (run_time_ns, run_cnt)` for every BPF program `pid` holds.
pub(super) fn snapshot(pid: u32) -> Result<BTreeMap<u64, (u64, u64)>> {
    let mut programs = BTreeMap::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fd"))?.flatten() {
        if !fs::read_link(entry.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:bpf-prog") {
            continue;
        }
        let Ok(info) = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            entry.file_name().to_string_lossy()
        )) else {
            continue;
        };
        let field = |key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(ns), Some(runs)) =
            (field("prog_id:"), field("run_time_ns:"), field("run_cnt:"))
        {
            programs.insert(id, (ns, runs));
        }
    }
    if programs.is_empty() {
        bail!("shmtrace ({pid}) holds no BPF programs");
    }
    Ok(programs)
}

/// Program names by id, from bpftool (the kernel's fdinfo has ids only): without them, the
/// table could not tell entry probes from exit probes.
pub(super) fn program_names() -> Result<BTreeMap<u64, String>> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .context(
            "running bpftool, which names the programs in the BPF statistics: install it \
             (apt-get install bpftool), or pass --no-probe-costs",
        )?;
    if !out.status.success() {
        bail!(
            "bpftool prog show failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let list: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("reading bpftool's JSON")?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_u64()?, p["name"].as_str()?.to_owned())))
        .collect())
}
