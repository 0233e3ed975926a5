//! Which processes to trace: a command started by shmtrace, running process trees, or every
//! process on the host. Each target registers itself with the probes before tracing starts.
mod command;

use std::{fs, os::unix::fs::MetadataExt};

use anyhow::{Result, bail};

pub use command::{RunningCommand, spawn_paused};

use crate::{
    kernel_ids,
    live::{bpf::Tracer, proc_scan},
};

/// Checks that every pid names a live process.
pub fn check_pids(pids: &[u32]) -> Result<()> {
    for pid in pids {
        if *pid == 0 || !proc_scan::exists(*pid) {
            bail!(
                "no process with pid {pid} is running (it may have exited); check with: ps -p {pid}"
            );
        }
    }
    Ok(())
}

/// Follows each process tree rooted at `roots`, and learns their /dev/shm file systems.
/// Returns every pid followed.
pub fn register_pids(tracer: &mut Tracer, roots: &[u32]) -> Result<Vec<u32>> {
    let mut all = Vec::new();
    for root in roots {
        for pid in proc_scan::process_tree(*root) {
            tracer.add_target(pid)?;
            for dev in proc_scan::shm_devs_of(pid) {
                tracer.add_shm_dev(dev)?;
            }
            all.push(pid);
        }
    }
    Ok(all)
}

/// Declares the /dev/shm file systems shmtrace can see now: this namespace's, and with
/// `every_namespace`, those of every container on the host.
pub fn register_shm_devs(tracer: &mut Tracer, every_namespace: bool) -> Result<()> {
    if let Ok(meta) = fs::metadata("/dev/shm") {
        tracer.add_shm_dev(kernel_ids::kernel_dev_from_stat(meta.dev()))?;
    }
    if every_namespace {
        for dev in proc_scan::shm_devs() {
            tracer.add_shm_dev(dev)?;
        }
    }
    Ok(())
}
