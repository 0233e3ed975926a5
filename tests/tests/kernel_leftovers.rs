//! Leftovers are sized by the pages they hold, not their nominal size: a file sized by
//! `truncate` and never written holds nothing, and must not be listed as holding its size;
//! a written one holds its bytes. Real shell tools on a real 1 MiB tmpfs in a private mount
//! namespace, traced by the real binary (root and BPF only).
use std::process::Command;

use serde_json::Value;
use shmtrace_tests::{diagnosis::*, read_json_lines, require_root, serial, shmtrace, tempdir};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Mounts a 1 MiB tmpfs on /dev/shm in a fresh mount namespace, then runs `$1` there.
const PRIVATE_SHM: &str = "set -e; mount --make-rprivate /; \
     mount -t tmpfs -o size=1m shmtrace-test /dev/shm; sh -c \"$1\"";

/// A 16 MiB file only truncated (no pages), a 512 KiB file written by dd, both left behind by
/// processes that exited; then a 768 KiB write that does not fit beside the written one.
const FILL: &str = "truncate -s 16M /dev/shm/sized; \
     dd if=/dev/zero of=/dev/shm/written bs=64k count=8 2>/dev/null";
const WRITE: &str = "dd if=/dev/zero of=/dev/shm/big bs=768k count=1";

fn trace(script: &str) -> (std::process::Output, Vec<Value>) {
    require_root();
    let dir = tempdir();
    let out = dir.join("trace.jsonl");
    let output = shmtrace()
        .args(["--json", "-o"])
        .arg(&out)
        .args(["--", "unshare", "-m", "sh", "-c", PRIVATE_SHM, "sh", script])
        .output()
        .expect("running shmtrace");
    let records = read_json_lines(&out);
    let _ = std::fs::remove_dir_all(&dir);
    (output, records)
}

fn remaining<'a>(summary: &'a Value, path: &str) -> &'a Value {
    summary["remaining"]
        .as_array()
        .expect("remaining")
        .iter()
        .find(|r| r["path"] == path)
        .unwrap_or_else(|| panic!("{path} is not in the summary's remaining: {summary}"))
}

/// Text and JSON summaries alike give the truncated file 0 B (with its size apart), and the
/// written one its 512 KiB.
#[test]
fn a_truncated_leftover_holds_nothing_and_a_written_one_its_bytes() {
    let _guard = serial();
    let (output, records) = trace(FILL);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let summary = summary(&records);
    let sized = remaining(summary, "/dev/shm/sized");
    assert_eq!(sized["bytes"], 0, "{summary}");
    assert_eq!(sized["size"], 16 * MIB, "{summary}");
    let written = remaining(summary, "/dev/shm/written");
    assert_eq!(written["bytes"], 512 * KIB, "{summary}");

    // The same in words: the file that holds nothing is not among those that hold memory.
    require_root();
    let dir = tempdir();
    let text_out = dir.join("trace.txt");
    let text = shmtrace()
        .arg("-o")
        .arg(&text_out)
        .args(["--", "unshare", "-m", "sh", "-c", PRIVATE_SHM, "sh", FILL])
        .output()
        .expect("running shmtrace");
    assert!(text.status.success());
    let text = std::fs::read_to_string(&text_out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!text.contains("/dev/shm/sized (16.0 MiB"), "{text}");
    assert!(
        text.contains("1 object still holds memory")
            && text.contains("/dev/shm/written (512.0 KiB, still in /dev/shm)"),
        "{text}"
    );
    assert!(
        text.contains("/dev/shm/sized (0 B of 16.0 MiB, still in /dev/shm)"),
        "{text}"
    );
}

/// A write that fails for the written leftover: the diagnosis names that file with its 512
/// KiB and not the truncated one, says the size is enough without it, and its remove command,
/// run before the same write, lets the write succeed.
#[test]
fn the_diagnosis_names_the_leftover_that_holds_pages_and_its_removal_works() {
    let _guard = serial();
    let (output, records) = trace(&format!("{FILL}; {WRITE}"));
    let dump = || {
        let mut lines: Vec<String> = records.iter().map(Value::to_string).collect();
        lines.push(String::from_utf8_lossy(&output.stderr).into_owned());
        lines.join("\n")
    };
    let d = diagnoses(&records)
        .into_iter()
        .find(|d| d["comm"] == "dd")
        .unwrap_or_else(|| panic!("no diagnosis of dd:\n{}", dump()));
    assert_eq!(d["cause"], "leftovers", "{d}");
    assert_eq!(d["failures"][0]["errno"], "ENOSPC", "{d}");
    let leftovers = &d["leftovers"];
    let files = leftovers["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "only the written file holds pages: {d}");
    assert_eq!(files[0]["path"], "/dev/shm/written", "{d}");
    assert_eq!(files[0]["bytes"], 512 * KIB, "{d}");
    assert_eq!(leftovers["bytes"], 512 * KIB, "{d}");
    assert_eq!(leftovers["enough_without_them"], true, "{d}");
    let remove = leftovers["remove"].as_str().unwrap();
    assert_eq!(remove, "rm -f -- /dev/shm/written", "{d}");

    // Applied: the same files, the advised removal, then the same write, which now fits.
    let applied = Command::new("unshare")
        .args(["-m", "sh", "-c", PRIVATE_SHM, "sh"])
        .arg(format!("{FILL}; {remove}; {WRITE}"))
        .output()
        .expect("running the workload");
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
}
