//! `shmtrace demo`: a real /dev/shm failure, reproduced and explained, with no container. The
//! workload it traces is `crate::live::demo`, run as the hidden `__demo-workload` subcommand.
use std::{ffi::OsString, process::ExitCode};

use anyhow::{Context, Result, bail};

use super::{DefaultStream, trace};
use crate::{
    cli::OutputArgs,
    live::{
        demo::{SHM_SIZE, WORKLOAD_STATUS},
        launch::{self, What},
    },
};
use shmtrace_core::event::ExitStatus;

/// `shmtrace demo`: traces the workload, with its diagnosis, on stdout.
pub fn run(output: &OutputArgs) -> Result<ExitCode> {
    crate::commands::init_logging(output.verbose);
    let exe = std::env::current_exe().context("finding shmtrace's own executable")?;
    println!(
        "shmtrace demo: a PyTorch-like DataLoader runs in a private mount namespace whose \
         /dev/shm is a {SHM_SIZE} tmpfs, and runs out of it.\n"
    );
    let what = What::Command(vec![
        exe.into_os_string(),
        OsString::from("__demo-workload"),
    ]);
    // The demo's trace goes to stdout, whatever a traced command's would do.
    let make_pipeline = |_: &launch::Launched<'_>| {
        let mut pipeline = trace::pipeline(output, DefaultStream::Stdout, false)?;
        pipeline.name_other_namespaces("the demo's private namespace");
        Ok(pipeline)
    };
    let outcome = launch::run(what, &launch::Options::probes(), make_pipeline)?;
    match outcome.command_status {
        Some(ExitStatus::Code(WORKLOAD_STATUS)) => Ok(ExitCode::SUCCESS),
        Some(_) if outcome.interrupted => Ok(ExitCode::from(130)),
        other => bail!("the demo workload did not fail the way it should have ({other:?})"),
    }
}
