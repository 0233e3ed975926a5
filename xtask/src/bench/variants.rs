//! The ways the workload is run: untraced, or under one tracer or another.
use std::{
    collections::BTreeMap,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{
    churn::CALLS,
    measure::{Finished, Running},
    reported::{self, Reported},
};

pub struct Variant {
    /// Short name, for `--variants`.
    pub name: &'static str,
    /// What a user would type, for the table.
    pub label: &'static str,
    kind: Kind,
}

enum Kind {
    Untraced,
    Shmtrace {
        flags: &'static [&'static str],
        sink: Sink,
        /// Run with `taskset -c 0`: the workload and shmtrace on one CPU, so that no stop
        /// wakes another CPU.
        on_one_cpu: bool,
    },
    /// shmtrace attached and tracing another process; the workload runs untraced beside it.
    /// What every other process on the host pays while shmtrace runs.
    ShmtraceIdle,
    /// `shmtrace --all` running beside the workload, which it traces as one process among all.
    ShmtraceAll,
    /// Empty BPF programs on shmtrace's hooks (`cargo xtask floor`): the least any tracer on
    /// those hooks can cost. With `records`, one record per call: the least a tracer that
    /// reports every call can cost.
    Floor {
        records: bool,
    },
    /// `cargo xtask ptrace-floor`: the ptrace source's stops in the churn, with nothing done at
    /// them.
    PtraceFloor {
        on_one_cpu: bool,
    },
    Strace {
        seccomp: bool,
    },
    PerfTrace,
}

#[derive(Clone, Copy, PartialEq)]
enum Sink {
    File,
    DevNull,
}

pub const ALL: [Variant; 16] = [
    Variant {
        name: "untraced",
        label: "untraced",
        kind: Kind::Untraced,
    },
    Variant {
        name: "floor",
        label: "empty programs, same hooks (floor)",
        kind: Kind::Floor { records: false },
    },
    Variant {
        name: "floor-records",
        label: "an empty record per call (record floor)",
        kind: Kind::Floor { records: true },
    },
    Variant {
        name: "shmtrace",
        label: "shmtrace -o FILE",
        kind: Kind::Shmtrace {
            flags: &[],
            sink: Sink::File,
            on_one_cpu: false,
        },
    },
    Variant {
        name: "shmtrace-json",
        label: "shmtrace --json -o FILE",
        kind: Kind::Shmtrace {
            flags: &["--json"],
            sink: Sink::File,
            on_one_cpu: false,
        },
    },
    Variant {
        name: "shmtrace-null",
        label: "shmtrace -o /dev/null",
        kind: Kind::Shmtrace {
            flags: &[],
            sink: Sink::DevNull,
            on_one_cpu: false,
        },
    },
    Variant {
        name: "shmtrace-failed",
        label: "shmtrace --failed -o FILE",
        kind: Kind::Shmtrace {
            flags: &["--failed"],
            sink: Sink::File,
            on_one_cpu: false,
        },
    },
    Variant {
        name: "shmtrace-ptrace",
        label: "shmtrace --backend ptrace -o FILE",
        kind: Kind::Shmtrace {
            flags: &["--backend", "ptrace"],
            sink: Sink::File,
            on_one_cpu: false,
        },
    },
    Variant {
        name: "shmtrace-ptrace-one-cpu",
        label: "taskset -c 0 shmtrace --backend ptrace",
        kind: Kind::Shmtrace {
            flags: &["--backend", "ptrace"],
            sink: Sink::File,
            on_one_cpu: true,
        },
    },
    Variant {
        name: "ptrace-floor",
        label: "ptrace stops alone (ptrace floor)",
        kind: Kind::PtraceFloor { on_one_cpu: false },
    },
    Variant {
        name: "ptrace-floor-one-cpu",
        label: "taskset -c 0 ptrace floor",
        kind: Kind::PtraceFloor { on_one_cpu: true },
    },
    Variant {
        name: "shmtrace-idle",
        label: "untraced, shmtrace --pid OTHER",
        kind: Kind::ShmtraceIdle,
    },
    Variant {
        name: "shmtrace-all",
        label: "beside shmtrace --all -o /dev/null",
        kind: Kind::ShmtraceAll,
    },
    Variant {
        name: "strace",
        label: "strace -f -o /dev/null",
        kind: Kind::Strace { seccomp: false },
    },
    Variant {
        name: "strace-seccomp",
        label: "strace -f --seccomp-bpf",
        kind: Kind::Strace { seccomp: true },
    },
    Variant {
        name: "perf-trace",
        label: "perf trace -o FILE",
        kind: Kind::PerfTrace,
    },
];

/// `xtask floor [--records] -- WORKLOAD`: workload[0] is this xtask binary, which also runs the
/// floors.
pub fn floor_command(workload: &[OsString], records: bool) -> Command {
    let mut command = Command::new(&workload[0]);
    command.arg("floor");
    if records {
        command.arg("--records");
    }
    command.arg("--").args(workload);
    command
}

/// What a run needs besides the workload's command line.
pub struct Setup {
    pub shmtrace: PathBuf,
    /// Where tracers write their output; emptied after each run.
    pub scratch: PathBuf,
}

/// A finished run of one variant.
pub struct Outcome {
    /// The workload, reaped by whoever started it.
    pub workload: WorkloadReport,
    /// The process we started: the workload itself, or the tracer running it.
    pub top: Finished,
    /// For tracers: the tracer process (`top`, or the idle shmtrace).
    pub tracer: Option<TracerUse>,
    pub reported: Reported,
}

pub struct TracerUse {
    /// The tracer's own CPU time, without the workload's.
    pub cpu_seconds: f64,
    pub peak_rss_kb: u64,
    /// For a tracer stopped by SIGINT: seconds from the signal to its exit.
    pub stop_seconds: Option<f64>,
}

/// What the workload said about itself.
pub struct WorkloadReport {
    pub loop_seconds: f64,
    pub cpu_seconds: f64,
    pub calls: BTreeMap<String, u64>,
}

impl Variant {
    pub fn traced(&self) -> bool {
        !matches!(self.kind, Kind::Untraced)
    }

    /// Whether the tools this variant needs are here; `Err` says which is missing and why.
    pub fn available(&self, setup: &Setup) -> Result<()> {
        let probe = |program: &Path, args: &[&str]| -> Result<()> {
            let out = Command::new(program)
                .args(args)
                .output()
                .with_context(|| format!("{} cannot be run", program.display()))?;
            if !out.status.success() {
                bail!(
                    "`{} {}` failed: {}",
                    program.display(),
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(())
        };
        match self.kind {
            Kind::Untraced | Kind::PtraceFloor { .. } => Ok(()),
            Kind::Floor { records } => super::floor::attach_all(records).map(drop),
            Kind::Shmtrace { .. } | Kind::ShmtraceIdle | Kind::ShmtraceAll => {
                probe(&setup.shmtrace, &["--version"])
            }
            Kind::Strace { .. } => probe(Path::new("strace"), &["-V"]),
            // perf trace needs tracefs and syscall tracepoints; try it for real.
            Kind::PerfTrace => probe(
                Path::new("perf"),
                &["trace", "-e", "close", "-o", "/dev/null", "--", "true"],
            ),
        }
    }

    /// Runs `workload` once this way.
    pub fn run(&self, setup: &Setup, workload: &[OsString]) -> Result<Outcome> {
        let output = setup.scratch.join("trace.out");
        let result = self.run_with(setup, workload, &output);
        let _ = fs::remove_file(&output);
        result
    }

    fn run_with(&self, setup: &Setup, workload: &[OsString], output: &Path) -> Result<Outcome> {
        match self.kind {
            Kind::ShmtraceIdle => return run_beside_idle_shmtrace(setup, workload),
            Kind::ShmtraceAll => return run_beside_shmtrace_all(setup, workload),
            _ => {}
        }
        let mut command = match self.kind {
            Kind::Untraced => direct(workload),
            Kind::Floor { records } => floor_command(workload, records),
            Kind::Shmtrace {
                flags,
                sink,
                on_one_cpu,
            } => {
                let mut c = on_cpus(&setup.shmtrace, on_one_cpu);
                c.args(flags).arg("-o");
                match sink {
                    Sink::File => c.arg(output),
                    Sink::DevNull => c.arg("/dev/null"),
                };
                c.arg("--").args(workload);
                c
            }
            Kind::PtraceFloor { on_one_cpu } => {
                let mut c = on_cpus(&workload[0], on_one_cpu);
                c.arg("ptrace-floor").arg("--").args(workload);
                c
            }
            Kind::Strace { seccomp } => {
                let mut c = Command::new("strace");
                c.args(["-f", "-qq"]);
                if seccomp {
                    c.arg("--seccomp-bpf");
                }
                c.arg("-e")
                    .arg(format!("trace={}", CALLS.join(",")))
                    .args(["-o", "/dev/null", "--"])
                    .args(workload);
                c
            }
            Kind::PerfTrace => {
                let mut c = Command::new("perf");
                c.args(["trace", "-e", &CALLS.join(",")])
                    .arg("-o")
                    .arg(output)
                    .arg("--")
                    .args(workload);
                c
            }
            Kind::ShmtraceIdle | Kind::ShmtraceAll => unreachable!("handled above"),
        };
        let top = Running::spawn(&mut command, false)?.finish()?;
        if !top.success() {
            bail!(
                "{} ended with {}: {}",
                self.label,
                top.describe_status(),
                last_lines(&top.stderr, 3)
            );
        }
        let workload = WorkloadReport::from_stdout(&top.stdout)?;
        let tracer = self.traced().then_some(TracerUse {
            cpu_seconds: top.own_cpu_seconds,
            peak_rss_kb: top.peak_rss_kb,
            stop_seconds: None,
        });
        let reported = match self.kind {
            Kind::Shmtrace { flags, sink, .. } => {
                let failed = flags.contains(&"--failed");
                let json = flags.contains(&"--json");
                read_shmtrace(sink, output, &top.stderr, json, failed)?
            }
            Kind::PerfTrace => reported::read_perf_trace(output)?,
            _ => Reported::default(),
        };
        Ok(Outcome {
            workload,
            top,
            tracer,
            reported,
        })
    }
}

/// A command for `program`, on CPU 0 alone (`taskset -c 0`) if `on_one_cpu`.
fn on_cpus(program: impl AsRef<std::ffi::OsStr>, on_one_cpu: bool) -> Command {
    if !on_one_cpu {
        return Command::new(program);
    }
    let mut c = Command::new("taskset");
    c.args(["-c", "0"]).arg(program);
    c
}

pub fn direct(workload: &[OsString]) -> Command {
    let mut c = Command::new(&workload[0]);
    c.args(&workload[1..]);
    c
}

/// `shmtrace --pid SLEEPER -o /dev/null`, attached and tracing a process that does nothing:
/// what runs beside it pays only what every untraced process on the host pays.
pub struct IdleShmtrace {
    sleeper: Child,
    tracer: Option<Running>,
}

impl IdleShmtrace {
    /// Starts it and waits until its probes are attached.
    pub fn start(setup: &Setup) -> Result<IdleShmtrace> {
        let sleeper = Command::new("sleep")
            .arg("600")
            .spawn()
            .context("starting sleep")?;
        let mut idle = IdleShmtrace {
            sleeper,
            tracer: None,
        };
        let tracer = Running::spawn(
            Command::new(&setup.shmtrace)
                .args(["-o", "/dev/null", "--pid"])
                .arg(idle.sleeper.id().to_string()),
            false,
        )?;
        wait_tracing(idle.tracer.insert(tracer))?;
        Ok(idle)
    }

    /// The shmtrace process, which holds the programs.
    pub fn pid(&self) -> u32 {
        self.tracer.as_ref().map_or(0, Running::pid)
    }

    /// Ends the sleeper, which ends shmtrace (its targets are gone), and checks that shmtrace
    /// exited cleanly.
    pub fn stop(mut self) -> Result<Finished> {
        self.end_sleeper();
        let tracer = self
            .tracer
            .take()
            .context("shmtrace was not started")?
            .finish()?;
        if !tracer.success() {
            bail!(
                "shmtrace --pid ended with {}: {}",
                tracer.describe_status(),
                last_lines(&tracer.stderr, 3)
            );
        }
        Ok(tracer)
    }

    fn end_sleeper(&mut self) {
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
    }
}

impl Drop for IdleShmtrace {
    /// On an error path: shmtrace follows the sleeper out, and is reaped.
    fn drop(&mut self) {
        self.end_sleeper();
        if let Some(tracer) = self.tracer.take() {
            let _ = tracer.finish();
        }
    }
}

/// Runs the workload untraced beside an [`IdleShmtrace`].
fn run_beside_idle_shmtrace(setup: &Setup, workload: &[OsString]) -> Result<Outcome> {
    let idle = IdleShmtrace::start(setup)?;
    let top = Running::spawn(&mut direct(workload), false)?.finish();
    let tracer = idle.stop()?;
    let reported = Reported {
        lost: Some(reported::lost_from_notices(&tracer.stderr)),
        ..Reported::default()
    };
    outcome_beside(top?, &tracer, None, reported)
}

/// The outcome of a workload run beside a shmtrace started on its own (not running it).
fn outcome_beside(
    top: Finished,
    tracer: &Finished,
    stop_seconds: Option<f64>,
    reported: Reported,
) -> Result<Outcome> {
    if !top.success() {
        bail!(
            "the workload ended with {}: {}",
            top.describe_status(),
            last_lines(&top.stderr, 3)
        );
    }
    Ok(Outcome {
        workload: WorkloadReport::from_stdout(&top.stdout)?,
        tracer: Some(TracerUse {
            cpu_seconds: tracer.own_cpu_seconds,
            peak_rss_kb: tracer.peak_rss_kb,
            stop_seconds,
        }),
        top,
        reported,
    })
}

/// Starts `shmtrace --all`, waits until its probes are attached, runs the workload beside it,
/// then stops it with SIGINT as a user would, timing how long it takes to exit.
fn run_beside_shmtrace_all(setup: &Setup, workload: &[OsString]) -> Result<Outcome> {
    let (top, tracer) = beside_shmtrace_all(setup, |_| {
        Running::spawn(&mut direct(workload), false)?.finish()
    })?;
    let reported = Reported {
        lost: Some(reported::lost_from_notices(&tracer.finished.stderr)),
        failed_reads: Some(reported::failed_reads_from_notices(&tracer.finished.stderr)),
        ..Reported::default()
    };
    outcome_beside(top, &tracer.finished, Some(tracer.stop_seconds), reported)
}

/// `shmtrace --all` after SIGINT.
pub struct StoppedAll {
    pub finished: Finished,
    /// From SIGINT to its exit.
    pub stop_seconds: f64,
}

/// Starts `shmtrace --all -o /dev/null`, waits until its probes are attached, calls `beside`
/// with its pid, then stops it with SIGINT (killed instead if `beside` failed). Its exit
/// status after SIGINT must be 130, as a shell's.
pub fn beside_shmtrace_all<T>(
    setup: &Setup,
    beside: impl FnOnce(u32) -> Result<T>,
) -> Result<(T, StoppedAll)> {
    let mut tracer = Running::spawn(
        Command::new(&setup.shmtrace).args(["--all", "-o", "/dev/null"]),
        false,
    )?;
    let pid = tracer.pid();
    let result = wait_tracing(&tracer).and_then(|()| beside(pid));
    let signalled = Instant::now();
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let result = match result {
        Ok(result) => result,
        Err(error) => {
            tracer.kill();
            let _ = tracer.finish();
            return Err(error);
        }
    };
    let finished = tracer.finish()?;
    let interrupted = libc::WIFEXITED(finished.status) && libc::WEXITSTATUS(finished.status) == 130;
    if !interrupted {
        bail!(
            "shmtrace --all ended with {}: {}",
            finished.describe_status(),
            last_lines(&finished.stderr, 3)
        );
    }
    let stop_seconds = finished.exited_at.duration_since(signalled).as_secs_f64();
    Ok((
        result,
        StoppedAll {
            finished,
            stop_seconds,
        },
    ))
}

/// Waits until shmtrace says it is tracing ("…; Ctrl-C to stop"). It says so once its probes
/// are attached and its signal handlers installed: a SIGINT before then would kill it, not
/// end its trace (exit 130).
pub fn wait_tracing(shmtrace: &Running) -> Result<()> {
    shmtrace
        .wait_for_stderr("Ctrl-C to stop", Duration::from_secs(60))
        .context("shmtrace did not start tracing")
}

/// The floor prints nothing when its program is attached. It is attached once it holds BPF
/// program descriptors and has gone to sleep, with that count steady.
pub fn wait_attached(pid: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut steady = 0;
    let mut last = 0;
    while Instant::now() < deadline {
        let programs = fs::read_dir(format!("/proc/{pid}/fd"))
            .with_context(|| format!("shmtrace ({pid}) exited before attaching"))?
            .flatten()
            .filter(|e| {
                fs::read_link(e.path())
                    .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf-prog")
            })
            .count();
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let sleeping = stat
            .rsplit(") ")
            .next()
            .is_some_and(|rest| rest.starts_with('S'));
        steady = if programs > 0 && programs == last && sleeping {
            steady + 1
        } else {
            0
        };
        last = programs;
        if steady >= 4 {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(50));
    }
    bail!("shmtrace ({pid}) did not attach within a minute")
}

impl WorkloadReport {
    fn from_stdout(lines: &[String]) -> Result<WorkloadReport> {
        let report: serde_json::Value = lines
            .iter()
            .rev()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v.get("seconds").is_some())
            .context("the workload printed no report")?;
        let number = |key: &str| report[key].as_f64().context(format!("report has no {key}"));
        Ok(WorkloadReport {
            loop_seconds: number("seconds")?,
            cpu_seconds: number("cpu_seconds")?,
            calls: report["calls"]
                .as_object()
                .context("report has no calls")?
                .iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                .collect(),
        })
    }
}

fn read_shmtrace(
    sink: Sink,
    output: &Path,
    stderr: &str,
    json: bool,
    failed: bool,
) -> Result<Reported> {
    if sink == Sink::DevNull {
        // The summary went to /dev/null too; losses are also noticed on stderr.
        return Ok(Reported {
            lost: Some(reported::lost_from_notices(stderr)),
            ..Reported::default()
        });
    }
    reported::read_shmtrace_file(output, json, failed)
}

impl Outcome {
    pub fn mismatch(&self) -> Option<String> {
        self.reported.mismatch(&self.workload.calls)
    }
}

pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}
