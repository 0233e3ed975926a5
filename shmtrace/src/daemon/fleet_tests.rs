//! The fleet's bookkeeping, with containers as a survey describes them: whose each count is,
//! when it waits for a survey, and when series retire. The main processes are this test's own
//! process (started before any event of the test) or a pid that does not exist.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use super::{
    fleet::{Fleet, Member, Tally},
    metrics::{Metrics, encode},
};
use crate::{
    capacity::Capacity,
    clock::boot_ns,
    container::{Candidate, Container, FoundBy, IpcMode, Runtime, ShmInfo, State},
};

const HOST: u32 = 4026531841;
const NS: u32 = 4026532300;

fn container(name: &str, mntns: u32, pid: u32) -> Container {
    Container {
        runtime: Runtime::Docker,
        found_by: FoundBy::CgroupScan,
        id: format!("{:0<64}", name.len()),
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
                files: None,
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
        count: 1,
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
        files: None,
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

/// Process 7001 is in the container whose id is that of `container("crashed", ..)`; 7002 in
/// that of `container("newcomer", ..)`; others in none.
fn cgroups(pid: u32) -> Option<Member> {
    let name = match pid {
        7001 => "crashed",
        7002 => "newcomer",
        _ => return None,
    };
    Some(Member {
        runtime: Runtime::Docker,
        id: container(name, 0, 0).id,
    })
}

#[test]
fn a_container_that_stopped_before_any_survey_is_counted_by_the_name_its_runtime_lists() {
    let (fleet, registry) = fleet(Duration::from_secs(60));
    let mut fleet = fleet.with_lookup(cgroups, |_, _| None);
    fleet.tally_from(7001, NS, failure(), boot_ns().unwrap(), Instant::now());
    let crashed = container("crashed", NS, 0);
    let stopped = Candidate {
        runtime: Runtime::Docker,
        id: crashed.id.clone(),
        name: "crashed".into(),
        pod: Some("job-0".into()),
        namespace: Some("ml".into()),
        state: State::Exited { code: Some(1) },
    };
    for _ in 0..3 {
        fleet.know_stopped(std::slice::from_ref(&stopped));
        fleet.survey(&[], Instant::now());
    }
    let text = text(&registry);
    assert!(
        text.contains(r#"shmtrace_shm_failures_total{container="crashed",pod="job-0",namespace="ml",runtime="docker",syscall="fallocate",errno="ENOSPC"} 1"#),
        "{text}"
    );
    assert!(!text.contains(r#"runtime="unknown""#), "{text}");
}

#[test]
fn a_container_removed_before_any_survey_is_counted_by_its_short_id_and_retires() {
    let (fleet, registry) = fleet(Duration::ZERO);
    let mut fleet = fleet.with_lookup(cgroups, |_, _| None);
    fleet.tally_from(7001, NS, failure(), boot_ns().unwrap(), Instant::now());
    for _ in 0..3 {
        fleet.know_stopped(&[]);
        fleet.survey(&[], Instant::now());
    }
    let short = &container("crashed", 0, 0).id[..12];
    let counted = text(&registry);
    assert!(
        counted.contains(&format!(
            r#"container="{short}",pod="",namespace="",runtime="docker",syscall="fallocate""#
        )),
        "{counted}"
    );
    fleet.survey(&[], Instant::now());
    let later = text(&registry);
    assert!(!later.contains(short), "not retired: {later}");
}

#[test]
fn a_namespace_number_recycled_between_two_surveys_is_not_credited_to_the_gone_container() {
    let (fleet, registry) = fleet(Duration::from_secs(60));
    let mut fleet = fleet.with_lookup(cgroups, |_, _| None);
    let me = std::process::id();
    fleet.survey(&[container("crashed", NS, me)], Instant::now());
    // "crashed" is removed and "newcomer" gets its namespace number before the next survey.
    fleet.tally_from(7002, NS, failure(), boot_ns().unwrap(), Instant::now());
    assert!(fleet.take_survey_wanted(), "a survey is asked for at once");
    assert!(!text(&registry).contains("ENOSPC"), "counted too early");
    fleet.survey(&[container("newcomer", NS, me)], Instant::now());
    let text = text(&registry);
    assert!(
        text.contains(r#"shmtrace_shm_failures_total{container="newcomer",pod="",namespace="",runtime="docker",syscall="fallocate",errno="ENOSPC"} 1"#),
        "{text}"
    );
    assert!(!text.contains(r#"container="crashed""#), "{text}");
}

#[test]
fn containers_that_reuse_a_namespace_number_between_surveys_keep_their_own_counts() {
    let (fleet, registry) = fleet(Duration::from_secs(60));
    let mut fleet = fleet.with_lookup(cgroups, |_, _| None);
    // "crashed" fails twice and is removed; "newcomer" takes its number and fails once; no
    // survey saw either running.
    fleet.tally_from(7001, NS, failure(), boot_ns().unwrap(), Instant::now());
    fleet.tally_from(7001, NS, failure(), boot_ns().unwrap(), Instant::now());
    fleet.tally_from(7002, NS, failure(), boot_ns().unwrap(), Instant::now());
    for _ in 0..3 {
        fleet.know_stopped(&[]);
        fleet.survey(&[], Instant::now());
    }
    let text = text(&registry);
    for (name, count) in [("crashed", 2), ("newcomer", 1)] {
        let short = &container(name, 0, 0).id[..12];
        assert!(
            text.contains(&format!(
                r#"shmtrace_shm_failures_total{{container="{short}",pod="",namespace="",runtime="docker",syscall="fallocate",errno="ENOSPC"}} {count}"#
            )),
            "{name}'s {count} failures:\n{text}"
        );
    }
}

#[test]
fn a_namespace_whose_first_process_is_gone_is_named_by_another_of_its_processes() {
    let (fleet, registry) = fleet(Duration::from_secs(60));
    // Process 7003 exited before it was looked up; the namespace's other processes are in
    // "crashed"'s cgroup.
    let mut fleet = fleet.with_lookup(cgroups, |_, mntns| {
        cgroups(if mntns == NS { 7001 } else { 0 })
    });
    fleet.tally_from(7003, NS, failure(), boot_ns().unwrap(), Instant::now());
    for _ in 0..3 {
        fleet.know_stopped(&[]);
        fleet.survey(&[], Instant::now());
    }
    let text = text(&registry);
    let short = &container("crashed", 0, 0).id[..12];
    assert!(text.contains(&format!(r#"container="{short}""#)), "{text}");
    assert!(!text.contains(r#"runtime="unknown""#), "{text}");
}

#[test]
fn a_container_whose_namespace_could_not_be_read_again_leaves_no_stale_number() {
    let (mut fleet, _registry) = fleet(Duration::ZERO);
    let me = std::process::id();
    fleet.survey(&[container("ending", NS, me)], Instant::now());
    // Listed running once more, but its process was ending: no namespace to read.
    let mut ending = container("ending", NS, me);
    ending.mntns = None;
    let changes = fleet.survey(&[ending], Instant::now());
    assert_eq!(changes.stopped_mntns, vec![NS]);
    fleet.survey(&[], Instant::now());
    // Its number is another namespace's now: counted without a trace of the old one.
    fleet.tally_in(NS, failure(), boot_ns().unwrap(), Instant::now());
}

#[test]
fn a_gone_containers_namespace_ends_even_when_another_took_the_number() {
    let (mut fleet, _registry) = fleet(Duration::from_secs(60));
    let me = std::process::id();
    fleet.survey(&[container("first", NS, me)], Instant::now());
    // Removed; "newcomer" has its number by the next survey.
    let changes = fleet.survey(&[container("newcomer", NS, me)], Instant::now());
    assert!(
        changes.stopped_mntns.is_empty(),
        "the number is the newcomer's"
    );
    // What was named there before the newcomer started was the first one's.
    let started = changes.ended.first().and_then(|(_, before)| *before);
    assert_eq!(changes.ended.len(), 1);
    assert_eq!(changes.ended[0].0, NS);
    assert!(started.is_some_and(|ns| ns > 0 && ns <= boot_ns().unwrap()));
    // Gone too: the number ends whole.
    let changes = fleet.survey(&[], Instant::now());
    assert_eq!(changes.ended, vec![(NS, None)]);
}

#[test]
fn a_namespace_nobody_claims_ends_once_no_process_is_in_it() {
    let (mut fleet, _registry) = fleet(Duration::from_secs(60));
    let ours = crate::kernel_ids::mount_namespace(std::process::id()).unwrap();
    // Pids that do not exist: no cgroup names either namespace. Nobody is in NS; this test
    // is in its own.
    for mntns in [NS, ours] {
        fleet.tally_from(
            u32::MAX - 1,
            mntns,
            failure(),
            boot_ns().unwrap(),
            Instant::now(),
        );
    }
    let mut ended = Vec::new();
    for _ in 0..3 {
        ended.extend(fleet.survey(&[], Instant::now()).ended);
    }
    assert_eq!(
        ended,
        vec![(NS, None)],
        "only the namespace nobody is in ends"
    );
}

/// Two containers sharing one /dev/shm (`--ipc=container:`) each show it, labelled with the
/// same `shm`; the node's use counts it once, beside a third container's own.
#[test]
fn a_shared_dev_shm_counts_once_in_the_nodes_use() {
    let (mut fleet, registry) = fleet(Duration::from_millis(200));
    let me = std::process::id();
    let mut other = container("other", NS + 2, me);
    other.id = "3".repeat(64);
    other.shm.measured = other.shm.measured.map(|m| Capacity { dev: 51, ..m });
    let mut sidecar = container("sidecar", NS + 1, me);
    sidecar.id = "2".repeat(64);
    fleet.survey(
        &[container("trainer", NS, me), sidecar, other.clone()],
        Instant::now(),
    );
    for ns in [NS, NS + 1, NS + 2] {
        fleet.tally_in(ns, Tally::Touch, boot_ns().unwrap(), Instant::now());
    }
    for (dev, used) in [(50, 40 << 20), (51, 8 << 20)] {
        fleet.measured(&Capacity {
            dev,
            size: 64 << 20,
            used,
            ts_ns: 0,
            files: None,
        });
    }
    let text = text(&registry);
    for name in ["trainer", "sidecar"] {
        assert!(
            text.contains(&format!(
                r#"shmtrace_shm_used_bytes{{container="{name}",pod="",namespace="",runtime="docker",shm="0:50"}} 41943040"#
            )),
            "{text}"
        );
    }
    assert!(
        text.contains("shmtrace_node_shm_used_bytes 50331648"),
        "{text}"
    );

    // The two sharing it are gone: their series retire, and the node counts the other's alone.
    fleet.survey(&[other.clone()], Instant::now());
    std::thread::sleep(Duration::from_millis(250));
    fleet.survey(&[other], Instant::now());
    let text = super::fleet_tests::text(&registry);
    assert!(!text.contains(r#"shm="0:50""#), "{text}");
    assert!(
        text.contains("shmtrace_node_shm_used_bytes 8388608"),
        "{text}"
    );
}

#[test]
fn a_main_process_that_failed_and_exited_before_its_records_were_read_is_its_containers() {
    // `sh -c 'sleep 3; dd ...'`: busybox's sh execs dd, which fails and exits in a
    // millisecond, before the daemon reads its records; `docker run --rm` then removes the
    // container, so no later survey can name it.
    const GONE_MAIN: u32 = u32::MAX - 1;
    let (fleet, registry) = fleet(Duration::from_secs(60));
    let mut fleet = fleet.with_lookup(|_| None, |_, _| None);
    fleet.survey(&[container("oneshot", NS, GONE_MAIN)], Instant::now());
    fleet.saw_process(GONE_MAIN, NS);
    fleet.tally_from(GONE_MAIN, NS, failure(), boot_ns().unwrap(), Instant::now());
    fleet.process_exited(GONE_MAIN);
    assert!(fleet.take_stale().is_empty(), "its namespace is still its");
    let text = text(&registry);
    assert!(
        text.contains(r#"shmtrace_shm_failures_total{container="oneshot",pod="",namespace="",runtime="docker",syscall="fallocate",errno="ENOSPC"} 1"#),
        "{text}"
    );
}

#[test]
fn a_namespace_whose_main_process_exit_was_read_already_waits_for_a_survey() {
    const GONE_MAIN: u32 = u32::MAX - 1;
    let (fleet, registry) = fleet(Duration::from_secs(60));
    let mut fleet = fleet.with_lookup(|_| None, |_, _| None);
    fleet.survey(&[container("ended", NS, GONE_MAIN)], Instant::now());
    fleet.saw_process(GONE_MAIN, NS);
    fleet.process_exited(GONE_MAIN);
    // A process of whoever has the number now.
    fleet.saw_process(7003, NS);
    fleet.tally_from(7003, NS, failure(), boot_ns().unwrap(), Instant::now());
    assert_eq!(fleet.take_stale(), vec![NS]);
    assert!(!text(&registry).contains("ENOSPC"), "counted too early");
}

#[test]
fn a_gone_wrapper_scripts_container_is_credited_with_its_childs_failure() {
    // `sh -c 'dd ...; echo done'`: dd (not the main process) fails, then sh exits and
    // `docker run --rm` removes the container, all before the daemon reads dd's records.
    // Neither process is there to name the container by its cgroup.
    const GONE_MAIN: u32 = u32::MAX - 1;
    const GONE_CHILD: u32 = u32::MAX - 2;
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    fleet.survey(&[container("wrapper", NS, GONE_MAIN)], Instant::now());
    fleet.saw_process(GONE_CHILD, NS);
    fleet.tally_from(
        GONE_CHILD,
        NS,
        failure(),
        boot_ns().unwrap(),
        Instant::now(),
    );
    assert_eq!(fleet.take_stale(), vec![NS], "its main process is gone");
    for _ in 0..3 {
        fleet.know_stopped(&[]);
        fleet.survey(&[], Instant::now());
    }
    let text = text(&registry);
    assert!(
        text.contains(r#"shmtrace_shm_failures_total{container="wrapper",pod="",namespace="",runtime="docker",syscall="fallocate",errno="ENOSPC"} 1"#),
        "{text}"
    );
}

#[test]
fn a_gone_containers_namespace_number_someone_else_is_in_is_not_credited_to_it() {
    // The survey's container is gone and a process in no container has its number (this
    // test's own namespace stands for it): that process's failure is nobody's.
    const GONE_MAIN: u32 = u32::MAX - 1;
    let ours = crate::kernel_ids::mount_namespace(std::process::id()).unwrap();
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    fleet.survey(&[container("ended", ours, GONE_MAIN)], Instant::now());
    fleet.saw_process(u32::MAX - 2, ours);
    fleet.tally_from(
        u32::MAX - 2,
        ours,
        failure(),
        boot_ns().unwrap(),
        Instant::now(),
    );
    for _ in 0..3 {
        fleet.know_stopped(&[]);
        fleet.survey(&[], Instant::now());
    }
    let text = text(&registry);
    assert!(!text.contains(r#"container="ended""#), "{text}");
    assert!(text.contains(r#"runtime="unknown""#), "{text}");
}

#[test]
fn a_name_removed_under_its_holders_counts_for_the_removers_container() {
    let (mut fleet, registry) = fleet(Duration::from_secs(60));
    let me = std::process::id();
    fleet.survey(&[container("cleaner", NS, me)], Instant::now());
    fleet.tally_in(NS, Tally::NameRemoved, boot_ns().unwrap(), Instant::now());
    fleet.tally_in(NS, Tally::NameRemoved, boot_ns().unwrap(), Instant::now());
    let text = text(&registry);
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("shmtrace_names_removed_total{") && l.contains(r#"container="cleaner""#)
        })
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.ends_with(" 2"), "{line}");
}
