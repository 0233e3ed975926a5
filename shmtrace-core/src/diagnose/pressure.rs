//! What a single failure does not show: the other requests that failed at the same moment on
//! the same /dev/shm, and how the sizes asked for grew before it. Advice built from one
//! request, at one size, takes several rounds of failures to reach a size that works.
use std::collections::{HashMap, VecDeque};

use super::{
    Failure, FailureKind,
    recommend::{Burst, Growth},
};

/// Failures within this long of each other count as one burst.
const BURST_WINDOW_NS: u64 = 1_000_000_000;
/// Failures remembered per /dev/shm.
const REMEMBERED: usize = 256;

#[derive(Clone, Copy, Debug)]
struct Refused {
    ts_ns: u64,
    pid: u32,
    request: u64,
    unmet: u64,
}

#[derive(Default)]
pub struct Pressure {
    refused: HashMap<u32, VecDeque<Refused>>,
    /// Per /dev/shm, each request size larger than all before it, in order.
    maxima: crate::model::FastMap<u32, Vec<u64>>,
}

impl Pressure {
    /// A size asked of an object on /dev/shm `dev` (ftruncate, fallocate, failed or not).
    pub fn asked(&mut self, dev: u32, request: u64) {
        let maxima = self.maxima.entry(dev).or_default();
        if request > maxima.last().copied().unwrap_or(0) {
            maxima.push(request);
        }
    }

    /// A request that /dev/shm `dev` refused.
    pub fn refused(&mut self, dev: u32, ts_ns: u64, pid: u32, request: u64, unmet: u64) {
        let refused = self.refused.entry(dev).or_default();
        if refused.len() == REMEMBERED {
            refused.pop_front();
        }
        refused.push_back(Refused {
            ts_ns,
            pid,
            request,
            unmet,
        });
    }

    /// The requests refused on `dev` within a second of `ts_ns`: each process's largest.
    pub fn burst(&self, dev: u32, ts_ns: u64) -> Burst {
        let mut per_pid: HashMap<u32, Refused> = HashMap::new();
        for r in self.refused.get(&dev).into_iter().flatten() {
            if r.ts_ns.abs_diff(ts_ns) > BURST_WINDOW_NS {
                continue;
            }
            let entry = per_pid.entry(r.pid).or_insert(*r);
            if r.request > entry.request {
                *entry = *r;
            }
        }
        Burst {
            processes: per_pid.len() as u32,
            requested: per_pid.values().map(|r| r.request).sum(),
            unmet: per_pid.values().map(|r| r.unmet).sum(),
        }
    }

    /// The requests refused with `primary` (itself at least), and how they grew.
    pub fn at(&self, primary: &Failure) -> (Burst, Option<Growth>) {
        let request = match &primary.kind {
            FailureKind::Call { request, .. } => *request,
            _ => 0,
        };
        let own = Burst {
            processes: 1,
            requested: request,
            unmet: primary.unmet,
        };
        let Some(dev) = primary.dev else {
            return (own, None);
        };
        let mut burst = self.burst(dev, primary.ts_ns);
        if burst.unmet < own.unmet {
            burst = own;
        }
        // Processes sharing its objects work on the same thing and may ask as it did: a
        // PostgreSQL worker that fails first, before the others ask, speaks for them all.
        let sharing = primary.peers + 1;
        if request > 0 && sharing > burst.processes {
            burst = Burst {
                processes: sharing,
                requested: burst.requested.max(u64::from(sharing) * request),
                unmet: burst.unmet.max(u64::from(sharing) * primary.unmet),
            };
        }
        let growth = self.growth(dev, request).or_else(|| {
            is_postgres_segment(&primary.kind).then_some(Growth {
                from: request / 2,
                to: request,
                known: Some("PostgreSQL's segments double"),
            })
        });
        (burst, growth)
    }

    /// How requests grew up to `request`, when it was the largest asked of `dev` so far and
    /// the last two steps up to it each grew the size by 1.5x to 4x (a trend, like
    /// PostgreSQL's doubling segments; not one big object after a few small ones).
    pub fn growth(&self, dev: u32, request: u64) -> Option<Growth> {
        let maxima = self.maxima.get(&dev)?;
        let steady = |from: u64, to: u64| from > 0 && to >= from + from / 2 && to <= 4 * from;
        match maxima.as_slice() {
            [.., before, from, to]
                if *to == request && steady(*before, *from) && steady(*from, *to) =>
            {
                Some(Growth {
                    from: *from,
                    to: *to,
                    known: None,
                })
            }
            _ => None,
        }
    }
}

/// A PostgreSQL dynamic shared memory segment (`/dev/shm/PostgreSQL.N`) that could not be
/// sized: a parallel query's shared hash table grows in segments of doubling size.
pub(super) fn is_postgres_segment(kind: &FailureKind) -> bool {
    matches!(kind, FailureKind::Call { path: Some(path), .. }
        if super::base_name(path).starts_with("PostgreSQL."))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_burst_counts_each_process_once_and_only_those_near_in_time() {
        let mut p = Pressure::default();
        p.refused(7, 1_000, 1, 16 * MIB, 8 * MIB);
        p.refused(7, 2_000, 1, 8 * MIB, 8 * MIB); // same process, smaller: not added
        p.refused(7, 3_000, 2, 16 * MIB, 8 * MIB);
        p.refused(7, 5_000_000_000, 3, 16 * MIB, 16 * MIB); // seconds later
        p.refused(8, 1_000, 4, 16 * MIB, 16 * MIB); // another /dev/shm
        let burst = p.burst(7, 1_500);
        assert_eq!(burst.processes, 2);
        assert_eq!(burst.requested, 32 * MIB);
        assert_eq!(burst.unmet, 16 * MIB);
    }

    #[test]
    fn growth_is_the_step_to_the_newest_largest_request() {
        let mut p = Pressure::default();
        for size in [MIB, 2 * MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB] {
            p.asked(7, size);
        }
        assert_eq!(
            p.growth(7, 16 * MIB),
            Some(Growth {
                from: 8 * MIB,
                to: 16 * MIB,
                known: None,
            })
        );
        // A request no larger than one before it is no growth.
        assert_eq!(p.growth(7, 4 * MIB), None);
        assert_eq!(p.growth(8, 4 * MIB), None);
        // Nor is one large object after small ones (a semaphore page, then a segment).
        p.asked(9, 4096);
        p.asked(9, 8192);
        p.asked(9, 6 * MIB);
        assert_eq!(p.growth(9, 6 * MIB), None);
    }
}
