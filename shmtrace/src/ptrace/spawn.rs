//! Starting the command under ptrace: forked by the tracer thread (a tracee's tracer is the
//! thread that attached it), held until it is attached with `PTRACE_SEIZE`, then let go to
//! install the base filter and exec, so that not one of its calls is missed.
//!
//! The child sets `no_new_privs`, which an unprivileged process needs to install a seccomp
//! filter: a set-user-ID program it runs then runs without gaining privileges, as it does in
//! a container started with `no-new-privileges`.
use std::{ffi::OsString, os::fd::AsRawFd};

use anyhow::{Context, Result, bail};
use nix::{
    errno::Errno,
    unistd::{ForkResult, Pid, fork},
};

use super::{PtraceError, filter};
use crate::child;

/// Failures of the filter's set-up are told apart from exec's errno by this bit.
const SETUP_FAILED: i32 = 1 << 24;

/// `PTRACE_O_*` of every traced thread: fork, vfork, clone and exec are reported, seccomp
/// stops are, syscall stops are marked, and every tracee dies with shmtrace (a process left
/// with the filter and no tracer would have its traced calls fail with ENOSYS).
pub const OPTIONS: libc::c_int = libc::PTRACE_O_TRACESYSGOOD
    | libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEEXEC
    | libc::PTRACE_O_TRACESECCOMP
    | libc::PTRACE_O_EXITKILL;

/// The command, forked and attached, about to install the filter and exec.
pub struct Spawned {
    pub pid: i32,
    /// Holds the child's report of a failed set-up or exec (its write end closes at exec).
    pub status: std::os::fd::OwnedFd,
}

/// Forks `argv` on this thread, attaches it, and lets it go. Must run on the tracer thread.
pub fn spawn(argv: &[OsString]) -> Result<Spawned> {
    if argv.is_empty() {
        bail!("no command given after --");
    }
    let c_argv = child::c_argv(argv)?;
    let program = filter::base();
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.instructions().as_ptr() as *mut libc::sock_filter,
    };
    let child::Pipes {
        go_read,
        go_write,
        status_read,
        status_write,
    } = child::Pipes::new()?;
    // SAFETY: the child only makes async-signal-safe calls (the ones below) before exec or
    // _exit; everything it uses was made before the fork.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            drop(go_write);
            drop(status_read);
            if !child::wait_for_release(&go_read) {
                // SAFETY: _exit is async-signal-safe and never returns.
                unsafe { libc::_exit(127) };
            }
            child::reset_signals();
            // SAFETY: prctl and seccomp with valid arguments; `prog` points to the filter,
            // alive in this copy of the parent's memory.
            unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::syscall(
                        libc::SYS_seccomp,
                        libc::SECCOMP_SET_MODE_FILTER,
                        0,
                        &raw const prog,
                    ) != 0
                {
                    child::report_and_exit(Errno::last_raw() | SETUP_FAILED, &status_write);
                }
            }
            child::exec(&c_argv, &status_write)
        }
        ForkResult::Parent { child } => {
            drop(go_read);
            drop(status_write);
            if let Err(errno) = seize(child) {
                // Closing the pipe makes the child exit; it is ours to reap.
                drop(go_write);
                let _ = nix::sys::wait::waitpid(child, None);
                return Err(PtraceError::Refused {
                    errno,
                    why: String::new(),
                }
                .into());
            }
            nix::unistd::write(&go_write, &[1]).context("releasing the traced command")?;
            Ok(Spawned {
                pid: child.as_raw(),
                status: status_read,
            })
        }
    }
}

fn seize(pid: Pid) -> Result<(), Errno> {
    // SAFETY: PTRACE_SEIZE of our own child, with options; no memory is passed.
    let done = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid.as_raw(), 0usize, OPTIONS as usize) };
    if done < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// Why the command did not start, from what the child wrote before it exited, with the
/// program's name.
pub fn start_failure(status: &std::os::fd::OwnedFd, program: &OsString) -> Option<anyhow::Error> {
    let mut buf = [0u8; 4];
    // SAFETY: reading four bytes into a local buffer.
    let n = unsafe { libc::read(status.as_raw_fd(), buf.as_mut_ptr().cast(), 4) };
    if n != 4 {
        return None;
    }
    let raw = i32::from_ne_bytes(buf);
    let program = program.to_string_lossy();
    if raw & SETUP_FAILED != 0 {
        let errno = Errno::from_raw(raw & !SETUP_FAILED);
        return Some(PtraceError::NoFilter { errno }.into());
    }
    Some(child::exec_failed(&program, Errno::from_raw(raw)))
}
