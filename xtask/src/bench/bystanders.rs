//! `bystanders`: what host-wide tracing (`shmtrace --all`, `shmtrace daemon`) costs the calls
//! of processes that never touch /dev/shm: web servers, databases, build jobs beside the
//! traced workloads on a node.
//!
//! Three loops make the calls shmtrace's busiest programs see, each in a process of its own
//! (`cargo xtask bystander`): `write` of 64 bytes to /dev/null (what `dd if=/dev/zero
//! of=/dev/null bs=64` does), `openat` and `close` of /etc/hostname, and an anonymous
//! `mmap`/`munmap` of 64 KiB. A fourth runs the write loop in a process that holds a /dev/shm
//! descriptor and mapping (a trainer writing its logs), whose calls shmtrace must look at.
//!
//! Two measurements, each against the floor (the same hooks with empty programs,
//! `floor.rs`):
//! - **per program**: the kernel's run-time statistics (`probes.rs`) around each loop, as
//!   nanoseconds per run of each program the loop's calls run, beside shmtrace and beside the
//!   floor; the ratio is the targets' figure;
//! - **timed**: each loop's own wall time beside the daemon, beside the floor and beside
//!   nothing, in rounds that interleave them, medians compared.
use std::{
    collections::BTreeMap,
    ffi::CString,
    os::unix::process::CommandExt,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{
    daemon::Daemon,
    measure::Running,
    probes,
    stats::Spread,
    table::markdown,
    target::Row,
    variants::{self, Setup},
    verdicts,
};

/// The calls a loop makes, one set per iteration.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Load {
    /// `write(/dev/null, 64 bytes)`.
    Write,
    /// `openat("/etc/hostname")`, `close`.
    OpenClose,
    /// `mmap(64 KiB, MAP_PRIVATE | MAP_ANONYMOUS)`, `munmap`.
    MapUnmap,
}

/// Options of the loop (`cargo xtask bystander`).
#[derive(clap::Args, Clone, Debug)]
pub struct BystanderArgs {
    #[arg(long, value_enum)]
    pub load: Load,
    #[arg(long, default_value_t = 1_000_000)]
    pub iterations: u64,
    /// Hold an open, mapped /dev/shm file during the loop.
    #[arg(long)]
    pub hold_shm: bool,
}

/// One loop as the benchmark runs it.
#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    load: Load,
    hold_shm: bool,
    /// The programs whose runs its calls are (as bpftool names them), with
    /// the call each stands for.
    programs: &'static [(&'static str, &'static str)],
}

const WORKLOADS: [Workload; 4] = [
    Workload {
        name: "write 64 B to /dev/null",
        load: Load::Write,
        hold_shm: false,
        programs: &[("sys_exit_write", "write")],
    },
    Workload {
        name: "open and close /etc/hostname",
        load: Load::OpenClose,
        hold_shm: false,
        programs: &[
            ("sys_enter_openat", "openat (entry)"),
            ("sys_exit", "openat (exit)"),
            ("sys_enter_close", "close"),
        ],
    },
    Workload {
        name: "mmap and munmap 64 KiB anonymous",
        load: Load::MapUnmap,
        hold_shm: false,
        programs: &[("sys_exit_mmap", "mmap"), ("sys_exit_munmap", "munmap")],
    },
    Workload {
        name: "write 64 B to /dev/null, holding /dev/shm",
        load: Load::Write,
        hold_shm: true,
        programs: &[("sys_exit_write", "write")],
    },
];

/// `cargo xtask bystander`: prints `{"ready":true}`, waits for a line on stdin, runs the
/// loop, prints `{"seconds":S}`, and waits for stdin to close.
pub fn run_loop(args: &BystanderArgs) -> Result<()> {
    let _held = args.hold_shm.then(HeldShm::create).transpose()?;
    println!("{}", json!({ "ready": true }));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let started = Instant::now();
    match args.load {
        Load::Write => write_loop(args.iterations)?,
        Load::OpenClose => open_loop(args.iterations)?,
        Load::MapUnmap => map_loop(args.iterations)?,
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("{}", json!({ "seconds": seconds }));
    while std::io::stdin().read_line(&mut line)? > 0 {}
    Ok(())
}

fn write_loop(iterations: u64) -> Result<()> {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&null);
    let buf = [0u8; 64];
    for _ in 0..iterations {
        // SAFETY: a valid descriptor and buffer.
        if unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) } != 64 {
            return Err(std::io::Error::last_os_error()).context("writing to /dev/null");
        }
    }
    Ok(())
}

fn open_loop(iterations: u64) -> Result<()> {
    let path = c"/etc/hostname";
    for _ in 0..iterations {
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("opening /etc/hostname");
        }
        // SAFETY: a descriptor this loop opened.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

fn map_loop(iterations: u64) -> Result<()> {
    const LEN: usize = 64 << 10;
    for _ in 0..iterations {
        // SAFETY: an anonymous mapping, unmapped at once.
        unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if at == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error()).context("mmap");
            }
            libc::munmap(at, LEN);
        }
    }
    Ok(())
}

/// A /dev/shm file held open and mapped, removed from the directory at once so that nothing
/// is left behind.
struct HeldShm {
    _fd: std::os::fd::OwnedFd,
}

impl HeldShm {
    fn create() -> Result<HeldShm> {
        let path = CString::new(format!(
            "/dev/shm/shmtrace-bystander-{}",
            std::process::id()
        ))?;
        // SAFETY: a NUL-terminated path; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("creating a /dev/shm file");
        }
        // SAFETY: a new descriptor nothing else owns.
        let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: plain calls on our descriptor; the mapping is left for the process's exit.
        unsafe {
            libc::unlink(path.as_ptr());
            if libc::ftruncate(fd, 1 << 20) != 0 {
                return Err(std::io::Error::last_os_error()).context("sizing a /dev/shm file");
            }
            let at = libc::mmap(
                std::ptr::null_mut(),
                1 << 20,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if at == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error()).context("mapping a /dev/shm file");
            }
            *(at as *mut u8) = 1;
        }
        Ok(HeldShm { _fd: owned })
    }
}

/// What runs beside the loops.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beside {
    Nothing,
    Floor,
    All,
    Daemon,
}

impl Beside {
    fn name(self) -> &'static str {
        match self {
            Beside::Nothing => "nothing",
            Beside::Floor => "empty programs",
            Beside::All => "shmtrace --all",
            Beside::Daemon => "shmtrace daemon",
        }
    }
}

/// A tracer running beside the loops, holding its programs.
enum Tracer {
    None,
    Process(Running),
    Daemon(Daemon),
}

impl Tracer {
    fn start(beside: Beside, setup: &Setup, exe: &Path) -> Result<Tracer> {
        let running = |command: &mut Command| -> Result<Tracer> {
            // A group of its own, stopped as one: the floor's `sleep` goes with it.
            let running = Running::spawn(command.process_group(0), false)?;
            variants::wait_attached(running.pid())?;
            Ok(Tracer::Process(running))
        };
        match beside {
            Beside::Nothing => Ok(Tracer::None),
            Beside::Floor => running(Command::new(exe).args(["floor", "--", "sleep", "3600"])),
            Beside::All => {
                running(Command::new(&setup.shmtrace).args(["--all", "-o", "/dev/null"]))
            }
            Beside::Daemon => Ok(Tracer::Daemon(Daemon::start(
                &setup.shmtrace,
                &setup.scratch,
                "bystanders",
            )?)),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Tracer::None => None,
            Tracer::Process(running) => Some(running.pid()),
            Tracer::Daemon(daemon) => Some(daemon.pid()),
        }
    }

    /// Stops it, and waits until the kernel has let go of its programs, so that the next
    /// tracer's start is not slowed by their release.
    fn stop(self) -> Result<()> {
        match self {
            Tracer::None => return Ok(()),
            Tracer::Process(running) => {
                // SAFETY: signalling the process group of our own child, which leads it.
                unsafe { libc::kill(-(running.pid() as libc::pid_t), libc::SIGTERM) };
                running.finish()?;
            }
            Tracer::Daemon(daemon) => drop(daemon),
        }
        super::measure::wait_for_background_detach()?;
        Ok(())
    }
}

/// One loop's run: its own loop time, and the tracer's program counters around it.
struct LoopRun {
    seconds: f64,
    /// Program name → (nanoseconds, runs) during the loop.
    programs: BTreeMap<String, (u64, u64)>,
}

fn run_workload(
    exe: &Path,
    workload: &Workload,
    iterations: u64,
    tracer: Option<u32>,
) -> Result<LoopRun> {
    let mut command = Command::new(exe);
    command
        .args(["bystander", "--load"])
        .arg(match workload.load {
            Load::Write => "write",
            Load::OpenClose => "open-close",
            Load::MapUnmap => "map-unmap",
        })
        .arg("--iterations")
        .arg(iterations.to_string());
    if workload.hold_shm {
        command.arg("--hold-shm");
    }
    let mut running = Running::spawn(&mut command, true)?;
    running
        .wait_for_line(|l| l.contains("\"ready\""))
        .context("the loop did not start")?;
    let before = tracer.map(probes::snapshot).transpose()?;
    running.send_line("go")?;
    let report = running
        .wait_for_line(|l| l.contains("\"seconds\""))
        .context("the loop did not finish")?;
    let after = tracer.map(probes::snapshot).transpose()?;
    running.close_stdin();
    let finished = running.finish()?;
    if !finished.success() {
        bail!(
            "the {} loop ended with {}",
            workload.name,
            finished.describe_status()
        );
    }
    let report: Value = serde_json::from_str(&report)?;
    let mut programs = BTreeMap::new();
    if let (Some(before), Some(after)) = (before, after) {
        let names = probes::program_names()?;
        for (id, (ns, runs)) in &after {
            let (ns0, runs0) = before.get(id).copied().unwrap_or((0, 0));
            let name = names.get(id).cloned().unwrap_or_else(|| format!("id {id}"));
            let entry = programs.entry(name).or_insert((0, 0));
            entry.0 += ns - ns0;
            entry.1 += runs - runs0;
        }
    }
    Ok(LoopRun {
        seconds: report["seconds"].as_f64().context("no loop time")?,
        programs,
    })
}

/// Nanoseconds per run of `program` in `run`, if it ran.
fn per_run(run: &LoopRun, program: &str) -> Option<f64> {
    let (ns, runs) = run.programs.get(program)?;
    (*runs > 0).then(|| *ns as f64 / *runs as f64)
}

/// The section of the report, its target rows, and the JSON saved.
pub fn measure(setup: &Setup, exe: &Path, quick: bool) -> Result<(String, Vec<Row>, Value)> {
    let iterations: u64 = if quick { 300_000 } else { 1_000_000 };
    let rounds = if quick { 3 } else { 5 };
    let mut text = String::from(
        "## bystanders: what host-wide tracing costs calls that do not concern /dev/shm\n\n",
    );
    let mut rows = Vec::new();

    // Per program, with statistics on: one pass beside each tracer.
    let mut costs: BTreeMap<(&str, &str), BTreeMap<&str, f64>> = BTreeMap::new();
    {
        let _stats = probes::enable_stats()?;
        for beside in [Beside::Floor, Beside::All, Beside::Daemon] {
            let tracer = Tracer::start(beside, setup, exe)?;
            let result = (|| -> Result<()> {
                for workload in &WORKLOADS {
                    let run = run_workload(exe, workload, iterations, tracer.pid())?;
                    for (program, call) in workload.programs {
                        // The floor is one empty program on every hook.
                        let name = if beside == Beside::Floor {
                            "floor"
                        } else {
                            program
                        };
                        if let Some(ns) = per_run(&run, name) {
                            costs
                                .entry((workload.name, call))
                                .or_default()
                                .insert(beside.name(), ns);
                        }
                    }
                }
                Ok(())
            })();
            tracer.stop()?;
            result?;
        }
    }
    let mut cells = vec![vec![
        "loop".to_owned(),
        "call".to_owned(),
        "empty program, ns/run".to_owned(),
        "shmtrace --all".to_owned(),
        "daemon".to_owned(),
        "bound".to_owned(),
    ]];
    let mut saved_costs = Vec::new();
    for workload in &WORKLOADS {
        for (_, call) in workload.programs {
            let Some(figures) = costs.get(&(workload.name, *call)) else {
                continue;
            };
            let floor = figures.get(Beside::Floor.name()).copied();
            let cell = |beside: Beside| match (figures.get(beside.name()), floor) {
                (Some(ns), Some(floor)) => format!("{ns:.0} ({:.2}×)", ns / floor),
                (Some(ns), None) => format!("{ns:.0}"),
                _ => "-".to_owned(),
            };
            cells.push(vec![
                workload.name.to_owned(),
                (*call).to_owned(),
                floor.map_or("-".to_owned(), |f| format!("{f:.0}")),
                cell(Beside::All),
                cell(Beside::Daemon),
                verdicts::bystander_target(workload.hold_shm)
                    .bound
                    .to_owned(),
            ]);
            let worst = [Beside::All, Beside::Daemon]
                .iter()
                .filter_map(|b| figures.get(b.name()))
                .fold(f64::NAN, |a, b| a.max(*b));
            if let Some(floor) = floor {
                rows.push(verdicts::bystander_call(
                    call,
                    workload.hold_shm,
                    worst,
                    floor,
                ));
            }
            saved_costs.push(json!({
                "loop": workload.name, "call": call,
                "ns_per_run": figures,
            }));
        }
    }
    text.push_str(&format!(
        "Per program, {iterations} iterations a loop (BPF run-time statistics):\n\n{}\n",
        markdown(&cells)
    ));

    // Timed, statistics off, interleaved round by round.
    let order = [Beside::Nothing, Beside::Floor, Beside::Daemon];
    let mut times: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
    for _ in 0..rounds {
        for beside in order {
            let tracer = Tracer::start(beside, setup, exe)?;
            // Let the tracer's start-up work (the daemon's first survey) pass.
            std::thread::sleep(Duration::from_millis(500));
            let result = (|| -> Result<()> {
                for workload in WORKLOADS.iter().filter(|w| !w.hold_shm) {
                    let run = run_workload(exe, workload, iterations, None)?;
                    times
                        .entry((workload.name, beside.name()))
                        .or_default()
                        .push(run.seconds);
                }
                Ok(())
            })();
            tracer.stop()?;
            result?;
        }
    }
    let mut cells = vec![vec![
        "loop".to_owned(),
        "beside nothing".to_owned(),
        "beside empty programs".to_owned(),
        "beside the daemon".to_owned(),
        "daemon / empty".to_owned(),
    ]];
    let mut saved_times = Vec::new();
    for workload in WORKLOADS.iter().filter(|w| !w.hold_shm) {
        let spread = |beside: Beside| {
            times
                .get(&(workload.name, beside.name()))
                .and_then(|t| Spread::of(t))
        };
        let (Some(nothing), Some(floor), Some(daemon)) = (
            spread(Beside::Nothing),
            spread(Beside::Floor),
            spread(Beside::Daemon),
        ) else {
            continue;
        };
        let ratio = daemon.median / floor.median;
        let ms = |s: &Spread| {
            format!(
                "{:.0} ms ({:.0}–{:.0})",
                s.median * 1e3,
                s.min * 1e3,
                s.max * 1e3
            )
        };
        cells.push(vec![
            workload.name.to_owned(),
            ms(&nothing),
            ms(&floor),
            ms(&daemon),
            format!("{ratio:.3}"),
        ]);
        rows.push(verdicts::bystander_timed(workload.name, ratio, rounds));
        saved_times.push(json!({
            "loop": workload.name,
            "seconds": {
                "nothing": times.get(&(workload.name, Beside::Nothing.name())),
                "floor": times.get(&(workload.name, Beside::Floor.name())),
                "daemon": times.get(&(workload.name, Beside::Daemon.name())),
            },
        }));
    }
    text.push_str(&format!(
        "\nTimed, {rounds} rounds interleaved, {iterations} iterations a loop (the loop's own wall time; median, range):\n\n{}\n",
        markdown(&cells)
    ));
    Ok((
        text,
        rows,
        json!({ "iterations": iterations, "costs": saved_costs, "times": saved_times }),
    ))
}
