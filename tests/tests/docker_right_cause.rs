//! The right cause on real programs in real Docker containers, for the kinds of issue 32: each
//! failing run is traced, its diagnosis must have the recipe's cause, its advice is applied
//! once and the program run again (it must succeed), and the healthy run of the same program
//! must get no diagnosis. The runs are the corpus's recipes (`src/bin/corpus.rs`), run again
//! with `corpus check`, which leaves tests/corpus as it is.
use std::{process::Command, time::Duration};

use serde_json::Value;
use shmtrace_tests::{
    daemon::{Daemon, sample},
    docker::require_docker,
    live::LiveTracer,
    require_root, serial,
    shared_shm::RemovedNextDoor,
    sizing::{Job, MIB},
};

fn check(entries: &[&str]) {
    let _guard = serial();
    require_root();
    require_docker();
    let output = Command::new(env!("CARGO_BIN_EXE_corpus"))
        .arg("check")
        .args(entries)
        .output()
        .expect("running the corpus recorder");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    eprintln!("{log}");
}

/// PyTorch's file_system strategy in a 256 MiB /dev/shm of 200 files: inodes_full, the
/// nr_inodes advised works; with enough files, no diagnosis.
#[test]
fn out_of_files_not_bytes() {
    check(&[
        "pytorch-file-system-out-of-files",
        "healthy-pytorch-file-system-enough-files",
    ]);
}

/// multiprocessing.shared_memory's name removed by rm while held: name_removed; kept, no
/// diagnosis.
#[test]
fn a_name_removed_by_another_process() {
    check(&[
        "shared-memory-name-removed",
        "healthy-shared-memory-name-kept",
    ]);
}

/// A clean-up in another container sharing the /dev/shm (a pod's sidecar) removes the name:
/// traced container by container, the reader's diagnosis names the remover's container.
#[test]
fn a_name_removed_by_another_container() {
    check(&["shared-memory-name-removed-by-another-container"]);
}

/// The same removal, by a sweeper that stays (a sidecar's), traced host-wide (`--all`) and by
/// the daemon at once: each names the remover the same way (its pid, command line and
/// container), and the daemon counts the removal under the remover's container.
#[test]
fn a_name_removed_by_another_container_host_wide_and_in_the_daemon() {
    let _guard = serial();
    require_root();
    require_docker();
    let mut job = RemovedNextDoor { host_wide: true }.start(64 * MIB);
    let job_names = job.container().to_owned();
    let (owner, cleaner) = job_names.split_once(',').expect("two containers");
    let (owner, cleaner) = (owner.to_owned(), cleaner.to_owned());
    let daemon = Daemon::start(&["--interval", "1s"]);
    let tracer = LiveTracer::start(&["--all"]);
    // Both know the containers before the job goes: the owner's warm-up is labelled with its
    // container, and both containers ran before either tracer started, so the survey that
    // named one named the other.
    tracer.wait_for_record(|r| r["path"] == "/dev/shm/warm-up" && r["container"]["name"] == *owner);
    daemon.wait_for_metric(Duration::from_secs(60), |l| {
        l.starts_with("shmtrace_shm_size_bytes") && l.contains(&format!("\"{owner}\""))
    });
    assert!(!job.go(), "the reader attached to a name that was removed");
    let is_readers = |r: &Value| {
        r["event"] == "diagnosis" && r["ending"]["exit_code"] == 2 && r["place"] == *owner.as_str()
    };
    let host_wide = tracer.wait_for_record(is_readers);
    let removed_total = daemon.wait_for_metric(Duration::from_secs(60), |l| {
        l.starts_with("shmtrace_names_removed_total") && l.contains(&format!("\"{cleaner}\""))
    });
    let (_, log, _) = tracer.stop();
    let (_, lines, stderr) = daemon.stop();
    let in_daemon = lines.iter().find(|r| is_readers(r)).unwrap_or_else(|| {
        panic!("no diagnosis of the reader in the daemon's lines:\n{lines:#?}\n{stderr}")
    });
    for (who, diagnosis) in [("--all", &host_wide), ("the daemon", in_daemon)] {
        assert_eq!(
            diagnosis["cause"], "name_removed",
            "{who}: {diagnosis:#}\n{log}"
        );
        let removed = &diagnosis["removed"];
        assert_eq!(removed["path"], "/dev/shm/job_buf", "{who}: {removed:#}");
        assert_eq!(removed["by_comm"], "python3", "{who}: {removed:#}");
        assert_eq!(removed["by_place"], cleaner.as_str(), "{who}: {removed:#}");
        assert_eq!(
            removed["by_argv"].as_array().map(|argv| &argv[..3]),
            Some(&["/usr/bin/python3", "-B", "-c"].map(Value::from)[..]),
            "{who}: {removed:#}"
        );
        assert!(
            removed["holders"].as_array().is_some_and(|h| !h.is_empty()),
            "{who}: {removed:#}"
        );
    }
    // The same, but for when: each tracer's probes read the clock themselves.
    let without_time = |removed: &Value| {
        let mut removed = removed.clone();
        removed.as_object_mut().unwrap().remove("ns_before");
        removed
    };
    assert_eq!(
        without_time(&host_wide["removed"]),
        without_time(&in_daemon["removed"]),
        "--all and the daemon name the removal differently"
    );
    assert_eq!(
        sample(
            &removed_total,
            "shmtrace_names_removed_total",
            &[("container", &cleaner)]
        ),
        Some(1.0),
        "{removed_total}"
    );
}

/// Open MPI over UCX: every rank asks for huge pages (shmget SHM_HUGETLB, mmap MAP_HUGETLB),
/// is refused and takes ordinary pages. In 8 MiB one rank's write of zeros over its segment
/// fails and mpirun ends the others: only that rank is diagnosed, none for its probes, and the
/// size shmtrace size measures works; in 64 MiB, no diagnosis.
#[test]
fn probes_that_fall_back_are_not_the_cause() {
    check(&["mpi-ucx-job-in-a-small-dev-shm", "healthy-mpi-ucx-job"]);
}

/// Services that looked at /dev/shm's free space and were then stopped with SIGINT and SIGTERM
/// get no diagnosis.
#[test]
fn a_stopped_service_is_not_diagnosed_for_its_look() {
    check(&["looked-at-dev-shm-then-stopped"]);
}

/// Eight writers growing files by write() in 8 MiB: no size the trace shows too small; the
/// size shmtrace size measures on a roomy /dev/shm works; in 64 MiB, no diagnosis.
#[test]
fn files_grown_by_write() {
    check(&[
        "writers-growing-files-by-write",
        "healthy-writers-growing-files-by-write",
    ]);
}

/// A missing directory under /dev/shm is not a missing /dev/shm; made, no diagnosis.
#[test]
fn a_missing_directory_under_dev_shm() {
    check(&[
        "missing-directory-under-dev-shm",
        "healthy-directory-under-dev-shm",
    ]);
}
