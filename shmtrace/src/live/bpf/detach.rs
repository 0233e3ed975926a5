//! Detaching the programs without making the user wait for the kernel.
//!
//! Detaching a syscall tracepoint waits for RCU grace periods under a lock the kernel holds
//! for every tracepoint, so shmtrace's 32 attachments take 1 to 1.5 s to let go, however they
//! are closed (measured in docs/BENCHMARKS.md). Nothing of shmtrace's output depends on that
//! wait. So at the end short-lived `shmtrace-detach` processes take over the last references
//! to the attachments and let the kernel release them, while shmtrace itself exits at once.
//! They hold nothing else: no terminal, pipe or file of shmtrace's, so whoever reads
//! shmtrace's output sees it end when shmtrace ends. They step aside while a later run
//! attaches (`attaching`).
use std::{fs, os::fd::RawFd};

use super::attaching;

/// Hands the attachments (`perf_event` and `bpf_link` descriptors) to background processes
/// that close them after this process has closed its own copies. `Some(handover)` when it
/// runs; the caller drops its links, then drops the handover to let it go. `None` if it could
/// not start (the caller then detaches the slow way).
pub fn in_background() -> Option<Handover> {
    let keep = attachment_descriptors();
    if keep.is_empty() {
        return None;
    }
    let mut pipe = [0; 2];
    // SAFETY: `pipe` has room for the two descriptors.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let [go_read, go_write] = pipe;
    // SAFETY: fork has no preconditions; the child runs `detacher` only.
    match unsafe { libc::fork() } {
        // SAFETY: the child of a fork, as `detacher` requires.
        0 => unsafe { detacher(&keep, go_read) },
        -1 => {
            // SAFETY: closing our own descriptors.
            unsafe {
                libc::close(go_read);
                libc::close(go_write);
            }
            None
        }
        child => {
            // SAFETY: closing our own descriptor; reaping our own child, which exits at once.
            unsafe {
                libc::close(go_read);
                libc::waitpid(child, std::ptr::null_mut(), 0);
            }
            Some(Handover { go_write })
        }
    }
}

/// Held while this process closes its copies of the attachments; dropping it lets the
/// background processes close the last ones.
pub struct Handover {
    go_write: RawFd,
}

impl Drop for Handover {
    fn drop(&mut self) {
        // SAFETY: our own descriptor; its end is the background process's signal to go on.
        unsafe { libc::close(self.go_write) };
    }
}

/// Background processes sharing the releases: each waits for its own, and the kernel lets
/// them share grace periods (one process closing 38 links took 2.6 s; 8 took about 1.3 s).
const DETACHERS: usize = 8;

/// The forked child: forks the detachers (so that nobody has to reap the ones doing the slow
/// work, and shmtrace waits only for this one) and exits. Detacher `n` keeps every
/// [`DETACHERS`]th attachment from the `n`th and the pipe, closes every other descriptor,
/// waits for the pipe's end, then closes its attachments, which releases them, one at a time,
/// holding each while a later run attaches (`attaching`), and exits.
///
/// # Safety
/// Only right in a child just forked from a multithreaded process: it makes async-signal-safe
/// calls only, and never returns.
unsafe fn detacher(keep: &[RawFd], go_read: RawFd) -> ! {
    // SAFETY: async-signal-safe calls on memory prepared before the fork.
    unsafe {
        let mut group = 0;
        while group < DETACHERS.min(keep.len()) && libc::fork() != 0 {
            group += 1;
        }
        if group == DETACHERS.min(keep.len()) {
            libc::_exit(0);
        }
        libc::prctl(libc::PR_SET_NAME, c"shmtrace-detach".as_ptr());
        libc::setsid();
        let mine = |fd: RawFd| {
            keep.iter()
                .position(|&kept| kept == fd)
                .is_some_and(|index| index % DETACHERS == group)
        };
        let highest = keep.iter().copied().max().unwrap_or(0).max(go_read);
        for fd in 0..=highest {
            if fd != go_read && !mine(fd) {
                libc::close(fd);
            }
        }
        // The system call (Linux 5.9; shmtrace needs 5.15), not glibc's wrapper, which is
        // glibc 2.34's: the release binaries run on glibc 2.31 (docs/install.md).
        libc::syscall(
            libc::SYS_close_range,
            highest as libc::c_uint + 1,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        );
        let mut byte = 0u8;
        while libc::read(go_read, (&raw mut byte).cast(), 1) < 0 {}
        // One at a time, each after any run that is attaching now has done so (`attaching`);
        // and none before a moment has passed, so that the next run of a loop or a script,
        // started at once, finds no release under way.
        let mut waits_left =
            attaching::HOLD_AT_MOST.as_millis() / attaching::LOOK_EVERY.as_millis();
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: attaching::LOOK_EVERY.as_nanos() as libc::c_long,
        };
        for _ in 0..attaching::FIRST_RELEASE_AFTER.as_millis() / attaching::LOOK_EVERY.as_millis() {
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
        for &fd in keep.iter().filter(|&&fd| mine(fd)) {
            while waits_left > 0 && attaching::someone_attaching() {
                libc::nanosleep(&pause, std::ptr::null_mut());
                waits_left -= 1;
            }
            libc::close(fd);
        }
        libc::_exit(0)
    }
}

/// This process's descriptors of tracepoint attachments (`perf_event`) and links
/// (`bpf_link`): the ones whose release waits for the kernel.
fn attachment_descriptors() -> Vec<RawFd> {
    let Ok(entries) = fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            fs::read_link(entry.path()).is_ok_and(|target| {
                let target = target.as_os_str();
                target == "anon_inode:[perf_event]" || target == "anon_inode:bpf_link"
            })
        })
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect()
}
