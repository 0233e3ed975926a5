//! The count of records the kernel could not write because the ring buffer was full.
//!
//! The loader reads these counts and every sink shows or stores them, so the type lives here,
//! below both.
use std::collections::BTreeMap;

use shmtrace_common::EventKind;

/// Records the kernel could not write because the ring buffer was full, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LostCounts {
    by_kind: BTreeMap<EventKind, u64>,
}

impl LostCounts {
    pub fn add(&mut self, kind: EventKind, count: u64) {
        if count > 0 {
            *self.by_kind.entry(kind).or_default() += count;
        }
    }

    pub fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }

    pub fn by_kind(&self) -> impl Iterator<Item = (EventKind, u64)> + '_ {
        self.by_kind.iter().map(|(kind, count)| (*kind, *count))
    }

    /// What was lost since `earlier`.
    pub fn since(&self, earlier: &LostCounts) -> LostCounts {
        let mut delta = LostCounts::default();
        for (kind, count) in self.by_kind() {
            let before = earlier.by_kind.get(&kind).copied().unwrap_or(0);
            delta.add(kind, count.saturating_sub(before));
        }
        delta
    }
}
