//! `shmtrace check` inside real Docker containers, as user 1000 with no capability
//! (issue 34): a roomy /dev/shm, a full one, none (`--ipc=none`), a read-only one, one with
//! few inodes, and a memory limit smaller than /dev/shm. Each runs `check --json` (and the
//! text form where it says something the JSON cannot) and reads what it found.
use serde_json::Value;
use shmtrace_tests::unprivileged::{Run, Runtime, run};

const MIB: u64 = 1 << 20;

/// Runs `script` (which ends with a check) and parses the last line of its stdout.
fn check(prefix: &str, flags: &[&str], script: &str) -> (Run, Value) {
    let run = run(Runtime::Docker, prefix, flags, script);
    let last = run.stdout.lines().last().unwrap_or_default();
    let report: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("check wrote no JSON ({e}):\n{}", run.dump()));
    eprintln!(
        "{prefix}: check took {} ms: {}",
        report["elapsed_ms"], report["shm"]
    );
    (run, report)
}

#[test]
fn a_roomy_shm_passes_min() {
    let (run, report) = check(
        "check-roomy",
        &["--shm-size", "1g"],
        "/x/shmtrace check --min 512m >/dev/null; echo \"min=$?\"; /x/shmtrace check --json",
    );
    assert!(run.stdout.contains("min=0"), "{}", run.dump());
    let shm = &report["shm"];
    assert_eq!(shm["kind"], "runtime", "Docker's own tmpfs: {shm}");
    assert_eq!(shm["size_bytes"], 1u64 << 30);
    assert_eq!(shm["writable"], true);
    assert_eq!(report["first_limit"], "shm_full");
    assert_eq!(report["platform"]["runtime"], "docker");
    assert!(
        report["fixes"][0]
            .as_str()
            .unwrap()
            .contains("docker run --shm-size"),
        "{report}"
    );
    assert!(report["limits"]["open_files"]["soft"].as_u64().unwrap() > 0);
}

#[test]
fn a_full_shm_names_what_fills_it() {
    // A leftover nobody holds, and an unlinked file a sleeping process holds open.
    let (run, report) = check(
        "check-full",
        &["--shm-size", "8m"],
        "dd if=/dev/zero of=/dev/shm/held bs=1M count=2 2>/dev/null; \
         sleep 60 3</dev/shm/held & sleep 0.3; rm /dev/shm/held; \
         dd if=/dev/zero of=/dev/shm/leftover bs=1M count=10 2>/dev/null; \
         /x/shmtrace check --min 4m; echo \"min=$?\"; /x/shmtrace check --json",
    );
    assert_eq!(report["shm"]["free_bytes"], 0, "{}", run.dump());
    assert_eq!(report["first_limit"], "shm_full");
    let files = report["files"].as_array().unwrap();
    let leftover = files
        .iter()
        .find(|f| f["path"] == "/dev/shm/leftover")
        .unwrap_or_else(|| panic!("the leftover is named: {}", run.dump()));
    assert_eq!(leftover["leftover"], true);
    assert_eq!(leftover["bytes"], 6 * MIB, "what is left of 8 MiB after 2");
    let held = files
        .iter()
        .find(|f| f["path"] == "/dev/shm/held")
        .unwrap_or_else(|| panic!("the unlinked file is named: {}", run.dump()));
    assert_eq!(held["linked"], false);
    assert_eq!(held["holders"][0]["comm"], "sleep");
    assert_eq!(held["holders"][0]["open"], true);
    // The text says it is full and what to remove; --min looks at the size, which is enough.
    assert!(run.stdout.contains("FULL now"), "{}", run.dump());
    assert!(
        run.stdout.contains("rm /dev/shm/leftover"),
        "{}",
        run.dump()
    );
    assert!(run.stdout.contains("min=0"), "{}", run.dump());
}

#[test]
fn no_shm_with_ipc_none() {
    let (run, report) = check(
        "check-ipc-none",
        &["--ipc", "none"],
        "/x/shmtrace check --min 1m >/dev/null; echo \"min=$?\"; /x/shmtrace check --json",
    );
    assert_eq!(report["shm"]["kind"], "missing", "{}", run.dump());
    assert_eq!(report["first_limit"], "unusable");
    assert!(run.stdout.contains("min=3"), "{}", run.dump());
    assert!(
        report["fixes"][0].as_str().unwrap().contains("--ipc=none"),
        "{report}"
    );
}

#[test]
fn a_read_only_shm_is_unusable() {
    let (run, report) = check(
        "check-read-only",
        &["--tmpfs", "/dev/shm:ro,size=64m"],
        "/x/shmtrace check --min 1m >/dev/null; echo \"min=$?\"; /x/shmtrace check --json",
    );
    assert_eq!(report["shm"]["read_only"], true, "{}", run.dump());
    assert_eq!(report["shm"]["kind"], "tmpfs");
    assert_eq!(report["first_limit"], "unusable");
    assert!(run.stdout.contains("min=3"), "{}", run.dump());
    assert!(
        report["min"].is_null() && report["fixes"][0].as_str().unwrap().contains("read-write"),
        "{report}"
    );
}

#[test]
fn few_inodes_are_counted_and_warned_of() {
    // 200 inodes, 40 of them used by small files: bytes to spare, names running out.
    let (run, report) = check(
        "check-inodes",
        &["--tmpfs", "/dev/shm:rw,size=256m,nr_inodes=200"],
        "i=0; while [ $i -lt 40 ]; do echo x >/dev/shm/sem.$i; i=$((i+1)); done; \
         /x/shmtrace check; /x/shmtrace check --json",
    );
    let shm = &report["shm"];
    assert_eq!(shm["inodes"], 200, "{}", run.dump());
    let free = shm["inodes_free"].as_u64().unwrap();
    assert!((150..=160).contains(&free), "{free} of 200 free: {shm}");
    assert!(
        run.stdout.contains("inodes left: many small objects"),
        "{}",
        run.dump()
    );
    assert_eq!(
        report["files"].as_array().unwrap().len(),
        32,
        "the largest 32 of 40"
    );
}

#[test]
fn a_memory_limit_smaller_than_shm_trips_first() {
    let (run, report) = check(
        "check-memory",
        &["--shm-size", "512m", "--memory", "128m"],
        "/x/shmtrace check --min 256m; echo \"min=$?\"; /x/shmtrace check --json",
    );
    assert_eq!(report["first_limit"], "memory_limit", "{}", run.dump());
    let memory = &report["memory"];
    assert_eq!(memory["limit_bytes"], 128 * MIB, "{memory}");
    assert!(run.stdout.contains("min=3"), "{}", run.dump());
    assert!(
        run.stdout.contains("memory limit leaves room for only"),
        "{}",
        run.dump()
    );
    assert!(
        report["fixes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().contains("--memory")),
        "{report}"
    );
}
