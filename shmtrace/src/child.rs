//! What a child forked to run a traced command does between `fork` and `exec`, for the eBPF
//! source (`live::target`) and the ptrace source alike. Only async-signal-safe calls: the
//! process that forked may have other threads, whose locks the child inherits held.
use std::{
    ffi::CString,
    os::fd::{AsRawFd, OwnedFd},
};

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
