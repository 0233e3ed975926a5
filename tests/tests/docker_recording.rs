//! Recording real workloads failing in real Docker containers (a 1 MiB /dev/shm) with
//! `shmtrace record`, then reading them back with `report` and `show`: a recorder killed with
//! SIGKILL; redaction checked byte by byte; the HTML report rendered in headless Chromium and
//! the Perfetto file parsed. Rotation and the flight recorder, which need no container, are in
//! `kernel_recording.rs`.
use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;
use shmtrace_tests::{
    docker::{self, Container},
    read_json_lines,
    recording::{
        Recorder, diagnoses_without_time, rendered_dom, replay, rfc3339_seconds, screenshot,
        seconds_between, wall_now_ns,
    },
    require_root, serial, shmtrace, tempdir,
};

/// The Python workloads, mounted read-only at /w in containers.
fn workloads() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
    format!("{}:/w:ro", dir.display())
}

/// The container's script waits for the test to say go, so that the recorder is attached
/// before anything happens.
const WAIT_FOR_GO: &str = "while [ ! -e /work/go ]; do sleep 0.1; done";

/// Records `script` (after go) in a container with a 1 MiB /dev/shm until the container
/// stops; returns the trace file, what `record --json` printed live, and its stderr.
fn record_container(prefix: &str, extra: &[&str], script: &str) -> (PathBuf, Vec<Value>, String) {
    let mut flags = vec!["--shm-size", "1m"];
    let mount = workloads();
    flags.extend(["-v", mount.as_str()]);
    flags.extend(extra);
    let container = Container::run(prefix, &flags, &format!("{WAIT_FOR_GO}; {script}"));
    let dir = tempdir();
    let file = dir.join("trace.shmtrace");
    let live = dir.join("live.jsonl");
    let recorder = Recorder::start(
        &[
            "--container",
            &container.name,
            "--json",
            "-o",
            file.to_str().unwrap(),
        ],
        &live,
        "shmtrace: tracing container",
    );
    container.signal("go");
    container.wait();
    // The container's last events are in the ring buffer; the recorder reads every 100 ms.
    std::thread::sleep(Duration::from_millis(500));
    let (status, stderr) = recorder.interrupt();
    assert_eq!(status.code(), Some(130), "record interrupted: {stderr}");
    assert!(stderr.contains("shmtrace: wrote"), "{stderr}");
    (file, read_json_lines(&live), stderr)
}

/// A DataLoader whose workers hit ENOSPC (PyTorch >= 2.10), then one whose worker dies of
/// SIGBUS (PyTorch <= 2.9), in one 1 MiB container.
fn record_dataloader_failures(prefix: &str) -> PathBuf {
    let (file, _, _) = record_container(
        prefix,
        &[],
        "/usr/bin/python3 -B /w/pytorch_fallocate.py; /usr/bin/python3 -B /w/pytorch_mmap_sigbus.py",
    );
    file
}

#[test]
fn a_recorded_container_failure_reports_the_live_diagnosis() {
    let _guard = serial();
    require_root();
    let (file, live, stderr) = record_container(
        "rec-live",
        &[],
        "/usr/bin/python3 -B /w/pytorch_fallocate.py --workers 2",
    );
    let live_diagnoses = diagnoses_without_time(&live);
    let worker = live_diagnoses
        .iter()
        .find(|d| d["role"] == "dataloader_worker")
        .unwrap_or_else(|| panic!("no worker diagnosed live: {live:?}\n{stderr}"));
    assert_eq!(worker["cause"], "shm_full");
    assert_eq!(worker["failures"][0]["syscall"], "fallocate");
    assert_eq!(worker["failures"][0]["errno"], "ENOSPC");
    assert_eq!(worker["shm"]["size"], 1 << 20);

    let report = replay("report", &file, &[]);
    report.assert_ok();
    let replayed = diagnoses_without_time(&report.records);
    assert_eq!(replayed.len(), live_diagnoses.len(), "{}", report.stderr());
    for (live, replayed) in live_diagnoses.iter().zip(&replayed) {
        for (key, value) in live.as_object().unwrap() {
            assert_eq!(
                &replayed[key], value,
                "diagnosis of pid {}: {key} differs live and replayed",
                live["pid"]
            );
        }
        assert_eq!(live, replayed);
    }
    // Times agree too, to the clock offset each process measured for itself.
    let times = |records: &[Value]| -> Vec<String> {
        records
            .iter()
            .filter(|r| r["event"] == "diagnosis")
            .map(|r| r["ts"].as_str().unwrap().to_owned())
            .collect()
    };
    for (a, b) in times(&live).iter().zip(times(&report.records)) {
        assert!(seconds_between(a, &b).abs() < 0.001, "{a} vs {b}");
    }
    // And so does the summary, but for the duration (live: wall time; file: first to last).
    let summary = |records: &[Value]| {
        let mut s = records
            .iter()
            .rfind(|r| r["event"] == "summary")
            .expect("a summary")
            .clone();
        s.as_object_mut().unwrap().remove("seconds");
        s
    };
    assert_eq!(summary(&live), summary(&report.records));
    // The file is complete.
    assert!(
        !report.stderr().contains("ends early"),
        "{}",
        report.stderr()
    );
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
}

#[test]
fn a_recorder_killed_with_sigkill_leaves_a_file_that_reads_up_to_the_kill() {
    let _guard = serial();
    require_root();
    // Steady activity a recorder keeps up with even on a busy machine: 10 objects from a new
    // process every ~60 ms.
    let container = Container::run(
        "rec-kill",
        &[],
        &format!(
            "{WAIT_FOR_GO}; while true; do /x/shm-exerciser burst 10; echo >> /work/rounds; \
             sleep 0.05; done"
        ),
    );
    let dir = tempdir();
    let file = dir.join("trace.shmtrace");
    let recorder = Recorder::start(
        &["--container", &container.name, "-o", file.to_str().unwrap()],
        &dir.join("stdout"),
        "shmtrace: tracing container",
    );
    container.signal("go");
    // Kill after enough rounds for the counts below (each is 10 objects of 4 calls), however
    // long a loaded machine takes for them, rather than after a fixed time.
    wait_for_rounds(&container, 60);
    let killed_at = wall_now_ns();
    let stderr = recorder.kill();
    drop(container);

    for subcommand in ["report", "show"] {
        let replayed = replay(subcommand, &file, &[]);
        replayed.assert_ok();
        assert!(
            replayed.stderr().contains("the trace ends early"),
            "{subcommand} does not say the file ends early: {}\nrecorder: {stderr}",
            replayed.stderr()
        );
    }
    let show = replay("show", &file, &[]);
    let objects = show
        .of("openat")
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .unwrap_or("")
                .starts_with("/dev/shm/burst_")
        })
        .count();
    assert!(objects > 200, "only {objects} objects before the kill");
    let last = show
        .records
        .iter()
        .filter_map(|r| r["ts"].as_str())
        .max_by_key(|ts| rfc3339_seconds(ts))
        .expect("events");
    let before_kill = (killed_at - rfc3339_seconds(last)) as f64 / 1e9;
    eprintln!("{objects} objects recorded; the last event {before_kill:.3} s before the kill");
    // The recorder flushes what it has read at least every 100 ms: the last event is typically
    // 0.1 to 0.25 s before the kill here, even with the machine busy with other work.
    assert!(
        (-0.05..1.0).contains(&before_kill),
        "the last event is {before_kill:.3} s before the kill"
    );
    let summary = replay("report", &file, &[]);
    let summary = summary.of("summary");
    assert!(summary[0]["events"].as_u64().unwrap() > 2000, "{summary:?}");
    // What the kill cut off may have freed what the file last saw held: nothing is said to be
    // "still" anywhere.
    assert_eq!(summary[0]["cut"], true, "{summary:?}");
    let report = shmtrace()
        .arg("report")
        .arg(&file)
        .output()
        .expect("running shmtrace report");
    let text = String::from_utf8_lossy(&report.stdout) + String::from_utf8_lossy(&report.stderr);
    assert!(!text.contains("still in /dev/shm"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Waits (up to two minutes) until the container's loop has finished `rounds` rounds.
fn wait_for_rounds(container: &Container, rounds: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let done = std::fs::read_to_string(container.work.join("rounds"))
            .map(|text| text.lines().count())
            .unwrap_or(0);
        if done >= rounds {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {done} of {rounds} rounds in two minutes"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn inspect(container: &str, format: &str) -> String {
    let output = Command::new("docker")
        .args(["inspect", "--format", format, container])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn a_redacted_trace_keeps_no_identifying_string_and_still_diagnoses() {
    let _guard = serial();
    require_root();
    // The recorder runs on a host with a name distinctive enough to look for in the bytes.
    const HOSTNAME: &str = "shm-secret-host-5521";
    const TOKEN: &str = "zebra-kumquat-9173";
    let container = Container::run(
        "rec-redact",
        &["--shm-size", "1m"],
        &format!("{WAIT_FOR_GO}; /x/shm-exerciser fallocate-enospc {TOKEN}; sleep 0.3"),
    );
    let id = inspect(&container.name, "{{.Id}}");
    assert_eq!(id.len(), 64, "{id}");
    let dir = tempdir();
    let file = dir.join("trace.shmtrace");
    let recorder = Recorder::start_on_host(
        HOSTNAME,
        &["--container", &container.name, "-o", file.to_str().unwrap()],
        &dir.join("stdout"),
        "shmtrace: tracing container",
    );
    container.signal("go");
    container.wait();
    std::thread::sleep(Duration::from_millis(500));
    let (_, stderr) = recorder.interrupt();

    let secrets = [
        id.as_str(),
        &id[..12],
        docker::image(),
        HOSTNAME,
        TOKEN,
        container.name.as_str(),
        "/x/shm-exerciser",
        "shm-exerciser",
    ];
    // The original holds them all, so finding none in the copy means something.
    let original = std::fs::read(&file).unwrap();
    for secret in secrets {
        assert!(
            contains(&original, secret),
            "{secret} not in the original: {stderr}"
        );
    }
    let before = replay("report", &file, &[]);
    before.assert_ok();

    let redacted = dir.join("shareable.shmtrace");
    let output = shmtrace()
        .arg("report")
        .arg(&file)
        .args(["--redact", "-o"])
        .arg(&redacted)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bytes = std::fs::read(&redacted).unwrap();
    for secret in secrets {
        assert!(
            !contains(&bytes, secret),
            "{secret:?} survives in the redacted file"
        );
    }
    // The preamble's flags (bytes 10..12, docs/trace-format.md) say redacted.
    assert_eq!(&bytes[..8], b"\x89SHMTRC\n");
    assert_eq!(u16::from_le_bytes([bytes[10], bytes[11]]) & 1, 1);

    let after = replay("report", &redacted, &[]);
    after.assert_ok();
    let description = after.stderr();
    assert!(description.contains(", redacted"), "{description}");
    assert!(!description.contains(HOSTNAME), "{description}");
    // The same diagnosis, but for the names redaction replaces (the object keeps its shape).
    let diagnosis = |records: &[&Value]| -> Value {
        let d = records
            .iter()
            .find(|d| d["cause"] == "shm_full")
            .unwrap_or_else(|| panic!("no shm_full diagnosis: {records:?}"));
        let f = &d["failures"][0];
        serde_json::json!({
            "pid": d["pid"],
            "failure": [&f["syscall"], &f["errno"], &f["request"], &f["cause"], &f["ts_ns"]],
            "shm": d["shm"],
            "recommendation": d["recommendation"]["min_bytes"],
        })
    };
    let original = diagnosis(&before.of("diagnosis"));
    assert_eq!(original["failure"][1], "ENOSPC");
    assert_eq!(diagnosis(&after.of("diagnosis")), original);
    let path = after.of("diagnosis")[0]["failures"][0]["path"].clone();
    assert!(
        path.as_str().unwrap().starts_with("/dev/shm/torch_"),
        "{path}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Text as the HTML page escapes it.
fn html_escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

#[test]
fn the_html_report_draws_use_lanes_and_failures_in_chromium() {
    let _guard = serial();
    require_root();
    let file = record_dataloader_failures("rec-html");
    let dir = file.parent().unwrap().to_owned();
    let page = dir.join("report.html");
    let report = replay("report", &file, &["--html", page.to_str().unwrap()]);
    report.assert_ok();
    assert!(report.stderr().contains("wrote"), "{}", report.stderr());

    let html = std::fs::read_to_string(&page).unwrap();
    for remote in ["http://", "https://", "<script", "<link", "url(", "src="] {
        assert!(
            !html.contains(remote),
            "{remote} in a page that must fetch nothing"
        );
    }

    let dom = rendered_dom(&page);
    assert!(dom.contains("<h1>shmtrace report</h1>"), "{dom}");
    // The use chart: the demand curve, measurements and the 1 MiB ceiling, with the ENOSPC.
    for needle in [
        r#"<path class="usage-held" d="M"#,
        r#"<path class="usage-demand" d="M"#,
        r#"<path class="usage-measured" d="M"#,
        r#"<path class="capacity" d="M"#,
        "size 1.0 MiB",
        r#"<g class="marker-line enospc">"#,
        r#"<g class="marker-line sigbus">"#,
    ] {
        assert!(dom.contains(needle), "{needle} not drawn");
    }
    // A lane per process, each once, with its role.
    let lanes: Vec<&str> = dom
        .split(r#"<g class="lane" data-pid=""#)
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap())
        .collect();
    let unique: HashSet<&&str> = lanes.iter().collect();
    assert_eq!(
        unique.len(),
        lanes.len(),
        "a process drawn twice: {lanes:?}"
    );
    let diagnoses = report.of("diagnosis");
    let trainers = diagnoses.iter().filter(|d| d["role"] == "trainer").count();
    assert_eq!(trainers, 2, "two DataLoaders, two trainers: {diagnoses:?}");
    for d in &diagnoses {
        let pid = d["pid"].to_string();
        assert!(
            lanes.contains(&pid.as_str()),
            "no lane for pid {pid}: {lanes:?}"
        );
        // Its diagnosis, as text: its own block, or the block of those that failed as it did
        // at the same time, which names it.
        let headline = d["text"][1].as_str().unwrap();
        let in_a_block = dom
            .split(r#"<details class="diagnosis"#)
            .skip(1)
            .filter_map(|rest| rest.split("data-pid=\"").nth(1)?.split('"').next())
            .any(|pids| pids.split(' ').any(|p| p == pid));
        assert!(
            dom.contains(&html_escaped(headline)) || in_a_block,
            "{headline} not shown"
        );
    }
    assert!(count(&dom, "trainer · pid ") >= 2);
    assert!(dom.contains("worker 0 · pid "));
    // Allocations as spans, and the failures and deaths marked on their lanes.
    assert!(count(&dom, r#"<g class="span"#) >= 10, "few spans drawn");
    assert!(dom.contains("torch_"), "no torch_ object labelled");
    for mark in [
        r#"<g class="marker enospc""#,
        r#"<g class="marker sigbus""#,
        r#"<g class="marker killed""#,
    ] {
        assert!(dom.contains(mark), "{mark} not drawn");
    }
    assert!(dom.contains("killed by SIGBUS"));

    let png = std::env::temp_dir().join("shmtrace-report-screenshot.png");
    screenshot(&page, &png, 1400, 2400);
    let image = std::fs::read(&png).unwrap();
    assert_eq!(&image[..8], b"\x89PNG\r\n\x1a\n");
    assert!(image.len() > 50_000, "a nearly empty screenshot");
    eprintln!("screenshot of the report: {}", png.display());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_perfetto_trace_parses_with_processes_holds_failures_and_counters() {
    let _guard = serial();
    require_root();
    let file = record_dataloader_failures("rec-perfetto");
    let dir = file.parent().unwrap().to_owned();
    let json = dir.join("trace.json");
    let report = replay("report", &file, &["--perfetto", json.to_str().unwrap()]);
    report.assert_ok();
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap())
        .expect("the Perfetto file is JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let of = |ph: &str| -> Vec<&Value> { events.iter().filter(|e| e["ph"] == ph).collect() };
    for event in events {
        assert!(event["pid"].is_u64(), "{event}");
        if event["ph"] != "M" {
            assert!(event["ts"].as_f64().is_some_and(|t| t >= 0.0), "{event}");
        }
    }
    let names: Vec<&str> = of("M")
        .iter()
        .filter(|e| e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("trainer · pid ")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("worker 0 · pid ")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("/dev/shm of ")),
        "{names:?}"
    );
    // Every hold begins and ends.
    let (begins, ends) = (of("b"), of("e"));
    assert!(begins.len() >= 10);
    let ids = |events: &[&Value]| -> HashSet<String> {
        events.iter().map(|e| e["id"].to_string()).collect()
    };
    assert_eq!(ids(&begins), ids(&ends));
    assert!(
        begins
            .iter()
            .any(|e| e["name"].as_str().unwrap().contains("torch_"))
    );
    let instants: HashSet<&str> = of("i").iter().filter_map(|e| e["cat"].as_str()).collect();
    for cat in ["enospc", "sigbus", "killed", "diagnosis"] {
        assert!(instants.contains(cat), "no {cat} instant: {instants:?}");
    }
    let counters: HashSet<&str> = of("C").iter().filter_map(|e| e["name"].as_str()).collect();
    for counter in ["held by traced objects", "in use (statfs)", "size"] {
        assert!(
            counters.contains(counter),
            "no {counter} counter: {counters:?}"
        );
    }
    let sizes: HashSet<u64> = of("C")
        .iter()
        .filter(|e| e["name"] == "size")
        .filter_map(|e| e["args"]["bytes"].as_u64())
        .collect();
    assert_eq!(sizes, HashSet::from([1 << 20]));
    let _ = std::fs::remove_dir_all(dir);
}
