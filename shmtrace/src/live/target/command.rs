//! Starting a command under tracing: it is forked paused, registered with the probes, and only
//! then allowed to exec, so not one of its calls is missed.
use std::{
    ffi::OsString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    sync::Arc,
};

use anyhow::{Context, Result, bail};
use nix::{
    errno::Errno,
    sys::wait::{WaitStatus, waitpid},
    unistd::{ForkResult, Pid, fork},
};

use crate::child;
use shmtrace_core::event::ExitStatus;

/// A forked child waiting for [`PausedCommand::start`] before it runs the command.
pub struct PausedCommand {
    pid: Pid,
    program: String,
    go: OwnedFd,
    exec_status: OwnedFd,
}

/// Forks a child that will run `argv` once released.
///
/// Must be called while the process has a single thread (before the async runtime starts):
/// the child only reads a pipe and calls `execvp`.
pub fn spawn_paused(argv: &[OsString]) -> Result<PausedCommand> {
    let Some(program) = argv.first() else {
        bail!("no command given after --");
    };
    let c_argv = child::c_argv(argv)?;
    let child::Pipes {
        go_read,
        go_write,
        status_read,
        status_write,
    } = child::Pipes::new()?;

    // SAFETY: the process is single-threaded here (documented precondition), and the child
    // only calls async-signal-safe functions before exec or _exit.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            drop(go_write);
            drop(status_read);
            if !child::wait_for_release(&go_read) {
                // shmtrace gave up before releasing us.
                // SAFETY: _exit is async-signal-safe and never returns.
                unsafe { libc::_exit(127) };
            }
            child::reset_signals();
            child::exec(&c_argv, &status_write)
        }
        ForkResult::Parent { child } => Ok(PausedCommand {
            pid: child,
            program: program.to_string_lossy().into_owned(),
            go: go_write,
            exec_status: status_read,
        }),
    }
}

impl PausedCommand {
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// Lets the child exec. Fails, naming the command, if exec failed.
    pub fn start(self) -> Result<RunningCommand> {
        nix::unistd::write(&self.go, &[1]).context("releasing the traced command")?;
        drop(self.go);
        let mut buf = [0u8; 4];
        let n = loop {
            match nix::unistd::read(&self.exec_status, &mut buf) {
                Err(Errno::EINTR) => continue,
                other => break other.context("waiting for the traced command to start")?,
            }
        };
        if n == 4 {
            let errno = Errno::from_raw(i32::from_ne_bytes(buf));
            let _ = waitpid(self.pid, None);
            return Err(child::exec_failed(&self.program, errno));
        }
        Ok(RunningCommand {
            pid: self.pid,
            pidfd: pidfd_open(self.pid).map(Arc::new),
        })
    }
}

/// The traced command, running.
#[derive(Clone, Debug)]
pub struct RunningCommand {
    pid: Pid,
    /// Names this very process until it is reaped, so that a signal sent after its exit
    /// cannot reach another that took its pid. `None` where pidfd_open is refused (a
    /// seccomp filter): then the pid.
    pidfd: Option<Arc<OwnedFd>>,
}

/// A descriptor for the process `pid`, which must be our unreaped child.
fn pidfd_open(pid: Pid) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    // SAFETY: a non-negative result is a descriptor we now own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

impl RunningCommand {
    /// The command another tracer started (ptrace's), our child: to signal it. Its end is
    /// that tracer's to wait for, not [`RunningCommand::wait`]'s.
    pub fn of_child(pid: u32) -> RunningCommand {
        let pid = Pid::from_raw(pid as i32);
        RunningCommand {
            pid,
            pidfd: pidfd_open(pid).map(Arc::new),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// Sends `signo` to the command (not to its process group, which may be shmtrace's own,
    /// with the rest of a pipeline). An exited command is not an error: there is nothing
    /// left to stop.
    pub fn signal(&self, signo: i32) -> Result<()> {
        let result = match &self.pidfd {
            // SAFETY: pidfd_send_signal with a valid descriptor, no siginfo and no flags.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    signo,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            },
            // SAFETY: kill has no memory preconditions.
            None => libc::c_long::from(unsafe { libc::kill(self.pid.as_raw(), signo) }),
        };
        match result {
            0 => Ok(()),
            _ if Errno::last() == Errno::ESRCH => Ok(()),
            _ => Err(Errno::last()).with_context(|| {
                format!(
                    "cannot send {} to the traced command (pid {})",
                    shmtrace_core::event::names::signal_name(signo),
                    self.pid
                )
            }),
        }
    }

    /// Blocks until the command exits.
    pub fn wait(&self) -> Result<ExitStatus> {
        loop {
            match waitpid(self.pid, None) {
                Ok(WaitStatus::Exited(_, code)) => return Ok(ExitStatus::Code(code)),
                Ok(WaitStatus::Signaled(_, signal, core_dumped)) => {
                    return Ok(ExitStatus::Signal {
                        signo: signal as i32,
                        core_dumped,
                    });
                }
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(errno) => return Err(errno).context("waiting for the traced command"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(script: &str) -> ExitStatus {
        let argv = ["sh", "-c", script].map(OsString::from);
        spawn_paused(&argv)
            .unwrap()
            .start()
            .unwrap()
            .wait()
            .unwrap()
    }

    /// This test process ignores SIGPIPE, as every Rust program does; the command must not.
    #[test]
    fn the_command_gets_default_signal_dispositions() {
        // A shell cannot undo a signal ignored on entry, so an inherited SIG_IGN shows here.
        assert_eq!(
            run("kill -PIPE $$; exit 0"),
            ExitStatus::Signal {
                signo: libc::SIGPIPE,
                core_dumped: false
            }
        );
    }

    #[test]
    fn the_command_gets_an_empty_signal_mask() {
        // Block SIGTERM in this thread (the one that forks); the command must not inherit it.
        let mut term = nix::sys::signal::SigSet::empty();
        term.add(nix::sys::signal::Signal::SIGTERM);
        let mut old = nix::sys::signal::SigSet::empty();
        nix::sys::signal::pthread_sigmask(
            nix::sys::signal::SigmaskHow::SIG_BLOCK,
            Some(&term),
            Some(&mut old),
        )
        .unwrap();
        let status = run("kill -TERM $$; exit 0");
        nix::sys::signal::pthread_sigmask(
            nix::sys::signal::SigmaskHow::SIG_SETMASK,
            Some(&old),
            None,
        )
        .unwrap();
        assert_eq!(
            status,
            ExitStatus::Signal {
                signo: libc::SIGTERM,
                core_dumped: false
            }
        );
    }
}
