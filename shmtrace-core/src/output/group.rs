//! Diagnoses of processes that failed the same way at the same time, shown as one block: four
//! DataLoader workers that each failed to fallocate a batch, the parallel workers of one
//! PostgreSQL query. Each process keeps its own diagnosis in JSON; only the text and the HTML
//! report put them together.
use crate::diagnose::{Diagnosis, FailureKind};

/// Diagnoses made this close together (their processes ended together) may share a block.
pub const WINDOW_NS: u64 = 1_000_000_000;

/// Whether `b` tells the same story as `a`: the same cause and remedy, the same kind of
/// failure, the same role under the same parent, in the same place, ended the same way,
/// within [`WINDOW_NS`].
pub fn same_story(a: &Diagnosis, b: &Diagnosis) -> bool {
    a.follows.is_none()
        && b.follows.is_none()
        && !a.failures.is_empty()
        && !b.failures.is_empty()
        && a.ts_ns.abs_diff(b.ts_ns) <= WINDOW_NS
        && a.place == b.place
        && a.cause == b.cause
        && a.role.kind == b.role.kind
        && a.role.trainer == b.role.trainer
        && a.program.map(|k| k.program) == b.program.map(|k| k.program)
        && a.program_role == b.program_role
        && a.ending == b.ending
        && a.recommendation.as_ref().map(|r| r.min_bytes)
            == b.recommendation.as_ref().map(|r| r.min_bytes)
        && shape(a) == shape(b)
}

/// What failed, without where or how much: `("fallocate", "ENOSPC")`, `("SIGBUS", "BUS_ADRERR")`.
fn shape(d: &Diagnosis) -> Option<(&str, &str)> {
    d.failures.first().map(|f| match &f.kind {
        FailureKind::Call { syscall, errno, .. } => (*syscall, errno.as_str()),
        FailureKind::Fault { signal, code, .. } => (signal.as_str(), code.as_str()),
        FailureKind::OomKill => ("oom_kill", ""),
        FailureKind::SpaceCheck { .. } => ("space_check", ""),
    })
}

/// When its first failure happened (its diagnosis's time when it had none).
pub fn first_failure_ns(d: &Diagnosis) -> u64 {
    d.failures.iter().map(|f| f.ts_ns).min().unwrap_or(d.ts_ns)
}

/// Splits diagnoses, in the order they were made, into blocks: each of those that tell the
/// same story as its first, the one whose failure came first leading.
pub fn blocks(all: &[Diagnosis]) -> Vec<Vec<&Diagnosis>> {
    let mut blocks: Vec<Vec<&Diagnosis>> = Vec::new();
    for d in all {
        match blocks.last_mut() {
            Some(block) if same_story(block[0], d) => block.push(d),
            _ => blocks.push(vec![d]),
        }
    }
    for block in &mut blocks {
        block.sort_by_key(|d| (first_failure_ns(d), d.pid));
    }
    blocks
}

/// Diagnoses waiting for the others of their block, as a stream shows them.
#[derive(Default)]
pub struct Pending {
    waiting: Vec<Diagnosis>,
}

impl Pending {
    /// Takes `d`; returns the blocks ready to show: the one it closes, if it tells another
    /// story, and itself when nothing can join it (a trainer that only followed its worker).
    pub fn push(&mut self, d: Diagnosis) -> Vec<Vec<Diagnosis>> {
        let mut ready = Vec::new();
        if let Some(first) = self.waiting.first()
            && !same_story(first, &d)
        {
            ready.extend(self.take());
        }
        if d.follows.is_some() || d.failures.is_empty() {
            ready.push(vec![d]);
        } else {
            self.waiting.push(d);
        }
        ready
    }

    /// The block, once nothing can join it any more: the trace has moved `now_ns` past it.
    pub fn due(&mut self, now_ns: u64) -> Option<Vec<Diagnosis>> {
        let last = self.waiting.iter().map(|d| d.ts_ns).max()?;
        (now_ns > last.saturating_add(WINDOW_NS)).then(|| self.take())?
    }

    /// The block waiting, whatever may come.
    pub fn take(&mut self) -> Option<Vec<Diagnosis>> {
        if self.waiting.is_empty() {
            return None;
        }
        let mut block = std::mem::take(&mut self.waiting);
        block.sort_by_key(|d| (first_failure_ns(d), d.pid));
        Some(block)
    }
}
