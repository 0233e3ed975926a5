//! What Prometheus scrapes: one family per fact, labelled by container. The families are
//! shared handles (the registry keeps its own), so the fleet updates them and the HTTP server
//! encodes them without a lock of ours.
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

/// Who a series is about. Empty strings where not known (Prometheus reads an empty label as
/// absent): `pod` and `namespace` outside Kubernetes; everything but `runtime` for processes
/// outside any container (`runtime="host"`) or in a namespace no runtime claims
/// (`runtime="unknown"`).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerLabels {
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub runtime: String,
}

impl ContainerLabels {
    pub fn host() -> ContainerLabels {
        ContainerLabels {
            runtime: "host".into(),
            ..ContainerLabels::default()
        }
    }

    pub fn unknown() -> ContainerLabels {
        ContainerLabels {
            runtime: "unknown".into(),
            ..ContainerLabels::default()
        }
    }
}

/// A container's /dev/shm series: the container, and which /dev/shm it sees (`shm`, the file
/// system's device, `major:minor`). Containers that share one (`--ipc=container:`,
/// `--ipc=shareable`, a pod's emptyDir, the host's) have the same `shm`, so that
/// `max by (instance, shm)` counts it once.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShmLabels {
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub runtime: String,
    pub shm: String,
}

impl ShmLabels {
    pub fn new(of: &ContainerLabels, dev: u32) -> ShmLabels {
        ShmLabels {
            container: of.container.clone(),
            pod: of.pod.clone(),
            namespace: of.namespace.clone(),
            runtime: of.runtime.clone(),
            shm: shmtrace_common::KernelDev(dev).to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub runtime: String,
    pub syscall: String,
    pub errno: String,
}

impl FailureLabels {
    pub fn new(of: &ContainerLabels, syscall: &str, errno: &str) -> FailureLabels {
        FailureLabels {
            container: of.container.clone(),
            pod: of.pod.clone(),
            namespace: of.namespace.clone(),
            runtime: of.runtime.clone(),
            syscall: syscall.to_owned(),
            errno: errno.to_owned(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeathLabels {
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub runtime: String,
    pub role: String,
}

impl DeathLabels {
    pub fn new(of: &ContainerLabels, role: &str) -> DeathLabels {
        DeathLabels {
            container: of.container.clone(),
            pod: of.pod.clone(),
            namespace: of.namespace.clone(),
            runtime: of.runtime.clone(),
            role: role.to_owned(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// Every family the daemon exports.
#[derive(Clone, Default)]
pub struct Metrics {
    pub shm_size: Family<ShmLabels, Gauge>,
    pub shm_used: Family<ShmLabels, Gauge>,
    pub shm_peak: Family<ShmLabels, Gauge>,
    pub node_shm_used: Gauge,
    pub recommended: Family<ContainerLabels, Gauge>,
    pub failures: Family<FailureLabels, Counter>,
    pub sigbus: Family<ContainerLabels, Counter>,
    pub names_removed: Family<ContainerLabels, Counter>,
    pub deaths: Family<DeathLabels, Counter>,
    pub events: Counter,
    pub lost: Family<KindLabels, Counter>,
    pub unrecorded: Family<KindLabels, Counter>,
    pub malformed: Counter,
    pub probe_errors: Family<KindLabels, Counter>,
    pub containers: Gauge,
    pub series_retired: Counter,
    pub recordings_written: Counter,
    pub recordings_deleted: Counter,
    pub recording_errors: Counter,
    pub state_entries: Family<KindLabels, Gauge>,
    pub state_evictions: Family<KindLabels, Counter>,
    pub http_connections: Gauge,
    pub http_shed: Family<KindLabels, Counter>,
}

impl Metrics {
    /// The families, and a registry that encodes them.
    pub fn new() -> (Metrics, Registry) {
        let metrics = Metrics::default();
        let mut registry = Registry::with_prefix("shmtrace");
        let m = metrics.clone();
        registry.register(
            "shm_size_bytes",
            "Capacity of the container's /dev/shm, measured",
            m.shm_size,
        );
        registry.register(
            "shm_used_bytes",
            "Bytes in use in the container's /dev/shm, measured",
            m.shm_used,
        );
        registry.register(
            "shm_peak_bytes",
            "Most bytes seen in use in the container's /dev/shm since it started",
            m.shm_peak,
        );
        registry.register(
            "node_shm_used_bytes",
            "Bytes in use in the /dev/shm file systems of the followed containers, each counted \
             once however many containers share it",
            m.node_shm_used,
        );
        registry.register(
            "recommended_shm_bytes",
            "The /dev/shm size shmtrace advises for the container, once a failure gave a basis",
            m.recommended,
        );
        registry.register(
            "shm_failures",
            "Failed shared-memory calls, by system call and errno",
            m.failures,
        );
        registry.register(
            "sigbus",
            "SIGBUS faults on /dev/shm mappings (a page the full tmpfs could not provide)",
            m.sigbus,
        );
        registry.register(
            "names_removed",
            "/dev/shm names removed by a process other than their maker while others still held \
             them, and then opened in vain, by the remover's container",
            m.names_removed.clone(),
        );
        registry.register(
            "process_deaths",
            "Processes that died of a full /dev/shm, by role",
            m.deaths,
        );
        registry.register(
            "events",
            "Records received from the kernel probes",
            m.events,
        );
        registry.register(
            "events_lost",
            "Records the probes dropped because the ring buffer was full, by kind",
            m.lost,
        );
        registry.register(
            "unrecorded",
            "Failures and SIGBUS the probes counted whose records were lost, by kind (failure, \
             sigbus); the failure and SIGBUS counts include them",
            m.unrecorded,
        );
        registry.register(
            "records_malformed",
            "Records from the probes that could not be decoded (probe and daemon versions differ?)",
            m.malformed,
        );
        registry.register(
            "probe_errors",
            "Failures of the daemon to update the probes' maps or read their counters, by kind",
            m.probe_errors,
        );
        registry.register(
            "containers_followed",
            "Containers whose /dev/shm the daemon follows now",
            m.containers,
        );
        registry.register(
            "series_retired",
            "Containers whose series were removed after --retain",
            m.series_retired,
        );
        registry.register(
            "recordings_written",
            "Incident recordings written to --record-dir",
            m.recordings_written,
        );
        registry.register(
            "recordings_deleted",
            "Incident recordings deleted to stay within --record-quota",
            m.recordings_deleted,
        );
        registry.register(
            "recording_errors",
            "Incident recordings that could not be written",
            m.recording_errors,
        );
        registry.register(
            "state_entries",
            "Entries the daemon's analysis holds now (processes, objects, diagnoses, ...), by kind",
            m.state_entries,
        );
        registry.register(
            "state_evictions",
            "Entries dropped because a bound on the daemon's memory was reached, by kind",
            m.state_evictions,
        );
        registry.register(
            "http_connections",
            "Connections to the metrics port being served now",
            m.http_connections,
        );
        registry.register(
            "http_connections_shed",
            "Connections to the metrics port closed because every slot was taken, by kind: \
             at_capacity (the new one, at once, when all are answering), idle_evicted (the one idle longest, for the new one)",
            m.http_shed,
        );
        (metrics, registry)
    }

    /// Removes a container's /dev/shm series: it is gone, or sees another /dev/shm now.
    pub fn retire_shm(&self, shm: &ShmLabels) {
        for family in [&self.shm_size, &self.shm_used, &self.shm_peak] {
            family.remove(shm);
        }
    }

    /// Removes every series of a container that is gone.
    pub fn retire<'a>(
        &self,
        labels: &ContainerLabels,
        shm: Option<&ShmLabels>,
        failures: impl IntoIterator<Item = &'a (String, String)>,
        roles: impl IntoIterator<Item = &'a String>,
    ) {
        if let Some(shm) = shm {
            self.retire_shm(shm);
        }
        self.recommended.remove(labels);
        self.sigbus.remove(labels);
        self.names_removed.remove(labels);
        for (syscall, errno) in failures {
            self.failures
                .remove(&FailureLabels::new(labels, syscall, errno));
        }
        for role in roles {
            self.deaths.remove(&DeathLabels::new(labels, role));
        }
        self.series_retired.inc();
    }
}

/// The two text formats a scraper may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, what Prometheus asks for first.
    OpenMetrics,
    /// The Prometheus text format 0.0.4, for everything else (curl, promtool, older scrapers).
    PrometheusText,
}

impl Format {
    /// From the request's `Accept` header.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::PrometheusText,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The registry in the format asked for.
pub fn encode(registry: &Registry, format: Format) -> String {
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, registry),
        Format::PrometheusText => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, registry)
        }
    };
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trainer() -> ContainerLabels {
        ContainerLabels {
            container: "trainer".into(),
            pod: "job-0".into(),
            namespace: "ml".into(),
            runtime: "containerd".into(),
        }
    }

    #[test]
    fn series_carry_the_container_labels_and_retire_completely() {
        let (metrics, registry) = Metrics::new();
        let labels = trainer();
        let shm = ShmLabels::new(&labels, 50);
        metrics.shm_size.get_or_create(&shm).set(64 << 20);
        metrics
            .failures
            .get_or_create(&FailureLabels::new(&labels, "fallocate", "ENOSPC"))
            .inc();
        metrics
            .deaths
            .get_or_create(&DeathLabels::new(&labels, "dataloader_worker"))
            .inc();
        let text = encode(&registry, Format::OpenMetrics);
        assert!(text.contains(
            r#"shmtrace_shm_size_bytes{container="trainer",pod="job-0",namespace="ml",runtime="containerd",shm="0:50"} 67108864"#
        ), "{text}");
        assert!(text.contains(
            r#"shmtrace_shm_failures_total{container="trainer",pod="job-0",namespace="ml",runtime="containerd",syscall="fallocate",errno="ENOSPC"} 1"#
        ), "{text}");

        metrics.retire(
            &labels,
            Some(&shm),
            &[("fallocate".to_owned(), "ENOSPC".to_owned())],
            &["dataloader_worker".to_owned()],
        );
        let text = encode(&registry, Format::OpenMetrics);
        assert!(!text.contains("trainer"), "{text}");
        assert!(text.contains("shmtrace_series_retired_total 1"), "{text}");
    }

    #[test]
    fn hostile_names_are_escaped_in_the_exposition() {
        let (metrics, registry) = Metrics::new();
        let labels = ContainerLabels {
            container: "evil\"} 1\nshmtrace_fake 2".into(),
            runtime: "docker".into(),
            ..ContainerLabels::default()
        };
        metrics.sigbus.get_or_create(&labels).inc();
        let text = encode(&registry, Format::OpenMetrics);
        assert!(
            !text.lines().any(|l| l.starts_with("shmtrace_fake")),
            "{text}"
        );
    }
}
