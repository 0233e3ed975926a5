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
        // The reader of the output went away (`| head -1`): end quietly, with the status of
        // a tool killed by SIGPIPE, as other command-line tools do.
        Err(error) if broken_pipe(&error) => ExitCode::from(128 + libc::SIGPIPE as u8),
        Err(error) => {
            eprintln!("shmtrace: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        None => commands::trace::run(&cli.target, &cli.output),
        Some(Command::Record(args)) => commands::record::run(&args),
        Some(Command::Report(args)) => commands::replay::report(&args),
        Some(Command::Show(args)) => commands::replay::show(&args),
        Some(Command::Demo { output }) => live::demo::run(&output),
        Some(Command::DemoWorkload) => live::demo::workload(),
    }
}
