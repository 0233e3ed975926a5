//! A bound on how long a shmtrace started by a test may run. A test that waits for shmtrace to
//! end by itself would otherwise hang the whole suite when it does not: the watchdog kills it,
//! says so, and the test fails on the status or output it then gets.
use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{Arc, Condvar, Mutex},
    time::Duration,
};

/// Longer than any shmtrace a test starts is meant to run (the longest, a sizing bisection
/// step on a loaded machine, takes a minute or two).
pub const LIMIT: Duration = Duration::from_secs(8 * 60);

/// Kills the process after [`LIMIT`] unless dropped first.
pub struct Watchdog {
    disarmed: Arc<(Mutex<bool>, Condvar)>,
}

impl Watchdog {
    /// Arms a watchdog for a child that has not been reaped yet. Holds a pidfd, so a reused
    /// pid is never signalled.
    pub fn arm(pid: u32, what: String) -> Watchdog {
        let disarmed = Arc::new((Mutex::new(false), Condvar::new()));
        // SAFETY: pidfd_open takes a pid and flags, and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        assert!(
            fd >= 0,
            "pidfd_open({pid}): {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a descriptor just returned to us, owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let shared = Arc::clone(&disarmed);
        std::thread::spawn(move || {
            let (lock, woken) = &*shared;
            let guard = lock.lock().unwrap();
            let (guard, _) = woken
                .wait_timeout_while(guard, LIMIT, |disarmed| !*disarmed)
                .unwrap();
            if !*guard {
                eprintln!(
                    "test watchdog: {what} (pid {pid}) still ran after {LIMIT:?}; killing it"
                );
                // SAFETY: a valid pidfd; no siginfo; no flags.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        pidfd.as_raw_fd(),
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    );
                }
            }
        });
        Watchdog { disarmed }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, woken) = &*self.disarmed;
        *lock.lock().unwrap() = true;
        woken.notify_all();
    }
}
