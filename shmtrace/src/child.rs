//! Starting a traced command, for the eBPF source (`live::target`) and the ptrace source
//! alike: what the parent prepares before `fork` ([`Pipes`], [`c_argv`]) and makes of a
//! failed `exec` ([`exec_failed`]), and what the child does between `fork` and `exec`. The
//! child makes only async-signal-safe calls: the process that forked may have other threads,
//! whose locks the child inherits held.
use std::{
    ffi::{CString, OsString},
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
};

use anyhow::{Context, Result};
use nix::{errno::Errno, fcntl::OFlag, unistd::pipe2};

/// The command's arguments as `exec` takes them.
pub fn c_argv(argv: &[OsString]) -> Result<Vec<CString>> {
    argv.iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .context("a command argument contains a NUL byte")
}

/// The two pipes between shmtrace and the child: `go` releases the child (a byte, or the
/// write end closed to make it give up), `status` brings back the errno of a failed set-up
/// or `exec` (its write end closes at a successful `exec`). Both close on exec.
pub struct Pipes {
    pub go_read: OwnedFd,
    pub go_write: OwnedFd,
    pub status_read: OwnedFd,
    pub status_write: OwnedFd,
}

impl Pipes {
    pub fn new() -> Result<Pipes> {
        let (go_read, go_write) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
        let (status_read, status_write) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
        Ok(Pipes {
            go_read,
            go_write,
            status_read,
            status_write,
        })
    }
}

/// Why `program` could not be run, from the errno its `exec` failed with.
pub fn exec_failed(program: &str, errno: Errno) -> anyhow::Error {
    let hint = match errno {
        Errno::ENOENT => "command not found; check the name and your PATH",
        Errno::EACCES => "permission denied; is it executable?",
        _ => "cannot execute it",
    };
    anyhow::anyhow!("{program}: {hint} ({})", errno.desc())
}

/// Gives the command the signal state a shell would: every disposition at its default and
/// nothing blocked. Rust's runtime ignores SIGPIPE, and an ignored signal survives exec, so
/// without this `yes | head -1` under shmtrace would make `yes` fail with EPIPE instead of
/// dying of SIGPIPE: a tracer must not change the program it traces.
pub fn reset_signals() {
    // SAFETY: a zeroed sigaction with SIG_DFL is valid; sigaction and sigprocmask are
    // async-signal-safe, and an error (SIGKILL, SIGSTOP, the reserved real-time signals of
    // the C library) leaves that signal as it was, which is the default already.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut default.sa_mask);
        for signo in 1..=libc::SIGRTMAX() {
            libc::sigaction(signo, &default, std::ptr::null_mut());
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

/// Waits for the byte that releases the child; `false` when the parent gave up instead.
pub fn wait_for_release(go: &OwnedFd) -> bool {
    let mut byte = [0u8; 1];
    // SAFETY: reading one byte into a local buffer.
    unsafe { libc::read(go.as_raw_fd(), byte.as_mut_ptr().cast(), 1) == 1 }
}

/// Runs `argv` (searched in PATH), or reports why not on `status` (`errno`, 4 bytes) and
/// exits 127.
pub fn exec(argv: &[CString], status: &OwnedFd) -> ! {
    let errno = match nix::unistd::execvp(&argv[0], argv) {
        Err(errno) => errno as i32,
        Ok(never) => match never {},
    };
    report_and_exit(errno, status)
}

/// Writes `errno` on `status` and exits 127, without unwinding.
pub fn report_and_exit(errno: i32, status: &OwnedFd) -> ! {
    let bytes = errno.to_ne_bytes();
    // SAFETY: writing four bytes from a local buffer, then exiting without unwinding.
    unsafe {
        libc::write(status.as_raw_fd(), bytes.as_ptr().cast(), 4);
        libc::_exit(127)
    }
}
