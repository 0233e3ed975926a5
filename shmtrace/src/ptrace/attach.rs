//! Following processes that are already running (`--pid`), as far as the kernel's ptrace
//! rules allow: every thread is attached with `PTRACE_SEIZE` and interrupted once, and what
//! the process already holds on /dev/shm (descriptors, mappings) is learned from /proc, so
//! that its calls on them are recognised.
//!
//! No filter is added and nothing else is changed in them: they stop at every call
//! (`PTRACE_SYSCALL`), which costs them more than a traced command pays, and when shmtrace
//! ends the kernel lets them go as they were.
use std::{fs, os::unix::fs::MetadataExt};

use anyhow::Result;
use nix::errno::Errno;

use super::{
    PtraceError,
    spawn::OPTIONS,
    tracer::{Tracer, file_of},
    wait::{self, Stop},
};
use crate::kernel_ids;

/// Options for processes attached while running: no seccomp stops (they have no filter),
/// and they are not killed if shmtrace ends first.
const ATTACH_OPTIONS: libc::c_int =
    OPTIONS & !libc::PTRACE_O_TRACESECCOMP & !libc::PTRACE_O_EXITKILL;

/// Attaches to each of `pids` and its threads; returns the pids attached. A pid that is gone
/// is skipped; one that may not be traced is an error that says why.
pub fn attach(tracer: &mut Tracer, pids: &[u32]) -> Result<Vec<u32>> {
    let mut attached = Vec::new();
    for &pid in pids {
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        let tids: Vec<i32> = tasks
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .collect();
        for tid in tids {
            match seize(tid) {
                Ok(()) => {}
                // A thread that ended meanwhile.
                Err(Errno::ESRCH) => continue,
                Err(errno) => {
                    return Err(PtraceError::Attach {
                        pid,
                        errno,
                        why: why_not(pid),
                    }
                    .into());
                }
            }
            tracer.adopt(tid, pid as i32);
            // Its first stop, then on to its calls; one stopped by job control stays so.
            let mut stopped = false;
            loop {
                match wait::wait_for(tid) {
                    Ok(Stop::Interrupt) | Err(_) => break,
                    Ok(Stop::JobControl) => {
                        stopped = true;
                        break;
                    }
                    Ok(Stop::Ended(status)) => {
                        tracer.ended(tid, status);
                        break;
                    }
                    // A signal on its way before the interrupt: delivered, then the stop.
                    Ok(Stop::Signal(signo)) => {
                        let _ = wait::resume(tid, libc::PTRACE_SYSCALL, signo);
                    }
                    Ok(_) => {
                        let _ = wait::resume(tid, libc::PTRACE_SYSCALL, 0);
                    }
                }
            }
            if stopped {
                let _ = wait::listen(tid);
            } else {
                tracer.resume(tid, 0);
            }
        }
        learn_holdings(tracer, pid as i32);
        attached.push(pid);
    }
    Ok(attached)
}

fn seize(tid: i32) -> Result<(), Errno> {
    // SAFETY: ptrace requests with no memory passed.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, ATTACH_OPTIONS as usize) < 0 {
            return Err(Errno::last());
        }
        if libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) < 0 {
            return Err(Errno::last());
        }
    }
    Ok(())
}

/// Why the kernel refuses to let this process trace `pid`.
fn why_not(pid: u32) -> String {
    let scope = fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    let owner = fs::metadata(format!("/proc/{pid}")).map(|m| m.uid()).ok();
    let me = nix::unistd::getuid().as_raw();
    match (scope, owner) {
        (_, Some(owner)) if owner != me => format!(
            "it belongs to user {owner}, and only a process's own user may trace it (root may, \
             with the eBPF probes)"
        ),
        (Some(1), _) => "Yama's ptrace_scope is 1: only a process's ancestors may trace it; \
                         start the program under shmtrace instead (shmtrace -- COMMAND)"
            .to_owned(),
        (Some(2 | 3), _) => {
            "Yama's ptrace_scope forbids it to users without CAP_SYS_PTRACE".to_owned()
        }
        _ => "it may be traced already (by a debugger, or another shmtrace), or be a program \
              that made itself untraceable (prctl PR_SET_DUMPABLE), or the container's seccomp \
              profile forbids ptrace"
            .to_owned(),
    }
}

/// What `pid` holds on /dev/shm already: its descriptors are armed (their calls are looked
/// at), its mappings known (for `munmap` and SIGBUS).
fn learn_holdings(tracer: &mut Tracer, pid: i32) {
    if let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.filter_map(Result::ok) {
            let Some(fd) = fd.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if file_of(pid, fd).is_some_and(|file| tracer.shm_devs.contains(&file.dev))
                && let Some(process) = tracer.processes.get_mut(&pid)
            {
                process.armed.insert(fd);
                process.highest_fd = process.highest_fd.max(fd);
            }
        }
    }
    let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return;
    };
    for line in maps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(device)) = (fields.next(), fields.nth(2)) else {
            continue;
        };
        let dev = device.split_once(':').and_then(|(major, minor)| {
            Some(kernel_ids::kernel_dev(
                u64::from_str_radix(major, 16).ok()?,
                u64::from_str_radix(minor, 16).ok()?,
            ))
        });
        let span = range.split_once('-').and_then(|(start, end)| {
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            ))
        });
        if let (Some(dev), Some((start, end))) = (dev, span)
            && tracer.shm_devs.contains(&dev)
            && let Some(process) = tracer.processes.get_mut(&pid)
        {
            process.mappings.push((start, end - start));
        }
    }
}
