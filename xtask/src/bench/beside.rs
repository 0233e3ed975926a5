//! What runs beside the bystanders' loops and the real server: nothing, the floor's empty
//! programs, `shmtrace --all` or `shmtrace daemon`, started and stopped the same way for both.
use std::{os::unix::process::CommandExt, path::Path, process::Command};

use anyhow::Result;

use super::{
    daemon::Daemon,
    measure::Running,
    variants::{self, Setup},
};

/// What runs beside the measured programs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Beside {
    Nothing,
    Floor,
    All,
    Daemon,
}

impl Beside {
    pub fn name(self) -> &'static str {
        match self {
            Beside::Nothing => "nothing",
            Beside::Floor => "empty programs",
            Beside::All => "shmtrace --all",
            Beside::Daemon => "shmtrace daemon",
        }
    }
}

/// A tracer running beside them, holding its programs.
pub enum Tracer {
    None,
    Process(Running),
    Daemon(Daemon),
}

impl Tracer {
    pub fn start(beside: Beside, setup: &Setup, exe: &Path) -> Result<Tracer> {
        // A group of its own, stopped as one: the floor's `sleep` goes with it.
        let spawn = |command: &mut Command| Running::spawn(command.process_group(0), false);
        match beside {
            Beside::Nothing => Ok(Tracer::None),
            Beside::Floor => {
                let floor = spawn(Command::new(exe).args(["floor", "--", "sleep", "3600"]))?;
                variants::wait_attached(floor.pid())?;
                Ok(Tracer::Process(floor))
            }
            Beside::All => {
                let all = spawn(Command::new(&setup.shmtrace).args(["--all", "-o", "/dev/null"]))?;
                variants::wait_tracing(&all)?;
                Ok(Tracer::Process(all))
            }
            Beside::Daemon => Ok(Tracer::Daemon(Daemon::start(
                &setup.shmtrace,
                &setup.scratch,
                "bystanders",
            )?)),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        match self {
            Tracer::None => None,
            Tracer::Process(running) => Some(running.pid()),
            Tracer::Daemon(daemon) => Some(daemon.pid()),
        }
    }

    /// Stops it, and waits until the kernel has let go of its programs, so that the next
    /// tracer's start is not slowed by their release.
    pub fn stop(self) -> Result<()> {
        match self {
            Tracer::None => return Ok(()),
            Tracer::Process(running) => {
                // SAFETY: signalling the process group of our own child, which leads it.
                unsafe { libc::kill(-(running.pid() as libc::pid_t), libc::SIGTERM) };
                running.finish()?;
            }
            Tracer::Daemon(daemon) => drop(daemon),
        }
        super::measure::wait_for_background_detach()?;
        Ok(())
    }
}
