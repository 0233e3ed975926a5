//! The life of the metric series: a container has series once it touched /dev/shm, they count
//! what it did, its /dev/shm is measured while it runs, and they go `--retain` after it is
//! gone. A series is named by its labels (container, pod, namespace, runtime), not by the
//! runtime's id: a container restarted, or re-created under its name, continues its series.
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use super::metrics::{ContainerLabels, FailureLabels, Metrics, NoMore, RoleLabel, ShmLabel};
use shmtrace_core::capacity::Capacity;

/// Something to count for a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Countable {
    /// A /dev/shm call: the container has series from now on.
    Touch,
    /// `count` failed calls (more than one when the kernel counted failures whose records
    /// were lost).
    Failure {
        syscall: String,
        errno: String,
        count: u64,
    },
    Sigbus {
        count: u64,
    },
    /// An open of a /dev/shm name another process removed while it was held, counted for the
    /// remover's container.
    NameRemoved,
    /// Deaths of a full /dev/shm, as the probes count them (`flags::SHM_DEATH`); `role` is
    /// `unknown` for those whose records were lost.
    Death {
        role: String,
        count: u64,
    },
    Recommended(u64),
    /// How full its /dev/shm was at a failure, as the diagnosis says (at least what the traced
    /// objects held; a `size` of 0 when it was not measured then): a survey may never see it
    /// so, the processes having freed it all.
    FullAt(Capacity),
}

/// A container's series, and what they need to be kept up.
#[derive(Default)]
struct Tracked {
    /// Main process of a running container, whose /dev/shm is measured.
    pid: Option<u32>,
    shm_dev: Option<u32>,
    /// Its /dev/shm series as last set: they change with the /dev/shm it sees.
    shm: Option<ShmLabel>,
    /// Has series (touched /dev/shm).
    touched: bool,
    peak: u64,
    gone_since: Option<Instant>,
}

pub struct Series {
    metrics: Metrics,
    retain: Duration,
    by_labels: HashMap<ContainerLabels, Tracked>,
    /// Each /dev/shm's use as last measured, for the node's figure (a shared one once).
    used_by_dev: HashMap<u32, u64>,
}

impl Series {
    pub fn new(metrics: Metrics, retain: Duration) -> Series {
        Series {
            metrics,
            retain,
            by_labels: HashMap::new(),
            used_by_dev: HashMap::new(),
        }
    }

    /// Containers followed (with series, or running), gone ones not yet retired included.
    pub fn followed(&self) -> usize {
        self.by_labels.len()
    }

    /// A container the runtimes list as running now, with its main process and /dev/shm.
    /// `restarted`: a new main process, whose high-water mark starts again.
    pub fn running(
        &mut self,
        labels: &ContainerLabels,
        pid: Option<u32>,
        shm_dev: Option<u32>,
        restarted: bool,
    ) {
        let tracked = self.by_labels.entry(labels.clone()).or_default();
        if restarted {
            tracked.peak = 0;
        }
        tracked.pid = pid;
        tracked.shm_dev = shm_dev;
        tracked.gone_since = None;
    }

    /// Running containers, as one survey found them: the others are gone from `now`, and
    /// those gone `--retain` ago, or untouched, lose their series.
    pub fn survey_done(&mut self, running: &HashSet<ContainerLabels>, now: Instant) {
        self.metrics.containers_followed.set(running.len() as i64);
        let mut retire = Vec::new();
        for (labels, tracked) in &mut self.by_labels {
            if running.contains(labels) {
                continue;
            }
            tracked.pid = None;
            let since = *tracked.gone_since.get_or_insert(now);
            if !tracked.touched || now.duration_since(since) >= self.retain {
                retire.push(labels.clone());
            }
        }
        for labels in retire {
            if let Some(tracked) = self.by_labels.remove(&labels)
                && tracked.touched
            {
                self.metrics.retire(&labels);
            }
        }
        self.count_node_shm();
    }

    /// A container no survey saw running (it was gone first): followed as gone from `now`,
    /// unless it is followed already, so that its series retire after `--retain`.
    pub fn gone(&mut self, labels: &ContainerLabels, now: Instant) {
        self.by_labels
            .entry(labels.clone())
            .or_insert_with(|| Tracked {
                gone_since: Some(now),
                ..Tracked::default()
            });
    }

    /// Counts `tally` for the container of `labels`.
    pub fn apply(&mut self, labels: &ContainerLabels, tally: Countable) {
        // A container's series are followed from its first count, listed by a survey yet or
        // not (one that touched /dev/shm before the survey that lists it is measured then); the
        // host's and nobody's never retire.
        let tracked = match labels.runtime.as_str() {
            "host" | "unknown" => None,
            _ => Some(self.by_labels.entry(labels.clone()).or_default()),
        };
        let first_touch = tracked.as_ref().is_some_and(|t| !t.touched);
        if let Some(tracked) = tracked {
            tracked.touched = true;
            // A count for a container gone (one of a name reused by containers no survey saw
            // running): its series were just changed, and stay `--retain` from now, for
            // Prometheus to scrape them; retired from the first one's end, each reuse after
            // `--retain` would start the counts again.
            if tracked.gone_since.is_some() {
                tracked.gone_since = Some(Instant::now());
            }
            if let Countable::FullAt(capacity) = &tally {
                full_at(&self.metrics, labels, tracked, capacity);
            }
        }
        let m = &self.metrics;
        match tally {
            Countable::Touch => {}
            Countable::Failure {
                syscall,
                errno,
                count,
            } => drop(
                m.shm_failures
                    .get(labels, FailureLabels { syscall, errno })
                    .inc_by(count),
            ),
            Countable::Sigbus { count } => drop(m.sigbus.get(labels, NoMore).inc_by(count)),
            Countable::NameRemoved => drop(m.names_removed.get(labels, NoMore).inc()),
            Countable::Death { role, count } => drop(
                m.process_deaths
                    .get(labels, RoleLabel { role })
                    .inc_by(count),
            ),
            Countable::Recommended(bytes) => {
                let gauge = m.recommended_shm_bytes.get(labels, NoMore);
                gauge.set(gauge.get().max(clamp(bytes)));
            }
            // Its series, set above, are its container's.
            Countable::FullAt(_) => {}
        };
        // A container's first touch: its counters start at zero, so that `increase()` sees
        // its first failure.
        if first_touch {
            drop(m.sigbus.get(labels, NoMore));
        }
    }

    /// A /dev/shm was measured: size, use, and the high-water mark, for each running
    /// container with series that sees it; and the node's use, in which it counts once.
    pub fn measured(&mut self, sample: &Capacity) {
        let mut seen = false;
        for (labels, tracked) in &mut self.by_labels {
            if tracked.shm_dev != Some(sample.dev)
                || tracked.gone_since.is_some()
                || !tracked.touched
            {
                continue;
            }
            seen = true;
            tracked.peak = tracked.peak.max(sample.used);
            let shm = ShmLabel::of(sample.dev);
            let m = &self.metrics;
            drop_other_shm(m, labels, tracked, &shm);
            m.shm_size_bytes
                .get(labels, shm.clone())
                .set(clamp(sample.size));
            m.shm_used_bytes
                .get(labels, shm.clone())
                .set(clamp(sample.used));
            m.shm_peak_bytes
                .get(labels, shm.clone())
                .set(clamp(tracked.peak));
            tracked.shm = Some(shm);
        }
        if seen {
            self.used_by_dev.insert(sample.dev, sample.used);
        }
        self.count_node_shm();
    }

    /// The node's /dev/shm use: each file system a running container with series sees, once.
    fn count_node_shm(&mut self) {
        let live: HashSet<u32> = self
            .by_labels
            .values()
            .filter(|t| t.touched && t.gone_since.is_none())
            .filter_map(|t| t.shm_dev)
            .collect();
        self.used_by_dev.retain(|dev, _| live.contains(dev));
        let used: u64 = self.used_by_dev.values().sum();
        self.metrics.node_shm_used_bytes.set(clamp(used));
    }

    /// Main processes of the containers whose /dev/shm should be measured now: running ones
    /// that have series.
    pub fn to_measure(&self) -> Vec<u32> {
        self.by_labels
            .values()
            .filter(|t| t.touched && t.gone_since.is_none())
            .filter_map(|t| t.pid)
            .collect()
    }
}

/// A container's /dev/shm as a diagnosis found it at a failure: its high-water mark, and its
/// size when it was measured then (a survey sets it otherwise).
fn full_at(metrics: &Metrics, labels: &ContainerLabels, tracked: &mut Tracked, at: &Capacity) {
    // A size of 0: not measured at the failure.
    let used = match at.size {
        0 => at.used,
        size => at.used.min(size),
    };
    tracked.peak = tracked.peak.max(used);
    let shm = ShmLabel::of(at.dev);
    drop_other_shm(metrics, labels, tracked, &shm);
    if at.size > 0 {
        metrics
            .shm_size_bytes
            .get(labels, shm.clone())
            .set(clamp(at.size));
    }
    metrics
        .shm_peak_bytes
        .get(labels, shm.clone())
        .set(clamp(tracked.peak));
    tracked.shm = Some(shm);
}

/// A container whose /dev/shm is now `shm`: the series of the one it saw before go (they are
/// set again under `shm` after this).
fn drop_other_shm(
    metrics: &Metrics,
    labels: &ContainerLabels,
    tracked: &mut Tracked,
    shm: &ShmLabel,
) {
    if let Some(old) = tracked.shm.take()
        && old != *shm
    {
        for family in metrics.shm_families() {
            family.remove(labels, &old);
        }
    }
}

fn clamp(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::metrics::{ExpositionFormat, encode};

    fn on(dev: u32, used: u64) -> Capacity {
        Capacity {
            dev,
            size: 64 << 20,
            used,
            ts_ns: 0,
            files: None,
        }
    }

    /// A container that comes to see another /dev/shm (a restart into another IPC namespace)
    /// keeps no series of the one before, whether a survey measures the new one or a failure's
    /// diagnosis reports it.
    #[test]
    fn a_container_moved_to_another_dev_shm_keeps_no_series_of_the_old() {
        let (metrics, registry) = Metrics::new();
        let mut series = Series::new(metrics, Duration::from_secs(60));
        let labels = ContainerLabels {
            container: "trainer".into(),
            runtime: "docker".into(),
            ..ContainerLabels::default()
        };
        let shm_series = |shm: &str| {
            let text = encode(&registry, ExpositionFormat::PrometheusText);
            text.lines()
                .filter(|l| !l.starts_with('#') && l.contains(&format!("shm=\"{shm}\"")))
                .filter_map(|l| l.split('{').next().map(str::to_owned))
                .collect::<Vec<_>>()
        };
        let all = [
            "shmtrace_shm_size_bytes",
            "shmtrace_shm_used_bytes",
            "shmtrace_shm_peak_bytes",
        ];
        series.apply(&labels, Countable::Touch);
        series.running(&labels, Some(1), Some(50), false);
        series.measured(&on(50, 1 << 20));
        assert_eq!(shm_series("0:50"), all);

        series.running(&labels, Some(2), Some(51), true);
        series.measured(&on(51, 2 << 20));
        assert!(shm_series("0:50").is_empty());
        assert_eq!(shm_series("0:51"), all);

        series.apply(&labels, Countable::FullAt(on(52, 64 << 20)));
        assert!(shm_series("0:51").is_empty());
        assert_eq!(
            shm_series("0:52"),
            ["shmtrace_shm_size_bytes", "shmtrace_shm_peak_bytes"]
        );
    }
}
