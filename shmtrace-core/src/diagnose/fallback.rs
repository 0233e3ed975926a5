//! A failed call followed by a successful one of the same kind from the same thread is a
//! probe, not a failure: libraries ask for huge pages and take ordinary ones, try one way and
//! then another. The failure is held as usual; the fallback withdraws it.
//!
//! Two shapes, seen in real programs:
//! - a huge-page request refused (`SHM_HUGETLB`, `MAP_HUGETLB`): withdrawn by the thread's next
//!   success of the same call, whatever it did in between and however long the machine took
//!   (UCX asks `shmctl(IPC_INFO)` for the System V limits between its huge and its ordinary
//!   `shmget`); a program that wanted huge pages and could not do without them makes no
//!   ordinary request, and is diagnosed for the pool;
//! - any other failure: withdrawn only by a success of the same call that is the thread's very
//!   next call and comes at once, so that a program that fails, reports and tries again later
//!   keeps its failure.
use super::Diagnoser;
use crate::event::{Call, Event, Syscall};

/// How soon the fallback must follow: a library's retry comes within microseconds; a program
/// that fails, reports and tries again later has not probed.
pub(super) const FALLBACK_NS: u64 = 5_000_000;

/// A failed call of a thread, until its fallback or (for a failure other than a huge-page
/// request) the thread's next call.
#[derive(Clone, Copy, Debug)]
pub(super) struct LastFailed {
    pid: u32,
    syscall: Syscall,
    ts_ns: u64,
}

impl Diagnoser {
    /// Takes in a call: a failure of it is remembered for its thread, and a success that
    /// falls back from a failure of the same kind withdraws that failure.
    pub(super) fn learn_fallback(&mut self, event: &Event, call: &Call, failed_now: bool) {
        let previous = self.last_failed.remove(&event.tid);
        if failed_now {
            let failed = LastFailed {
                pid: event.pid,
                syscall: call.syscall,
                ts_ns: event.ts_ns,
            };
            if call.asks_for_huge_pages() {
                self.huge_refused.entry(event.tid).or_default().push(failed);
            } else {
                self.last_failed.insert(event.tid, failed);
            }
            return;
        }
        if call.failed() {
            return;
        }
        if let Some(refused) = self.huge_refused.get_mut(&event.tid) {
            let (fell_back, kept): (Vec<LastFailed>, Vec<LastFailed>) = refused
                .drain(..)
                .partition(|r| r.syscall == call.syscall && r.pid == event.pid);
            if kept.is_empty() {
                self.huge_refused.remove(&event.tid);
            } else {
                *refused = kept;
            }
            for failed in fell_back {
                self.withdraw(event.pid, event.tid, failed.ts_ns);
            }
        }
        let Some(previous) = previous else { return };
        if previous.syscall != call.syscall
            || previous.pid != event.pid
            || event.ts_ns.saturating_sub(previous.ts_ns) > FALLBACK_NS
        {
            return;
        }
        self.withdraw(event.pid, event.tid, previous.ts_ns);
    }

    /// Withdraws the huge-page requests `pid` was refused and had not yet fallen back from,
    /// when another process ends it: stopped before it could take ordinary pages, it never
    /// showed that it could not do without (the ranks of a parallel job a launcher stops when
    /// one fails, on a loaded machine).
    pub(super) fn withdraw_unanswered_huge_requests(&mut self, pid: u32) {
        let unanswered: Vec<(u32, u64)> = self
            .huge_refused
            .iter()
            .flat_map(|(tid, refused)| refused.iter().map(move |r| (*tid, *r)))
            .filter(|(_, r)| r.pid == pid)
            .map(|(tid, r)| (tid, r.ts_ns))
            .collect();
        for (tid, ts_ns) in unanswered {
            self.withdraw(pid, tid, ts_ns);
        }
    }

    /// Forgets what a process that ended had refused (`tid`: the thread its exit came from;
    /// a refusal of another of its threads goes by its pid, from the few held).
    pub(super) fn forget_fallbacks(&mut self, pid: u32, tid: u32) {
        self.last_failed.remove(&tid);
        if !self.huge_refused.is_empty() {
            self.huge_refused
                .retain(|_, refused| refused.iter().all(|r| r.pid != pid));
        }
    }

    /// Takes back the failure `tid` had at `ts_ns`: it fell back from it.
    fn withdraw(&mut self, pid: u32, tid: u32, ts_ns: u64) {
        let Some(pending) = self.pending.get_mut(&pid) else {
            return;
        };
        let before = pending.len();
        pending.retain(|f| !(f.tid == tid && f.ts_ns == ts_ns));
        let withdrawn = (before - pending.len()) as u64;
        if let Some(outcome) = self.outcomes.get_mut(&pid) {
            outcome.0 = outcome.0.saturating_sub(withdrawn);
        }
        if pending.is_empty() {
            self.pending.remove(&pid);
        }
    }
}
