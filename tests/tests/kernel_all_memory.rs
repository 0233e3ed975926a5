//! A host-wide trace (`shmtrace --all`) keeps memory bounded over a fork storm: processes that
//! ended quietly are forgotten while it runs, and the closing table still counts every one.
use std::process::Command;

use shmtrace_tests::{live::LiveTracer, require_root, serial};

/// Short-lived processes, one after the other: each shell creates a file in /dev/shm and an
/// `rm` it starts removes it; all exit with status 0.
const SHELLS: usize = 1500;

#[test]
fn a_host_wide_trace_forgets_quiet_exits_and_still_counts_them() {
    let _guard = serial();
    require_root();
    // --verbose: the trace says, at each pass, how many processes its analysis holds.
    let tracer = LiveTracer::start(&["--all", "--verbose"]);
    let script = format!(
        "i=0; while [ $i -lt {SHELLS} ]; do \
           sh -c 'f=/dev/shm/allmem-e2e-$$; : > $f; rm $f'; i=$((i+1)); done"
    );
    let storm = Command::new("sh").args(["-c", &script]).status().unwrap();
    assert!(storm.success());
    // Past the short linger, and a pass of forgetting.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let (status, stderr, records) = tracer.stop();
    assert_eq!(status.code(), Some(130), "interrupted: {stderr}");

    let held: Vec<u64> = stderr
        .lines()
        .filter_map(|line| line.split("analysis holds ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect();
    assert!(held.len() >= 5, "a pass every 300 ms: {stderr}");
    let most = *held.iter().max().unwrap();
    // Every shell and every rm would be held without forgetting: over 2 * SHELLS.
    assert!(
        most < SHELLS as u64,
        "the analysis held {most} processes at once: {held:?}"
    );
    let last = *held.last().unwrap();
    assert!(
        last < 200,
        "the storm's processes are forgotten once it is over: {held:?}"
    );

    let summary = records
        .iter()
        .find(|r| r["event"] == "summary")
        .unwrap_or_else(|| panic!("no summary: {stderr}"));
    let counted: u64 = summary["roles"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|row| row["processes"].as_u64())
        .sum();
    assert!(
        counted >= 2 * SHELLS as u64,
        "the closing table counts forgotten processes too: {summary}"
    );
    assert!(summary["processes"].as_u64().unwrap() >= 2 * SHELLS as u64);
    assert_eq!(summary["lost"], 0, "{stderr}");
    assert!(!stderr.contains("memory bounds reached"), "{stderr}");
}
