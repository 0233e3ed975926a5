//! `shmtrace [OPTIONS] -- COMMAND` / `--pid` / `--all`: live tracing to the terminal.
use std::process::ExitCode;

use anyhow::Result;

use super::{DefaultStream, init_logging, open_output_args};
use crate::{
    cli::{OutputArgs, TargetArgs},
    clock::Clock,
    diagnose::Diagnoser,
    kernel_ids,
    live::launch::{self, What},
    live::session::Outcome,
    model::World,
    output::filter::Filter,
    pipeline::Pipeline,
};

pub fn run(target: &TargetArgs, output: &OutputArgs) -> Result<ExitCode> {
    init_logging(output.verbose);
    let what = What::from_args(target)?;
    let options = launch::tracer_options(&what, target);
    let default = if what.is_command() {
        DefaultStream::Stderr
    } else {
        DefaultStream::Stdout
    };
    let outcome = launch::run(
        what,
        &options,
        |_| pipeline(output, default, target.failed),
        output.verbose,
    )?;
    Ok(exit_code(&outcome))
}

/// The pipeline of a live trace shown on the terminal (`default` when no file is named).
pub fn pipeline(
    output: &OutputArgs,
    default: DefaultStream,
    failed_only: bool,
) -> Result<Pipeline> {
    let output = open_output_args(output, default, Clock::now())?;
    let filter = if failed_only {
        Filter::failed_only()
    } else {
        Filter::default()
    };
    Ok(Pipeline::new(
        World::new(),
        host_diagnoser(),
        output,
        filter,
    ))
}

/// A diagnoser that calls shmtrace's own mount namespace `host`.
pub fn host_diagnoser() -> Diagnoser {
    Diagnoser::new(kernel_ids::mount_namespace(std::process::id()).unwrap_or(0))
}

/// The traced command's status, 130 after Ctrl-C, 0 otherwise.
pub fn exit_code(outcome: &Outcome) -> ExitCode {
    match (outcome.command_status, outcome.interrupted) {
        (Some(status), _) => ExitCode::from(status.shell_status().clamp(0, 255) as u8),
        (None, true) => ExitCode::from(130),
        (None, false) => ExitCode::SUCCESS,
    }
}
