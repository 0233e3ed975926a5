//! Sizing advice that works the first time (issue 8), on real programs in real Docker
//! containers: the advice shmtrace gives after a failure, applied once, makes the same workload
//! pass; so does the size `shmtrace size` measures on a roomy /dev/shm; and both are at most
//! 1.5x the smallest `--shm-size` that works, which each test finds itself by bisection.
//!
//! Each test prints a `ratio:` line, the figures of docs/sizing.md.
use shmtrace_tests::{
    docker::require_docker,
    pytorch,
    recording::{Recorder, replay},
    require_root, serial,
    sizing::{self, Job, MIB, PostgresQuery, Script},
    workload::PYTHON,
};

/// The bound of the issue: advice at most this much above the smallest size that works.
const MAX_RATIO: f64 = 1.5;

/// The whole check for one workload: it fails in `small` bytes; the advice after that failure
/// works and is within [`MAX_RATIO`] of the smallest working size; so is `shmtrace size`'s,
/// measured with `roomy` bytes. Bisection runs in steps of `step` bytes.
fn check(job: &dyn Job, small: u64, roomy: u64, step: u64) {
    require_root();
    require_docker();
    let _serial = serial();
    let what = job.describe();

    let failed = sizing::advice_after_failure(job, small);
    assert!(
        !failed.succeeded,
        "{what} should fail with {} MiB of /dev/shm",
        small / MIB
    );
    let advised = failed
        .advised
        .unwrap_or_else(|| panic!("no advice after {what} failed:\n{}", failed.log));
    eprintln!(
        "{what}: after the failure, advised {} MiB: {}",
        advised / MIB,
        failed.basis
    );

    let sized = sizing::size(job, roomy, &[]);
    assert!(
        sized.succeeded,
        "{what} failed with a roomy /dev/shm:\n{}",
        sized.log
    );
    assert_eq!(
        sized.status,
        Some(130),
        "shmtrace size after Ctrl-C:\n{}",
        sized.log
    );
    let measured = sized.advised();
    eprintln!(
        "{what}: shmtrace size advised {} MiB: {}",
        measured / MIB,
        sized.report["shm"][0]["advice"]["basis"]
    );

    assert!(
        sizing::works(job, advised),
        "{what} still fails with the {} MiB advised after its failure ({})",
        advised / MIB,
        failed.basis
    );
    assert!(
        sizing::works(job, measured),
        "{what} fails with the {} MiB shmtrace size advised",
        measured / MIB
    );

    let smallest = sizing::smallest_working(job, small, advised.min(measured), step);
    for (how, bytes) in [
        ("after the failure", advised),
        ("by shmtrace size", measured),
    ] {
        let ratio = bytes as f64 / smallest as f64;
        eprintln!(
            "ratio: {what} | smallest {:.1} MiB | advised {how} {:.1} MiB | {ratio:.2}",
            smallest as f64 / MIB as f64,
            bytes as f64 / MIB as f64
        );
        assert!(
            ratio <= MAX_RATIO,
            "{what}: the {:.1} MiB advised {how} is {ratio:.2}x the smallest size that works, \
             {:.1} MiB",
            bytes as f64 / MIB as f64,
            smallest as f64 / MIB as f64
        );
    }
}

fn python_script(what: &str, script_and_args: &str) -> Script {
    Script {
        what: what.to_owned(),
        flags: sizing::workloads_mount(),
        command: format!("cd /w && {PYTHON} -B {script_and_args}"),
    }
}

fn dataloader(what: &str, args: &str) -> Script {
    let venv = pytorch::venv().display().to_string();
    let mut flags = sizing::workloads_mount();
    flags.extend(pytorch::docker_mounts());
    Script {
        what: what.to_owned(),
        flags,
        command: format!("cd /w && {venv}/bin/python -B torch_dataloader.py {args}"),
    }
}

#[test]
fn multiprocessing_shared_memory() {
    let job = python_script(
        "multiprocessing.shared_memory, 24 MiB written by 3 processes",
        "shared_memory_sigbus.py --size 24M --workers 3",
    );
    check(&job, 8 * MIB, 256 * MIB, MIB);
}

#[test]
fn several_processes_failing_at_the_same_moment() {
    let job = python_script(
        "5 processes sizing 6 MiB segments at once",
        "burst.py --procs 5 --size 6M",
    );
    check(&job, 16 * MIB, 256 * MIB, MIB);
}

#[test]
fn pytorch_dataloader_two_workers_fast_trainer() {
    let job = dataloader(
        "PyTorch DataLoader, 2 workers, 8 MiB batches, prefetch 2",
        "--workers 2 --batch-bytes 8M --prefetch 2 --batches 12 --step 0 --timeout 5",
    );
    check(&job, 8 * MIB, 512 * MIB, MIB);
}

#[test]
fn pytorch_dataloader_three_workers_deep_prefetch() {
    let job = dataloader(
        "PyTorch DataLoader, 3 workers, 4 MiB batches, prefetch 4, slow trainer",
        "--workers 3 --batch-bytes 4M --prefetch 4 --batches 24 --step 0.1 --timeout 5",
    );
    check(&job, 8 * MIB, 512 * MIB, MIB);
}

#[test]
fn postgresql_parallel_hash_join() {
    let job = PostgresQuery {
        what: "PostgreSQL 15, parallel hash join of 2 x 300k rows".to_owned(),
        settings: vec![
            "max_parallel_workers_per_gather=4".to_owned(),
            "work_mem=64MB".to_owned(),
        ],
        setup: "CREATE TABLE a AS SELECT g AS id, md5(g::text) AS pad FROM \
                generate_series(1, 300000) g; CREATE TABLE b AS SELECT * FROM a; \
                ANALYZE a; ANALYZE b;"
            .to_owned(),
        query: "SET enable_parallel_hash = on; SET parallel_leader_participation = on; \
                SELECT count(*) FROM a JOIN b USING (id);"
            .to_owned(),
    };
    check(&job, 8 * MIB, 512 * MIB, 2 * MIB);
}

#[test]
fn size_budget_gates_ci() {
    require_root();
    require_docker();
    let _serial = serial();
    let job = python_script(
        "5 processes sizing 6 MiB segments at once",
        "burst.py --procs 5 --size 6M",
    );
    let sized = sizing::size(&job, 256 * MIB, &[]);
    let needed = sized.advised();
    let fits = sizing::size(
        &job,
        256 * MIB,
        &["--budget", &format!("{}m", needed / MIB)],
    );
    // With --budget the status is the verdict: ended with Ctrl-C, a fitting watch passes.
    assert_eq!(
        fits.status,
        Some(0),
        "a budget of exactly the advice fits:\n{}",
        fits.log
    );
    assert_eq!(fits.report["budget"]["fits"], true, "{}", fits.report);
    let over = sizing::size(
        &job,
        256 * MIB,
        &["--budget", &format!("{}Mi", needed / MIB - 1)],
    );
    assert_eq!(
        over.status,
        Some(3),
        "a budget 1 MiB short must fail:\n{}",
        over.log
    );
    assert_eq!(over.report["budget"]["fits"], false, "{}", over.report);
    assert!(over.succeeded, "the workload itself ran fine");
}

#[test]
fn report_size_from_a_recording() {
    require_root();
    require_docker();
    let _serial = serial();
    let job = python_script(
        "5 processes sizing 6 MiB segments at once",
        "burst.py --procs 5 --size 6M",
    );
    let dir = shmtrace_tests::tempdir();
    let file = dir.join("burst.shmtrace");
    let mut started = job.start(256 * MIB);
    let recorder = Recorder::start(
        &[
            "-o",
            file.to_str().unwrap(),
            "--container",
            started.container(),
        ],
        &dir.join("stdout"),
        "shmtrace: tracing",
    );
    assert!(started.go(), "the burst fits in 256 MiB");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, log) = recorder.interrupt();
    assert_eq!(status.code(), Some(130), "{log}");
    let report = replay("report", &file, &["--size"]);
    assert!(report.output.status.success(), "{}", report.stderr());
    let sized = &report.records[0];
    let shm = &sized["shm"][0];
    let peak = shm["peak_bytes"].as_u64().unwrap();
    // The five processes hold their fallocated 6 MiB at once; the kernel reported every page.
    assert!((30 * MIB..32 * MIB).contains(&peak), "{sized}");
    let advised = shm["advice"]["min_bytes"].as_u64().unwrap();
    assert!(
        sizing::works(&job, advised),
        "the {} MiB report --size advised does not work",
        advised / MIB
    );
    let _ = std::fs::remove_dir_all(dir);
}
