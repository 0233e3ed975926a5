//! `shmtrace daemon` while its ring buffer overflows: a real Docker container's failed writes,
//! SIGBUS and deaths, made while the daemon reads nothing (stopped, as a starved agent on a busy
//! node is), are most of them lost as records, and the metrics still count every one of them,
//! because the probes count them in the kernel as well. Needs root and Docker; fails loudly
//! without them.
use std::time::{Duration, Instant};

use nix::{sys::signal::Signal, unistd::Pid};
use shmtrace_tests::{
    daemon::{Daemon, sample, total},
    docker::{self, Container},
    require_root, serial,
};

/// Failed writes after the fill: far more records than the smallest ring buffer holds.
const FAILED_WRITES: usize = 3000;
const SIGBUS_DEATHS: usize = 3;
/// SIGBUS faults per death: the exerciser's Rust runtime handles the first (its stack-overflow
/// handler, which finds no guard page hit, restores the default and returns), and the access
/// faults again (`shmtrace --json -- shm-exerciser sigbus` shows both).
const FAULTS_PER_DEATH: usize = 2;
const SIGBUS_FAULTS: f64 = (SIGBUS_DEATHS * FAULTS_PER_DEATH) as f64;

fn signal(daemon: &Daemon, signal: Signal) {
    nix::sys::signal::kill(Pid::from_raw(daemon.pid() as i32), signal).unwrap();
}

#[test]
fn failures_sigbus_and_deaths_whose_records_were_lost_are_still_counted_exactly() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    // The smallest ring buffer: about 30 records.
    let daemon = Daemon::start(&["--interval", "1s", "--buffer-size", "4K"]);
    // The daemon reads the fill as it happens, then stops reading: the failed writes, the
    // SIGBUS and the processes' exits are made while it reads nothing.
    let container = Container::run(
        "daemon-loss",
        &["--shm-size", "1m"],
        &format!(
            "/x/shm-exerciser failures {FAILED_WRITES} /work > /work/failures.out; \
             for i in $(seq {SIGBUS_DEATHS}); do /x/shm-exerciser sigbus; rm /dev/shm/psm_sigbus; done; \
             touch /work/done; sleep 600"
        ),
    );
    docker::wait_for(&container.work.join("filled"));
    daemon.wait_for_metric(Duration::from_secs(30), |l| {
        l.starts_with("shmtrace_shm_failures_total") && l.contains(&container.name)
    });
    signal(&daemon, Signal::SIGSTOP);
    container.signal("go");
    docker::wait_for(&container.work.join("done"));
    signal(&daemon, Signal::SIGCONT);
    let printed = std::fs::read_to_string(container.work.join("failures.out")).unwrap();
    let failed: f64 = printed
        .trim()
        .strip_prefix("failed ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the exerciser printed {printed:?}"));
    assert!(failed > FAILED_WRITES as f64, "{printed}");

    let name = container.name.clone();
    let name = name.as_str();
    let of_it = [
        ("container", name),
        ("syscall", "write"),
        ("errno", "ENOSPC"),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = daemon.metrics();
        let counted = total(&text, "shmtrace_shm_failures_total", &of_it);
        let sigbus = total(&text, "shmtrace_sigbus_total", &[("container", name)]);
        let deaths = total(
            &text,
            "shmtrace_process_deaths_total",
            &[("container", name)],
        );
        if (counted == failed && sigbus == SIGBUS_FAULTS && deaths == SIGBUS_DEATHS as f64)
            || Instant::now() > deadline
        {
            break text;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    drop(container);
    let (_, lines, stderr) = daemon.stop();
    let lost = total(&text, "shmtrace_events_lost_total", &[]);
    assert!(
        lost > 0.0,
        "no record was lost, so this test proves nothing: raise FAILED_WRITES\n{text}"
    );
    assert_eq!(
        total(&text, "shmtrace_shm_failures_total", &of_it),
        failed,
        "the container's write()s failed {failed} times, and the metrics say otherwise while \
         {lost} records were lost\n{text}\nstderr: {stderr}"
    );
    assert_eq!(
        total(&text, "shmtrace_sigbus_total", &[("container", name)]),
        SIGBUS_FAULTS,
        "{SIGBUS_DEATHS} processes died of SIGBUS in the container, {FAULTS_PER_DEATH} faults \
         each\n{text}\nstderr: {stderr}"
    );
    // Only the processes killed by SIGBUS died: the one whose writes failed exited 0, and the
    // shell that started them all was still running.
    assert_eq!(
        total(
            &text,
            "shmtrace_process_deaths_total",
            &[("container", name)]
        ),
        SIGBUS_DEATHS as f64,
        "{SIGBUS_DEATHS} processes died of SIGBUS in the container\n{text}\nstderr: {stderr}"
    );
    let unrecorded_deaths = sample(&text, "shmtrace_unrecorded_total", &[("kind", "death")]);
    assert!(
        unrecorded_deaths.is_some_and(|n| n > 0.0),
        "no death's record was lost, so the death count proves nothing: {unrecorded_deaths:?}\n{text}"
    );
    // The summary at stop counts every loss of the run, at least what was scraped before.
    let summary = lines
        .iter()
        .rfind(|l| l["event"] == "summary")
        .unwrap_or_else(|| panic!("no summary at stop; lines: {lines:#?}"));
    let summarised = summary["lost_by_reason"]["ring_full"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(
        summarised >= lost,
        "the summary at stop says {summarised} records were lost to a full ring buffer, the \
         metrics said {lost} before: {summary}"
    );
    let unrecorded = sample(&text, "shmtrace_unrecorded_total", &[("kind", "failure")]);
    assert!(
        unrecorded.is_some_and(|n| n > 0.0 && n <= failed),
        "shmtrace_unrecorded_total{{kind=\"failure\"}} should count the failures whose records \
         were lost: {unrecorded:?}\n{text}"
    );
}

/// A burst of failures far bigger than the smallest ring buffer, in a container that exits as
/// soon as it has failed and is removed at once: most records are lost, the container is gone
/// before the kernel's counts are compared with them, and its count is still exact, under its
/// name.
#[test]
fn a_container_that_exits_at_once_after_failing_keeps_its_exact_count_under_loss() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let daemon = Daemon::start(&["--interval", "1s", "--buffer-size", "4K"]);
    let container = Container::run(
        "daemon-loss-brief",
        &["--shm-size", "1m"],
        "/x/shm-exerciser failures 20000 > /work/failures.out",
    );
    container.wait();
    let printed = std::fs::read_to_string(container.work.join("failures.out")).unwrap();
    let name = container.name.clone();
    drop(container);
    let failed: f64 = printed
        .trim()
        .strip_prefix("failed ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the exerciser printed {printed:?}"));
    let of_it = [("container", name.as_str()), ("errno", "ENOSPC")];
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = daemon.metrics();
        if total(&text, "shmtrace_shm_failures_total", &of_it) == failed
            || Instant::now() > deadline
        {
            break text;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let (_, _, stderr) = daemon.stop();
    assert!(
        total(&text, "shmtrace_events_lost_total", &[]) > 0.0,
        "no record was lost, so this test proves nothing\n{text}"
    );
    assert_eq!(
        total(&text, "shmtrace_shm_failures_total", &of_it),
        failed,
        "{name} failed {failed} times and exited at once\n{text}\nstderr: {stderr}"
    );
}
