//! Records of processes not yet attributed to a followed container.
//!
//! While a followed container is not running (`--wait`, or after it stopped), the probes report
//! every process outside shmtrace's own mount namespace, flagged `HELD`: a container's first
//! processes run before its runtime has told shmtrace which namespace is its. Those records
//! wait here, by mount namespace. When the watcher learns a followed container's namespace, its
//! records go on to the pipeline, in the order they were made; records of other namespaces
//! (other containers, sandboxed services) are dropped after [`HOLD_FOR`].
use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant},
};

use bytes::Bytes;
use shmtrace_common::{Header, flags};
use zerocopy::FromBytes;

/// How long a record waits for its namespace to be named. Runtimes under load take seconds
/// to answer for a container that just started; this leaves them many.
pub const HOLD_FOR: Duration = Duration::from_secs(30);
/// At most this many bytes of records wait; the oldest go first, and are counted.
pub const HOLD_BYTES: usize = 32 << 20;

struct Waiting {
    arrived: Instant,
    mntns: u32,
    /// When the probes made it (`CLOCK_BOOTTIME` ns).
    ts_ns: u64,
    record: Bytes,
}

#[derive(Default)]
pub struct Hold {
    /// Waiting records, oldest first.
    waiting: VecDeque<Waiting>,
    bytes: usize,
    /// Namespaces of followed containers: their held records pass straight on.
    followed: HashSet<u32>,
    /// Records dropped from a namespace for want of room, said when it is followed.
    dropped: HashMap<u32, u64>,
    /// Records released and not yet handed on.
    ready: Vec<Bytes>,
}

impl Hold {
    /// Sorts a batch from the ring: records to work on now stay in `batch`, in order; held
    /// records of namespaces not (yet) followed are kept back.
    pub fn admit(&mut self, batch: &mut Vec<Bytes>, now: Instant) {
        batch.retain(|record| self.admit_one(record, now));
    }

    /// Whether to work on `record` now; if not, it is kept back.
    pub fn admit_one(&mut self, record: &Bytes, now: Instant) -> bool {
        let Some((mntns, ts_ns)) = held_namespace(record) else {
            return true;
        };
        if self.followed.contains(&mntns) {
            return true;
        }
        self.expire(now);
        self.bytes += record.len();
        self.waiting.push_back(Waiting {
            arrived: now,
            mntns,
            ts_ns,
            record: record.clone(),
        });
        self.make_room();
        false
    }

    fn make_room(&mut self) {
        while self.bytes > HOLD_BYTES {
            let Some(oldest) = self.waiting.pop_front() else {
                break;
            };
            self.bytes -= oldest.record.len();
            *self.dropped.entry(oldest.mntns).or_default() += 1;
        }
    }

    /// As [`Hold::admit`], before there is a pipeline to hand records to: those that need no
    /// holding wait with the released ones.
    pub fn keep(&mut self, batch: &mut Vec<Bytes>, now: Instant) {
        self.admit(batch, now);
        self.ready.append(batch);
    }

    /// A followed container runs in `mntns`, since its first process started at `since_ns`
    /// (when known): its held records are released (see [`Hold::take_ready`]), and those still
    /// in the ring pass from now on. Records of that namespace number from before `since_ns`
    /// are another's (numbers are reused once a namespace is gone) or the runtime's setting
    /// up, and are dropped. Returns how many of its records were dropped for want of room.
    pub fn follow(&mut self, mntns: u32, since_ns: Option<u64>) -> u64 {
        self.followed.insert(mntns);
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        for one in self.waiting.drain(..) {
            if one.mntns != mntns {
                kept.push_back(one);
                continue;
            }
            self.bytes -= one.record.len();
            if since_ns.is_none_or(|since| one.ts_ns >= since) {
                self.ready.push(one.record);
            }
        }
        self.waiting = kept;
        self.dropped.remove(&mntns).unwrap_or(0)
    }

    /// The container in `mntns` stopped (its first process exited): the number may name an
    /// unrelated namespace next.
    pub fn unfollow(&mut self, mntns: u32) {
        self.followed.remove(&mntns);
    }

    /// Records released by [`Hold::follow`], oldest first.
    pub fn take_ready(&mut self) -> Vec<Bytes> {
        std::mem::take(&mut self.ready)
    }

    fn expire(&mut self, now: Instant) {
        while let Some(oldest) = self.waiting.front() {
            if now.duration_since(oldest.arrived) < HOLD_FOR {
                break;
            }
            self.bytes -= oldest.record.len();
            self.waiting.pop_front();
        }
    }
}

/// The mount namespace and time of a held record; `None` for any other record.
fn held_namespace(record: &[u8]) -> Option<(u32, u64)> {
    let (header, _) = Header::read_from_prefix(record).ok()?;
    (header.flags & flags::HELD != 0).then_some((header.mntns, header.ts_ns))
}

#[cfg(test)]
mod tests {
    use zerocopy::IntoBytes;

    use super::*;

    fn record(mntns: u32, held: bool, pid: u32) -> Bytes {
        let header = Header {
            flags: if held { flags::HELD } else { 0 },
            mntns,
            pid,
            ts_ns: u64::from(pid) * 1000,
            ..Header::default()
        };
        Bytes::copy_from_slice(header.as_bytes())
    }

    fn pids(records: &[Bytes]) -> Vec<u32> {
        records
            .iter()
            .map(|r| Header::read_from_prefix(r).unwrap().0.pid)
            .collect()
    }

    #[test]
    fn a_followed_namespace_gets_its_held_records_in_order_and_others_wait() {
        let mut hold = Hold::default();
        let now = Instant::now();
        let mut batch = vec![
            record(7, true, 1),
            record(8, true, 2),
            record(0, false, 3),
            record(7, true, 4),
        ];
        hold.admit(&mut batch, now);
        assert_eq!(pids(&batch), vec![3], "only the unheld record passes");
        assert_eq!(hold.follow(7, None), 0);
        assert_eq!(pids(&hold.take_ready()), vec![1, 4]);
        assert!(hold.take_ready().is_empty());

        let mut later = vec![record(7, true, 5), record(8, true, 6)];
        hold.admit(&mut later, now);
        assert_eq!(pids(&later), vec![5], "namespace 7 is followed now");
        hold.follow(8, None);
        assert_eq!(pids(&hold.take_ready()), vec![2, 6]);
        hold.unfollow(7);
        let mut reused = vec![record(7, true, 9)];
        hold.admit(&mut reused, now);
        assert!(
            reused.is_empty(),
            "a stopped container's number is held again"
        );
    }

    #[test]
    fn records_from_before_the_container_started_are_another_namespace_of_that_number() {
        let mut hold = Hold::default();
        let now = Instant::now();
        let mut batch = vec![record(7, true, 1), record(7, true, 2), record(7, true, 3)];
        hold.admit(&mut batch, now);
        assert_eq!(hold.follow(7, Some(2000)), 0);
        assert_eq!(pids(&hold.take_ready()), vec![2, 3]);
    }

    #[test]
    fn old_records_expire_and_a_full_hold_counts_what_it_drops() {
        let mut hold = Hold::default();
        let start = Instant::now();
        hold.admit(&mut vec![record(7, true, 1)], start);
        hold.admit(&mut vec![record(8, true, 2)], start + HOLD_FOR);
        assert_eq!(hold.follow(7, None), 0);
        assert!(hold.take_ready().is_empty(), "expired");
        hold.follow(8, None);
        assert_eq!(pids(&hold.take_ready()), vec![2]);

        let per = record(9, true, 0).len();
        let mut flood: Vec<Bytes> = (0..HOLD_BYTES / per + 10)
            .map(|i| record(9, true, i as u32))
            .collect();
        hold.admit(&mut flood, start);
        assert_eq!(hold.follow(9, None), 10);
        let ready = hold.take_ready();
        assert_eq!(ready.len(), HOLD_BYTES / per);
        assert_eq!(pids(&ready)[0], 10, "the oldest were dropped");
    }
}
