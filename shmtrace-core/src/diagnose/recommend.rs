//! How big /dev/shm must be, and how to make it so for each way a container is started.
use serde::Serialize;

use crate::{
    model::StartedBy,
    size::{count, human},
};

/// What /dev/shm had to hold when it failed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Demand {
    /// What the traced processes' live objects take once written.
    pub traced: u64,
    /// Used by others on the same /dev/shm (measured use beyond the traced objects).
    pub others: u64,
    /// What the failing call asked for beyond that.
    pub request: u64,
    /// The DataLoader's steady-state need, when a DataLoader was involved.
    pub dataloader: Option<DataloaderDemand>,
    /// The /dev/shm size that proved too small.
    pub capacity: Option<u64>,
}

/// What a DataLoader keeps in /dev/shm at once: `workers x prefetch` batches in flight, plus
/// the batch the trainer holds while it asks for the next, plus one a forked worker inherits
/// from the previous epoch; and a page per multiprocessing semaphore (three per worker and
/// the trainer's queue, and a few more), which stays used after its name is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DataloaderDemand {
    pub workers: u32,
    /// Batches in flight per worker: the most seen at once, and at least PyTorch's default
    /// `prefetch_factor` of 2.
    pub prefetch: u32,
    pub batch_bytes: u64,
}

impl DataloaderDemand {
    pub fn total(&self) -> u64 {
        let batches = u64::from(self.workers) * u64::from(self.prefetch) + 3;
        let semaphores = (3 * (u64::from(self.workers) + 1) + 5) * 4096;
        batches * self.batch_bytes + semaphores
    }
}

/// PyTorch's default `prefetch_factor`.
pub const DEFAULT_PREFETCH: u32 = 2;
/// Headroom over the computed need: allocations are not perfectly packed, and batches vary.
const HEADROOM_PERCENT: u64 = 25;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Recommendation {
    pub min_bytes: u64,
    /// How `min_bytes` was reached, in words.
    pub basis: String,
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
    let observed = demand.others + demand.traced + demand.request;
    let mut need = observed;
    let mut basis = format!("{} held or asked for when it failed", human(observed));
    if let Some(loader) = demand.dataloader {
        let steady = demand.others + loader.total();
        if steady > need {
            need = steady;
            basis = format!(
                "({} x {} batches in flight + 3) x {} per batch, and semaphores: {}",
                count(loader.workers, "worker"),
                loader.prefetch,
                human(loader.batch_bytes),
                human(loader.total())
            );
            if demand.others > 0 {
                basis.push_str(&format!(", plus {} used by others", human(demand.others)));
            }
        }
    }
    // It failed at this size, so it needs at least that plus what was asked for.
    if let Some(capacity) = demand.capacity {
        let floor = capacity + demand.request.max(1);
        if floor > need {
            need = floor;
            basis = if demand.request > 0 {
                format!(
                    "the {} it has, plus the {} the failing call asked for",
                    human(capacity),
                    human(demand.request)
                )
            } else {
                format!("more than the {} it has", human(capacity))
            };
        }
    }
    let min_bytes = round_up(need + need * HEADROOM_PERCENT / 100);
    basis.push_str(&format!(", plus {HEADROOM_PERCENT}% headroom"));

    let docker_size = docker_size(min_bytes);
    let k8s_size = kubernetes_size(min_bytes);
    let mut alternatives = Vec::new();
    if demand.dataloader.is_some() {
        alternatives.push(
            "fewer DataLoader workers (num_workers), a smaller batch_size, or a lower \
             prefetch_factor"
                .to_owned(),
        );
    }
    if nccl {
        alternatives.push(
            "NCCL_SHM_DISABLE=1 makes NCCL use sockets or the network instead of /dev/shm"
                .to_owned(),
        );
    }
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
        preferred,
        docker: format!("{run} run --shm-size={docker_size} ..."),
        compose: format!("shm_size: \"{docker_size}\"   ({compose_where}, docker compose)"),
        kubernetes: format!(
            "volumes: [{{name: dshm, emptyDir: {{medium: Memory, sizeLimit: {k8s_size}}}}}] and \
             volumeMounts: [{{name: dshm, mountPath: /dev/shm}}]"
        ),
        alternatives,
        memory_note: format!(
            "/dev/shm pages count against the container's memory limit: allow {} more memory \
             (docker --memory, Kubernetes resources.limits.memory), or the OOM killer takes over",
            human(min_bytes)
        ),
    }
}

/// Rounds up to a size people write: whole MiB below 16 MiB, then 16 MiB steps below 256 MiB,
/// 128 MiB steps below 4 GiB, whole GiB above.
pub fn round_up(bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let step = match bytes {
        b if b < 16 * MIB => MIB,
        b if b < 256 * MIB => 16 * MIB,
        b if b < 4096 * MIB => 128 * MIB,
        _ => 1024 * MIB,
    };
    bytes.div_ceil(step).max(1) * step
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
    fn rounds_to_sizes_people_write() {
        assert_eq!(round_up(1), MIB);
        assert_eq!(round_up(MIB + 1), 2 * MIB);
        assert_eq!(round_up(100 * MIB), 112 * MIB);
        assert_eq!(round_up(1000 * MIB), 1024 * MIB);
        assert_eq!(docker_size(2 * MIB), "2m");
        assert_eq!(docker_size(2048 * MIB), "2g");
        assert_eq!(kubernetes_size(1152 * MIB), "1152Mi");
    }

    #[test]
    fn a_dataloader_needs_all_its_batches_in_flight() {
        // 4 workers x 2 batches of 96 MiB, failing in a 64 MiB /dev/shm after one batch.
        let demand = Demand {
            traced: 96 * MIB,
            others: 0,
            request: 96 * MIB,
            dataloader: Some(DataloaderDemand {
                workers: 4,
                prefetch: 2,
                batch_bytes: 96 * MIB,
            }),
            capacity: Some(64 * MIB),
        };
        let r = recommend(&demand, false, &StartedBy::Unknown);
        // (4 x 2 + 3) x 96 MiB + 20 pages = 1056 MiB + 80 KiB, + 25% -> 1408 MiB.
        assert_eq!(r.min_bytes, 1408 * MIB);
        assert_eq!(r.docker, "docker run --shm-size=1408m ...");
        assert!(r.basis.contains("4 workers x 2 batches"), "{}", r.basis);
        assert!(r.kubernetes.contains("sizeLimit: 1408Mi"));
        assert!(r.alternatives[0].contains("num_workers"));
    }

    #[test]
    fn never_recommends_the_size_that_failed() {
        let demand = Demand {
            traced: 10,
            request: 10,
            capacity: Some(64 * MIB),
            ..Demand::default()
        };
        assert!(recommend(&demand, true, &StartedBy::Unknown).min_bytes > 64 * MIB);
        assert!(
            recommend(&demand, true, &StartedBy::Unknown).alternatives[0]
                .contains("NCCL_SHM_DISABLE=1")
        );
    }
}
