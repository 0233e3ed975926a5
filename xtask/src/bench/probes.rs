//! Where shmtrace's overhead goes: run time of each BPF program during the workload's loop.
//!
//! The kernel counts run time per program while statistics are enabled (`BPF_ENABLE_STATS`,
//! the same switch as `sysctl kernel.bpf_stats_enabled=1`, but tied to a descriptor, so it
//! turns itself off if the benchmark dies). Each loaded program's `/proc/PID/fdinfo` entry
//! shows `run_time_ns` and `run_cnt`; the workload pauses before and after its loop
//! (`churn --hold`) so the counters are read exactly around it.
use std::{
    collections::BTreeMap,
    ffi::OsString,
    fs,
    os::fd::{FromRawFd, OwnedFd},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::{measure::Running, variants::Setup};

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
    /// shmtrace's voluntary context switches over the whole run: roughly, how often the
    /// ring buffer woke it.
    pub tracer_nvcsw: i64,
}

impl ProbeReport {
    pub fn total_ns(&self) -> u64 {
        self.probes.iter().map(|p| p.run_ns).sum()
    }

    pub fn probe(&self, name: &str) -> Option<&ProbeCost> {
        self.probes.iter().find(|p| p.name == name)
    }
}

/// Runs `shmtrace FLAGS -o /dev/null -- WORKLOAD --hold` with statistics on.
pub fn measure(
    setup: &Setup,
    flags: &[&str],
    workload: &[OsString],
    objects: u64,
) -> Result<ProbeReport> {
    let _stats = enable_stats()?;
    let mut command = Command::new(&setup.shmtrace);
    command
        .args(flags)
        .args(["-o", "/dev/null", "--"])
        .args(workload)
        .arg("--hold");
    let mut tracer = Running::spawn(&mut command, true)?;
    type Snapshot = BTreeMap<u64, (u64, u64)>;
    let result = (|| -> Result<(Snapshot, Snapshot, BTreeMap<u64, String>, serde_json::Value)> {
        tracer
            .wait_for_line(|l| l.contains("\"ready\""))
            .context("the workload did not start under shmtrace")?;
        let before = snapshot(tracer.pid())?;
        tracer.send_line("go")?;
        let report = tracer
            .wait_for_line(|l| l.contains("\"seconds\""))
            .context("the workload did not finish under shmtrace")?;
        let after = snapshot(tracer.pid())?;
        let names = program_names();
        let report: serde_json::Value = serde_json::from_str(&report)?;
        Ok((before, after, names, report))
    })();
    tracer.close_stdin();
    let finished = tracer.finish()?;
    let (before, after, names, report) = result?;
    if !finished.success() {
        bail!("shmtrace ended with {}", finished.describe_status());
    }
    let mut probes: Vec<ProbeCost> = after
        .iter()
        .map(|(id, (ns, runs))| {
            let (ns0, runs0) = before.get(id).copied().unwrap_or((0, 0));
            ProbeCost {
                name: names
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| format!("program id {id}")),
                runs: runs - runs0,
                run_ns: ns - ns0,
            }
        })
        .collect();
    probes.sort_by(|a, b| b.run_ns.cmp(&a.run_ns).then(a.name.cmp(&b.name)));
    let workload_nvcsw = report["nvcsw"].as_i64().unwrap_or(0);
    Ok(ProbeReport {
        probes,
        objects,
        loop_seconds: report["seconds"].as_f64().unwrap_or(f64::NAN),
        tracer_nvcsw: finished.nvcsw - workload_nvcsw,
    })
}

/// Turns on run-time statistics for as long as the returned descriptor is open.
fn enable_stats() -> Result<OwnedFd> {
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
fn snapshot(pid: u32) -> Result<BTreeMap<u64, (u64, u64)>> {
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

/// Program names by id, from bpftool (the kernel's fdinfo has ids only). Empty without it.
fn program_names() -> BTreeMap<u64, String> {
    let Ok(out) = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
    else {
        return BTreeMap::new();
    };
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_u64()?, p["name"].as_str()?.to_owned())))
        .collect()
}
