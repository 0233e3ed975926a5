//! Which processes to trace: a command started by shmtrace, running process trees, or every
//! process on the host. Each target registers itself with the probes before tracing starts.
mod command;

use std::{collections::HashSet, fs};

use anyhow::{Result, bail};

pub use command::{RunningCommand, spawn_paused};

use crate::live::{
    bpf::Tracer,
    proc_scan::{self, ShmMount},
};

/// Checks that every pid names a live process.
pub fn check_pids(pids: &[u32]) -> Result<()> {
    for pid in pids {
        if *pid == 0 || !proc_scan::exists(*pid) {
            bail!(
                "no process with pid {pid} is running (it may have exited); check with: ps -p {pid}"
            );
        }
        if is_zombie(*pid) {
            // It would never send the exit the trace waits for.
            bail!(
                "pid {pid} has already exited (a zombie, waiting for its parent to collect its \
                 status): there is nothing left to trace; check with: ps -o pid,stat,comm -p {pid}"
            );
        }
    }
    Ok(())
}

/// Whether `pid` has exited and waits to be reaped (state `Z` in /proc/PID/stat).
fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| state_of(&stat))
        .is_some_and(|state| state == 'Z' || state == 'X')
}

/// The state letter of a /proc/PID/stat line: after the last `)`, as the name may hold any.
fn state_of(stat: &str) -> Option<char> {
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// Follows each process tree rooted at `roots`, and learns their /dev/shm file systems.
/// Returns every pid followed.
pub fn register_pids(tracer: &mut Tracer, roots: &[u32]) -> Result<Vec<u32>> {
    let mut all = Vec::new();
    for root in roots {
        for pid in proc_scan::process_tree(*root) {
            if is_zombie(pid) {
                // Its exit is past: waiting for it would never end.
                continue;
            }
            tracer.add_target(pid)?;
            for mount in proc_scan::shm_mounts_of(pid) {
                tracer.add_shm_dev(mount.dev, mount.tmpfs)?;
            }
            all.push(pid);
        }
    }
    Ok(all)
}

/// Declares the /dev/shm file systems shmtrace can see now: this namespace's, and with
/// `every_namespace`, those of every container on the host. Returns them.
pub fn register_shm_devs(tracer: &mut Tracer, every_namespace: bool) -> Result<HashSet<u32>> {
    let mounts: HashSet<ShmMount> = if every_namespace {
        proc_scan::shm_mounts()
    } else {
        proc_scan::shm_mounts_of(std::process::id())
            .into_iter()
            .collect()
    };
    for mount in &mounts {
        tracer.add_shm_dev(mount.dev, mount.tmpfs)?;
    }
    Ok(mounts.iter().map(|mount| mount.dev).collect())
}

/// Host-wide tracing: follows every process that holds a descriptor or mapping on one of
/// `devs` now, as the probes follow one from its first /dev/shm call (see
/// `scope::fd_call_scope` in the probes). Returns them.
pub fn register_shm_holders(tracer: &mut Tracer, devs: &HashSet<u32>) -> Result<Vec<u32>> {
    let holders = proc_scan::shm_holders(devs, std::process::id());
    for pid in &holders {
        tracer.add_holder(*pid)?;
    }
    Ok(holders)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_pid_is_refused() {
        // SAFETY: the child exits at once; the parent reaps it below.
        let child = match unsafe { nix::unistd::fork() }.unwrap() {
            // SAFETY: _exit is async-signal-safe, as a forked child of a threaded test needs.
            nix::unistd::ForkResult::Child => unsafe { libc::_exit(0) },
            nix::unistd::ForkResult::Parent { child } => child,
        };
        let pid = child.as_raw() as u32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !is_zombie(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never became a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let error = check_pids(&[pid]).unwrap_err().to_string();
        nix::sys::wait::waitpid(child, None).unwrap();
        assert!(error.contains("zombie"), "{error}");
        check_pids(&[std::process::id()]).unwrap();
    }

    #[test]
    fn reads_the_state_after_a_hostile_name() {
        assert_eq!(state_of("42 (a) Z (b) S 1 2"), Some('S'));
        assert_eq!(state_of("42 (x) Z 1"), Some('Z'));
        assert_eq!(state_of("garbage"), None);
    }
}
