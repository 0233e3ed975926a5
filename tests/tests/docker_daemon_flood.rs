//! `shmtrace daemon` under a connection flood on its metrics port from user nobody (issue 25,
//! items 2 and 3). With `ulimit -n 1024` and 2,000 connections held, `/healthz` and `/metrics`
//! still answer, the Docker socket still names a container that fails meanwhile, and the daemon
//! never runs out of descriptors; three floods of 15,000 connections leave its memory within a
//! bound. Needs root, Docker, util-linux and Debian's python3; fails loudly without them.
use std::time::{Duration, Instant};

use shmtrace_tests::{
    daemon::{Daemon, http_get, sample},
    docker::{self, Container},
    flood::Flood,
    read_json_lines, require_root, serial,
};

/// What the daemon's RSS may grow by across the three floods (docs/fleet.md, "Under load").
const FLOOD_RSS_BOUND_KIB: u64 = 16 * 1024;

/// Writes 2 MiB into a 1 MiB /dev/shm once /work/go exists.
const WORKLOAD: &str = "while [ ! -e /work/go ]; do sleep 0.1; done; dd if=/dev/zero of=/dev/shm/fill bs=2M count=1; sleep 600";

#[test]
fn a_flood_of_held_connections_leaves_healthz_and_the_runtimes_working() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let daemon = Daemon::start_with_open_files(1024, &["--interval", "1s"]);
    let flood = Flood::start(&daemon.addr, 2000, false);
    println!(
        "flood as nobody: {} connections made, {} not",
        flood.held, flood.failed
    );
    assert!(
        flood.held >= 1900,
        "the flood made only {} connections",
        flood.held
    );

    // While they are held: the kubelet's probe answers, every time, within its 1 s default.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut probes = 0;
    while Instant::now() < deadline {
        let asked = Instant::now();
        let answer = http_get(&daemon.addr, "/healthz");
        assert!(
            matches!(answer, Ok((200, _))) && asked.elapsed() < Duration::from_secs(1),
            "/healthz under the flood: {answer:?} after {:?}; stderr:\n{}",
            asked.elapsed(),
            daemon.stderr()
        );
        probes += 1;
        std::thread::sleep(Duration::from_millis(200));
    }

    // And the Docker socket works: a container failing meanwhile is named.
    let failing = Container::run("daemon-flood-fail", &["--shm-size", "1m"], WORKLOAD);
    std::thread::sleep(Duration::from_secs(3));
    failing.signal("go");
    let name = failing.name.clone();
    let text = daemon.wait_for_metric(Duration::from_secs(30), |l| {
        l.starts_with("shmtrace_shm_failures_total") && l.contains(&format!("\"{name}\""))
    });
    let shed = sample(
        &text,
        "shmtrace_http_connections_shed_total",
        &[("kind", "at_capacity")],
    )
    .unwrap_or(0.0)
        + sample(
            &text,
            "shmtrace_http_connections_shed_total",
            &[("kind", "idle_evicted")],
        )
        .unwrap_or(0.0);
    let open = sample(&text, "shmtrace_http_connections", &[]).expect("the connections gauge");
    println!("{probes} /healthz probes answered; {shed} connections shed, {open} open");
    assert!(shed >= 1000.0, "only {shed} connections shed:\n{text}");
    assert!(open <= 128.0, "{open} connections served at once");
    let failure_line = || {
        read_json_lines(&daemon.dir.join("stdout.jsonl"))
            .into_iter()
            .find(|l| l["errno"] == "ENOSPC" && l["container"]["name"] == name.as_str())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while failure_line().is_none() {
        assert!(
            Instant::now() < deadline,
            "no failure line naming {name}: the runtime was not asked?\n{}",
            daemon.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(flood);
    drop(failing);
    let (status, _, stderr) = daemon.stop();
    assert!(status.success(), "daemon exit {status}: {stderr}");
    assert!(
        !stderr.contains("Too many open files"),
        "the daemon ran out of descriptors:\n{stderr}"
    );
    assert!(
        stderr.contains("open files limit 1024") && stderr.contains("at most 128 metrics"),
        "the start-up lines say the limit and the cap:\n{stderr}"
    );
}

#[test]
fn floods_of_connections_leave_memory_within_a_bound() {
    require_root();
    let _serial = serial();
    // Descriptors enough for every connection of a flood: the bound must come from the
    // daemon, not from the limit. (It inherits this process's hard limit.)
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("getrlimit");
    assert!(
        hard >= 16_384,
        "the hard open-files limit is {hard}: a flood of 15,000 needs 16,384 (ulimit -Hn)"
    );
    let daemon = Daemon::start_with_open_files(hard, &[]);
    // Warm: the first scrapes and surveys allocate what they keep.
    for _ in 0..5 {
        daemon.metrics();
        std::thread::sleep(Duration::from_millis(200));
    }
    let before = daemon.rss_kib();
    let mut after = Vec::new();
    for _ in 0..3 {
        let flood = Flood::start(&daemon.addr, 15_000, true);
        assert!(
            flood.held >= 14_000,
            "the flood made only {} connections",
            flood.held
        );
        std::thread::sleep(Duration::from_secs(1));
        drop(flood);
        std::thread::sleep(Duration::from_secs(2));
        after.push(daemon.rss_kib());
    }
    let text = daemon.metrics();
    println!(
        "daemon RSS {before} KiB before, {after:?} KiB after each of three floods of 15,000 \
         connections; shed: {:?} at capacity, {:?} idle evicted",
        sample(
            &text,
            "shmtrace_http_connections_shed_total",
            &[("kind", "at_capacity")]
        ),
        sample(
            &text,
            "shmtrace_http_connections_shed_total",
            &[("kind", "idle_evicted")]
        ),
    );
    let last = *after.last().unwrap();
    assert!(
        last <= before + FLOOD_RSS_BOUND_KIB,
        "RSS grew from {before} KiB to {last} KiB ({after:?})"
    );
    let (status, _, stderr) = daemon.stop();
    assert!(status.success(), "daemon exit {status}: {stderr}");
}
