//! `shmtrace [OPTIONS] -- COMMAND` / `--pid` / `--all`: live tracing to the terminal.
use std::process::ExitCode;

use anyhow::Result;

use super::{DefaultStream, init_logging, open_output_args};
use crate::{
    cli::{OutputArgs, TargetArgs},
    kernel_ids,
    live::launch::{self, What},
    live::session::Outcome,
};
use shmtrace_core::{
    clock::Clock,
    diagnose::Diagnoser,
    model::{QUIET_LINGER_NS, Retention, World},
    output::filter::Filter,
    pipeline::Pipeline,
};

pub fn run(target: &TargetArgs, output: &OutputArgs) -> Result<ExitCode> {
    init_logging(output.verbose);
    let what = What::from_args(target)?;
    let options = launch::options(&what, target);
    let default = if what.is_command() {
        DefaultStream::Stderr
    } else {
        DefaultStream::Stdout
    };
    let host_wide = matches!(what, What::All { .. });
    let outcome = launch::run(what, &options, |_| {
        let world = if host_wide {
            World::new().with_retention(HOST_WIDE)
        } else {
            World::new()
        };
        pipeline_of(world, output, default, target.failed)
    })?;
    Ok(exit_code(&outcome))
}

/// What a host-wide trace (`--all`) keeps of what ended: it may run for days beside every
/// process on the host, so its memory must not grow with their number. A process that
/// ended quietly (status 0, holding nothing, no failure) is forgotten half a second after
/// its exit; any other after a minute, as the daemon does by default, for the diagnoses that
/// follow a death. The caps are the daemon's; what they drop is counted and shown.
const HOST_WIDE: Retention = Retention {
    linger_ns: 60_000_000_000,
    quiet_linger_ns: QUIET_LINGER_NS,
    max_processes: 32_768,
    max_objects: 32_768,
};

/// The pipeline of a live trace shown on the terminal (`default` when no file is named).
pub fn pipeline(
    output: &OutputArgs,
    default: DefaultStream,
    failed_only: bool,
) -> Result<Pipeline> {
    pipeline_of(World::new(), output, default, failed_only)
}

fn pipeline_of(
    world: World,
    output: &OutputArgs,
    default: DefaultStream,
    failed_only: bool,
) -> Result<Pipeline> {
    let output = open_output_args(output, default, Clock::now()?)?;
    let filter = if failed_only {
        Filter::failed_only()
    } else {
        Filter::default()
    };
    Ok(Pipeline::new(world, host_diagnoser(), output, filter))
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
