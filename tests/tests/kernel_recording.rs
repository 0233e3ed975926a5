//! `shmtrace record` of the scenario program in a private /dev/shm (root and BPF only):
//! rotation into numbered files, each readable alone and all in order together, and the flight
//! recorder's one file with the seconds before a real failure.
use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use serde_json::Value;
use shmtrace_tests::{
    exerciser,
    recording::{replay, seconds_between},
    require_root, serial, shmtrace, tempdir,
};

/// `NAME.NNNNNN.shmtrace` files in `dir`, by number.
fn numbered_files(dir: &Path) -> Vec<(u32, PathBuf)> {
    let mut files: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            let number = name
                .strip_prefix("t.")?
                .strip_suffix(".shmtrace")?
                .parse()
                .ok()?;
            Some((number, path))
        })
        .collect();
    files.sort();
    files
}

/// The burst object numbers a replay saw created, in order.
fn burst_numbers(records: &[Value]) -> Vec<u64> {
    records
        .iter()
        .filter(|r| r["event"] == "openat")
        .filter_map(|r| {
            r["path"]
                .as_str()?
                .strip_prefix("/dev/shm/burst_")?
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn rotation_keeps_the_newest_files_each_readable_alone_and_in_order_together() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let base = dir.join("t.shmtrace");
    let output = shmtrace()
        .args(["record", "--max-size", "64K", "--keep", "3", "-o"])
        .arg(&base)
        .arg("--")
        .arg(exerciser())
        .args(["--private-shm", "1m", "burst", "5000"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let files = numbered_files(&dir);
    assert_eq!(files.len(), 3, "{files:?}\n{stderr}");
    let numbers: Vec<u32> = files.iter().map(|(n, _)| *n).collect();
    assert!(numbers[0] > 0, "older files were removed: {numbers:?}");
    assert_eq!(numbers, [numbers[0], numbers[0] + 1, numbers[0] + 2]);
    let newest = files[2].1.display().to_string();
    assert!(
        stderr.contains(&format!("wrote {newest}")) && stderr.contains("removed by --keep"),
        "{stderr}"
    );

    let mut each = Vec::new();
    for (i, (_, file)) in files.iter().enumerate() {
        assert!(std::fs::metadata(file).unwrap().len() <= 64 << 10);
        let show = replay("show", file, &[]);
        show.assert_ok();
        assert!(!show.stderr().contains("ends early"), "{}", show.stderr());
        let numbers = burst_numbers(&show.records);
        // The newest may start after the burst's last open (with only its closes, unlinks
        // and exits), when a file boundary falls there; the set's end below checks it.
        assert!(
            !numbers.is_empty() || i == files.len() - 1,
            "{} holds no burst",
            file.display()
        );
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
        let report = replay("report", file, &[]);
        report.assert_ok();
        assert!(!report.of("summary").is_empty());
        each.extend(numbers);
    }
    // The set, read through its name, is the three files one after the other, ending where
    // the burst ended.
    let set = replay("show", &base, &[]);
    set.assert_ok();
    assert_eq!(burst_numbers(&set.records), each);
    assert_eq!(*each.last().unwrap(), 4999);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_flight_recorder_writes_one_file_with_the_seconds_before_a_real_failure() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let base = dir.join("f.shmtrace");
    let ex = exerciser().display().to_string();
    // Old activity (3.5 s before: outside the 2 s window), recent activity (0.5 s before),
    // then fallocate ENOSPC in a 1 MiB /dev/shm; recording goes on past the 1 s tail.
    let script = format!(
        "{ex} --private-shm 1m munmap; sleep 3; {ex} --private-shm 1m burst 100; sleep 0.5; \
         {ex} --private-shm 1m fallocate-enospc; sleep 2"
    );
    let output = shmtrace()
        .args([
            "record",
            "--on-failure",
            "--window",
            "2",
            "--tail",
            "1",
            "-o",
        ])
        .arg(&base)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("1 failure file written"), "{stderr}");
    let written: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(written, [dir.join("f.000000.shmtrace")], "{stderr}");

    let show = replay("show", &written[0], &[]);
    show.assert_ok();
    assert!(
        show.stderr().contains("flight recorder file after: ENOSPC"),
        "{}",
        show.stderr()
    );
    assert!(!show.stderr().contains("ends early"), "{}", show.stderr());
    let failure = show
        .of("fallocate")
        .into_iter()
        .find(|r| r["errno"] == "ENOSPC")
        .unwrap_or_else(|| panic!("no failure in the file: {:?}", show.records));
    let bursts = burst_numbers(&show.records);
    assert_eq!(
        bursts,
        (0..100).collect::<Vec<u64>>(),
        "the recent activity"
    );
    let paths: HashSet<&str> = show
        .records
        .iter()
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert!(
        !paths.contains("/dev/shm/unmapped"),
        "activity from before the window was kept: {paths:?}"
    );
    let first_burst = show
        .of("openat")
        .into_iter()
        .find(|r| r["path"] == "/dev/shm/burst_0")
        .unwrap();
    let lead = seconds_between(
        first_burst["ts"].as_str().unwrap(),
        failure["ts"].as_str().unwrap(),
    );
    assert!(
        (0.3..2.0).contains(&lead),
        "burst {lead:.3} s before the failure"
    );

    let report = replay("report", &written[0], &[]);
    report.assert_ok();
    let diagnosis = report
        .of("diagnosis")
        .into_iter()
        .find(|d| d["cause"] == "shm_full")
        .unwrap_or_else(|| panic!("not diagnosed: {:?}", report.records));
    assert_eq!(diagnosis["failures"][0]["syscall"], "fallocate");
    assert_eq!(diagnosis["failures"][0]["errno"], "ENOSPC");
    assert_eq!(
        diagnosis["failures"][0]["path"],
        "/dev/shm/torch_fallocate_0"
    );
    // The summary's time is the file's own: the 2 s window and the 1 s tail, not the time
    // since the first context record it carries (3.5 s before this fix; issue 25, item 10).
    let seconds = report
        .of("summary")
        .last()
        .and_then(|s| s["seconds"].as_f64())
        .unwrap_or_else(|| panic!("no summary: {:?}", report.records));
    assert!(
        seconds <= 3.05,
        "the recording covers {seconds:.2} s, more than its window and tail"
    );
    let _ = std::fs::remove_dir_all(dir);
}
