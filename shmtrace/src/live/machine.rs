//! The machine shmtrace runs on, as the pipeline's [`Environment`]: processes are looked up in
//! /proc and /dev/shm is measured when something fails. A replay uses
//! [`shmtrace_core::pipeline::Recorded`] instead, so only this side reads the machine.
use shmtrace_core::{diagnose::Capacity, model::ProcSnapshot, pipeline::Environment};

/// The machine shmtrace runs on.
pub struct LiveMachine;

impl Environment for LiveMachine {
    fn snapshot(&mut self, pid: u32) -> Option<ProcSnapshot> {
        super::proc_scan::snapshot(pid)
    }

    fn measure(&mut self, pids: &[u32], ts_ns: u64) -> Option<Capacity> {
        pids.iter().find_map(|pid| {
            let shm = crate::container::measure_shm(*pid).ok()?;
            Some(Capacity {
                dev: shm.dev?,
                size: shm.size_bytes?,
                used: shm.used_bytes?,
                ts_ns,
            })
        })
    }
}
