//! shmtrace: explain why programs in containers run out of shared memory.
//!
//! The analysis lives in the `shmtrace-core` library: `event` (decoded records) -> `model`
//! (processes and /dev/shm objects) -> `diagnose` (roles, failures, advice) -> `output` (text,
//! JSON, summary), with `record` as a tap that writes trace files and `report` as an observer
//! that draws a recorded trace (HTML, Perfetto); `pipeline` runs records through those steps.
//! This binary adds `live` (the probes, the session that feeds the pipeline from the kernel,
//! the watcher, the targets, the demo), `container` (the runtimes' APIs) and `commands` (the
//! subcommands). See docs/architecture.md.
mod cli;
mod commands;
mod container;
mod daemon;
mod live;

// The core's modules, under the names the binary's modules use (`crate::record::...`).
use shmtrace_core::{clock, diagnose, event, model, output, pipeline, record, report, size};

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
        Some(Command::Demo { output }) => live::demo::run(&output),
        Some(Command::DemoWorkload) => live::demo::workload(),
    }
}
