//! `shmtrace daemon` beside real Docker containers that live shorter than a survey of the
//! runtimes: what they leave in their own /dev/shm is forgotten with them (the analysis' object
//! count comes back to where it was), and a failure in a container's first moments is named
//! by its container in the JSON lines, as the metrics name it, as is one in a container that
//! `docker run --rm` removes as soon as it fails. Needs root and Docker; fails loudly without
//! them.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use shmtrace_tests::{
    daemon::{Daemon, sample},
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
    let failing = Container::run(
        "daemon-young-fail",
        &["--shm-size", "1m"],
        "dd if=/dev/zero of=/dev/shm/fill bs=2M count=1; rm /dev/shm/fill; sleep 600",
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
        .filter(|l| l["comm"] == "dd")
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
