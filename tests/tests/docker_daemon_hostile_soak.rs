//! Soak under hostile neighbours: `shmtrace daemon --record-dir`, started with `ulimit -n 1024`,
//! beside real Docker containers created and removed one after another (their mount namespace
//! numbers recycle), each failing in its 1 MiB /dev/shm and ending once a survey has seen it, while user nobody holds a flood of
//! connections to the metrics port and a shell forks without pause. Afterwards every incident
//! recording names the container that was running when each failure happened, `/healthz`
//! answered throughout, RSS stayed within a bound (docs/fleet.md, "Under load"), and every
//! container's failure count equals the failures its program counted. Needs root, Docker,
//! python3 and util-linux; fails loudly without them.
use std::{
    collections::HashMap,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use shmtrace_tests::{
    daemon::{Daemon, http_get, total},
    docker::{self, Container},
    flood::Flood,
    recording::{replay, rfc3339_seconds, wall_now_ns},
    require_root, serial,
};

const CONTAINERS: usize = 24;
/// Failed writes each container makes after filling its /dev/shm.
const FAILED_WRITES: usize = 5;
/// Connections held by nobody: more than the daemon's descriptors.
const FLOOD: u32 = 1500;
/// How much the daemon's RSS may grow from the first containers to the end (docs/fleet.md).
const RSS_GROWTH_KIB: u64 = 32 * 1024;
/// The slowest `/healthz` answer allowed.
const HEALTHZ_WITHIN: Duration = Duration::from_secs(2);

/// When a container ran, by the wall clock (ns since the Unix epoch), and what it made.
struct Ran {
    name: String,
    mntns: u32,
    from_ns: i128,
    to_ns: i128,
    failed: f64,
}

/// `/healthz` every 200 ms until `stop`: the answers that were not a quick 200.
fn watch_health(addr: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut bad = Vec::new();
        let mut asked = 0;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let answer = http_get(&addr, "/healthz");
            let took = started.elapsed();
            asked += 1;
            match answer {
                Ok((200, _)) if took <= HEALTHZ_WITHIN => {}
                other => bad.push(format!("probe {asked}: {other:?} after {took:?}")),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(asked >= 10, "/healthz was asked only {asked} times");
        bad
    })
}

/// A shell that forks a child that does nothing, without pause, until `stop`: the fork
/// storm of a build job. Returns how many it forked.
fn fork_storm(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut forked = 0;
        while !stop.load(Ordering::Relaxed) {
            let status = Command::new("sh")
                .args(["-c", "i=0; while [ $i -lt 500 ]; do (:); i=$((i+1)); done"])
                .status()
                .expect("sh");
            assert!(status.success());
            forked += 500;
        }
        forked
    })
}

fn mount_namespace(pid: u32) -> u32 {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    let text = link.to_string_lossy();
    text.trim_start_matches("mnt:[")
        .trim_end_matches(']')
        .parse()
        .unwrap_or_else(|_| panic!("{text}"))
}

#[test]
fn hostile_neighbours_and_recycled_namespaces_leave_recordings_and_counts_right() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let record_dir = shmtrace_tests::tempdir().join("incidents");
    let daemon = Daemon::start_with_open_files(
        1024,
        &[
            "--interval",
            "1s",
            "--retain",
            "600s",
            "--record-dir",
            record_dir.to_str().unwrap(),
        ],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let health = watch_health(daemon.addr.clone(), stop.clone());
    let storm = fork_storm(stop.clone());
    let flood = Flood::start(&daemon.addr, FLOOD, false);

    let mut ran: Vec<Ran> = Vec::new();
    let mut rss_warm = 0;
    for i in 0..CONTAINERS {
        let from_ns = wall_now_ns();
        let container = Container::run(
            "daemon-hostile",
            &["--shm-size", "1m"],
            &format!(
                "/x/shm-exerciser failures {FAILED_WRITES} /work > /work/failures.out; \
                 touch /work/done"
            ),
        );
        // Full, and waiting to make its failed writes.
        docker::wait_for(&container.work.join("filled"));
        let mntns = mount_namespace(container.pid());
        // It fails and ends once a survey has measured its /dev/shm: the size gauge is part
        // of what this test checks.
        let name = container.name.clone();
        daemon.wait_for_metric(Duration::from_secs(60), |l| {
            l.starts_with("shmtrace_shm_size_bytes") && l.contains(&format!("\"{name}\""))
        });
        container.signal("go");
        docker::wait_for(&container.work.join("done"));
        container.wait();
        let to_ns = wall_now_ns();
        let printed = std::fs::read_to_string(container.work.join("failures.out")).unwrap();
        let failed = printed
            .trim()
            .strip_prefix("failed ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the exerciser printed {printed:?}"));
        ran.push(Ran {
            name: container.name.clone(),
            mntns,
            from_ns,
            to_ns,
            failed,
        });
        drop(container);
        if i == 2 {
            rss_warm = daemon.rss_kib();
        }
    }
    let recycled = ran.len()
        - ran
            .iter()
            .map(|r| r.mntns)
            .collect::<std::collections::HashSet<_>>()
            .len();
    assert!(
        recycled > 0,
        "no mount namespace number was used twice in {CONTAINERS} containers: this test \
         proves nothing about recycling"
    );

    // Every container's failures, counted.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (counted, text) = loop {
        let text = daemon.metrics();
        let counted: HashMap<&str, f64> = ran
            .iter()
            .map(|r| {
                let of_it = [("container", r.name.as_str())];
                (
                    r.name.as_str(),
                    total(&text, "shmtrace_shm_failures_total", &of_it),
                )
            })
            .collect();
        let all = ran.iter().all(|r| counted[r.name.as_str()] == r.failed);
        if all || Instant::now() > deadline {
            break (counted, text);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let rss_end = daemon.rss_kib();
    stop.store(true, Ordering::Relaxed);
    let bad_health = health.join().unwrap();
    let forked = storm.join().unwrap();
    let (held, shed) = (flood.held, flood.failed);
    drop(flood);
    println!(
        "{CONTAINERS} containers ({recycled} reused a namespace number), {forked} forks, \
         {held} connections held ({shed} not made); daemon RSS {rss_warm} KiB after 3 \
         containers, {rss_end} KiB at the end"
    );
    let (status, lines, stderr) = daemon.stop();
    assert!(status.success(), "daemon exit {status}: {stderr}");
    assert!(
        bad_health.is_empty(),
        "/healthz did not answer 200 within {HEALTHZ_WITHIN:?}: {bad_health:?}"
    );
    let wrong: Vec<String> = ran
        .iter()
        .filter(|r| counted[r.name.as_str()] != r.failed)
        .map(|r| {
            format!(
                "{}: made {}, counted {}",
                r.name,
                r.failed,
                counted[r.name.as_str()]
            )
        })
        .collect();
    assert!(wrong.is_empty(), "failure counts: {wrong:?}\n{text}");
    assert!(
        rss_end <= rss_warm + RSS_GROWTH_KIB,
        "RSS grew from {rss_warm} KiB to {rss_end} KiB"
    );

    // Every diagnosis of an exerciser in every recording names the container that ran at
    // its time.
    let recordings: Vec<&str> = lines
        .iter()
        .filter(|l| l["event"] == "recording")
        .filter_map(|l| l["path"].as_str())
        .collect();
    assert!(!recordings.is_empty(), "no recording; stderr: {stderr}");
    let (mut named, mut unnamed) = (0, 0);
    let mut wrong = Vec::new();
    for path in &recordings {
        let report = replay("report", std::path::Path::new(path), &[]);
        for diagnosis in report
            .records
            .iter()
            .filter(|r| r["event"] == "diagnosis" && r["comm"] == "shm-exerciser")
        {
            let at = rfc3339_seconds(diagnosis["ts"].as_str().unwrap());
            let running: Vec<&str> = ran
                .iter()
                .filter(|r| r.from_ns <= at && at <= r.to_ns)
                .map(|r| r.name.as_str())
                .collect();
            match diagnosis["container"]["name"].as_str() {
                Some(name) if running == [name] => named += 1,
                None => unnamed += 1,
                Some(name) => wrong.push(format!(
                    "{path}: names {name}, while {running:?} ran: {diagnosis}"
                )),
            }
        }
    }
    println!(
        "diagnoses in {} recordings: {named} named by the container running then, {unnamed} \
         by none",
        recordings.len()
    );
    assert!(
        wrong.is_empty(),
        "diagnoses that name a container other than the one running then: {wrong:#?}"
    );
    // Each ended after a survey had seen it, so its diagnosis (made at its exit) can name it.
    assert_eq!(unnamed, 0, "diagnoses in recordings that name no container");
    let checked = named;
    assert!(
        checked >= CONTAINERS / 2,
        "only {checked} diagnoses of the {CONTAINERS} containers' failures in {} recordings",
        recordings.len()
    );
}
