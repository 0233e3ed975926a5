//! Two small workloads for the targets: a fork storm (`cargo xtask storm`), where each
//! child creates and unlinks one /dev/shm object and exits, and a time stamp (`cargo xtask
//! stamp`), which prints the monotonic clock so that a tracer's start-up and teardown around it
//! can be timed.
use std::{ffi::CString, time::Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

/// `CLOCK_MONOTONIC` in nanoseconds, comparable between processes.
pub fn monotonic_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `cargo xtask stamp`: prints `{"monotonic_ns": N}` and exits.
pub fn stamp() {
    println!("{}", json!({ "monotonic_ns": monotonic_ns() }));
}

/// `cargo xtask storm --processes N --tag T`: forks N children one after the other; each
/// creates `/dev/shm/torch_<pid>_<tag>_0`, closes and unlinks it, and exits. Prints a report in
/// the churn workload's format.
pub fn run(processes: u64, tag: &str) -> Result<()> {
    if tag.contains(['/', '\0']) {
        bail!("--tag must not contain '/' or NUL");
    }
    let started = Instant::now();
    let mut failed = 0u64;
    for _ in 0..processes {
        // SAFETY: single-threaded; the child only makes system calls on prepared buffers and
        // leaves with `_exit`.
        match unsafe { libc::fork() } {
            -1 => return Err(std::io::Error::last_os_error()).context("fork"),
            0 => {
                // SAFETY: getpid has no preconditions.
                let pid = unsafe { libc::getpid() };
                let path =
                    CString::new(format!("/dev/shm/torch_{pid}_{tag}_0")).expect("no NUL in a tag");
                // SAFETY: a NUL-terminated path; the descriptor is ours.
                let status = unsafe {
                    let fd = libc::open(
                        path.as_ptr(),
                        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                        0o600,
                    );
                    if fd < 0 {
                        1
                    } else {
                        libc::close(fd);
                        libc::unlink(path.as_ptr());
                        0
                    }
                };
                // SAFETY: leaving the child without running the parent's destructors.
                unsafe { libc::_exit(status) };
            }
            pid => {
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                    failed += 1;
                }
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if failed > 0 {
        bail!("{failed} of {processes} children failed to create their object");
    }
    let cpu = |who| {
        // SAFETY: an all-zero rusage is valid.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid out-pointer; getrusage fills it.
        unsafe { libc::getrusage(who, &mut usage) };
        let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        s(usage.ru_utime) + s(usage.ru_stime)
    };
    println!(
        "{}",
        json!({
            "seconds": seconds,
            "processes": processes,
            "calls": { "openat": processes, "close": processes, "unlink": processes },
            "cpu_seconds": cpu(libc::RUSAGE_SELF) + cpu(libc::RUSAGE_CHILDREN),
        })
    );
    Ok(())
}
