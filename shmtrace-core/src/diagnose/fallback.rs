//! A failed call followed at once by a successful one of the same kind from the same thread is
//! a probe, not a failure: libraries ask for huge pages and take ordinary ones, try one way and
//! then another. The failure is held as usual; the fallback withdraws it.
use super::Diagnoser;
use crate::event::{Call, Event, Syscall};

/// How soon the fallback must follow: a library's retry comes within microseconds; a program
/// that fails, reports and tries again later has not probed.
pub(super) const FALLBACK_NS: u64 = 5_000_000;

/// The latest failed call of a thread, until its next call.
#[derive(Clone, Copy, Debug)]
pub(super) struct LastFailed {
    pid: u32,
    syscall: Syscall,
    ts_ns: u64,
}

impl Diagnoser {
    /// Takes in a call: a failure of it is remembered for its thread, and a success that
    /// follows a failure of the same kind at once withdraws that failure.
    pub(super) fn learn_fallback(&mut self, event: &Event, call: &Call, failed_now: bool) {
        let previous = self.last_failed.remove(&event.tid);
        if failed_now {
            self.last_failed.insert(
                event.tid,
                LastFailed {
                    pid: event.pid,
                    syscall: call.syscall,
                    ts_ns: event.ts_ns,
                },
            );
            return;
        }
        let Some(previous) = previous else { return };
        if call.failed()
            || previous.syscall != call.syscall
            || previous.pid != event.pid
            || event.ts_ns.saturating_sub(previous.ts_ns) > FALLBACK_NS
        {
            return;
        }
        if let Some(pending) = self.pending.get_mut(&event.pid) {
            let before = pending.len();
            pending.retain(|f| !(f.tid == event.tid && f.ts_ns == previous.ts_ns));
            let withdrawn = (before - pending.len()) as u64;
            if let Some(outcome) = self.outcomes.get_mut(&event.pid) {
                outcome.0 = outcome.0.saturating_sub(withdrawn);
            }
            if pending.is_empty() {
                self.pending.remove(&event.pid);
            }
        }
    }
}
