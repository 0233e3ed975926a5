//! `bystanders`: what host-wide tracing (`shmtrace --all`, `shmtrace daemon`) costs the calls
//! of processes that never touch /dev/shm, and a holder's calls on its other descriptors: web
//! servers, databases, build jobs beside the traced workloads on a node, and a trainer writing
//! its logs.
//!
//! Loops make the calls shmtrace's busiest programs see, each in a process of its own (`cargo
//! xtask bystander`): `write` of 64 bytes to /dev/null (what `dd if=/dev/zero of=/dev/null
//! bs=64` does), `openat` and `close` of /etc/hostname, an anonymous `mmap`/`munmap` of 64 KiB,
//! and a `mmap`/`munmap` of a file's first page. Some run in a process that holds a /dev/shm
//! descriptor and mapping (whose calls shmtrace must look at), some with more than 64
//! descriptors open (a grown descriptor table, as a PyTorch trainer's, read another way by the
//! probes), and some both.
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
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{
    beside::{Beside, Tracer},
    measure::Running,
    probes,
    stats::Spread,
    table::markdown,
    target::{Row, Target},
    target_list,
    variants::Setup,
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
    /// `mmap(4 KiB, MAP_PRIVATE)` of a file (the loop's own program), `munmap`.
    MapFile,
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
    /// Hold 100 more descriptors during the loop, so that the descriptor table has grown past
    /// the 64 slots a process starts with.
    #[arg(long)]
    pub grown_table: bool,
}

/// One loop as the benchmark runs it.
#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    load: Load,
    hold_shm: bool,
    grown_table: bool,
    /// The programs whose runs its calls are (as bpftool names them), with the call each
    /// stands for and the target its run is judged against (`None`: shown, not a target).
    programs: &'static [(&'static str, &'static str, Option<&'static Target>)],
    /// Whether its wall time is compared too, and judged against [`target_list::BYSTANDER_TIMED`]
    /// (`Some(false)`: shown only).
    timed: Option<bool>,
}

const WORKLOADS: [Workload; 10] = [
    Workload {
        name: "write 64 B to /dev/null",
        load: Load::Write,
        hold_shm: false,
        grown_table: false,
        programs: &[(
            "sys_exit_write",
            "write",
            Some(&target_list::BYSTANDER_CALL),
        )],
        timed: Some(true),
    },
    Workload {
        name: "open and close /etc/hostname",
        load: Load::OpenClose,
        hold_shm: false,
        grown_table: false,
        programs: &[
            ("sys_exit_openat", "openat", Some(&target_list::OPEN_CALL)),
            (
                "sys_enter_close",
                "close",
                Some(&target_list::BYSTANDER_CALL),
            ),
        ],
        timed: Some(true),
    },
    Workload {
        name: "mmap and munmap 64 KiB anonymous",
        load: Load::MapUnmap,
        hold_shm: false,
        grown_table: false,
        programs: &[
            ("sys_exit_mmap", "mmap", Some(&target_list::BYSTANDER_CALL)),
            (
                "sys_exit_munmap",
                "munmap",
                Some(&target_list::BYSTANDER_CALL),
            ),
        ],
        timed: Some(false),
    },
    Workload {
        name: "open and close /etc/hostname, 100 descriptors open",
        load: Load::OpenClose,
        hold_shm: false,
        grown_table: true,
        programs: &[
            (
                "sys_exit_openat",
                "openat",
                Some(&target_list::GROWN_TABLE_CALL),
            ),
            (
                "sys_enter_close",
                "close",
                Some(&target_list::BYSTANDER_CALL),
            ),
        ],
        timed: None,
    },
    Workload {
        name: "write 64 B to /dev/null, holding /dev/shm",
        load: Load::Write,
        hold_shm: true,
        grown_table: false,
        programs: &[("sys_exit_write", "write", Some(&target_list::HOLDER_CALL))],
        timed: None,
    },
    Workload {
        name: "open and close /etc/hostname, holding /dev/shm",
        load: Load::OpenClose,
        hold_shm: true,
        grown_table: false,
        programs: &[
            ("sys_exit_openat", "openat", Some(&target_list::OPEN_CALL)),
            ("sys_enter_close", "close", Some(&target_list::HOLDER_CALL)),
        ],
        timed: None,
    },
    Workload {
        name: "mmap and munmap a file's page, holding /dev/shm",
        load: Load::MapFile,
        hold_shm: true,
        grown_table: false,
        // The munmap of a process that mapped /dev/shm is reported, whatever it unmaps: its
        // mappings are kept current, to trace a SIGBUS back to its file.
        programs: &[
            ("sys_exit_mmap", "mmap", Some(&target_list::HOLDER_CALL)),
            ("sys_exit_munmap", "munmap", None),
        ],
        timed: None,
    },
    Workload {
        name: "write 64 B to /dev/null, holding /dev/shm, 100 descriptors open",
        load: Load::Write,
        hold_shm: true,
        grown_table: true,
        programs: &[(
            "sys_exit_write",
            "write",
            Some(&target_list::GROWN_TABLE_CALL),
        )],
        timed: None,
    },
    Workload {
        name: "open and close /etc/hostname, holding /dev/shm, 100 descriptors open",
        load: Load::OpenClose,
        hold_shm: true,
        grown_table: true,
        programs: &[
            (
                "sys_exit_openat",
                "openat",
                Some(&target_list::GROWN_TABLE_CALL),
            ),
            (
                "sys_enter_close",
                "close",
                Some(&target_list::GROWN_TABLE_CALL),
            ),
        ],
        timed: None,
    },
    Workload {
        name: "mmap and munmap a file's page, holding /dev/shm, 100 descriptors open",
        load: Load::MapFile,
        hold_shm: true,
        grown_table: true,
        programs: &[
            (
                "sys_exit_mmap",
                "mmap",
                Some(&target_list::GROWN_TABLE_CALL),
            ),
            ("sys_exit_munmap", "munmap", None),
        ],
        timed: None,
    },
];

/// `cargo xtask bystander`: prints `{"ready":true}`, waits for a line on stdin, runs the
/// loop, prints `{"seconds":S}`, and waits for stdin to close.
pub fn run_loop(args: &BystanderArgs) -> Result<()> {
    if !args.grown_table && table_size()? > EMBEDDED_FDS {
        // This process's descriptor table grew at its fork: its parent had a descriptor above
        // 63 open (bash keeps 255; any inherited one does). A table never shrinks, but a
        // child's is sized by the open descriptors of the process that forks it: with all but
        // the standard three closed, the child starts with the table a process starts with.
        // Once only: a child that still has a grown table fails, rather than fork again.
        if std::env::var_os(RESPAWNED).is_some() {
            bail!(
                "the loop's descriptor table has {} slots in a child started with three descriptors",
                table_size()?
            );
        }
        // SAFETY: closes descriptors this process does not use: nothing but the standard
        // three is open on purpose at the loop's start.
        if unsafe { libc::close_range(3, u32::MAX, 0) } != 0 {
            return Err(std::io::Error::last_os_error()).context("closing inherited descriptors");
        }
        let status = Command::new(std::env::current_exe()?)
            .args(std::env::args_os().skip(1))
            .env(RESPAWNED, "1")
            .status()
            .context("running the loop in a child")?;
        std::process::exit(status.code().unwrap_or(1));
    }
    let _held = args.hold_shm.then(HeldShm::create).transpose()?;
    let _descriptors = args.grown_table.then(grow_table).transpose()?;
    let fd_table = table_size()?;
    if args.grown_table != (fd_table > EMBEDDED_FDS) {
        bail!("the loop's descriptor table has {fd_table} slots");
    }
    println!("{}", json!({ "ready": true, "fd_table": fd_table }));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let started = Instant::now();
    match args.load {
        Load::Write => write_loop(args.iterations)?,
        Load::OpenClose => open_loop(args.iterations)?,
        Load::MapUnmap => map_loop(args.iterations)?,
        Load::MapFile => map_file_loop(args.iterations)?,
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

fn map_file_loop(iterations: u64) -> Result<()> {
    const LEN: usize = 4096;
    let file = std::fs::File::open(std::env::current_exe()?)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    for _ in 0..iterations {
        // SAFETY: a private read-only mapping of our own file, unmapped at once.
        unsafe {
            let at = libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                fd,
                0,
            );
            if at == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error()).context("mmap of a file");
            }
            libc::munmap(at, LEN);
        }
    }
    Ok(())
}

/// The slots of this process's descriptor table (`FDSize` in /proc/self/status).
fn table_size() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("FDSize:"))
        .and_then(|size| size.trim().parse().ok())
        .context("no FDSize in /proc/self/status")
}

/// Set in the loop's environment when it runs itself again in a child (`run_loop`).
const RESPAWNED: &str = "SHMTRACE_BYSTANDER_RESPAWNED";

/// The slots of the descriptor table a process starts with (`NR_OPEN_DEFAULT`).
const EMBEDDED_FDS: u64 = 64;

/// Has the probes meet a tmpfs directory and a tmpfs regular file, as they do at once on any
/// host (daemons open what is under /run): they learn such files' operations, which rule out
/// the other files of a grown descriptor table with one read (docs/probes.md). From a child
/// that exits: host-wide, a process is followed from its first /dev/shm call on, and so is
/// every process it starts afterwards. Done in this process, it made every loop a followed
/// one, and the loops of processes "holding nothing" measured a holder's cost (a write at
/// 106-114 ns in this bench, against 70 in the same loop started elsewhere).
fn show_tmpfs_files() -> Result<()> {
    let path = format!("/dev/shm/shmtrace-bystander-warm-{}", std::process::id());
    let status = Command::new("sh")
        .args([
            "-c",
            r#"ls /dev/shm >/dev/null && : >"$1" && rm "$1""#,
            "sh",
        ])
        .arg(&path)
        .status()
        .context("running sh to list /dev/shm and make a file there")?;
    if !status.success() {
        bail!("listing /dev/shm and making {path} failed: {status}");
    }
    Ok(())
}

/// 100 descriptors of /dev/null, held: the descriptor table grows past the 64 slots a
/// process starts with.
fn grow_table() -> Result<Vec<std::fs::File>> {
    (0..100)
        .map(|_| std::fs::File::open("/dev/null").context("opening /dev/null"))
        .collect()
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
            Load::MapFile => "map-file",
        })
        .arg("--iterations")
        .arg(iterations.to_string());
    if workload.hold_shm {
        command.arg("--hold-shm");
    }
    if workload.grown_table {
        command.arg("--grown-table");
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
        "## bystanders: what host-wide tracing costs calls that do not concern /dev/shm\n\n\
         The bound of each program's run is the target's; `-`: shown, not a target.\n\n",
    );
    let mut rows = Vec::new();

    // Per program, with statistics on: one pass beside each tracer.
    let mut costs: BTreeMap<(&str, &str), BTreeMap<&str, f64>> = BTreeMap::new();
    {
        let _stats = probes::enable_stats()?;
        for beside in [Beside::Floor, Beside::All, Beside::Daemon] {
            let tracer = Tracer::start(beside, setup, exe)?;
            let result = (|| -> Result<()> {
                show_tmpfs_files()?;
                for workload in &WORKLOADS {
                    let run = run_workload(exe, workload, iterations, tracer.pid())?;
                    for (program, call, _) in workload.programs {
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
        for (_, call, program_target) in workload.programs {
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
                program_target.map_or("-".to_owned(), |t| t.bound.to_owned()),
            ]);
            let worst = [Beside::All, Beside::Daemon]
                .iter()
                .filter_map(|b| figures.get(b.name()))
                .fold(f64::NAN, |a, b| a.max(*b));
            if let (Some(floor), Some(target)) = (floor, program_target) {
                rows.push(verdicts::bystander_call(
                    target,
                    &format!("{call}, {}", workload.name),
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
                for workload in WORKLOADS.iter().filter(|w| w.timed.is_some()) {
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
    for workload in WORKLOADS.iter().filter(|w| w.timed.is_some()) {
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
        if workload.timed == Some(true) {
            rows.push(verdicts::bystander_timed(workload.name, ratio, rounds));
        }
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
