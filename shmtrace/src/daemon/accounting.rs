//! What the records did not say, made up for once a second: the kernel's loss counters (what
//! the ring buffer dropped), its tallies of failures, SIGBUS and deaths whose records never came
//! (`unseen`), and the processes the analysis thinks alive whose exit records were lost (the
//! vanished-process sweep).
use std::{
    cell::RefCell,
    rc::Rc,
    time::{Duration, Instant},
};

use anyhow::Result;
use shmtrace_common::{Loss, TallyKey};

use super::{
    fleet::Fleet,
    metrics::{KindLabels, Metrics},
    series::Countable,
    unseen::Unseen,
    whose::there_at,
};
use crate::live::bpf::Tracer;
use shmtrace_core::{clock::boot_ns, event::LostCounts, pipeline::Pipeline};

/// How often the analysis' live processes are looked for in /proc when nothing was lost.
const VANISH_CHECK_EVERY: Duration = Duration::from_secs(30);
/// How long a process must have been silent to be looked for: its exit record, if it has one,
/// has been read by then.
const QUIET_BEFORE_VANISHED_NS: u64 = 2_000_000_000;

/// The daemon's own kinds of probe error (beside the probes' failed reads).
pub const PROBE_ERRORS: [&str; 3] = ["lost_counters", "tally_counters", "shm_devs"];

/// A probe map that could not be read or updated: said in the metrics and the log.
pub struct ProbeError {
    pub kind: &'static str,
    pub error: String,
}

pub struct Accounting {
    lost: LostCounts,
    /// Failures, SIGBUS and deaths counted in the kernel, against the records read.
    unseen: Rc<RefCell<Unseen>>,
    /// When the kernel's counts were last read (`CLOCK_BOOTTIME` ns): what is found missing
    /// at the next reading happened before.
    counts_read_ns: u64,
    /// Losses counted, and when, at the last look for vanished processes.
    lost_at_vanish_check: u64,
    vanish_checked: Instant,
    /// A gone process was seen too recently to be forgotten at the last look.
    vanish_check_owed: bool,
    /// The ring buffer was found empty (and what it held handled) since the kernel's counts
    /// were last read: every record written before that reading has been read, or was lost.
    caught_up: bool,
    /// The latest record handled (`CLOCK_BOOTTIME` ns): one written after the reading has
    /// been read, so every one written before it has been too (the reader takes the ring in
    /// order, and stops at a record not yet committed).
    latest_record_ns: u64,
}

/// A record stamped this long after a reading was written after it.
const STAMPED_AFTER_NS: u64 = 1_000_000;

impl Accounting {
    pub fn new(unseen: Rc<RefCell<Unseen>>, metrics: &Metrics) -> Accounting {
        // Every kind's loss, unrecorded and probe error counter exists from the start, so
        // that the first is an increase Prometheus sees.
        for kind in shmtrace_common::EventKind::ALL {
            drop(
                metrics
                    .events_lost
                    .get_or_create(&loss_labels(Loss::RingFull(kind))),
            );
        }
        for kind in ["failure", "sigbus", "death"] {
            drop(metrics.unrecorded.get_or_create(&KindLabels::of(kind)));
        }
        let probe_errors = [
            Loss::PathRead,
            Loss::KernelRead,
            Loss::UserRead,
            Loss::Pending,
            Loss::Tally,
        ]
        .map(loss_labels)
        .into_iter()
        .chain(PROBE_ERRORS.map(KindLabels::of));
        for labels in probe_errors {
            drop(metrics.probe_errors.get_or_create(&labels));
        }
        Accounting {
            lost: LostCounts::default(),
            unseen,
            counts_read_ns: 0,
            lost_at_vanish_check: 0,
            vanish_checked: Instant::now(),
            vanish_check_owed: false,
            caught_up: true,
            latest_record_ns: 0,
        }
    }

    /// Entries held, for the state metrics.
    pub fn entries(&self) -> usize {
        self.unseen.borrow().entries()
    }

    /// The kernel's loss counters: what is new goes to the metrics and the pipeline.
    pub fn check_lost(
        &mut self,
        tracer: &Tracer,
        pipeline: &mut Pipeline,
        metrics: &Metrics,
    ) -> Result<Option<ProbeError>> {
        let total = match tracer.lost() {
            Ok(total) => total,
            Err(error) => {
                return Ok(Some(ProbeError {
                    kind: "lost_counters",
                    error: error.to_string(),
                }));
            }
        };
        for (loss, count) in total.since(&self.lost).by_kind() {
            // A full ring buffer loses events; a failed probe read is a probe error (under
            // host-wide tracing, mostly other processes' paths that were not paged in).
            let family = match loss {
                Loss::RingFull(_) => &metrics.events_lost,
                _ => &metrics.probe_errors,
            };
            family.get_or_create(&loss_labels(loss)).inc_by(count);
        }
        self.lost = total.clone();
        pipeline.lost(total, boot_ns()?)?;
        Ok(None)
    }

    /// The reader found the ring buffer empty, and what it held has been handled.
    pub fn caught_up(&mut self) {
        self.caught_up = true;
    }

    /// A record stamped `ts_ns` has been handled.
    pub fn handled(&mut self, ts_ns: u64) {
        self.latest_record_ns = self.latest_record_ns.max(ts_ns);
    }

    /// Counts the failures, SIGBUS and deaths that the kernel counted and whose records were
    /// lost, for the container of their namespace, so that the metrics' counts stay exact.
    ///
    /// The last reading is compared with the records read since only once the reader has
    /// caught up with the ring buffer, or read a record written after it: a reader that lags
    /// (a starved daemon reads seconds late) has records of it still to read, which are not
    /// lost, and would be counted twice. Until then, the last reading is kept and nothing is
    /// compared.
    pub fn count_unseen(
        &mut self,
        tracer: &mut Tracer,
        fleet: &mut Fleet,
        metrics: &Metrics,
    ) -> Result<Vec<ProbeError>> {
        let past = self.latest_record_ns > self.counts_read_ns.saturating_add(STAMPED_AFTER_NS);
        if !std::mem::take(&mut self.caught_up) && !past {
            return Ok(Vec::new());
        }
        let reading = match tracer.tallies() {
            Ok(reading) => reading,
            Err(error) => {
                return Ok(vec![ProbeError {
                    kind: "tally_counters",
                    error: error.to_string(),
                }]);
            }
        };
        let before_ns = self.counts_read_ns;
        self.counts_read_ns = boot_ns()?;
        let found = self.unseen.borrow_mut().reconcile(reading);
        for (key, count) in found.unseen {
            let Some((kind, tally)) = unseen_tally(key, count) else {
                continue;
            };
            metrics
                .unrecorded
                .get_or_create(&KindLabels::of(kind))
                .inc_by(count);
            fleet.count_in(key.mntns, before_ns, tally);
        }
        Ok(match tracer.forget_tallies(&found.forget) {
            Ok(()) => Vec::new(),
            Err(error) => vec![ProbeError {
                kind: "tally_counters",
                error: error.to_string(),
            }],
        })
    }

    /// A namespace's container ended: its tallies go after its last records were compared.
    pub fn namespace_ended(&mut self, mntns: u32) {
        self.unseen.borrow_mut().ended(mntns);
    }

    /// After records were lost (and every so often), looks in /proc for the processes the
    /// analysis thinks alive: one that is gone, its exit record lost, is forgotten (counted
    /// in `shmtrace_state_evictions_total{kind="vanished_process"}`), so that the state
    /// built from lost records does not grow.
    pub fn forget_vanished(&mut self, pipeline: &mut Pipeline) -> Result<()> {
        let lost = self.lost.total();
        if lost == self.lost_at_vanish_check
            && !self.vanish_check_owed
            && self.vanish_checked.elapsed() < VANISH_CHECK_EVERY
        {
            return Ok(());
        }
        self.lost_at_vanish_check = lost;
        self.vanish_checked = Instant::now();
        self.vanish_check_owed = false;
        let now_ns = boot_ns()?;
        let mut gone = Vec::new();
        for (pid, first_seen_ns, last_seen_ns) in pipeline.live_processes() {
            if there_at(pid, first_seen_ns) {
                continue;
            }
            if last_seen_ns.saturating_add(QUIET_BEFORE_VANISHED_NS) < now_ns {
                gone.push(pid);
            } else {
                // Its exit record may still be on its way: looked at again next time.
                self.vanish_check_owed = true;
            }
        }
        if gone.is_empty() {
            return Ok(());
        }
        pipeline.forget_vanished(&gone)
    }
}

/// What a count of the kernel's is, as the metrics say it, and its kind for
/// `shmtrace_unrecorded_total`.
fn unseen_tally(key: TallyKey, count: u64) -> Option<(&'static str, Countable)> {
    match key.what {
        TallyKey::SIGBUS => return Some(("sigbus", Countable::Sigbus { count })),
        // Who died is in the records that were lost.
        TallyKey::DEATH => {
            return Some((
                "death",
                Countable::Death {
                    role: "unknown".to_owned(),
                    count,
                },
            ));
        }
        _ => {}
    }
    let syscall = shmtrace_common::Syscall::try_from(key.what).ok()?;
    let errno = match key.errno {
        0 => "MSG_CTRUNC".to_owned(),
        errno => shmtrace_core::event::names::errno_name(i32::from(errno)),
    };
    Some((
        "failure",
        Countable::Failure {
            syscall: syscall.name().to_owned(),
            errno,
            count,
        },
    ))
}

pub fn loss_labels(loss: Loss) -> KindLabels {
    let kind = match loss {
        Loss::RingFull(kind) => format!("{kind:?}").to_lowercase(),
        Loss::PathRead => "path_read".to_owned(),
        Loss::KernelRead => "kernel_read".to_owned(),
        Loss::UserRead => "argument_read".to_owned(),
        Loss::Pending => "pending_calls_full".to_owned(),
        Loss::Tally => "tally_full".to_owned(),
    };
    KindLabels { kind }
}
