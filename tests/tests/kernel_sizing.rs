//! `shmtrace size -- CMD` and `shmtrace size --pid PID` (issue 8), on the real kernel: five
//! processes fallocate 6 MiB each at the same moment in a private 64 MiB /dev/shm; the peak is
//! what they allocated at once, and the advised size works when applied.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use shmtrace_tests::{
    recording::wait_for, require_root, serial, shmtrace, tempdir, workload::PYTHON,
};

const MIB: u64 = 1 << 20;

fn workloads() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .display()
        .to_string()
}

/// `sh -c` script: a private /dev/shm of `$1` bytes, then the burst (after `$2` exists, if
/// given).
const IN_PRIVATE_SHM: &str = "set -e; mount --make-rprivate /; \
     mount -t tmpfs -o size=\"$1\" shmtrace-sizing /dev/shm; \
     while [ -n \"$2\" ] && [ ! -e \"$2\" ]; do sleep 0.05; done; \
     exec \"$3\" -B \"$4\"/burst.py --procs 5 --size 6M";

fn burst(shm_bytes: u64, go: &str) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["-m", "sh", "-c", IN_PRIVATE_SHM, "sh"])
        .arg(shm_bytes.to_string())
        .arg(go)
        .arg(PYTHON)
        .arg(workloads());
    command
}

fn check_report(report: &Value) {
    let shm = &report["shm"][0];
    let peak = shm["peak_bytes"].as_u64().unwrap();
    assert!((30 * MIB..32 * MIB).contains(&peak), "{report}");
    assert_eq!(shm["size"], 64 * MIB, "{report}");
    let roles = shm["roles"].as_array().unwrap();
    assert!(!roles.is_empty(), "{report}");
    let live = shm["live_at_peak"].as_array().unwrap();
    let segments = live
        .iter()
        .filter(|o| o["name"].as_str().unwrap().contains("shmtrace-burst-"))
        .count();
    assert_eq!(
        segments, 5,
        "all five segments were live at the peak: {report}"
    );
    let advised = shm["advice"]["min_bytes"].as_u64().unwrap();
    assert!(advised <= 45 * MIB, "{report}");
    // Applied: the burst fits in exactly the advised size, untraced.
    let status = burst(advised, "").status().unwrap();
    assert!(
        status.success(),
        "the burst fails in the advised {advised} bytes"
    );
    // And it does not in a size below what it allocated at once.
    let status = burst(24 * MIB, "").stderr(Stdio::null()).status().unwrap();
    assert!(!status.success(), "the burst should not fit in 24 MiB");
}

#[test]
fn size_of_a_command() {
    require_root();
    let _serial = serial();
    let out = tempdir().join("size.json");
    let output = shmtrace()
        .args(["size", "--json", "-o"])
        .arg(&out)
        .args(["--", "unshare"])
        .args(burst(64 * MIB, "").get_args())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    check_report(&report);
    // A budget below the advice fails with status 3, the same workload and measurement.
    let output = shmtrace()
        .args(["size", "--budget", "16m", "--", "unshare"])
        .args(burst(64 * MIB, "").get_args())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("DOES NOT FIT"), "{text}");
}

#[test]
fn size_of_running_processes() {
    require_root();
    let _serial = serial();
    let dir = tempdir();
    let go = dir.join("go");
    let mut workload = burst(64 * MIB, go.to_str().unwrap()).spawn().unwrap();
    let out = dir.join("size.json");
    let mut sizer = shmtrace()
        .args(["size", "--json", "-o"])
        .arg(&out)
        .args(["--pid", &workload.id().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it traces, then let the burst go.
    let mut stderr = std::io::BufReader::new(sizer.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("shmtrace: tracing") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
        assert!(n > 0, "shmtrace size ended before tracing");
    }
    // The rest of stderr is read on, so that shmtrace never blocks on a full pipe.
    let rest = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    std::fs::write(&go, b"").unwrap();
    assert!(workload.wait().unwrap().success());
    // It ends by itself once every traced process has exited.
    let status = wait_for(&mut sizer, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{}", rest.join().unwrap());
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    check_report(&report);
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 25, item 11: with --budget, exit status 3 meant both "does not fit" and "the command
/// exited 3". The status is now the verdict (3 does not fit, 4 the command failed, 0 fits), and
/// the command's own status is in the result.
#[test]
fn a_budget_verdict_is_not_the_commands_status() {
    require_root();
    let _serial = serial();
    let dir = tempdir();
    let shm = format!("/dev/shm/shmtrace-verdict-{}", std::process::id());
    let size = |budget: &str, script: &str| {
        let out = dir.join("size.json");
        let output = shmtrace()
            .args(["size", "--json", "--budget", budget, "-o"])
            .arg(&out)
            .args(["--", "sh", "-c", script, "sh", &shm])
            .output()
            .unwrap();
        let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap())
            .unwrap_or_else(|e| panic!("{e}: {output:?}"));
        (output.status.code(), report)
    };
    let write_2m = "dd if=/dev/zero of=\"$1\" bs=1M count=2 2>/dev/null; rm \"$1\"";

    // Fits, and the command exits 3: not "does not fit".
    let (status, report) = size("1g", &format!("{write_2m}; exit 3"));
    assert_eq!(report["budget"]["fits"], true, "{report}");
    assert_eq!(status, Some(4), "fits, the command failed: {report}");
    assert_eq!(report["command"]["exit_code"], 3, "{report}");

    // Does not fit, and the command succeeds.
    let (status, report) = size("1m", write_2m);
    assert_eq!(report["budget"]["fits"], false, "{report}");
    assert_eq!(status, Some(3), "{report}");
    assert_eq!(report["command"]["exit_code"], 0, "{report}");

    // Fits, and the command succeeds.
    let (status, report) = size("1g", write_2m);
    assert_eq!(status, Some(0), "{report}");

    // Text: the command's status is printed beside the verdict.
    let output = shmtrace()
        .args(["size", "--budget", "1g", "--", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("command   exited with status 3"), "{text}");
    assert!(text.contains("budget    fits"), "{text}");
    assert_eq!(output.status.code(), Some(4), "{text}");
    let _ = std::fs::remove_file(&shm);
    let _ = std::fs::remove_dir_all(dir);
}
