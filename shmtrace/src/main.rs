//! shmtrace: explain why programs in containers run out of shared memory.
//!
//! The pipeline: `bpf` (probes in the kernel, ring buffer) -> `event` (decoded records) ->
//! `model` (processes and /dev/shm objects) -> `output` (text, JSON, summary). `target` says
//! what to trace, `session` runs a live trace, `demo` is the built-in demonstration.
mod bpf;
mod cli;
mod container;
mod demo;
mod event;
mod model;
mod output;
mod proc_scan;
mod session;
mod target;

use std::{
    collections::HashSet,
    ffi::OsString,
    fs::File,
    io::{self, IsTerminal},
    process::ExitCode,
};

use anyhow::{Context, Result, bail};
use clap::Parser;

use crate::{
    bpf::{Tracer, TracerOptions},
    cli::{Cli, Command, OutputArgs, TraceArgs},
    event::ExitStatus,
    model::World,
    output::{Clock, Format, Output},
    session::{Ending, Session},
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("shmtrace: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Some(Command::Demo { output }) => demo(output),
        Some(Command::DemoWorkload) => demo::workload(),
        None => trace(cli.trace),
    }
}

/// What a live trace follows.
enum What {
    Command(Vec<OsString>),
    Pids(Vec<u32>),
    All,
}

fn trace(args: TraceArgs) -> Result<ExitCode> {
    let what = if !args.command.is_empty() {
        if !args.pid.is_empty() || args.all {
            bail!("give either a command after --, or --pid/--all, not both");
        }
        What::Command(args.command)
    } else if args.all {
        What::All
    } else if !args.pid.is_empty() {
        target::check_pids(&args.pid)?;
        What::Pids(args.pid)
    } else {
        bail!(
            "nothing to trace: give a command after --, --pid PID, or --all \
             (or try `shmtrace demo`; see shmtrace --help)"
        );
    };
    let options = TracerOptions {
        all: matches!(what, What::All),
        failed_only: args.failed,
        ring_buffer_bytes: args.buffer_size,
        ..TracerOptions::default()
    };
    live(what, options, &args.output, args.failed)
}

fn demo(output: OutputArgs) -> Result<ExitCode> {
    let exe = std::env::current_exe().context("finding shmtrace's own executable")?;
    println!(
        "shmtrace demo: a PyTorch-like DataLoader runs in a private mount namespace whose \
         /dev/shm is a {} tmpfs, and runs out of it.\n",
        demo::SHM_SIZE
    );
    let command = vec![exe.into_os_string(), OsString::from("__demo-workload")];
    // The demo's own output goes to stdout, whatever a traced command would do.
    let mut output = output;
    if output.output.is_none() {
        output.output = Some("/dev/stdout".into());
    }
    let code = live(
        What::Command(command),
        TracerOptions::default(),
        &output,
        false,
    )?;
    if code == ExitCode::from(demo::WORKLOAD_STATUS as u8) {
        Ok(ExitCode::SUCCESS)
    } else {
        bail!("the demo workload did not fail the way it should have")
    }
}

fn live(
    what: What,
    options: TracerOptions,
    out: &OutputArgs,
    failed_only: bool,
) -> Result<ExitCode> {
    init_logging(out.verbose);
    let mut tracer = Tracer::load(&options)?;
    target::register_shm_devs(&mut tracer, options.all)?;
    let mut world = World::new();
    let clock = Clock::now();
    let now_ns = now_boot_ns();

    // Fork the command before any thread exists (the async runtime starts below).
    let paused = match &what {
        What::Command(argv) => {
            let paused = target::spawn_paused(argv)?;
            tracer.add_target(paused.pid())?;
            Some(paused)
        }
        _ => None,
    };
    let pids = match &what {
        What::Pids(roots) => target::register_pids(&mut tracer, &mut world, roots, now_ns)?,
        _ => Vec::new(),
    };
    let output = open_output(out, matches!(what, What::Command(_)), clock, failed_only)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let ending = match (what, paused) {
        (What::Command(_), Some(paused)) => Ending::Command(paused.start()?),
        (What::Pids(_), _) => Ending::Pids(pids.into_iter().collect::<HashSet<u32>>()),
        _ => Ending::Interrupt,
    };
    let outcome = runtime.block_on(Session::new(tracer, world, output, out.verbose).run(ending))?;
    Ok(match (outcome.command_status, outcome.interrupted) {
        (Some(status), _) => ExitCode::from(status_byte(status)),
        (None, true) => ExitCode::from(130),
        (None, false) => ExitCode::SUCCESS,
    })
}

fn status_byte(status: ExitStatus) -> u8 {
    status.shell_status().clamp(0, 255) as u8
}

fn open_output(
    out: &OutputArgs,
    command_mode: bool,
    clock: Clock,
    failed_only: bool,
) -> Result<Output> {
    let (writer, terminal, to_file): (Box<dyn io::Write + Send>, bool, bool) = match &out.output {
        Some(path) => {
            let file = File::create(path)
                .with_context(|| format!("cannot write the trace to {}", path.display()))?;
            let terminal = file.is_terminal();
            let text = path.to_string_lossy();
            let is_stdio = text.starts_with("/dev/std") || text.starts_with("/dev/fd/");
            (Box::new(io::LineWriter::new(file)), terminal, !is_stdio)
        }
        None if command_mode => (Box::new(io::stderr()), io::stderr().is_terminal(), false),
        None => (
            Box::new(io::LineWriter::new(io::stdout())),
            io::stdout().is_terminal(),
            false,
        ),
    };
    let format = if out.json {
        Format::Json
    } else {
        Format::Human(out.color.enabled(terminal))
    };
    Ok(Output::new(writer, format, clock, failed_only, to_file))
}

fn init_logging(verbose: bool) {
    let level = if verbose { "debug" } else { "warn" };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_target(false)
        .try_init();
}

fn now_boot_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}
