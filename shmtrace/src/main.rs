//! shmtrace: explain why programs in containers run out of shared memory.
//!
//! The pipeline: `bpf` (probes in the kernel, ring buffer) -> `event` (decoded records) ->
//! `model` (processes and /dev/shm objects) -> `diagnose` (roles, failures, advice) ->
//! `output` (text, JSON, summary), with `record` as a tap that writes trace files and `report`
//! as an observer that draws a recorded trace (HTML, Perfetto).
//! `pipeline` runs records through those steps, `session` feeds it live, `commands` are the
//! subcommands, `target` says what to trace, `demo` is the built-in demonstration.
mod bpf;
mod cli;
mod commands;
mod container;
mod daemon;
mod demo;
mod diagnose;
mod event;
mod model;
mod output;
mod pipeline;
mod proc_scan;
mod record;
mod report;
mod session;
mod target;
mod watch;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::cli::{Cli, Command};

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
        None => commands::trace::run(&cli.target, &cli.output),
        Some(Command::Record(args)) => commands::record::run(&args),
        Some(Command::Report(args)) => commands::replay::report(&args),
        Some(Command::Show(args)) => commands::replay::show(&args),
        Some(Command::Daemon(args)) => daemon::run(&args),
        Some(Command::Demo { output }) => demo::run(&output),
        Some(Command::DemoWorkload) => demo::workload(),
    }
}
