//! `shmtrace daemon` meeting a Ray driver that was running before it started, in a real Docker
//! container with Docker's default 64 MiB /dev/shm: no exec of the driver is seen, and its
//! 200 MiB object store goes to /tmp when it starts the cluster. The daemon reads the
//! programs' command lines from /proc as it meets them, so Ray's own rule diagnoses it there
//! as it does under `shmtrace --container`, named by its container. Needs root, Docker and the
//! Ray venv (.ci/run installs it); fails loudly without them.
use std::time::Duration;

use shmtrace_tests::{
    daemon::{Daemon, sample},
    docker,
    ray::RayCluster,
    require_root, serial,
    sizing::MIB,
};

/// Docker's default /dev/shm.
const DOCKER_DEFAULT: u64 = 64 * MIB;

#[test]
fn a_ray_driver_running_before_the_daemon_is_diagnosed_by_rays_rule_when_its_store_goes_to_tmp() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let job = RayCluster { store: 200 * MIB };
    let container = job.driver_waiting(DOCKER_DEFAULT);
    let daemon = Daemon::start(&[]);
    container.signal("go");
    let code = container.wait();
    let store = std::fs::read_to_string(container.work.join("store")).unwrap_or_default();
    assert_eq!(code, 0, "Ray failed: {store}");
    assert!(
        store.starts_with("directory=/tmp"),
        "Ray kept its store in /dev/shm, so there is nothing to diagnose: {store}"
    );
    let name = container.name.clone();
    let text = daemon.wait_for_metric(Duration::from_secs(60), |l| {
        l.starts_with("shmtrace_recommended_shm_bytes") && l.contains(&format!("\"{name}\""))
    });
    drop(container);
    let (_, lines, stderr) = daemon.stop();
    let diagnosis = lines
        .iter()
        .find(|l| l["event"] == "diagnosis" && l["comm"] == "raylet")
        .unwrap_or_else(|| panic!("no diagnosis of the raylet; lines: {lines:#?}\n{stderr}"));
    assert_eq!(diagnosis["container"]["name"], name.as_str(), "{diagnosis}");
    assert_eq!(diagnosis["program"], "Ray object store", "{diagnosis}");
    let failure = &diagnosis["failures"][0];
    assert_eq!(failure["kind"], "space_check", "{diagnosis}");
    assert!(
        failure["decided"]
            .as_str()
            .is_some_and(|d| d.contains("went to /tmp/ray")),
        "{diagnosis}"
    );
    // Ray's rule: the store at most 90% of the free space.
    let needed = (200 * MIB * 100).div_ceil(90);
    assert_eq!(failure["need"].as_u64(), Some(needed), "{diagnosis}");
    let advised = diagnosis["recommendation"]["min_bytes"]
        .as_u64()
        .unwrap_or(0);
    assert!(advised >= needed, "{diagnosis}");
    assert_eq!(
        sample(
            &text,
            "shmtrace_recommended_shm_bytes",
            &[("container", &name)]
        ),
        Some(advised as f64),
        "{text}"
    );
}
