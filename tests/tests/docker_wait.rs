//! `--wait` on a loaded machine: shmtrace waits for a container that does not exist yet, and
//! must see the first /dev/shm call of the container's first process, every time. The probes
//! hold what unknown mount namespaces do while the container is waited for (shmtrace's
//! `live::hold`); before that, the container's first calls were often made before shmtrace's
//! one-second poll of Docker had put its namespace in the kernel filter.
use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use shmtrace_tests::{
    docker::{Container, require_docker},
    live::LiveTracer,
    require_root, serial,
};

/// Container starts in a row that must all be caught.
const STARTS: usize = 20;
/// Host processes spinning on the CPU during the run (the machine has 2 cores).
const BUSY_LOOPS: usize = 2;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let guard = serial();
    require_root();
    require_docker();
    guard
}

/// CPU and fork load for the length of a test: busy loops on the host, and a neighbour
/// container that forks and execs without pause (its records are held, then must be dropped,
/// while the followed container is waited for). Stopped on drop.
struct Load {
    busy: Vec<Child>,
    _forker: Container,
}

impl Load {
    fn start() -> Load {
        let busy = (0..BUSY_LOOPS)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .spawn()
                    .expect("starting a busy loop")
            })
            .collect();
        let forker = Container::run(
            "shmtrace-e2e-wait-forker",
            &[],
            // A fork and an exec every 20 ms or so: busy, without starving the daemons.
            "while :; do /bin/true; sleep 0.02; done",
        );
        Load {
            busy,
            _forker: forker,
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in &mut self.busy {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn wait_sees_the_first_shm_call_of_20_containers_in_a_row_under_load() {
    let _guard = setup();
    let load = Load::start();
    let began = Instant::now();
    let mut loads = Vec::new();
    let mut removals = Vec::new();
    for start in 0..STARTS {
        let name = Container::name_for("shmtrace-e2e-wait");
        let tracer = LiveTracer::start_until(
            &["--container", &name, "--wait"],
            "shmtrace: waiting for container",
        );
        let first = format!("/dev/shm/first-{start}");
        // The container's first process's first /dev/shm call is its first command.
        let container = Container::run_named(&name, &[], &format!("echo x > {first}; sleep 600"));
        let seen = tracer.find_record(|r| r["path"] == first.as_str(), Duration::from_secs(60));
        let pid = container.pid();
        let (_, log, records) = tracer.stop();
        assert!(
            seen.is_ok(),
            "start {start}: {first} was not seen within a minute (container pid {pid}): \
             {records:?}\n{log}"
        );
        // Removing a container takes a second or more on a loaded machine: meanwhile, the
        // next start.
        removals.push(std::thread::spawn(move || drop(container)));
        let ours: Vec<&Value> = records
            .iter()
            .filter(|r| r["pid"] == pid && r["container"]["name"] == name.as_str())
            .collect();
        let exec = ours
            .iter()
            .position(|r| r["event"] == "exec" && r["argv"][0] == "sh");
        let open = ours.iter().position(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/dev/shm/"))
        });
        assert!(
            exec.is_some() && open.is_some() && exec < open,
            "start {start}: the exec of the container's first process (pid {pid}) and then \
             its first /dev/shm call must be seen: {ours:?}\n{log}"
        );
        let open = ours[open.unwrap()];
        assert_eq!(open["event"], "openat", "start {start}: {open}");
        assert_eq!(open["path"], first.as_str(), "start {start}: {open}");
        assert!(
            !log.contains("were dropped"),
            "start {start}: held records were dropped: {log}"
        );
        loads.push(load_average());
    }
    let took = began.elapsed();
    for removal in removals {
        removal.join().expect("removing a container");
    }
    drop(load);
    eprintln!(
        "{STARTS} container starts under --wait, every first /dev/shm call seen, in {took:.1?}; \
         load average (1, 5, 15 min) after each start: {}",
        loads.join(" | ")
    );
}

#[test]
fn ctrl_c_ends_a_wait_for_a_container_that_never_comes() {
    let _guard = setup();
    let name = Container::name_for("shmtrace-e2e-wait-never");
    let tracer = LiveTracer::start_until(
        &["--container", &name, "--wait"],
        "shmtrace: waiting for container",
    );
    let (status, log, records) = tracer.stop();
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(
        log.contains("interrupted before the container ran; nothing was traced"),
        "{log}"
    );
    assert!(records.is_empty(), "{records:?}");
}
