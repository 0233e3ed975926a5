//! `shmtrace daemon` beside real Docker containers that live shorter than a survey of the
//! runtimes: what they leave in their own /dev/shm is forgotten with them (the analysis' object
//! count comes back to where it was), and a failure in a container's first moments is named
//! by its container in the JSON lines, as the metrics name it, as is one in a container that
//! `docker run --rm` removes as soon as it fails; and a container whose death the daemon hears
//! of before it reads its last calls still has them named by their file. Needs root and
//! Docker; fails loudly without them.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;
use shmtrace_tests::{
    daemon::{Daemon, sample, total},
    docker::{self, Container},
    require_root, serial,
};

/// Short-lived containers, and how many run at once.
const CONTAINERS: usize = 24;
const AT_ONCE: usize = 8;
/// Objects the analysis may still hold above its count before them: other tests' files, the
/// host's. Far below one per container.
const OBJECTS_SLACK: u64 = 4;

fn signal(daemon: &Daemon, signal: Signal) {
    nix::sys::signal::kill(Pid::from_raw(daemon.pid() as i32), signal).unwrap();
}

fn objects(daemon: &Daemon) -> u64 {
    let text = daemon.metrics();
    sample(&text, "shmtrace_state_entries", &[("kind", "object")])
        .unwrap_or_else(|| panic!("no shmtrace_state_entries{{kind=\"object\"}}:\n{text}"))
        as u64
}

#[test]
fn objects_of_removed_containers_private_dev_shm_are_forgotten() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let daemon = Daemon::start(&["--interval", "1s", "--forget-after", "2s"]);
    // The gauge is set once a second.
    std::thread::sleep(Duration::from_millis(1500));
    let before = objects(&daemon);

    // Each leaves a file in its own /dev/shm, unmounted when it is removed. The daemon reads
    // their records late, as on a busy node: by then their processes are gone, and no cgroup
    // says whose the namespace was.
    let image = docker::image();
    signal(&daemon, Signal::SIGSTOP);
    for wave in 0..CONTAINERS / AT_ONCE {
        let children: Vec<_> = (0..AT_ONCE)
            .map(|i| {
                Command::new("docker")
                    .args(["run", "--rm", "--network", "none", image, "sh", "-c"])
                    .arg(format!("echo left-behind > /dev/shm/left-{wave}-{i}"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("docker run")
            })
            .collect();
        for child in children {
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "docker run: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    signal(&daemon, Signal::SIGCONT);
    // The gauge, set once a second, says what was before the records were read: it is read
    // once they have been, and three surveys (a quarter of a second apart, asked for by
    // the unknown namespaces) have said that nobody claims them.
    std::thread::sleep(Duration::from_secs(4));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = objects(&daemon);
    while after > before + OBJECTS_SLACK && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        after = objects(&daemon);
    }
    let (_, _, stderr) = daemon.stop();
    assert!(
        after <= before + OBJECTS_SLACK,
        "the daemon still holds {after} /dev/shm objects, {before} before {CONTAINERS} \
         short-lived containers each left one file in their own /dev/shm (at most \
         {OBJECTS_SLACK} more allowed): the files of removed containers are not forgotten; \
         stderr:\n{stderr}"
    );
}

#[test]
fn a_failure_in_a_containers_first_moments_is_named_by_its_container_in_the_json_lines() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let daemon = Daemon::start(&["--interval", "1s"]);
    // Fails at once, before any survey can have seen it, removes what it wrote (so that no
    // survey sees /dev/shm full), and stays up so that one sees it.
    // A file of its own: the daemon sees every dd on the machine.
    let file = format!("/dev/shm/young-{}", std::process::id());
    let failing = Container::run(
        "daemon-young-fail",
        &["--shm-size", "1m"],
        &format!("dd if=/dev/zero of={file} bs=2M count=1; rm {file}; sleep 600"),
    );
    let name = failing.name.clone();
    daemon.wait_for_metric(Duration::from_secs(30), |l| {
        l.starts_with("shmtrace_shm_failures_total") && l.contains(&format!("\"{name}\""))
    });
    // Its /dev/shm was full at the failure, as the diagnosis says: the peak says so too, not
    // the 0 B every survey measured (issue 33).
    daemon.wait_for_metric(Duration::from_secs(10), |l| {
        l.starts_with("shmtrace_shm_peak_bytes")
            && l.contains(&format!("\"{name}\""))
            && l.ends_with(" 1048576")
    });
    drop(failing);
    let (_, lines, stderr) = daemon.stop();
    // dd's failed write, and the diagnosis of its exit.
    let failed: Vec<_> = lines
        .iter()
        .filter(|l| l["comm"] == "dd" && l.to_string().contains(&file))
        .filter(|l| l["errno"] == "ENOSPC" || l["event"] == "diagnosis")
        .collect();
    assert!(
        failed.iter().any(|l| l["event"] == "diagnosis") && failed.len() >= 2,
        "no JSON line for dd's ENOSPC or no diagnosis of it; lines: {lines:#?}\nstderr: {stderr}"
    );
    for line in failed {
        assert_eq!(
            line["container"]["name"], name,
            "dd's failure in container {name}, which failed before a survey saw it, is not \
             named by it in the JSON lines (the metrics name it): {line}"
        );
        if line["event"] == "diagnosis" {
            assert_eq!(line["place"], name, "{line}");
        }
    }
}

/// `docker run --rm` removes a container as soon as its main process ends, before the daemon
/// has read the records of its failure; a survey saw it while it paused. Its failure is counted
/// under its name whether the failing `dd` is its main process (busybox's `sh -c` execs the
/// last command) or a child of a shell that ends just after it.
#[test]
fn a_failure_of_a_container_removed_as_it_ends_is_counted_under_its_name() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let daemon = Daemon::start(&["--interval", "1s"]);
    let image = docker::image();
    let fill = "dd if=/dev/zero of=/dev/shm/fill bs=1M count=4";
    let runs: Vec<_> = [
        ("daemon-rm-main", format!("sleep 3; {fill}")),
        (
            "daemon-rm-child",
            format!("sleep 3; {fill} || {{ echo failed; exit 1; }}"),
        ),
    ]
    .into_iter()
    .map(|(prefix, script)| {
        let name = Container::name_for(prefix);
        let child = Command::new("docker")
            .args(["run", "--rm", "--name", &name, "--network", "none"])
            .args(["--shm-size", "1m", image, "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("docker run");
        (name, child)
    })
    .collect();
    let mut names = Vec::new();
    for (name, child) in runs {
        let output = child.wait_with_output().unwrap();
        assert!(
            !output.status.success(),
            "dd filled 4 MiB of {name}'s 1 MiB /dev/shm without failing"
        );
        names.push(name);
    }
    for name in &names {
        // Three surveys at most, a second apart, and the tick that counts.
        daemon.wait_for_metric(Duration::from_secs(30), |l| {
            l.starts_with("shmtrace_shm_failures_total")
                && l.contains(&format!("container=\"{name}\""))
                && l.contains("errno=\"ENOSPC\"")
        });
    }
    let (_, lines, stderr) = daemon.stop();
    // The exec'd dd's container was claimed when its records were read: its lines name it.
    let main = &names[0];
    let named = lines
        .iter()
        .filter(|l| l["comm"] == "dd" && l["errno"] == "ENOSPC")
        .any(|l| l["container"]["name"] == main.as_str());
    assert!(
        named,
        "no JSON line of dd's ENOSPC names {main}; lines: {lines:#?}\nstderr: {stderr}"
    );
}

/// The mount namespace number of a running container's main process.
fn mntns_of(container: &str) -> Option<u64> {
    let output = Command::new("docker")
        .args(["inspect", "--format", "{{.State.Pid}}", container])
        .output()
        .ok()?;
    let pid = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let link = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()?;
    link.to_string_lossy()
        .trim_start_matches("mnt:[")
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// A container fails at its very end (EROFS on a read-only /dev/shm, and its shell exits 1),
/// younger than any survey, and the next container takes its mount namespace number a moment
/// later: the survey its failure asks for sees the next one there. Every line of the first
/// one's failure (the failed open, its exit, its diagnosis) and its metric name the first one,
/// none the next one or nobody.
#[test]
fn a_failure_at_a_containers_end_is_its_own_when_the_next_takes_its_namespace_at_once() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let daemon = Daemon::start(&["--interval", "30s"]);
    let image = docker::image();
    // The kernel gives a freed number to the next namespace made, unless another test's
    // container takes it first: a few tries.
    let (first, next, _next_run, attempt) = (0..5)
        .find_map(|attempt| {
            let first = Container::name_for("daemon-end-first");
            let run = Command::new("docker")
                .args(["run", "--rm", "--name", &first, "--network", "none"])
                .args(["--tmpfs", "/dev/shm:ro,size=1m", image, "sh", "-c"])
                .arg(format!(
                    "sleep 0.8; echo x > /dev/shm/ended-{attempt}; exit 1"
                ))
                .stderr(Stdio::null())
                .spawn()
                .expect("docker run");
            std::thread::sleep(Duration::from_millis(400));
            let had = mntns_of(&first);
            let status = run.wait_with_output().expect("docker run").status;
            assert_eq!(status.code(), Some(1), "the first container did not fail");
            let next = Container::name_for("daemon-end-next");
            let next_run = Container::run_named(&next, &[], "sleep 5");
            (had.is_some() && mntns_of(&next) == had).then_some((first, next, next_run, attempt))
        })
        .expect("in five tries, no container took the number of the one before it");
    // The surveys the first one's failure asked for (three, a quarter of a second apart) see
    // the next one on the number.
    std::thread::sleep(Duration::from_millis(2500));
    let text = daemon.metrics();
    let (_, lines, stderr) = daemon.stop();
    let context = format!("{text}\nstderr: {stderr}");
    assert_eq!(
        sample(
            &text,
            "shmtrace_shm_failures_total",
            &[("container", &first), ("errno", "EROFS")]
        ),
        Some(1.0),
        "{context}"
    );
    for other in [("container", next.as_str()), ("runtime", "unknown")] {
        assert_eq!(
            sample(
                &text,
                "shmtrace_shm_failures_total",
                &[other, ("errno", "EROFS")]
            ),
            None,
            "{context}"
        );
    }
    let failed = lines
        .iter()
        .find(|l| l["errno"] == "EROFS" && l["path"] == format!("/dev/shm/ended-{attempt}"))
        .unwrap_or_else(|| panic!("no line of the EROFS; lines: {lines:#?}\n{context}"));
    let pid = failed["pid"].clone();
    let of_first: Vec<&Value> = lines
        .iter()
        .filter(|l| l["pid"] == pid || l["follows_pid"] == pid)
        .collect();
    for kind in ["exit", "diagnosis"] {
        assert!(
            of_first.iter().any(|l| l["event"] == kind),
            "no {kind} line of the first container's shell: {of_first:#?}\n{context}"
        );
    }
    for line in &of_first {
        assert_eq!(
            line["container"]["name"],
            first.as_str(),
            "a line of the first container's failure names another (the next is {next}): {line}"
        );
        if line["event"] == "diagnosis" {
            assert_eq!(line["place"], first.as_str(), "{line}");
        }
    }
}

/// The runtime's word that a container died comes by another road than its records: a daemon
/// behind the ring buffer (here stopped, then flooded) hears of the death before it reads the
/// container's last calls. Those calls still name the file they were on, which the daemon
/// learned long before, when the container opened it: its end waits for its records.
#[test]
fn a_containers_last_calls_read_after_its_death_was_heard_of_still_name_its_file() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let daemon = Daemon::start(&["--interval", "1s", "--buffer-size", "64M"]);
    // The opened file, then (told) records enough to take the daemon several reads, and the
    // write that fills /dev/shm behind them.
    let container = Container::run(
        "daemon-heard-dead",
        &["--shm-size", "1m"],
        "exec 3>/dev/shm/heard-dead; touch /work/opened; \
         while [ ! -e /work/go ]; do sleep 0.05; done; \
         /x/shm-exerciser burst 20000; \
         dd if=/dev/zero bs=64k count=32 >&3; exit 1",
    );
    docker::wait_for(&container.work.join("opened"));
    // The open read, and the container listed by a survey.
    std::thread::sleep(Duration::from_secs(2));
    signal(&daemon, Signal::SIGSTOP);
    container.signal("go");
    let code = container.wait();
    signal(&daemon, Signal::SIGCONT);
    assert_eq!(code, 1, "the container did not fail as planned");
    daemon.wait_for_metric(Duration::from_secs(60), |l| {
        l.starts_with("shmtrace_shm_failures_total")
            && l.contains(&format!("container=\"{}\"", container.name))
            && l.contains("errno=\"ENOSPC\"")
    });
    let text = daemon.metrics();
    let (_, lines, stderr) = daemon.stop();
    assert_eq!(
        total(&text, "shmtrace_events_lost_total", &[]),
        0.0,
        "records were lost with a 64 MiB ring buffer, so the test proves nothing\n{text}"
    );
    let failed: Vec<&Value> = lines
        .iter()
        .filter(|l| l["comm"] == "dd" && l["errno"] == "ENOSPC")
        .filter(|l| l["container"]["name"] == container.name.as_str())
        .collect();
    assert!(
        !failed.is_empty(),
        "no line of dd's ENOSPC in {}: {lines:#?}\nstderr: {stderr}",
        container.name
    );
    for line in failed {
        assert_eq!(
            line["path"], "/dev/shm/heard-dead",
            "{line}\nstderr: {stderr}"
        );
    }
}
