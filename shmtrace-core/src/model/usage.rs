//! Running counts: over the whole trace, and per /dev/shm file system.

/// Running totals over the whole trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub events: u64,
    pub failed_calls: u64,
    pub objects_created: u64,
    pub objects_freed: u64,
    /// Memory held by live objects now, and at most.
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub processes_seen: u64,
    pub deaths_by_signal: u64,
}

/// What the traced processes' objects take on one /dev/shm file system.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShmUsage {
    /// Live objects.
    pub objects: u64,
    /// What the live objects take once fully written: the sum of `max(size, allocated)`.
    pub demand: u64,
    /// What they hold now, as far as system calls showed it.
    pub allocated: u64,
    pub peak_demand: u64,
    pub peak_allocated: u64,
}

impl ShmUsage {
    /// Replaces one object's `(demand, allocated)` contribution by another.
    pub(super) fn change(&mut self, before: (u64, u64), after: (u64, u64)) {
        self.demand = (self.demand + after.0).saturating_sub(before.0);
        self.allocated = (self.allocated + after.1).saturating_sub(before.1);
        self.peak_demand = self.peak_demand.max(self.demand);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
    }
}
