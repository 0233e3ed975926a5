//! The fleet's bookkeeping, with containers as a survey describes them: whose each count is,
//! when it waits for a survey, and when series retire. The main processes are this test's own
//! process (started before any event of the test) or a pid that does not exist.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::{
    fleet::{Fleet, Tally},
    metrics::{Metrics, encode},
};
use crate::{
    capacity::Capacity,
    clock::boot_ns,
    container::{Container, FoundBy, IpcMode, Runtime, ShmInfo, State},
};

const HOST: u32 = 4026531841;
const NS: u32 = 4026532300;

fn container(name: &str, mntns: u32, pid: u32) -> Container {
    Container {
        runtime: Runtime::Docker,
        found_by: FoundBy::CgroupScan,
        id: format!("{:0>64}", name.len()),
        name: name.into(),
        image: None,
        pod: None,
        namespace: None,
        pod_uid: None,
        sandbox_id: None,
        labels: BTreeMap::new(),
        pid: Some(pid),
        mntns: Some(mntns),
        cgroup_id: None,
        shm: ShmInfo {
            measured: Some(Capacity {
                dev: 50,
                size: 0,
                used: 0,
                ts_ns: 0,
            }),
            ..ShmInfo::default()
        },
        ipc: IpcMode::Private,
        state: State::Running,
    }
}

fn failure() -> Tally {
    Tally::Failure {
        syscall: "fallocate".into(),
        errno: "ENOSPC".into(),
    }
}

fn fleet(retain: Duration) -> (Fleet, prometheus_client::registry::Registry) {
    let (metrics, registry) = Metrics::new();
    (Fleet::new(metrics, HOST, retain), registry)
}

fn text(registry: &prometheus_client::registry::Registry) -> String {
    encode(registry, super::metrics::Format::PrometheusText)
}

#[test]
fn a_failure_before_the_first_survey_is_credited_to_its_container_once_found() {
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    let now = Instant::now();
    fleet.tally_in(NS, Tally::Touch, boot_ns().unwrap(), now);
    fleet.tally_in(NS, failure(), boot_ns().unwrap(), now);
    assert!(
        fleet.take_survey_wanted(),
        "an unknown namespace asks for a survey"
    );
    assert!(!text(&registry).contains("trainer"));

    let me = std::process::id();
    fleet.survey(&[container("trainer", NS, me)], Instant::now());
    let text = text(&registry);
    assert!(
        text.contains(r#"shmtrace_shm_failures_total{container="trainer",pod="",namespace="",runtime="docker",syscall="fallocate",errno="ENOSPC"} 1"#),
        "{text}"
    );
}

#[test]
fn a_recycled_namespace_does_not_credit_a_later_container() {
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    // The event came from a namespace whose owner is gone; a container started later got its
    // number (its main process does not exist here, so it cannot have started before).
    fleet.tally_in(NS, failure(), 1, Instant::now());
    fleet.survey(&[container("newcomer", NS, u32::MAX - 1)], Instant::now());
    let text = text(&registry);
    assert!(!text.contains("newcomer"), "{text}");
    assert!(text.contains(r#"runtime="unknown""#), "{text}");
}

#[test]
fn host_events_count_for_the_host_and_untouched_containers_have_no_series() {
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    fleet.survey(
        &[container("bystander", NS, std::process::id())],
        Instant::now(),
    );
    fleet.tally_in(HOST, failure(), boot_ns().unwrap(), Instant::now());
    assert!(!fleet.take_survey_wanted());
    let text = text(&registry);
    assert!(!text.contains("bystander"), "{text}");
    assert!(text.contains(r#"runtime="host""#), "{text}");
    assert!(text.contains("shmtrace_containers_followed 1"), "{text}");
}

#[test]
fn a_gone_container_keeps_its_series_for_retain_then_loses_all_of_them() {
    let (mut fleet, registry) = fleet(Duration::from_millis(200));
    let me = std::process::id();
    fleet.survey(&[container("trainer", NS, me)], Instant::now());
    fleet.tally_in(NS, failure(), boot_ns().unwrap(), Instant::now());
    fleet.tally_in(
        NS,
        Tally::Recommended(4 << 20),
        boot_ns().unwrap(),
        Instant::now(),
    );
    fleet.measured(&Capacity {
        dev: 50,
        size: 1 << 20,
        used: 1 << 20,
        ts_ns: 0,
    });
    assert!(text(&registry).contains(r#"shmtrace_shm_size_bytes{container="trainer""#));

    // Stopped: the namespace is forgotten at once, the series stay.
    let changes = fleet.survey(&[], Instant::now());
    assert_eq!(changes.stopped_mntns, vec![NS]);
    assert!(text(&registry).contains("trainer"));
    std::thread::sleep(Duration::from_millis(250));
    fleet.survey(&[], Instant::now());
    let text = text(&registry);
    assert!(!text.contains("trainer"), "{text}");
    assert!(text.contains("shmtrace_series_retired_total 1"), "{text}");
}

#[test]
fn a_restarted_container_continues_its_series_in_its_new_namespace() {
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    let me = std::process::id();
    fleet.survey(&[container("trainer", NS, me)], Instant::now());
    fleet.tally_in(NS, failure(), boot_ns().unwrap(), Instant::now());
    // docker restart: same name and id, a new main process in a new namespace.
    let mut restarted = container("trainer", NS + 1, me);
    restarted.pid = Some(1);
    let changes = fleet.survey(&[restarted], Instant::now());
    assert_eq!(changes.stopped_mntns, vec![NS]);
    assert_eq!(changes.started.len(), 1);
    fleet.tally_in(NS + 1, failure(), boot_ns().unwrap(), Instant::now());
    let text = text(&registry);
    assert!(
        text.contains(r#"shmtrace_shm_failures_total{container="trainer",pod="",namespace="",runtime="docker",syscall="fallocate",errno="ENOSPC"} 2"#),
        "{text}"
    );
}

#[test]
fn a_namespace_number_passed_from_a_gone_container_to_a_new_one_stays_the_new_ones() {
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    let me = std::process::id();
    fleet.survey(&[container("first", NS, me)], Instant::now());
    fleet.tally_in(NS, Tally::Touch, boot_ns().unwrap(), Instant::now());
    // `first` was removed and `second` started in its namespace number before the next survey;
    // `second` failed at once.
    let mut second = container("second", NS, me);
    second.id = "2".repeat(64);
    let survey_started = Instant::now();
    fleet.tally_in(NS, failure(), boot_ns().unwrap(), Instant::now());
    let changes = fleet.survey(&[second], survey_started);
    assert!(
        changes.stopped_mntns.is_empty(),
        "{:?}",
        changes.stopped_mntns
    );
    fleet.tally_in(NS, failure(), boot_ns().unwrap(), Instant::now());
    let text = text(&registry);
    assert!(
        text.contains(r#"shmtrace_shm_failures_total{container="second",pod="",namespace="",runtime="docker",syscall="fallocate",errno="ENOSPC"} 1"#),
        "{text}"
    );
}

#[test]
fn a_namespace_no_survey_claims_waits_three_surveys_then_counts_as_unknown() {
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    fleet.tally_in(NS, failure(), boot_ns().unwrap(), Instant::now());
    for _ in 0..2 {
        fleet.survey(&[], Instant::now());
        assert!(!text(&registry).contains("ENOSPC"), "counted too early");
    }
    fleet.survey(&[], Instant::now());
    let text = text(&registry);
    assert!(
        text.contains(r#"shmtrace_shm_failures_total{container="",pod="",namespace="",runtime="unknown",syscall="fallocate",errno="ENOSPC"} 1"#),
        "{text}"
    );
}

#[test]
fn an_event_read_after_a_new_container_took_its_namespace_is_not_the_new_ones() {
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    // The newcomer's main process is this test's; the event predates it (boot time 1 ns).
    fleet.survey(
        &[container("newcomer", NS, std::process::id())],
        Instant::now(),
    );
    fleet.tally_in(NS, failure(), 1, Instant::now());
    let text = text(&registry);
    assert!(!text.contains("newcomer"), "{text}");
    assert!(text.contains(r#"runtime="unknown""#), "{text}");
}
