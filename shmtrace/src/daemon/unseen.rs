//! Failures and SIGBUS that the kernel counted but whose records never came (the ring buffer
//! was full): the metrics count them too, so that what they count stays exact under loss.
//!
//! The probes count a failure (`TALLIES`, by mount namespace, call and errno) before they write
//! its record, so a count read now can be ahead of the records only because they are still on
//! their way. A reading is therefore compared with the records one reading later: by then every
//! record it counted has been read, or was lost. What is missing then is unseen for good, and
//! is counted once; later records cannot make up for it, for they are counted in later
//! readings.
use std::collections::HashMap;

use shmtrace_common::TallyKey;

/// Readings a namespace's counts stay after its container ended, before they are forgotten:
/// the last records of its processes are still compared.
const READINGS_KEPT_AFTER_END: u32 = 2;

#[derive(Default)]
pub struct Unseen {
    /// The kernel's counts at the last reading.
    counted: HashMap<TallyKey, u64>,
    /// Records read, by key.
    seen: HashMap<TallyKey, u64>,
    /// What was counted as unseen already, by key.
    added: HashMap<TallyKey, u64>,
    /// Namespaces whose container ended, with the readings left before they are forgotten.
    ending: HashMap<u32, u32>,
}

/// What one reading found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Counted in the kernel, never read as records: to be counted now.
    pub unseen: Vec<(TallyKey, u64)>,
    /// Keys of ended namespaces, to delete from the kernel's map.
    pub forget: Vec<TallyKey>,
}

impl Unseen {
    /// A record of a failure or SIGBUS was read.
    pub fn saw(&mut self, key: TallyKey) {
        *self.seen.entry(key).or_default() += 1;
    }

    /// The namespace's container ended: its counts go after a few more readings, so that a
    /// recycled number starts from zero.
    pub fn ended(&mut self, mntns: u32) {
        self.ending.entry(mntns).or_insert(READINGS_KEPT_AFTER_END);
    }

    /// Entries held, for the daemon's state metrics.
    pub fn entries(&self) -> usize {
        self.counted.len().max(self.seen.len())
    }

    /// Compares the last reading with the records read since, and keeps `reading` for the
    /// next comparison.
    pub fn reconcile(&mut self, reading: Vec<(TallyKey, u64)>) -> Reconciled {
        let mut found = Reconciled::default();
        for (key, &counted) in &self.counted {
            let seen = self.seen.get(key).copied().unwrap_or(0);
            let added = self.added.entry(*key).or_default();
            let missing = counted.saturating_sub(seen.saturating_add(*added));
            if missing > 0 {
                *added += missing;
                found.unseen.push((*key, missing));
            }
        }
        found.unseen.sort_unstable();
        self.counted = reading.into_iter().collect();

        let mut gone = Vec::new();
        self.ending.retain(|&mntns, left| {
            *left -= 1;
            if *left == 0 {
                gone.push(mntns);
            }
            *left > 0
        });
        for mntns in gone {
            found.forget.extend(
                self.counted
                    .keys()
                    .chain(self.seen.keys())
                    .filter(|key| key.mntns == mntns)
                    .copied(),
            );
            self.counted.retain(|key, _| key.mntns != mntns);
            self.seen.retain(|key, _| key.mntns != mntns);
            self.added.retain(|key, _| key.mntns != mntns);
        }
        found.forget.sort_unstable();
        found.forget.dedup();
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(mntns: u32) -> TallyKey {
        TallyKey {
            mntns,
            what: 5,
            errno: 28,
        }
    }

    #[test]
    fn records_still_on_their_way_are_not_unseen_and_lost_ones_are_counted_once() {
        let mut unseen = Unseen::default();
        // Three failures counted; one record read so far, two on their way.
        unseen.saw(key(7));
        assert_eq!(unseen.reconcile(vec![(key(7), 3)]), Reconciled::default());
        // One of the two came, one was lost; meanwhile two more were counted and read.
        for _ in 0..3 {
            unseen.saw(key(7));
        }
        let found = unseen.reconcile(vec![(key(7), 5)]);
        assert_eq!(
            found.unseen,
            Vec::new(),
            "3 counted, 4 read: nothing missing yet"
        );
        // The next reading: 5 counted, 4 read, so one is unseen, and only once.
        assert_eq!(
            unseen.reconcile(vec![(key(7), 5)]).unseen,
            vec![(key(7), 1)]
        );
        assert_eq!(unseen.reconcile(vec![(key(7), 5)]).unseen, Vec::new());
    }

    #[test]
    fn a_flood_of_lost_records_is_counted_whole() {
        let mut unseen = Unseen::default();
        for _ in 0..10 {
            unseen.saw(key(7));
        }
        unseen.reconcile(vec![(key(7), 10_000)]);
        let found = unseen.reconcile(vec![(key(7), 10_000)]);
        assert_eq!(found.unseen, vec![(key(7), 9_990)]);
    }

    #[test]
    fn an_ended_namespace_is_forgotten_after_its_last_readings() {
        let mut unseen = Unseen::default();
        unseen.reconcile(vec![(key(7), 2), (key(8), 1)]);
        unseen.ended(7);
        // Its last records are still compared: one of the two never came.
        unseen.saw(key(7));
        let found = unseen.reconcile(vec![(key(7), 2), (key(8), 1)]);
        assert_eq!(found.unseen, vec![(key(7), 1), (key(8), 1)]);
        assert_eq!(found.forget, Vec::new());
        let found = unseen.reconcile(vec![(key(7), 2), (key(8), 1)]);
        assert_eq!(found.forget, vec![key(7)]);
        // The number's next owner starts from zero.
        unseen.saw(key(7));
        unseen.reconcile(vec![(key(7), 1), (key(8), 1)]);
        assert_eq!(unseen.reconcile(vec![(key(7), 1)]).unseen, Vec::new());
    }
}
