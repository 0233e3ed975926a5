//! What Prometheus scrapes: one family per fact, labelled by container. The families are
//! shared handles (the registry keeps its own), so the fleet updates them and the HTTP server
//! encodes them without a lock of ours.
use std::{
    collections::{HashMap, HashSet},
    hash::Hash,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder},
    metrics::{MetricType, TypedMetric, counter::Counter, family::Family, gauge::Gauge},
    registry::{Metric, Registry},
};

/// Who a series is about. Empty strings where not known (Prometheus reads an empty label as
/// absent): `pod` and `namespace` outside Kubernetes; everything but `runtime` for processes
/// outside any container (`runtime="host"`) or in a namespace no container ever had
/// (`runtime="unknown"`).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
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

/// Which /dev/shm a container's /dev/shm series are of (`shm`, the file system's device,
/// `major:minor`). Containers that share one (`--ipc=container:`, `--ipc=shareable`, a pod's
/// emptyDir, the host's) have the same `shm`, so that `max by (instance, shm)` counts it once.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShmLabel {
    pub shm: String,
}

impl ShmLabel {
    pub fn of(dev: u32) -> ShmLabel {
        ShmLabel {
            shm: shmtrace_common::KernelDev(dev).to_string(),
        }
    }
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub syscall: String,
    pub errno: String,
}

#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabel {
    pub role: String,
}

/// No labels beyond the container's.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct NoMore;

impl EncodeLabelSet for NoMore {
    fn encode(&self, _: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        Ok(())
    }
}

/// A series' labels: the container's, then the family's own.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Labeled<X> {
    pub container: ContainerLabels,
    pub more: X,
}

impl<X: EncodeLabelSet> EncodeLabelSet for Labeled<X> {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.container.encode(encoder)?;
        self.more.encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

impl KindLabels {
    pub fn of(kind: &str) -> KindLabels {
        KindLabels { kind: kind.into() }
    }
}

/// A family with series per container (and per `X`, the family's own labels). It remembers
/// which `X`s each container has, so that [`PerContainer::retire`] removes them all: no family
/// can keep series of a container that is gone.
pub struct PerContainer<X, M> {
    family: Family<Labeled<X>, M>,
    extras: Arc<Mutex<HashMap<ContainerLabels, HashSet<X>>>>,
}

impl<X, M> Clone for PerContainer<X, M> {
    fn clone(&self) -> Self {
        PerContainer {
            family: self.family.clone(),
            extras: self.extras.clone(),
        }
    }
}

impl<X, M> Default for PerContainer<X, M>
where
    X: Clone + Hash + Eq,
    M: Default,
{
    fn default() -> Self {
        PerContainer {
            family: Family::default(),
            extras: Arc::default(),
        }
    }
}

impl<X, M> PerContainer<X, M>
where
    X: Clone + Hash + Eq,
    M: Default + Clone,
{
    /// The series of `container` with `more`, made (at zero) if new.
    pub fn get(&self, container: &ContainerLabels, more: X) -> M {
        self.extras
            .lock()
            .expect("not poisoned")
            .entry(container.clone())
            .or_default()
            .insert(more.clone());
        self.family
            .get_or_create(&Labeled {
                container: container.clone(),
                more,
            })
            .clone()
    }

    /// Removes one series.
    pub fn remove(&self, container: &ContainerLabels, more: &X) {
        if let Some(set) = self.extras.lock().expect("not poisoned").get_mut(container) {
            set.remove(more);
        }
        self.family.remove(&Labeled {
            container: container.clone(),
            more: more.clone(),
        });
    }
}

/// What every per-container family can be asked, whatever its labels and metric type.
trait Retire: Send + Sync {
    /// Removes every series of `container`.
    fn retire(&self, container: &ContainerLabels);
    /// Makes a series of `container` (a test's way to check that retiring reaches them all).
    #[cfg(test)]
    fn touch(&self, container: &ContainerLabels);
}

impl<X, M> Retire for PerContainer<X, M>
where
    X: Clone + Hash + Eq + Default + Send + Sync,
    M: Default + Clone + Send + Sync,
{
    fn retire(&self, container: &ContainerLabels) {
        let extras = self
            .extras
            .lock()
            .expect("not poisoned")
            .remove(container)
            .unwrap_or_default();
        for more in extras {
            self.family.remove(&Labeled {
                container: container.clone(),
                more,
            });
        }
    }

    #[cfg(test)]
    fn touch(&self, container: &ContainerLabels) {
        drop(self.get(container, X::default()));
    }
}

/// Declares every family the daemon exports, once each: its field, named as its metric
/// (without `shmtrace_` and a counter's `_total`), whether its series are per container (and
/// so retired with the container) or not, its type and its help text. From it come
/// [`Metrics`], [`Metrics::new`], which registers them in this order, and the tests' `HELP`.
macro_rules! families {
    ($($name:ident: $registered:ident $family:ty = $help:expr;)*) => {
        /// Every family the daemon exports.
        #[derive(Clone)]
        pub struct Metrics {
            $(pub $name: $family,)*
            /// The per-container families, as registered: what [`Metrics::retire`] empties.
            per_container: Arc<Vec<Box<dyn Retire>>>,
        }

        impl Metrics {
            /// The families, and a registry that encodes them.
            pub fn new() -> (Metrics, Registry) {
                let mut registry = Registry::with_prefix("shmtrace");
                let mut metrics = Metrics {
                    $($name: <$family>::default(),)*
                    per_container: Arc::default(),
                };
                let mut r = Registering {
                    registry: &mut registry,
                    per_container: Vec::new(),
                };
                $(r.$registered(stringify!($name), $help, &metrics.$name);)*
                metrics.per_container = Arc::new(r.per_container);
                (metrics, registry)
            }
        }

        /// Each metric's name (after `shmtrace_`, before a counter's `_total`) and help text,
        /// in the order they are exported: what the tests hold a scrape and docs/fleet.md to.
        #[cfg(test)]
        const HELP: &[(&str, &str)] = &[$((stringify!($name), $help),)*];
    };
}

families! {
    shm_size_bytes: per_container PerContainer<ShmLabel, Gauge> =
        "Capacity of the container's /dev/shm, measured";
    shm_used_bytes: per_container PerContainer<ShmLabel, Gauge> =
        "Bytes in use in the container's /dev/shm, measured";
    shm_peak_bytes: per_container PerContainer<ShmLabel, Gauge> =
        "Most bytes seen in use in the container's /dev/shm since it started";
    node_shm_used_bytes: other Gauge =
        "Bytes in use in the /dev/shm file systems of the followed containers, each counted \
         once however many containers share it";
    recommended_shm_bytes: per_container PerContainer<NoMore, Gauge> =
        "The /dev/shm size shmtrace advises for the container, once a failure gave a basis";
    shm_failures: per_container PerContainer<FailureLabels, Counter> =
        "Failed shared-memory calls, by system call and errno";
    sigbus: per_container PerContainer<NoMore, Counter> =
        "SIGBUS faults on /dev/shm mappings (a page the full tmpfs could not provide)";
    names_removed: per_container PerContainer<NoMore, Counter> =
        "/dev/shm names removed by a process other than their maker while others still held \
         them, and then opened in vain, by the remover's container";
    process_deaths: per_container PerContainer<RoleLabel, Counter> =
        "Processes that died of a full /dev/shm, by role";
    events: other Counter = "Records received from the kernel probes";
    events_lost: other Family<KindLabels, Counter> =
        "Records the probes dropped because the ring buffer was full, by kind";
    unrecorded: other Family<KindLabels, Counter> =
        "Failures, SIGBUS and deaths the probes counted whose records were lost, by kind \
         (failure, sigbus, death); the failure, SIGBUS and death counts include them";
    records_malformed: other Counter =
        "Records from the probes that could not be decoded (probe and daemon versions differ?)";
    probe_errors: other Family<KindLabels, Counter> =
        "Failures of the daemon to update the probes' maps or read their counters, by kind";
    containers_followed: other Gauge = "Containers whose /dev/shm the daemon follows now";
    series_retired: other Counter = "Containers whose series were removed after --retain";
    recordings_written: other Counter = "Incident recordings written to --record-dir";
    recordings_deleted: other Counter =
        "Incident recordings deleted to stay within --record-quota";
    recording_errors: other Counter = "Incident recordings that could not be written";
    state_entries: other Family<KindLabels, Gauge> =
        "Entries the daemon's analysis holds now (processes, objects, diagnoses, ...), by kind";
    state_evictions: other Family<KindLabels, Counter> =
        "Entries dropped because a bound on the daemon's memory was reached, by kind";
    http_connections: other Gauge = "Connections to the metrics port being served now";
    http_connections_shed: other Family<KindLabels, Counter> =
        "Connections to the metrics port closed because every slot was taken, by kind: \
         at_capacity (the new one, at once, when all are answering), idle_evicted (the one idle \
         longest, for the new one)";
}

/// Registers the families, and keeps the per-container ones for retirement.
struct Registering<'a> {
    registry: &'a mut Registry,
    per_container: Vec<Box<dyn Retire>>,
}

impl Registering<'_> {
    fn per_container<X, M>(&mut self, name: &str, help: &str, family: &PerContainer<X, M>)
    where
        X: Clone + Hash + Eq + Default + Send + Sync + std::fmt::Debug + EncodeLabelSet + 'static,
        M: Default + Clone + Send + Sync + std::fmt::Debug + TypedMetric + EncodeMetric + 'static,
    {
        self.registry
            .register(name, help, Listed(family.family.clone()));
        self.per_container.push(Box::new(family.clone()));
    }

    fn other(&mut self, name: &str, help: &str, metric: &(impl Metric + Clone)) {
        self.registry.register(name, help, Listed(metric.clone()));
    }
}

/// A family listed in every scrape, with its help and type, series or not: the registry
/// leaves out an empty one, and a family that comes and goes with what happened on the node
/// (`names_removed`, `process_deaths`) is not the table docs/fleet.md gives.
#[derive(Debug)]
struct Listed<M>(M);

impl<M: EncodeMetric> EncodeMetric for Listed<M> {
    fn encode(&self, encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

impl Metrics {
    /// The families labelled with a container's /dev/shm ([`ShmLabel`]): they change label
    /// together when the /dev/shm it sees changes.
    pub fn shm_families(&self) -> [&PerContainer<ShmLabel, Gauge>; 3] {
        [
            &self.shm_size_bytes,
            &self.shm_used_bytes,
            &self.shm_peak_bytes,
        ]
    }

    /// Removes every series of a container that is gone.
    pub fn retire(&self, container: &ContainerLabels) {
        for family in self.per_container.iter() {
            family.retire(container);
        }
        self.series_retired.inc();
    }
}

/// The two text formats a scraper may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpositionFormat {
    /// OpenMetrics 1.0, what Prometheus asks for first.
    OpenMetrics,
    /// The Prometheus text format 0.0.4, for everything else (curl, promtool, older scrapers).
    PrometheusText,
}

impl ExpositionFormat {
    /// From the request's `Accept` header.
    pub fn negotiate(accept: Option<&str>) -> ExpositionFormat {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => {
                ExpositionFormat::OpenMetrics
            }
            _ => ExpositionFormat::PrometheusText,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            ExpositionFormat::OpenMetrics => {
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            }
            ExpositionFormat::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The registry in the format asked for.
pub fn encode(registry: &Registry, format: ExpositionFormat) -> String {
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = match format {
        ExpositionFormat::OpenMetrics => {
            prometheus_client::encoding::text::encode(&mut text, registry)
        }
        ExpositionFormat::PrometheusText => {
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
    fn every_family_is_in_a_scrape_before_it_has_series() {
        let (_, registry) = Metrics::new();
        for format in [
            ExpositionFormat::OpenMetrics,
            ExpositionFormat::PrometheusText,
        ] {
            let text = encode(&registry, format);
            let typed: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("# TYPE shmtrace_"))
                .filter_map(|l| l.split(' ').next())
                .collect();
            let named: Vec<&str> = HELP.iter().map(|(name, _)| *name).collect();
            assert_eq!(typed.len(), named.len(), "{text}");
            for (typed, named) in typed.iter().zip(&named) {
                assert!(typed.starts_with(named), "{typed} for {named}:\n{text}");
            }
        }
    }

    /// docs/fleet.md's table of metrics is what a scrape lists: the same families, in the same
    /// order, of the same types (a daemon's real scrape is held to it too, in
    /// tests/tests/prometheus_daemon.rs, as root).
    #[test]
    fn the_fleet_page_lists_every_family_with_its_type() {
        let (_, registry) = Metrics::new();
        let scrape = encode(&registry, ExpositionFormat::PrometheusText);
        let exported: Vec<(&str, &str)> = scrape
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
            .collect();
        let documented: Vec<(&str, &str)> = include_str!("../../../docs/fleet.md")
            .lines()
            .filter(|l| l.starts_with("| `shmtrace_"))
            .filter_map(|l| {
                let mut cells = l.split('|').skip(1).map(str::trim);
                Some((cells.next()?.trim_matches('`'), cells.next()?))
            })
            .collect();
        assert_eq!(
            documented, exported,
            "docs/fleet.md's table of metrics is not what the daemon exports"
        );
    }

    #[test]
    fn series_carry_the_container_labels_then_their_own() {
        let (metrics, registry) = Metrics::new();
        let labels = trainer();
        metrics
            .shm_size_bytes
            .get(&labels, ShmLabel::of(50))
            .set(64 << 20);
        metrics
            .shm_failures
            .get(
                &labels,
                FailureLabels {
                    syscall: "fallocate".into(),
                    errno: "ENOSPC".into(),
                },
            )
            .inc();
        let text = encode(&registry, ExpositionFormat::OpenMetrics);
        assert!(text.contains(
            r#"shmtrace_shm_size_bytes{container="trainer",pod="job-0",namespace="ml",runtime="containerd",shm="0:50"} 67108864"#
        ), "{text}");
        assert!(text.contains(
            r#"shmtrace_shm_failures_total{container="trainer",pod="job-0",namespace="ml",runtime="containerd",syscall="fallocate",errno="ENOSPC"} 1"#
        ), "{text}");
    }

    /// Every family registered per container, whatever its labels, loses every series of a
    /// container retired, and only that container's.
    #[test]
    fn retiring_a_container_empties_every_per_container_family() {
        let (metrics, registry) = Metrics::new();
        let (gone, staying) = (trainer(), ContainerLabels::host());
        for family in metrics.per_container.iter() {
            family.touch(&gone);
            family.touch(&staying);
        }
        metrics
            .process_deaths
            .get(
                &gone,
                RoleLabel {
                    role: "dataloader_worker".into(),
                },
            )
            .inc();
        let families = |text: &str, runtime: &str| {
            text.lines()
                .filter(|l| !l.starts_with('#') && l.contains(&format!("runtime=\"{runtime}\"")))
                .filter_map(|l| l.split('{').next().map(str::to_owned))
                .collect::<HashSet<String>>()
        };
        let text = encode(&registry, ExpositionFormat::PrometheusText);
        // Every family that has a `container` label was touched, so each is registered as
        // per-container and retires with it.
        let labelled: HashSet<String> = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("container=\""))
            .filter_map(|l| l.split('{').next().map(str::to_owned))
            .collect();
        assert_eq!(families(&text, "containerd"), labelled, "{text}");
        assert_eq!(labelled.len(), metrics.per_container.len(), "{text}");

        metrics.retire(&gone);
        let text = encode(&registry, ExpositionFormat::PrometheusText);
        assert!(families(&text, "containerd").is_empty(), "{text}");
        assert_eq!(families(&text, "host"), labelled, "{text}");
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
        metrics.sigbus.get(&labels, NoMore).inc();
        let text = encode(&registry, ExpositionFormat::OpenMetrics);
        assert!(
            !text.lines().any(|l| l.starts_with("shmtrace_fake")),
            "{text}"
        );
    }
}
