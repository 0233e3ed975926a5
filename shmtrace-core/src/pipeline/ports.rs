//! What the pipeline talks to: the machine it may ask ([`Environment`]), where a copy of the
//! trace goes ([`Tap`]), and who watches it all ([`Observer`]).
use anyhow::Result;
use bytes::Bytes;

use crate::{
    capacity::Capacity,
    diagnose::{Diagnosis, Role, Roles},
    event::Event,
    model::{Annotation, ContainerInfo, ProcSnapshot, ShmHolders, World},
    record::{Trigger, UserRecord},
};

/// What the pipeline may ask of the machine.
pub trait Environment {
    /// The process as /proc shows it now.
    fn snapshot(&mut self, pid: u32) -> Option<ProcSnapshot>;
    /// The /dev/shm of the first of `pids` that can be reached.
    fn measure(&mut self, pids: &[u32], ts_ns: u64) -> Option<Capacity>;
    /// What holds the space of /dev/shm file system `dev` now, seen from the first of `pids`
    /// that can be reached: every file on it with pages, and who has it open or mapped.
    fn holders(&mut self, _pids: &[u32], _dev: u32, _ts_ns: u64) -> Option<ShmHolders> {
        None
    }
    /// Whether [`Environment::measure`] can ever measure anything: when it cannot (a
    /// replay), the pipeline does not gather the pids to ask it about for every event.
    fn can_measure(&self) -> bool {
        true
    }
}

/// A recorded trace: everything the machine said is in the file already.
pub struct Recorded;

impl Environment for Recorded {
    fn snapshot(&mut self, _: u32) -> Option<ProcSnapshot> {
        None
    }

    fn measure(&mut self, _: &[u32], _: u64) -> Option<Capacity> {
        None
    }

    fn can_measure(&self) -> bool {
        false
    }
}

/// Where a copy of the trace goes.
pub trait Tap {
    fn kernel(&mut self, bytes: &Bytes) -> Result<()>;
    fn user(&mut self, ts_ns: u64, record: &UserRecord) -> Result<()>;
    /// Something failed: the flight recorder writes its window.
    fn trigger(&mut self, ts_ns: u64, trigger: Trigger) -> Result<()>;
    /// Called often (every 100 ms): time to flush what is due.
    fn tick(&mut self, world: &World, now_ns: u64) -> Result<()>;
    /// Tracing ended; returns what to tell the user (`wrote trace.shmtrace: ...`).
    fn finish(self: Box<Self>, world: &World, now_ns: u64) -> Result<Option<String>>;
}

/// Watches what the pipeline learns, in order, to describe the whole trace afterwards (the
/// HTML and Perfetto pictures of `report`). It sees every event and diagnosis, whatever the
/// filter shows.
pub trait Observer {
    /// An event, once the model has applied it; `role` and `place` as the output shows them.
    fn event(&mut self, event: &Event, note: &Annotation, role: &Role, place: &str, world: &World);
    /// A process learned from /proc, with what it already held.
    fn seeded(&mut self, pid: u32, ts_ns: u64, world: &World);
    fn capacity(&mut self, sample: &Capacity);
    fn container(&mut self, info: &ContainerInfo);
    fn diagnosis(&mut self, diagnosis: &Diagnosis);
    /// The trace ended at `end_ns`; `roles` are as known at the end, `lost` counts the events
    /// the kernel could not deliver. Returns what to tell the user (`wrote report.html`).
    fn finish(
        self: Box<Self>,
        world: &World,
        roles: &Roles,
        lost: u64,
        end_ns: u64,
    ) -> Result<Option<String>>;
}
