//! Tracing real Docker containers by name: failures inside them, processes started later with
//! `docker exec`, a neighbour that must not be traced, a restart, a name that does not exist.
use serde_json::Value;
use shmtrace_tests::{
    docker::{Container, require_docker, wait_for},
    live::LiveTracer,
    require_root, serial, shmtrace,
};

/// A script that waits for /work/go, runs `then`, then marks /work/done and idles.
fn after_go(then: &str) -> String {
    format!("while [ ! -e /work/go ]; do sleep 0.05; done; {then}; touch /work/done; sleep 600")
}

fn in_container<'a>(records: &'a [Value], name: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["container"]["name"] == name)
        .collect()
}

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let guard = serial();
    require_root();
    require_docker();
    guard
}

#[test]
fn a_container_is_traced_by_name_through_enospc_and_sigbus() {
    let _guard = setup();
    let c = Container::run(
        "shmtrace-e2e-trainer",
        &["--shm-size", "1m"],
        &after_go("/x/shm-exerciser fallocate-enospc; /x/shm-exerciser sigbus"),
    );
    let tracer = LiveTracer::start(&["--container", &c.name]);
    c.signal("go");
    wait_for(&c.work.join("done"));
    let (status, log, records) = tracer.stop();
    assert_eq!(status.code(), Some(130), "{log}");
    let ours = in_container(&records, &c.name);

    let fallocate = ours
        .iter()
        .find(|r| r["event"] == "fallocate")
        .unwrap_or_else(|| panic!("no fallocate from the container: {records:?}\n{log}"));
    assert_eq!(fallocate["errno"], "ENOSPC");
    assert_eq!(fallocate["path"], "/dev/shm/torch_fallocate_0");
    assert_eq!(fallocate["container"]["runtime"], "docker");
    assert_eq!(fallocate["container"]["shm_size"], 1 << 20);
    assert_eq!(
        fallocate["container"]["image"],
        shmtrace_tests::docker::image()
    );

    let sigbus = ours
        .iter()
        .find(|r| r["event"] == "signal" && r["signal"] == "SIGBUS")
        .expect("the SIGBUS");
    assert_eq!(sigbus["path"], "/dev/shm/psm_sigbus");
    assert_eq!(sigbus["code"], "BUS_ADRERR");

    let diagnoses: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "diagnosis")
        .collect();
    assert_eq!(diagnoses.len(), 2, "one per failing process: {diagnoses:?}");
    for d in &diagnoses {
        assert_eq!(d["container"]["name"], c.name.as_str());
        assert_eq!(d["cause"], "shm_full");
        assert_eq!(
            d["shm"]["size"],
            1 << 20,
            "the container's /dev/shm at the failure"
        );
        assert!(d["recommendation"]["min_bytes"].as_u64().unwrap() > 1 << 20);
        assert_eq!(d["recommendation"]["preferred"], "docker");
    }
    let text = diagnoses[1]["text"].to_string();
    assert!(
        text.contains("/dev/shm  1.0 MiB, 1.0 MiB used when it failed (100%)"),
        "{text}"
    );
}

#[test]
fn processes_started_later_with_docker_exec_are_traced() {
    let _guard = setup();
    let c = Container::run("shmtrace-e2e-exec", &["--shm-size", "1m"], "sleep 600");
    let tracer = LiveTracer::start(&["--container", &c.name]);
    let exec = c.exec(&["/x/shm-exerciser", "fallocate-enospc"]);
    assert!(exec.status.success());
    let (_, log, records) = tracer.stop();
    let exec_events: Vec<&Value> = in_container(&records, &c.name)
        .into_iter()
        .filter(|r| r["event"] == "fallocate")
        .collect();
    assert_eq!(exec_events.len(), 1, "{records:?}\n{log}");
    assert_eq!(exec_events[0]["errno"], "ENOSPC");
    assert!(
        records
            .iter()
            .any(|r| r["event"] == "exec" && r["filename"] == "/x/shm-exerciser"),
        "the exec that entered the container is seen: {records:?}"
    );
}

#[test]
fn only_the_named_container_is_traced() {
    let _guard = setup();
    let script = after_go("/x/shm-exerciser fallocate-enospc");
    let traced = Container::run("shmtrace-e2e-traced", &["--shm-size", "1m"], &script);
    let other = Container::run("shmtrace-e2e-other", &["--shm-size", "1m"], &script);
    let tracer = LiveTracer::start(&["--container", &traced.name]);
    traced.signal("go");
    other.signal("go");
    wait_for(&traced.work.join("done"));
    wait_for(&other.work.join("done"));
    let (_, log, records) = tracer.stop();
    let calls: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "fallocate")
        .collect();
    assert_eq!(
        calls.len(),
        1,
        "only the traced container's call: {calls:?}\n{log}"
    );
    assert_eq!(calls[0]["container"]["name"], traced.name.as_str());
    assert!(in_container(&records, &other.name).is_empty());
}

#[test]
fn a_restarted_container_is_followed() {
    let _guard = setup();
    // Each start waits for a fresh go file, removes it, and makes its calls.
    let c = Container::run(
        "shmtrace-e2e-restart",
        &["--shm-size", "1m"],
        "while [ ! -e /work/go ]; do sleep 0.05; done; rm /work/go; \
         /x/shm-exerciser fallocate-enospc; touch /work/done; sleep 600",
    );
    let first_pid = c.pid();
    let mut tracer = LiveTracer::start(&["--container", &c.name]);
    c.signal("go");
    wait_for(&c.work.join("done"));
    std::fs::remove_file(c.work.join("done")).unwrap();
    c.restart();
    assert_ne!(c.pid(), first_pid);
    // The line that says what the container's /dev/shm holds starts the same way: wait for
    // the notice of the restart itself.
    let notice = tracer.wait_for_line(&format!("shmtrace: container {} restarted", c.name));
    assert!(notice.contains("following it"), "{notice}");
    c.signal("go");
    wait_for(&c.work.join("done"));
    let (_, log, records) = tracer.stop();
    let calls: Vec<&Value> = in_container(&records, &c.name)
        .into_iter()
        .filter(|r| r["event"] == "fallocate")
        .collect();
    assert_eq!(
        calls.len(),
        2,
        "one call before the restart and one after: {log}"
    );
    assert_ne!(calls[0]["pid"], calls[1]["pid"]);
}

#[test]
fn a_name_that_matches_nothing_lists_the_running_containers() {
    let _guard = setup();
    let running = Container::run("shmtrace-e2e-listed", &[], "sleep 600");
    // Unique to this run: nobody else's container may match it.
    let missing = format!("no-such-container-{}", running.name);
    let output = shmtrace().args(["--container", &missing]).output().unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("no container named \"{missing}\"")),
        "{text}"
    );
    assert!(
        text.contains(&running.name),
        "the running ones are listed: {text}"
    );
}

#[test]
fn host_wide_mode_labels_events_with_their_container() {
    let _guard = setup();
    // Until told to go, the container keeps making a /dev/shm file, so that the test can see
    // when shmtrace has learned the container (it looks once a second, and a loaded machine
    // may take longer) instead of guessing a delay.
    let c = Container::run(
        "shmtrace-e2e-all",
        &["--shm-size", "1m"],
        "while [ ! -e /work/go ]; do touch /dev/shm/warmup; rm -f /dev/shm/warmup; \
         sleep 0.1; done; /x/shm-exerciser fallocate-enospc; touch /work/done; sleep 600",
    );
    let tracer = LiveTracer::start(&["--all"]);
    let name = c.name.clone();
    tracer.wait_for_record(|r| r["path"] == "/dev/shm/warmup" && r["container"]["name"] == *name);
    c.signal("go");
    wait_for(&c.work.join("done"));
    let (_, log, records) = tracer.stop();
    let call = records
        .iter()
        .find(|r| r["event"] == "fallocate" && r["path"] == "/dev/shm/torch_fallocate_0")
        .unwrap_or_else(|| panic!("{log}"));
    assert_eq!(call["container"]["name"], c.name.as_str());
    assert_eq!(call["errno"], "ENOSPC");
}

/// Processes that ran before shmtrace attached and made no traced call since are in no pid
/// map of the probes; their container's mount namespace is. A SIGKILL sent to one from outside
/// (`docker kill`) must be shown with its sender, and its death not taken for a failure.
#[test]
fn a_process_running_before_shmtrace_is_seen_killed_from_outside() {
    let _guard = setup();
    let c = Container::run("shmtrace-e2e-killed", &[], "sleep 600");
    let pid = c.pid();
    let tracer = LiveTracer::start(&["--container", &c.name]);
    let killed = std::process::Command::new("docker")
        .args(["kill", "--signal", "KILL", &c.name])
        .output()
        .unwrap();
    assert!(killed.status.success(), "docker kill: {killed:?}");
    c.wait();
    let (_, log, records) = tracer.stop();
    let signals: Vec<&Value> = records
        .iter()
        // A signal record's `pid` is the receiver, its `target_pid` the sender (docs/json.md).
        .filter(|r| r["event"] == "signal" && r["pid"] == pid)
        .collect();
    assert!(
        !signals.is_empty(),
        "no signal to pid {pid}: {records:?}\n{log}"
    );
    for signal in &signals {
        assert_eq!(signal["signal"], "SIGKILL", "{signal}");
        assert_eq!(signal["failure"], false, "{signal}");
    }
    let exit = records
        .iter()
        .find(|r| r["event"] == "exit" && r["pid"] == pid)
        .unwrap_or_else(|| panic!("no exit of pid {pid}: {records:?}\n{log}"));
    assert_eq!(exit["signal"], "SIGKILL", "{exit}");
    assert!(
        signals
            .iter()
            .any(|s| s["target_pid"] == exit["killed_by_pid"]),
        "the death names a sender of the SIGKILL: {exit}\n{signals:?}"
    );
    assert_eq!(exit["failure"], false, "{exit}");
    assert!(
        !records.iter().any(|r| r["event"] == "diagnosis"),
        "a kill from outside is no /dev/shm failure: {records:?}"
    );
}

/// The same for a fault: a process that mapped a /dev/shm file before shmtrace attached, then
/// touches pages the full /dev/shm cannot back, dies of SIGBUS, which must be shown.
#[test]
fn a_process_running_before_shmtrace_is_seen_dying_of_sigbus() {
    let _guard = setup();
    let c = Container::run(
        "shmtrace-e2e-prior-sigbus",
        &["--shm-size", "1m"],
        "/x/shm-exerciser sigbus-when-told /work; sleep 600",
    );
    wait_for(&c.work.join("mapped"));
    let tracer = LiveTracer::start(&["--container", &c.name]);
    c.signal("go");
    let exit = tracer.wait_for_record(|r| {
        r["event"] == "exit" && r["comm"] == "shm-exerciser" && r["signal"] == "SIGBUS"
    });
    let (_, log, records) = tracer.stop();
    let signal = records
        .iter()
        .find(|r| r["event"] == "signal" && r["signal"] == "SIGBUS")
        .unwrap_or_else(|| panic!("no SIGBUS: {records:?}\n{log}"));
    assert_eq!(signal["pid"], exit["pid"], "{signal}");
    assert_eq!(signal["code"], "BUS_ADRERR", "{signal}");
    assert_eq!(signal["failure"], true, "{signal}");
    assert_eq!(exit["failure"], true, "{exit}");
    eprintln!("{signal}\n{log}");
}
