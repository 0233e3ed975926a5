//! Host-wide (`--all`, and the daemon), every death of a full /dev/shm the probes count has
//! its record, followed process or not: a shell whose `dd` failed for want of room, and which
//! then exits 1 without touching /dev/shm itself, is reported dead (`shm_death`), so the
//! daemon counts it once, under its container, and never as a lost record. Real `dd` on a
//! 1 MiB tmpfs in a private mount namespace (root and BPF only).
use std::process::Command;

use shmtrace_tests::{live::LiveTracer, require_root, serial};

#[test]
fn a_shell_that_dies_after_its_child_filled_dev_shm_is_reported_though_nothing_followed_it() {
    let _guard = serial();
    require_root();
    let tracer = LiveTracer::start(&["--all"]);
    // The shell forks dd (followed from its open of /dev/shm), then exits 1: a death by the
    // probes' rule, of a process nothing followed.
    let status = Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg(
            "mount --make-rprivate / && mount -t tmpfs -o size=1m hostwide /dev/shm && \
             sh -c 'dd if=/dev/zero of=/dev/shm/full bs=64k count=32 2>/dev/null; \
             echo $$; exit 1'",
        )
        .output()
        .unwrap();
    let shell: u64 = String::from_utf8_lossy(&status.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no shell pid: {status:?}"));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (_, stderr, records) = tracer.stop();
    let dd_died = records
        .iter()
        .any(|r| r["event"] == "exit" && r["comm"] == "dd" && r["shm_death"] == true);
    assert!(dd_died, "no death of dd: {stderr}\n{records:#?}");
    let exit = records
        .iter()
        .find(|r| r["event"] == "exit" && r["pid"] == shell)
        .unwrap_or_else(|| panic!("no exit record of the shell {shell}: {records:#?}"));
    assert_eq!(exit["shm_death"], true, "{exit}");
    assert_eq!(exit["exit_code"], 1, "{exit}");
}
