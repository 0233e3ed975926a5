//! What live tracing, recording and the demo share: load the probes, start or find the target,
//! run a session until it ends.
use std::{collections::HashSet, ffi::OsString};

use anyhow::{Context, Result, bail};

use crate::{
    bpf::{Tracer, TracerOptions},
    cli::TargetArgs,
    event::escape,
    pipeline::Pipeline,
    proc_scan,
    record::TargetDescription,
    session::{Ending, Outcome, Session, now_boot_ns},
    target,
};

/// What a live trace follows.
pub enum What {
    Command(Vec<OsString>),
    Pids(Vec<u32>),
    All,
}

impl What {
    /// From the target options; checks that given pids exist.
    pub fn from_args(args: &TargetArgs) -> Result<What> {
        if !args.command.is_empty() {
            if !args.pid.is_empty() || args.all {
                bail!("give either a command after --, or --pid/--all, not both");
            }
            Ok(What::Command(args.command.clone()))
        } else if args.all {
            Ok(What::All)
        } else if !args.pid.is_empty() {
            target::check_pids(&args.pid)?;
            Ok(What::Pids(args.pid.clone()))
        } else {
            bail!(
                "nothing to trace: give a command after --, --pid PID, or --all \
                 (or try `shmtrace demo`; see shmtrace --help)"
            )
        }
    }

    pub fn is_command(&self) -> bool {
        matches!(self, What::Command(_))
    }

    /// For a trace file's header.
    pub fn describe(&self, failed_only: bool) -> TargetDescription {
        TargetDescription {
            command: match self {
                What::Command(argv) => Some(
                    argv.iter()
                        .map(|a| escape::bytes(a.as_encoded_bytes()))
                        .collect(),
                ),
                _ => None,
            },
            pids: match self {
                What::Pids(pids) => pids.clone(),
                _ => Vec::new(),
            },
            host_wide: matches!(self, What::All),
            failed_only,
            containers: Vec::new(),
        }
    }
}

pub fn tracer_options(what: &What, args: &TargetArgs) -> TracerOptions {
    TracerOptions {
        all: matches!(what, What::All),
        failed_only: args.failed,
        ring_buffer_bytes: args.buffer_size,
        btf_path: args.kernel_btf.clone(),
        ..TracerOptions::default()
    }
}

/// Loads the probes, starts or attaches to the target, and traces until it ends.
pub fn run(
    what: What,
    options: &TracerOptions,
    mut pipeline: Pipeline,
    verbose: bool,
) -> Result<Outcome> {
    let mut tracer = Tracer::load(options)?;
    target::register_shm_devs(&mut tracer, options.all)?;

    // Fork the command before any thread exists (the async runtime starts below).
    let paused = match &what {
        What::Command(argv) => {
            let paused = target::spawn_paused(argv)?;
            tracer.add_target(paused.pid())?;
            Some(paused)
        }
        _ => None,
    };
    let mut pids = Vec::new();
    if let What::Pids(roots) = &what {
        let now = now_boot_ns();
        for pid in target::register_pids(&mut tracer, roots)? {
            if let Some(snapshot) = proc_scan::snapshot(pid) {
                pipeline.seed(&snapshot, now)?;
            }
            pids.push(pid);
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let ending = match (what, paused) {
        (What::Command(_), Some(paused)) => Ending::Command(paused.start()?),
        (What::Pids(roots), _) => {
            eprintln!(
                "shmtrace: tracing {} processes (pid {} and descendants); Ctrl-C to stop",
                pids.len(),
                roots
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Ending::Pids(pids.into_iter().collect::<HashSet<u32>>())
        }
        _ => {
            eprintln!(
                "shmtrace: tracing /dev/shm use of every process on the host; Ctrl-C to stop"
            );
            Ending::Interrupt
        }
    };
    runtime.block_on(Session::new(tracer, pipeline, verbose).run(ending))
}
