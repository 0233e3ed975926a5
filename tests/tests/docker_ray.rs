//! Ray (from PyPI) in real Docker containers: it decides where its object store goes from
//! /dev/shm's free space, and no call fails whatever it decides. With Docker's default 64m,
//! a 200 MiB store goes to /tmp (slower), and a store over 10 GB is refused outright. Each
//! diagnosis is checked by applying what it says and running Ray again.
use serde_json::Value;
use shmtrace_tests::{
    diagnosis::{diagnoses, u64_of},
    ray::RayCluster,
    recording::{Recorder, replay},
    serial,
    sizing::{self, Job, MIB, advice_after_failure},
    tempdir,
};

/// Docker's default /dev/shm.
const DOCKER_DEFAULT: u64 = 64 * MIB;

fn space_check(d: &Value) -> &Value {
    let failure = &d["failures"][0];
    assert_eq!(failure["kind"], "space_check", "{d}");
    assert_eq!(failure["size"], DOCKER_DEFAULT, "what Ray saw: {d}");
    assert_eq!(failure["free"], DOCKER_DEFAULT, "what Ray saw: {d}");
    failure
}

/// The store goes to /tmp at 64m: the raylet's diagnosis says so, from what the driver saw,
/// and advises a size by Ray's own rule (the store at most 90% of the free space). With that
/// size Ray keeps its store in /dev/shm, and shmtrace says nothing; a MiB short of Ray's rule,
/// Ray does not (so the rule is Ray's, not a guess with room to spare).
#[test]
fn ray_store_that_falls_back_to_tmp_gets_the_size_that_keeps_it_in_dev_shm() {
    let _guard = serial();
    let job = RayCluster { store: 200 * MIB };
    let failed = advice_after_failure(&job, DOCKER_DEFAULT);
    assert!(
        !failed.succeeded,
        "the store fitted in 64m:\n{}",
        failed.log
    );
    let found = diagnoses(&failed.records);
    assert_eq!(
        found.len(),
        1,
        "one diagnosis, the raylet's:\n{}",
        failed.log
    );
    let d = found[0];
    assert_eq!(d["comm"], "raylet", "{d}");
    assert_eq!(d["program"], "Ray object store", "{d}");
    assert_eq!(d["cause"], "shm_full", "{d}");
    let failure = space_check(d);
    let decided = failure["decided"].as_str().unwrap_or_default();
    assert!(decided.contains("went to /tmp/ray"), "{d}");
    // Ray's rule: 200 MiB / 0.9 free.
    let needed = (200 * MIB * 100).div_ceil(90);
    assert_eq!(u64_of(&failure["need"]), needed, "{d}");
    let advised = failed
        .advised
        .unwrap_or_else(|| panic!("no size advised:\n{}", failed.log));
    assert!(advised >= needed, "{d}");

    let healthy = advice_after_failure(&job, advised);
    assert!(
        healthy.succeeded,
        "with the {} MiB advised, Ray still did not keep its store in /dev/shm:\n{}",
        advised / MIB,
        healthy.log
    );
    assert!(
        diagnoses(&healthy.records).is_empty(),
        "a diagnosis for a Ray that had room:\n{}",
        healthy.log
    );
    // A recording replays to the same answer: the raylet's whole command line, read from
    // /proc, is in the file.
    let recorded = recorded_diagnoses(&job, DOCKER_DEFAULT);
    assert_eq!(recorded.len(), 1, "{recorded:#?}");
    assert_eq!(recorded[0]["failures"][0]["need"], failure["need"]);
    assert_eq!(recorded[0]["recommendation"]["min_bytes"], advised);

    let short = needed / MIB * MIB;
    assert!(
        !sizing::works(&job, short),
        "Ray kept its 200 MiB store whole in {} MiB: its rule is not 90% of the free space",
        short / MIB
    );
}

/// `shmtrace record` of one run of `job`, and the diagnoses `shmtrace report` finds in it.
fn recorded_diagnoses(job: &RayCluster, shm_bytes: u64) -> Vec<Value> {
    let dir = tempdir();
    let file = dir.join("ray.shmtrace");
    let mut started = job.start(shm_bytes);
    let file_arg = file.display().to_string();
    let recorder = Recorder::start(
        &["-o", &file_arg, "--container", started.container()],
        &dir.join("stdout"),
        "shmtrace: tracing",
    );
    started.go();
    let (status, stderr) = recorder.interrupt();
    assert_eq!(status.code(), Some(130), "{stderr}");
    let replayed = replay("report", &file, &[]);
    replayed.assert_ok();
    let _ = std::fs::remove_dir_all(&dir);
    replayed.of("diagnosis").into_iter().cloned().collect()
}

/// A store over 10 GB, which Ray refuses to put in /tmp: the driver exits 1 after looking at
/// /dev/shm's free space. The diagnosis blames what it saw, and sends the user to `shmtrace
/// size` on a roomy /dev/shm; the size that gives, applied once, lets Ray start with its
/// store in /dev/shm.
#[test]
fn ray_refusing_a_store_bigger_than_dev_shm_is_blamed_on_what_it_saw() {
    let _guard = serial();
    let job = RayCluster {
        store: 11_000_000_000,
    };
    let failed = advice_after_failure(&job, DOCKER_DEFAULT);
    assert!(!failed.succeeded, "Ray started:\n{}", failed.log);
    let found = diagnoses(&failed.records);
    let driver = found
        .iter()
        .find(|d| d["failures"][0]["kind"] == "space_check")
        .unwrap_or_else(|| panic!("no diagnosis from what Ray saw:\n{}", failed.log));
    assert_eq!(driver["ending"]["exit_code"], 1, "{driver}");
    let failure = space_check(driver);
    assert_eq!(failure["looked_by"], driver["pid"], "{driver}");
    assert!(
        failure["decided"]
            .as_str()
            .is_some_and(|t| t.starts_with("exited with status 1")),
        "{driver}"
    );
    assert!(driver["recommendation"].is_null(), "{driver}");
    let explanation = driver["explanation"].as_str().unwrap_or_default();
    assert!(explanation.contains("shmtrace size"), "{driver}");

    let sized = sizing::size(&job, 16 << 30, &[]);
    assert!(
        sized.succeeded,
        "Ray failed on a 16 GiB /dev/shm:\n{}",
        sized.log
    );
    let advised = sized.advised();
    assert!(
        sizing::works(&job, advised),
        "Ray did not keep its store in /dev/shm with the {} MiB shmtrace size advised ({})",
        advised / MIB,
        sized.report["shm"][0]["advice"]["basis"]
    );
}
