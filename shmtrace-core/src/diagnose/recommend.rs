//! How big /dev/shm must be, and how to make it so for each way a container is started.
use serde::Serialize;

use crate::{
    model::StartedBy,
    units::{count, human},
};

/// What /dev/shm had to hold when it failed, counted in pages allocated (the inodes' blocks),
/// not in nominal sizes: a file that was ftruncated and never filled holds nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Demand {
    /// Pages the traced processes' live objects held.
    pub traced: u64,
    /// Used by others on the same /dev/shm (measured use beyond the traced objects).
    pub others: u64,
    /// The requests that failed at the same moment on this /dev/shm, from every process.
    pub burst: Burst,
    /// How the sizes asked for grew up to the failing request, when they grew.
    pub growth: Option<Growth>,
    /// The DataLoader, when one was involved.
    pub dataloader: Option<DataloaderDemand>,
    /// The /dev/shm size that proved too small.
    pub capacity: Option<u64>,
    /// Files grown by write(): how many processes grew one, and the size one reached that
    /// its process finished (a whole need).
    pub written: Option<(u32, u64)>,
}

/// Requests that failed together: a PostgreSQL leader and its parallel workers all fail to
/// grow their segments within milliseconds of each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Burst {
    pub processes: u32,
    /// What they asked for, in all.
    pub requested: u64,
    /// What of it their objects did not already hold.
    pub unmet: u64,
}

/// The failing request against the largest one before it: PostgreSQL's segments double.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Growth {
    pub from: u64,
    pub to: u64,
    /// Known from the program rather than seen in the trace: PostgreSQL's dynamic shared memory
    /// areas double their segment size as they grow, and fail at their first big segment.
    pub known: Option<&'static str>,
}

impl Growth {
    /// Growth counts when a request is at least half as big again as any before it.
    pub fn significant(&self) -> bool {
        self.from > 0 && self.to >= self.from + self.from / 2
    }
}

/// A DataLoader as the run showed it: `workers`, the most batches one worker held at once, and
/// the batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DataloaderDemand {
    pub workers: u32,
    /// Batches in flight per worker: the most one worker held at once, and at least what a
    /// DataLoader queues by default.
    pub in_flight: u32,
    pub batch_bytes: u64,
}

impl DataloaderDemand {
    /// What the run showed: every worker with its batches in flight, and the two batches the
    /// trainer holds at once when it takes the next (its loop variable still names the one
    /// before, and taking one sends a worker its next index at once, so that a slow trainer
    /// sees that worker make a batch before it lets the old one go).
    pub fn measured(&self) -> u64 {
        (u64::from(self.workers) * u64::from(self.in_flight.max(1)) + TRAINER_HOLDS)
            * self.batch_bytes
    }

    /// The usual rule of thumb, an upper bound: `workers x prefetch_factor` batches queued,
    /// plus the one the trainer holds, one being collated and one a forked worker inherits;
    /// and a page per multiprocessing semaphore.
    pub fn bound(&self) -> u64 {
        let prefetch = u64::from(self.in_flight.max(DEFAULT_PREFETCH));
        let batches = u64::from(self.workers) * prefetch + 3;
        let semaphores = (3 * (u64::from(self.workers) + 1) + 5) * 4096;
        batches * self.batch_bytes + semaphores
    }

    fn bound_text(&self) -> String {
        format!(
            "DataLoader rule of thumb (bound, not used): ({} x {} batches + 3) x {} and semaphores = {}",
            count(self.workers, "worker"),
            self.in_flight.max(DEFAULT_PREFETCH),
            human(self.batch_bytes),
            human(self.bound())
        )
    }
}

/// Batches a DataLoader's trainer holds at once: the one it works on and the one it takes.
pub const TRAINER_HOLDS: u64 = 2;

/// PyTorch's default `prefetch_factor`.
pub const DEFAULT_PREFETCH: u32 = 2;
/// Headroom over the measured need: allocations are not perfectly packed, and batches vary.
pub const HEADROOM_PERCENT: u64 = 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Recommendation {
    pub min_bytes: u64,
    /// How `min_bytes` was reached, in words a user can check.
    pub basis: String,
    /// A figure shown for comparison, not used for `min_bytes` (the DataLoader rule of thumb).
    pub bound: Option<String>,
    pub docker: String,
    pub compose: String,
    pub kubernetes: String,
    /// Which of the three applies, when the container's labels tell: `docker`, `compose`,
    /// `kubernetes`.
    pub preferred: Option<&'static str>,
    /// Ways to need less instead.
    pub alternatives: Vec<String>,
    pub memory_note: String,
}

pub fn recommend(demand: &Demand, nccl: bool, started_by: &StartedBy) -> Recommendation {
    let held = demand.others + demand.traced;
    let burst = demand.burst;
    let mut need = held + burst.unmet;
    let mut basis = format!("{} held", human(held));
    if demand.others > 0 {
        basis.push_str(&format!(" ({} by others)", human(demand.others)));
    }
    basis.push_str(&match burst.processes {
        0 | 1 => format!(" + {} asked for when it failed", human(burst.unmet)),
        n => format!(
            " + {} asked for by {n} processes at once (failing together, or sharing the \
             failing one's objects)",
            human(burst.unmet)
        ),
    });
    if let Some(growth) = demand.growth.filter(Growth::significant) {
        // Cover the next step of the same growth, so that one round of advice is enough.
        let next = (burst.requested as u128 * (growth.to - growth.from) as u128
            / growth.from as u128) as u64;
        need += next;
        basis.push_str(&match growth.known {
            Some(why) => format!(
                " + {} for the next step of their growth ({why})",
                human(next)
            ),
            None => format!(
                " + {} for the next step of their growth (requests grew {} -> {})",
                human(next),
                human(growth.from),
                human(growth.to)
            ),
        });
    }
    if let Some(loader) = demand.dataloader {
        let steady = demand.others + loader.measured();
        if steady > need {
            need = steady;
            basis = format!(
                "({} x {} in flight (the most one worker held, at least the default \
                 prefetch_factor of {DEFAULT_PREFETCH}) + {TRAINER_HOLDS} the trainer holds as it \
                 takes the next) x {} per batch = {}",
                count(loader.workers, "worker"),
                match loader.in_flight.max(1) {
                    1 => "1 batch".to_owned(),
                    n => format!("{n} batches"),
                },
                human(loader.batch_bytes),
                human(loader.measured())
            );
            if demand.others > 0 {
                basis.push_str(&format!(", + {} used by others", human(demand.others)));
            }
        }
    }
    // Each writer needs what the one that finished wrote.
    if let Some((writers, size)) = demand.written {
        let all = u64::from(writers) * size + demand.others;
        if all > need {
            need = all;
            basis = format!(
                "{writers} processes each growing a file by write(), {} each (what one that \
                 finished wrote)",
                human(size)
            );
            if demand.others > 0 {
                basis.push_str(&format!(", + {} used by others", human(demand.others)));
            }
        }
    }
    // It failed at this size, so it needs more than that.
    if let Some(capacity) = demand.capacity {
        const PAGE: u64 = 4096;
        if capacity + PAGE > need {
            need = capacity + PAGE;
            basis = format!("more than the {} it has", human(capacity));
        }
    }
    let mut r = advise(need, &basis, started_by);
    r.bound = demand.dataloader.map(|loader| loader.bound_text());
    if demand.dataloader.is_some() {
        r.alternatives.push(
            "fewer DataLoader workers (num_workers), a smaller batch_size, or a lower \
             prefetch_factor"
                .to_owned(),
        );
    }
    if nccl {
        r.alternatives.push(
            "NCCL_SHM_DISABLE=1 makes NCCL use sockets or the network instead of /dev/shm"
                .to_owned(),
        );
    }
    r
}

/// The advice for a measured need of `need` bytes (reached as `basis` says): headroom added,
/// rounded to a size people write, in docker, compose and Kubernetes terms.
pub fn advise(need: u64, basis: &str, started_by: &StartedBy) -> Recommendation {
    let min_bytes = with_headroom(need);
    let basis = format!(
        "{basis}, + {HEADROOM_PERCENT}% headroom = {}, rounded up to {}",
        human(need + need * HEADROOM_PERCENT / 100),
        human(min_bytes)
    );
    let docker_size = docker_size(min_bytes);
    let k8s_size = kubernetes_size(min_bytes);
    let (compose_where, preferred) = match started_by {
        StartedBy::Compose { service, .. } => (
            format!("under services: {}:", crate::event::escape::text(service)),
            Some("compose"),
        ),
        StartedBy::DockerRun | StartedBy::Podman => ("in the service".to_owned(), Some("docker")),
        StartedBy::Kubernetes => ("in the service".to_owned(), Some("kubernetes")),
        StartedBy::Unknown => ("in the service".to_owned(), None),
    };
    let run = if *started_by == StartedBy::Podman {
        "podman"
    } else {
        "docker"
    };
    Recommendation {
        min_bytes,
        basis,
        bound: None,
        preferred,
        docker: format!("{run} run --shm-size={docker_size} ..."),
        compose: format!("shm_size: \"{docker_size}\"   ({compose_where}, docker compose)"),
        kubernetes: format!(
            "volumes: [{{name: dshm, emptyDir: {{medium: Memory, sizeLimit: {k8s_size}}}}}] and \
             volumeMounts: [{{name: dshm, mountPath: /dev/shm}}]"
        ),
        alternatives: Vec::new(),
        memory_note: format!(
            "/dev/shm pages count against the container's memory limit: allow {} more memory \
             (docker --memory, Kubernetes resources.limits.memory), or the OOM killer takes over",
            human(min_bytes)
        ),
    }
}

/// `need` plus the headroom, rounded up to a size people write.
pub fn with_headroom(need: u64) -> u64 {
    // Wide, and capped at the largest size there is, never below the need: a hostile figure
    // (a command line's) must not wrap around to a small one.
    let with = u128::from(need) * u128::from(100 + HEADROOM_PERCENT) / 100;
    round_up(u64::try_from(with).unwrap_or(u64::MAX))
}

/// Rounds up to a size people write, never by more than about 6% (beyond the headroom,
/// advice must stay close to the need: /dev/shm pages cost memory): whole MiB below 256 MiB,
/// 16 MiB steps below 4 GiB, 256 MiB steps above.
pub fn round_up(bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let step = match bytes {
        b if b < 256 * MIB => MIB,
        b if b < 4096 * MIB => 16 * MIB,
        _ => 256 * MIB,
    };
    // Capped at the largest size there is, never below `bytes`.
    bytes.div_ceil(step).max(1).saturating_mul(step)
}

/// `512m`, `2g`: docker's `--shm-size` and compose's `shm_size` units.
pub fn docker_size(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 30) {
        format!("{}g", bytes >> 30)
    } else {
        format!("{}m", bytes.div_ceil(1 << 20))
    }
}

/// `512Mi`, `2Gi`: Kubernetes quantities.
pub fn kubernetes_size(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 30) {
        format!("{}Gi", bytes >> 30)
    } else {
        format!("{}Mi", bytes.div_ceil(1 << 20))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_hostile_need_never_comes_out_smaller() {
        for need in [u64::MAX, u64::MAX / 2, u64::MAX - (1 << 20)] {
            assert!(with_headroom(need) >= need, "{need}");
            assert!(round_up(need) >= need, "{need}");
        }
    }

    #[test]
    fn rounds_to_sizes_people_write() {
        assert_eq!(round_up(1), MIB);
        assert_eq!(round_up(MIB + 1), 2 * MIB);
        assert_eq!(round_up(100 * MIB + 1), 101 * MIB);
        assert_eq!(round_up(1000 * MIB), 1008 * MIB);
        assert_eq!(round_up(5000 * MIB), 5120 * MIB);
        assert_eq!(docker_size(2 * MIB), "2m");
        assert_eq!(docker_size(2048 * MIB), "2g");
        assert_eq!(kubernetes_size(1152 * MIB), "1152Mi");
    }

    #[test]
    fn a_dataloader_needs_what_its_workers_held_not_the_rule_of_thumb() {
        // 4 workers, one 96 MiB batch each in flight, failing in a 64 MiB /dev/shm: all four
        // asked at once.
        let demand = Demand {
            traced: 0,
            burst: Burst {
                processes: 4,
                requested: 4 * 96 * MIB,
                unmet: 4 * 96 * MIB,
            },
            dataloader: Some(DataloaderDemand {
                workers: 4,
                in_flight: 1,
                batch_bytes: 96 * MIB,
            }),
            capacity: Some(64 * MIB),
            ..Demand::default()
        };
        let r = recommend(&demand, false, &StartedBy::Unknown);
        // (4 x 1 + 2) x 96 MiB = 576 MiB, + 20% = 691.2 MiB, rounded up to 704 MiB.
        assert_eq!(r.min_bytes, 704 * MIB);
        assert_eq!(r.docker, "docker run --shm-size=704m ...");
        assert!(
            r.basis.contains("4 workers x 1 batch in flight"),
            "{}",
            r.basis
        );
        assert!(r.basis.contains("20% headroom"), "{}", r.basis);
        // The rule of thumb is shown, labelled, and is far bigger.
        let bound = r.bound.expect("a DataLoader shows the rule of thumb");
        assert!(bound.contains("bound, not used"), "{bound}");
        assert!(bound.contains("1.0 GiB"), "{bound}");
        assert!(r.kubernetes.contains("sizeLimit: 704Mi"));
        assert!(r.alternatives[0].contains("num_workers"));
    }

    #[test]
    fn a_burst_of_growing_requests_is_covered_in_one_round() {
        // Five PostgreSQL processes fail at once to grow 8 MiB segments to 16 MiB in a
        // 64 MiB /dev/shm that holds 48 MiB.
        let demand = Demand {
            traced: 48 * MIB,
            burst: Burst {
                processes: 5,
                requested: 5 * 16 * MIB,
                unmet: 5 * 8 * MIB,
            },
            growth: Some(Growth {
                from: 8 * MIB,
                to: 16 * MIB,
                known: None,
            }),
            capacity: Some(64 * MIB),
            ..Demand::default()
        };
        let r = recommend(&demand, false, &StartedBy::Unknown);
        // 48 + 40 + 80 (the next doubling of 5 x 16 MiB) = 168 MiB, + 20% = 201.6 MiB.
        assert_eq!(r.min_bytes, 202 * MIB);
        assert!(r.basis.contains("5 processes at once"), "{}", r.basis);
        assert!(r.basis.contains("8.0 MiB -> 16.0 MiB"), "{}", r.basis);
        assert_eq!(r.bound, None);
    }

    #[test]
    fn never_recommends_the_size_that_failed() {
        let demand = Demand {
            traced: 10,
            burst: Burst {
                processes: 1,
                requested: 10,
                unmet: 10,
            },
            capacity: Some(64 * MIB),
            ..Demand::default()
        };
        assert!(recommend(&demand, true, &StartedBy::Unknown).min_bytes > 64 * MIB);
        assert!(
            recommend(&demand, true, &StartedBy::Unknown).alternatives[0]
                .contains("NCCL_SHM_DISABLE=1")
        );
    }

    #[test]
    fn never_a_size_smaller_than_or_equal_to_the_one_it_had() {
        // Little held or asked for, in a 256 MiB /dev/shm that failed: never 1 MiB.
        let demand = Demand {
            traced: 64 << 10,
            others: 0,
            burst: Burst {
                processes: 1,
                requested: 4096,
                unmet: 4096,
            },
            growth: None,
            dataloader: None,
            capacity: Some(256 * MIB),
            written: None,
        };
        let r = recommend(&demand, false, &StartedBy::DockerRun);
        assert!(r.min_bytes > 256 * MIB, "{r:?}");
    }

    #[test]
    fn writers_each_need_what_one_that_finished_wrote() {
        // Eight processes growing a file by 64 KiB writes in 8 MiB; one finished at 4.25 MiB.
        let demand = Demand {
            traced: 8 * MIB,
            others: 0,
            burst: Burst {
                processes: 1,
                requested: 64 << 10,
                unmet: 64 << 10,
            },
            growth: None,
            dataloader: None,
            capacity: Some(8 * MIB),
            written: Some((8, 4352 << 10)),
        };
        let r = recommend(&demand, false, &StartedBy::DockerRun);
        assert!(r.min_bytes >= 34 * MIB, "{r:?}");
        assert!(
            r.basis.contains("8 processes each growing a file"),
            "{}",
            r.basis
        );
    }
}
