//! The machine shmtrace runs on, as the pipeline's [`Environment`]: processes are looked up in
//! /proc and /dev/shm is measured when something fails. A replay uses
//! [`shmtrace_core::pipeline::Recorded`] instead, so only this side reads the machine.
use std::collections::HashMap;

use bytes::Bytes;
use shmtrace_core::{
    capacity::Capacity,
    event::{Body, decode},
    model::{ProcSnapshot, ShmHolders},
    pipeline::Environment,
};

/// The machine shmtrace runs on.
#[derive(Default)]
pub struct LiveMachine {
    /// /proc snapshots of failing processes, taken as soon as a batch of records arrived.
    early: HashMap<u32, ProcSnapshot>,
}

impl LiveMachine {
    /// Reads /proc for the processes that fail in `batch` before the batch is worked
    /// through: a failure wakes the reader at once, but the records before it take time, and
    /// a process that fails often exits within milliseconds (a PostgreSQL parallel worker),
    /// taking its container pid and title with it.
    pub fn read_failing_early(&mut self, batch: &[Bytes]) {
        self.early.clear();
        for record in batch {
            let Ok(event) = decode(record) else {
                continue;
            };
            let pid = match &event.body {
                // What the model may judge a failure, which it has not seen yet.
                Body::Call(call) if call.may_be_failure() => event.pid,
                Body::Signal(signal) if signal.addr != 0 => signal.target_pid,
                _ => continue,
            };
            if !self.early.contains_key(&pid)
                && let Some(snapshot) = super::proc_scan::snapshot(pid)
            {
                self.early.insert(pid, snapshot);
            }
        }
    }
}

impl Environment for LiveMachine {
    fn snapshot(&mut self, pid: u32) -> Option<ProcSnapshot> {
        self.early
            .remove(&pid)
            .or_else(|| super::proc_scan::snapshot(pid))
    }

    fn holders(&mut self, pids: &[u32], dev: u32, ts_ns: u64) -> Option<ShmHolders> {
        super::holders::holders(pids, dev, ts_ns)
    }

    fn measure(&mut self, pids: &[u32], ts_ns: u64) -> Option<Capacity> {
        pids.iter().find_map(|pid| {
            let shm = crate::container::measure_shm(*pid).ok()?;
            // Stamped with the time of the event that asked, as a replay will see it.
            Some(Capacity {
                ts_ns,
                ..shm.capacity()?
            })
        })
    }
}
