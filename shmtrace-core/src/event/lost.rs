//! What the probes could not report: records the kernel could not write because the ring buffer
//! was full (by record kind), and reads that failed (a path, a kernel field, an argument).
//!
//! The loader reads these counts and every sink shows or stores them, so the type lives here,
//! below both.
use std::collections::BTreeMap;

use shmtrace_common::Loss;

/// Losses by reason, counted in the kernel (`shmtrace_common::Loss`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LostCounts {
    by_kind: BTreeMap<Loss, u64>,
}

impl LostCounts {
    pub fn add(&mut self, kind: Loss, count: u64) {
        if count > 0 {
            let total = self.by_kind.entry(kind).or_default();
            *total = total.saturating_add(count);
        }
    }

    pub fn total(&self) -> u64 {
        self.by_kind
            .values()
            .fold(0, |sum, n| sum.saturating_add(*n))
    }

    pub fn by_kind(&self) -> impl Iterator<Item = (Loss, u64)> + '_ {
        self.by_kind.iter().map(|(kind, count)| (*kind, *count))
    }

    /// Counts by reason, for JSON: `{"ring_full": 3, "path_read": 2}` (reasons with a count
    /// only). A failed path read is usually another file's path that was not paged in yet,
    /// so tools that ask "were records dropped?" look at `ring_full`.
    pub fn by_reason(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut reasons = std::collections::BTreeMap::<&str, u64>::new();
        for (loss, count) in self.by_kind() {
            let key = match loss {
                Loss::RingFull(_) => "ring_full",
                Loss::PathRead => "path_read",
                Loss::KernelRead => "kernel_read",
                Loss::UserRead => "argument_read",
                Loss::Pending => "pending_full",
                Loss::Tally => "tally_full",
            };
            let slot = reasons.entry(key).or_default();
            *slot = slot.saturating_add(count);
        }
        reasons
            .into_iter()
            .map(|(key, count)| (key.to_owned(), count.into()))
            .collect()
    }

    /// `3 Syscall records (ring buffer full), 2 path reads failed`.
    pub fn describe(&self) -> String {
        self.by_kind()
            .map(|(kind, n)| format!("{n} {}", describe_loss(kind)))
            .collect::<Vec<_>>()
            .join(", ")
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

/// What one kind of loss means, after its count.
pub fn describe_loss(loss: Loss) -> String {
    match loss {
        Loss::RingFull(kind) => format!("{kind:?} records (ring buffer full)"),
        Loss::PathRead => "path reads failed".into(),
        Loss::KernelRead => "kernel field reads failed".into(),
        Loss::UserRead => "argument reads failed".into(),
        Loss::Pending => "calls not followed (pending-call table full)".into(),
        Loss::Tally => "failures not counted in the kernel (its table full)".into(),
    }
}

#[cfg(test)]
mod tests {
    use shmtrace_common::EventKind;

    use super::*;

    #[test]
    fn counts_by_reason_without_wrapping() {
        let mut counts = LostCounts::default();
        counts.add(Loss::RingFull(EventKind::Fork), 3);
        counts.add(Loss::PathRead, 2);
        counts.add(Loss::PathRead, u64::MAX);
        assert_eq!(counts.total(), u64::MAX);
        let mut earlier = LostCounts::default();
        earlier.add(Loss::RingFull(EventKind::Fork), 1);
        let delta = LostCounts::default().since(&earlier);
        assert_eq!(delta.total(), 0);
        let mut small = LostCounts::default();
        small.add(Loss::RingFull(EventKind::Fork), 3);
        small.add(Loss::PathRead, 2);
        assert_eq!(
            small.describe(),
            "3 Fork records (ring buffer full), 2 path reads failed"
        );
    }
}
