//! The fleet's bookkeeping, with records placed as the daemon places them and containers as
//! the runtimes describe them: whose each count is, what waits and for how long, and when
//! series retire. The machine is made up (`Made`): which cgroup is whose, which process is
//! where.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{
    fleet::{Fleet, Placed, Settled, WaitKey},
    metrics::{Metrics, encode},
    series::Countable,
    whose::{ContainerRef, Found, Lookups, Owner},
};
use crate::container::{
    Action, Candidate, CgroupMatch, CgroupOwner, Container, FoundBy, IpcMode, Runtime,
    RuntimeEvent, ShmInfo, State,
};
use shmtrace_core::capacity::Capacity;

const HOST: u32 = 4026531841;
const NS: u32 = 4026532300;
const SECOND: u64 = 1_000_000_000;

/// What the made-up machine shows; shared, so that a test changes it as containers come and go.
#[derive(Clone, Default)]
struct Made(Arc<Mutex<Machine>>);

#[derive(Default)]
struct Machine {
    cgroups: HashMap<u64, ContainerRef>,
    /// Processes still there, and their container (`None`: in none).
    processes: HashMap<u32, Option<ContainerRef>>,
    /// Namespaces someone is in.
    occupied: HashSet<u32>,
    /// Namespaces a container's process is in.
    containers_in: HashMap<u32, ContainerRef>,
}

impl Lookups for Made {
    fn cgroup(&mut self, id: u64) -> CgroupOwner {
        match self.0.lock().unwrap().cgroups.get(&id) {
            Some(c) => CgroupOwner::Container(CgroupMatch {
                runtime: c.runtime,
                id: c.id.to_string(),
                pod_uid: None,
                qos: None,
                path: String::new(),
                controllers: None,
            }),
            None => CgroupOwner::Gone,
        }
    }

    fn process(&mut self, pid: u32, _: u64) -> Option<Option<ContainerRef>> {
        self.0.lock().unwrap().processes.get(&pid).cloned()
    }

    fn namespace(&mut self, mntns: u32, _: u64) -> Option<ContainerRef> {
        self.0.lock().unwrap().containers_in.get(&mntns).cloned()
    }

    fn anyone_in(&mut self, mntns: u32) -> bool {
        self.0.lock().unwrap().occupied.contains(&mntns)
    }
}

fn id(name: &str) -> String {
    format!("{:x<64}", name)
        .chars()
        .map(|c| if c.is_ascii_hexdigit() { c } else { 'f' })
        .collect()
}

fn of(name: &str) -> ContainerRef {
    ContainerRef::new(Runtime::Docker, &id(name))
}

fn container(name: &str, mntns: u32, pid: u32) -> Container {
    Container {
        runtime: Runtime::Docker,
        found_by: FoundBy::CgroupScan,
        id: id(name),
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

fn event(name: &str, action: Action) -> RuntimeEvent {
    RuntimeEvent {
        runtime: Runtime::Docker,
        action,
        id: id(name),
        name: name.into(),
        image: None,
        pod: None,
        namespace: None,
        labels: BTreeMap::new(),
        time_ns: 0,
    }
}

fn failure() -> Countable {
    Countable::Failure {
        syscall: "write".into(),
        errno: "ENOSPC".into(),
        count: 1,
    }
}

fn fleet(retain: Duration) -> (Fleet, Made, prometheus_client::registry::Registry) {
    let (metrics, registry) = Metrics::new();
    let made = Made::default();
    (
        Fleet::new(metrics, HOST, retain, Box::new(made.clone())),
        made,
        registry,
    )
}

fn text(registry: &prometheus_client::registry::Registry) -> String {
    encode(registry, super::metrics::ExpositionFormat::PrometheusText)
}

fn failures_of(text: &str, container: &str, runtime: &str) -> f64 {
    let wanted = format!(r#"container="{container}",pod="",namespace="",runtime="{runtime}""#);
    text.lines()
        .filter(|l| l.starts_with("shmtrace_shm_failures_total{") && l.contains(&wanted))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A record of `pid` in `mntns` and cgroup `cgroup`, at `ts`, failing.
fn fail(fleet: &mut Fleet, pid: u32, mntns: u32, cgroup: u64, ts: u64) -> Found {
    let found = fleet.place(pid, mntns, cgroup, ts);
    fleet.count(&found, ts, failure());
    found
}

/// The issue's race: a container failed at its very end, and the next took its namespace
/// number a moment later. Its records, read after, are its own by their cgroup, whatever
/// the surveys say of the number now; nothing goes to the next one or to `unknown`.
#[test]
fn a_record_read_after_the_next_container_took_its_number_is_named_by_its_cgroup() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(11, of("first"));
    fleet.runtime_event(&event("first", Action::Started));
    // A survey already sees the next one on the number; the first one's records come now.
    fleet.survey(
        &[container("next", NS, std::process::id())],
        &[],
        Instant::now(),
    );
    let found = fail(&mut fleet, 900, NS, 11, 5 * SECOND);
    assert_eq!(found, Found::Owner(Owner::Container(of("first"))));
    // Its exit, whose cgroup is gone by then, is its own all the same (the cgroup was met).
    made.0.lock().unwrap().cgroups.clear();
    assert_eq!(fleet.place(900, NS, 11, 6 * SECOND), found);
    let text = text(&registry);
    assert_eq!(failures_of(&text, "first", "docker"), 1.0, "{text}");
    assert_eq!(failures_of(&text, "next", "docker"), 0.0, "{text}");
    assert!(!text.contains(r#"runtime="unknown""#), "{text}");
}

/// A container that lives 100 ms is never listed running: its events name it.
#[test]
fn a_container_no_survey_saw_is_named_by_its_events() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(12, of("brief"));
    fleet.runtime_event(&event("brief", Action::Created));
    fail(&mut fleet, 901, NS, 12, SECOND);
    fleet.runtime_event(&event("brief", Action::Destroyed));
    fleet.survey(&[], &[], Instant::now());
    let text = text(&registry);
    assert_eq!(failures_of(&text, "brief", "docker"), 1.0, "{text}");
}

/// Names reused: each container's counts go under the name it had, and a container renamed
/// after its record was counted keeps the count under the name it had then.
#[test]
fn containers_that_reuse_a_name_and_a_number_each_count_for_themselves() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    for (run, cgroup) in [(0_u64, 20_u64), (1, 21), (2, 22)] {
        let name = format!("c{run}");
        // One after another on one number, each removed before a survey.
        let mut started = event(&name, Action::Started);
        started.id = id(&format!("c{run}-{cgroup}"));
        made.0
            .lock()
            .unwrap()
            .cgroups
            .insert(cgroup, ContainerRef::new(Runtime::Docker, &started.id));
        fleet.runtime_event(&started);
        fail(
            &mut fleet,
            1000 + run as u32,
            NS,
            cgroup,
            (run + 1) * SECOND,
        );
        fleet.runtime_event(&RuntimeEvent {
            action: Action::Destroyed,
            ..started
        });
    }
    let text = text(&registry);
    for run in 0..3 {
        assert_eq!(
            failures_of(&text, &format!("c{run}"), "docker"),
            1.0,
            "{text}"
        );
    }
}

/// A container the events did not name (a CRI container: no event stream) is asked for, and
/// its counts wait for the answer.
#[test]
fn a_container_nobody_named_yet_is_asked_for_and_its_counts_wait() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(13, of("quiet"));
    let found = fail(&mut fleet, 902, NS, 13, SECOND);
    assert_eq!(fleet.take_to_describe(), vec![of("quiet")]);
    assert_eq!(
        fleet.resolve(&found, SECOND),
        Err(WaitKey::Name(of("quiet")))
    );
    assert_eq!(failures_of(&text(&registry), "quiet", "docker"), 0.0);
    let mut stopped = container("quiet", NS, 1);
    stopped.state = State::Exited { code: Some(1) };
    fleet.described(&stopped, None);
    let text = text(&registry);
    assert_eq!(failures_of(&text, "quiet", "docker"), 1.0, "{text}");
    let settled = fleet.take_settled();
    assert!(
        matches!(&settled[..], [(WaitKey::Name(c), Settled::Placed(Placed::Container { unnamed: None, .. }))] if *c == of("quiet")),
        "{settled:?}"
    );
}

/// No runtime ever names it: after three surveys, its short id, and the lines say why.
#[test]
fn a_container_no_runtime_names_is_counted_under_its_short_id_after_three_surveys() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(14, of("lost"));
    fail(&mut fleet, 903, NS, 14, SECOND);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(2));
        fleet.survey(&[], &[], Instant::now());
    }
    let text = text(&registry);
    let short = &id("lost")[..12];
    assert_eq!(failures_of(&text, short, "docker"), 1.0, "{text}");
    let settled = fleet.take_settled();
    assert!(
        matches!(
            &settled[..],
            [(
                _,
                Settled::Placed(Placed::Container {
                    unnamed: Some(_),
                    ..
                })
            )]
        ),
        "{settled:?}"
    );
}

/// Where no cgroup names a container (a runtime that leaves cgroup2 alone) and the process is
/// gone, the record waits for a survey: the container that had the number then gets it, one
/// that came after does not, and a namespace nobody claims is nobody's (and, nobody being in
/// it, it ended).
#[test]
fn a_record_no_cgroup_places_goes_to_whoever_had_the_number_then() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    let me = std::process::id();
    let my_start = crate::live::proc_scan::start_ns(me).unwrap();
    // Before the survey that shows the container, which started before the record.
    let found = fail(&mut fleet, 904, NS, 1, my_start + SECOND);
    assert_eq!(
        found,
        Found::Unplaced {
            mntns: NS,
            cgroup_id: 1
        }
    );
    assert!(fleet.take_survey_wanted());
    fleet.survey(&[container("then", NS, me)], &[], Instant::now());
    assert_eq!(failures_of(&text(&registry), "then", "docker"), 1.0);

    // A record from before this process started: not its own; after three surveys, nobody's.
    let found = fail(&mut fleet, 905, NS + 1, 1, my_start - SECOND);
    assert_eq!(
        found,
        Found::Unplaced {
            mntns: NS + 1,
            cgroup_id: 1
        }
    );
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(2));
        fleet.survey(&[container("later", NS + 1, me)], &[], Instant::now());
    }
    let text = text(&registry);
    assert_eq!(failures_of(&text, "later", "docker"), 0.0, "{text}");
    assert_eq!(failures_of(&text, "", "unknown"), 1.0, "{text}");
    drop(made);
}

#[test]
fn a_namespace_nobody_claims_ends_once_no_process_is_in_it() {
    let (mut fleet, made, _registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().occupied.insert(NS);
    fail(&mut fleet, 906, NS, 1, SECOND);
    fail(&mut fleet, 907, NS + 1, 1, SECOND);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(2));
        fleet.survey(&[], &[], Instant::now());
    }
    let ended: Vec<u32> = fleet.take_ended().iter().map(|e| e.mntns).collect();
    assert_eq!(ended, vec![NS + 1], "only the namespace nobody is in ends");
}

/// The kernel counted a failure whose record was lost; the container had gone by the reading:
/// its last tenant is credited, not `unknown`.
#[test]
fn a_count_whose_record_was_lost_goes_to_the_namespaces_last_container() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(15, of("burst"));
    fleet.runtime_event(&event("burst", Action::Started));
    fail(&mut fleet, 908, NS, 15, SECOND);
    fleet.runtime_event(&event("burst", Action::Destroyed));
    fleet.survey(&[], &[], Instant::now());
    fleet.count_in(
        NS,
        10 * SECOND,
        Countable::Failure {
            syscall: "write".into(),
            errno: "ENOSPC".into(),
            count: 19_999,
        },
    );
    let text = text(&registry);
    assert_eq!(failures_of(&text, "burst", "docker"), 20_000.0, "{text}");
}

#[test]
fn host_records_count_for_the_host_and_untouched_containers_have_no_series() {
    let (mut fleet, _made, registry) = fleet(Duration::from_secs(60));
    fleet.survey(
        &[container("idle", NS, std::process::id())],
        &[],
        Instant::now(),
    );
    fail(&mut fleet, 909, HOST, 1, SECOND);
    let text = text(&registry);
    assert_eq!(failures_of(&text, "", "host"), 1.0, "{text}");
    // No series of the container: every family is in the scrape from the start (its HELP
    // text may hold the word), but none is labelled with it.
    assert!(!text.contains("container=\"idle\""), "{text}");
}

#[test]
fn a_gone_container_keeps_its_series_for_retain_then_loses_all_of_them() {
    let (mut fleet, made, registry) = fleet(Duration::from_millis(200));
    made.0.lock().unwrap().cgroups.insert(16, of("trainer"));
    fleet.survey(
        &[container("trainer", NS, std::process::id())],
        &[],
        Instant::now(),
    );
    fail(&mut fleet, 910, NS, 16, SECOND);
    fleet.measured(&Capacity {
        dev: 50,
        size: 64 << 20,
        used: 1 << 20,
        ts_ns: 0,
        files: None,
    });
    fleet.survey(&[], &[], Instant::now());
    assert!(text(&registry).contains(r#"container="trainer""#));
    std::thread::sleep(Duration::from_millis(250));
    fleet.survey(&[], &[], Instant::now());
    let text = text(&registry);
    assert!(!text.contains(r#"container="trainer""#), "{text}");
    assert!(text.contains("shmtrace_series_retired_total 1"), "{text}");
}

/// A name reused by containers that each live less than a survey: its series stay as long as
/// its containers keep counting, and go `--retain` after the last one's count, not after the
/// first one was gone (the soak's failing containers lost their counts every `--retain`).
#[test]
fn a_name_reused_by_short_lived_containers_keeps_its_series_while_they_count() {
    let retain = Duration::from_millis(1000);
    let (mut fleet, made, registry) = fleet(retain);
    for (run, cgroup) in [(0_u64, 30_u64), (1, 31), (2, 32)] {
        let mut started = event("batch", Action::Started);
        started.id = id(&format!("batch-{cgroup}"));
        made.0
            .lock()
            .unwrap()
            .cgroups
            .insert(cgroup, ContainerRef::new(Runtime::Docker, &started.id));
        fleet.runtime_event(&started);
        fail(
            &mut fleet,
            1100 + run as u32,
            NS,
            cgroup,
            (run + 1) * SECOND,
        );
        fleet.runtime_event(&RuntimeEvent {
            action: Action::Destroyed,
            ..started
        });
        // No survey sees it running; the next comes 600 ms later: the third within --retain
        // of the second, not of the first.
        fleet.survey(&[], &[], Instant::now());
        std::thread::sleep(Duration::from_millis(600));
    }
    fleet.survey(&[], &[], Instant::now());
    let text_now = text(&registry);
    assert_eq!(failures_of(&text_now, "batch", "docker"), 3.0, "{text_now}");
    assert!(
        text_now.contains("shmtrace_series_retired_total 0"),
        "{text_now}"
    );
    // Then --retain after the last count, they go.
    std::thread::sleep(retain);
    fleet.survey(&[], &[], Instant::now());
    let text_then = text(&registry);
    assert!(!text_then.contains(r#"container="batch""#), "{text_then}");
}

#[test]
fn a_restarted_container_continues_its_series_in_its_new_namespace() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    let me = std::process::id();
    made.0.lock().unwrap().cgroups.insert(17, of("web"));
    fleet.survey(&[container("web", NS, me)], &[], Instant::now());
    fail(&mut fleet, 911, NS, 17, SECOND);
    let starts = fleet.survey(&[container("web", NS + 5, 1)], &[], Instant::now());
    assert_eq!(starts.len(), 1, "a new main process is a start");
    let ended: Vec<u32> = fleet.take_ended().iter().map(|e| e.mntns).collect();
    assert_eq!(ended, vec![NS]);
    fail(&mut fleet, 912, NS + 5, 17, 2 * SECOND);
    assert_eq!(failures_of(&text(&registry), "web", "docker"), 2.0);
}

/// Two containers sharing one /dev/shm (`--ipc=container:`) each show it, labelled with the
/// same `shm`; the node's use counts it once, beside a third container's own.
#[test]
fn a_shared_dev_shm_counts_once_in_the_nodes_use() {
    let (mut fleet, _made, registry) = fleet(Duration::from_millis(200));
    let me = std::process::id();
    let mut other = container("other", NS + 2, me);
    other.shm.measured = other.shm.measured.map(|m| Capacity { dev: 51, ..m });
    let sidecar = container("sidecar", NS + 1, me);
    fleet.survey(
        &[container("trainer", NS, me), sidecar, other.clone()],
        &[],
        Instant::now(),
    );
    for (name, ns) in [("trainer", NS), ("sidecar", NS + 1), ("other", NS + 2)] {
        let found = Found::Owner(Owner::Container(of(name)));
        fleet.count(&found, ns as u64, Countable::Touch);
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
    fleet.survey(&[other.clone()], &[], Instant::now());
    std::thread::sleep(Duration::from_millis(250));
    fleet.survey(&[other], &[], Instant::now());
    let text = super::fleet_tests::text(&registry);
    assert!(!text.contains(r#"shm="0:50""#), "{text}");
    assert!(
        text.contains("shmtrace_node_shm_used_bytes 8388608"),
        "{text}"
    );
}

/// A container that stopped before a survey saw it run, not removed: the name its runtime
/// lists among its stopped containers.
#[test]
fn a_container_listed_stopped_is_named_by_that_list() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(18, of("stopped"));
    fail(&mut fleet, 913, NS, 18, SECOND);
    let candidate = Candidate {
        runtime: Runtime::Docker,
        id: id("stopped"),
        name: "stopped".into(),
        pod: None,
        namespace: None,
        state: State::Exited { code: Some(1) },
    };
    fleet.survey(&[], &[candidate], Instant::now());
    assert_eq!(failures_of(&text(&registry), "stopped", "docker"), 1.0);
}

/// A container no survey listed that dies: the namespace it had last ends with it (its own
/// /dev/shm is gone), and one another container took since does not.
#[test]
fn a_container_that_dies_unlisted_ends_the_namespace_it_had_last() {
    let (mut fleet, made, _registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(19, of("brief"));
    made.0.lock().unwrap().cgroups.insert(20, of("after"));
    fleet.runtime_event(&event("brief", Action::Started));
    fail(&mut fleet, 914, NS, 19, SECOND);
    fail(&mut fleet, 915, NS + 1, 19, SECOND);
    // The second number passed to another container before the first one died.
    fail(&mut fleet, 916, NS + 1, 20, 2 * SECOND);
    fleet.runtime_event(&event("brief", Action::Died));
    let ended: Vec<u32> = fleet.take_ended().iter().map(|e| e.mntns).collect();
    assert_eq!(ended, vec![NS]);
}

/// A container that touched /dev/shm before the survey that lists it (it filled its /dev/shm
/// as it started) is measured from that survey on.
#[test]
fn a_container_that_touched_dev_shm_before_any_survey_is_measured_once_listed() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(21, of("early"));
    fleet.runtime_event(&event("early", Action::Started));
    let found = fleet.place(917, NS, 21, SECOND);
    fleet.count(&found, SECOND, Countable::Touch);
    fleet.survey(
        &[container("early", NS, std::process::id())],
        &[],
        Instant::now(),
    );
    assert_eq!(fleet.to_measure(), vec![std::process::id()]);
    fleet.measured(&Capacity {
        dev: 50,
        size: 1 << 20,
        used: 1 << 20,
        ts_ns: 0,
        files: None,
    });
    let text = text(&registry);
    assert!(
        text.contains(r#"shmtrace_shm_size_bytes{container="early""#),
        "{text}"
    );
}

#[test]
fn a_name_removed_under_its_holders_counts_for_the_removers_container() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(22, of("cleaner"));
    fleet.runtime_event(&event("cleaner", Action::Started));
    // The remover was met in its container (its unlink's record).
    fleet.place(918, NS, 22, SECOND);
    fleet.count_for(918, NS, SECOND, Countable::NameRemoved);
    fleet.count_for(918, NS, 2 * SECOND, Countable::NameRemoved);
    let text = text(&registry);
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("shmtrace_names_removed_total{") && l.contains(r#"container="cleaner""#)
        })
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.ends_with(" 2"), "{line}");
}

/// A process in no container's cgroup, in a namespace whose number a container that just ended
/// had (an `unshare -m` sandbox made a moment after): the sandbox's, not the container's. In
/// an hour's soak, tests' sandboxes beside the churn put 12 failures on healthy containers.
/// Entered into a running container (`nsenter`), the same process is the container's.
#[test]
fn a_sandbox_given_an_ended_containers_number_is_no_containers() {
    let (mut fleet, made, registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().cgroups.insert(12, of("ended"));
    fleet.runtime_event(&event("ended", Action::Started));
    fleet.place(909, NS, 12, SECOND);
    // The container ends; a sandbox's process, in the root cgroup and no container, has its
    // number.
    made.0.lock().unwrap().processes.insert(910, None);
    let found = fail(&mut fleet, 910, NS, 1, 2 * SECOND);
    assert_eq!(found, Found::Owner(Owner::NoContainer));
    // `nsenter` into a running container: one of its processes is in the namespace.
    made.0.lock().unwrap().cgroups.insert(13, of("running"));
    made.0
        .lock()
        .unwrap()
        .containers_in
        .insert(NS + 1, of("running"));
    made.0.lock().unwrap().processes.insert(911, None);
    let found = fail(&mut fleet, 911, NS + 1, 1, 3 * SECOND);
    assert_eq!(found, Found::Owner(Owner::Container(of("running"))));
    let text = text(&registry);
    assert_eq!(failures_of(&text, "ended", "docker"), 0.0, "{text}");
}

/// An `unshare -m` sandbox in no container, with a tmpfs of its own on /dev/shm: no runtime
/// says when it ends, but its /dev/shm goes with it, and the next tmpfs made takes its device
/// number. In an hour's soak, a test's sandbox left an NCCL segment there, and three
/// containers given the number later were told it was taking their space. Once the last
/// process the analysis followed there ended and nobody is in it, it ends, once.
#[test]
fn a_sandbox_ends_once_nobody_is_in_it() {
    let (mut fleet, made, _registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().processes.insert(912, None);
    made.0.lock().unwrap().occupied.insert(NS);
    let found = fail(&mut fleet, 912, NS, 1, SECOND);
    assert_eq!(found, Found::Owner(Owner::NoContainer));
    // Its last traced process ended, but its untraced shell is still there.
    fleet.last_exit_in(NS, &found);
    fleet.check_sandboxes(false);
    assert!(fleet.take_ended().is_empty(), "someone is still in it");
    // Asked only when every sandbox is looked for again.
    made.0.lock().unwrap().occupied.remove(&NS);
    fleet.check_sandboxes(false);
    assert!(fleet.take_ended().is_empty(), "looked for once at first");
    fleet.check_sandboxes(true);
    let ended: Vec<_> = fleet
        .take_ended()
        .into_iter()
        .map(|e| (e.mntns, e.container.clone(), fleet.taken_at(&e)))
        .collect();
    assert_eq!(ended, vec![(NS, None, None)]);
    fleet.check_sandboxes(true);
    assert!(fleet.take_ended().is_empty(), "it ends once");
    // The host's namespace is no sandbox.
    fleet.last_exit_in(HOST, &Found::Owner(Owner::Host));
    fleet.check_sandboxes(true);
    assert!(fleet.take_ended().is_empty());
}

/// The same sandbox on a loaded machine: its records are read after its processes ended, so
/// nothing in /proc says it was in no container, and they wait for the surveys. Its end does
/// not: nobody is in it after its last traced exit, so it is gone with its /dev/shm, before
/// the next tmpfs given its device number fills up. In 3 of 4 end-to-end runs beside CPU
/// hogs, the next sandbox's failure was told of this one's file as leftovers.
#[test]
fn a_sandbox_gone_before_its_records_were_read_ends_all_the_same() {
    let (mut fleet, made, _registry) = fleet(Duration::from_secs(60));
    let found = fail(&mut fleet, 913, NS, 1, SECOND);
    assert_eq!(
        found,
        Found::Unplaced {
            mntns: NS,
            cgroup_id: 1
        }
    );
    fleet.last_exit_in(NS, &found);
    fleet.check_sandboxes(false);
    let ended: Vec<_> = fleet
        .take_ended()
        .into_iter()
        .map(|e| (e.mntns, e.container))
        .collect();
    assert_eq!(ended, vec![(NS, None)]);
    // A container's namespace ends when its runtime says so, not at its last traced exit:
    // an untraced process of it may be on its way in (`docker exec`).
    made.0.lock().unwrap().cgroups.insert(14, of("running"));
    let found = fail(&mut fleet, 914, NS + 1, 14, 2 * SECOND);
    fleet.last_exit_in(NS + 1, &found);
    fleet.check_sandboxes(true);
    assert!(fleet.take_ended().is_empty());
}

/// A sandbox's shell is still there at the first traced exit (`touch`), gone by the last
/// (`exec dd`): the last one looks again at once, so that the sandbox ends then, not at the
/// next look at every sandbox waited for (a second later, or more on a loaded machine).
#[test]
fn a_sandbox_is_looked_for_again_at_its_next_last_exit() {
    let (mut fleet, made, _registry) = fleet(Duration::from_secs(60));
    made.0.lock().unwrap().processes.insert(915, None);
    made.0.lock().unwrap().occupied.insert(NS);
    let found = fail(&mut fleet, 915, NS, 1, SECOND);
    fleet.last_exit_in(NS, &found);
    fleet.check_sandboxes(false);
    assert!(fleet.take_ended().is_empty(), "its shell is still there");
    made.0.lock().unwrap().occupied.remove(&NS);
    fleet.last_exit_in(NS, &found);
    fleet.check_sandboxes(false);
    let ended: Vec<_> = fleet.take_ended().into_iter().map(|e| e.mntns).collect();
    assert_eq!(ended, vec![NS]);
}
