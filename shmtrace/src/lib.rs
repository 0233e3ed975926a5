//! shmtrace: explain why programs in containers run out of shared memory.
//!
//! The analysis lives in the `shmtrace-core` library: `event` (decoded records) -> `model`
//! (processes and /dev/shm objects) -> `diagnose` (roles, failures, advice) -> `output` (text,
//! JSON, summary), with `record` as a tap that writes trace files and `report` as an observer
//! that draws a recorded trace (HTML, Perfetto); `pipeline` runs records through those steps.
//! This crate adds `live` (the probes, the session that feeds the pipeline from the kernel,
//! the watcher, the targets, the demo), `container` (the runtimes' APIs) and `commands` (the
//! subcommands); `main.rs` only parses the command line and runs one. It is a library as
//! well as a binary so that the tests of the container runtimes, which need the runtimes
//! running, live in the tests crate (`tests/tests/docker_*.rs`, ...) and not in here.
//! See docs/architecture.md.
pub mod child;
pub mod cli;
pub mod commands;
pub mod container;
pub mod daemon;
pub mod kernel_ids;
pub mod live;
pub mod ptrace;

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::{Cli, Command};

/// The first line of `--help`: which source a trace would use here, and why.
pub fn mode_here() -> String {
    match (live::bpf::check_privileges(), ptrace::usable()) {
        (Ok(()), _) => "Here: eBPF probes (this process may load them).".to_owned(),
        (Err(_), Ok(())) => "Here: ptrace, unprivileged (no root, CAP_BPF or CAP_PERFMON for the \
                             eBPF probes): commands and your own processes, not --container or \
                             --all; `shmtrace check` needs nothing."
            .to_owned(),
        (Err(_), Err(why)) => format!(
            "Here: no tracing: no root, CAP_BPF or CAP_PERFMON for the eBPF probes, and {why}."
        ),
    }
}

/// Runs the command `cli` names.
pub fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        None => commands::trace::run(&cli.target, &cli.output),
        Some(Command::Record(args)) => commands::record::run(&args),
        // `--size` conflicts with `--redact`, `--html` and `--perfetto`: the advice alone.
        Some(Command::Report(args)) if args.size => commands::size::from_trace(&args),
        Some(Command::Report(args)) => commands::replay::report(&args),
        Some(Command::Show(args)) => commands::replay::show(&args),
        Some(Command::Size(args)) => commands::size::run(&args),
        Some(Command::Check(args)) => commands::check::run(&args),
        Some(Command::Daemon(args)) => daemon::run(&args),
        Some(Command::Demo { output }) => commands::demo::run(&output),
        Some(Command::DemoWorkload) => live::demo::workload(),
    }
}
