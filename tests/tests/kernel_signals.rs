//! Signals, as a shell, a supervisor or a pipe deliver them (issue 11): the traced command keeps
//! the dispositions it would have without shmtrace; SIGHUP ends a recording with its summary and
//! end mark; SIGUSR1 makes the flight recorder write; a closed stdout ends a trace quietly.
//! Real probes, root.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;
use shmtrace_tests::{
    hardening::{Background, run, text},
    require_root, serial, tempdir,
};

#[test]
fn the_traced_command_dies_of_sigpipe_like_without_shmtrace() {
    let _guard = serial();
    require_root();
    let output = run(&[
        "--",
        "bash",
        "-c",
        "yes | head -1 >/dev/null; exit ${PIPESTATUS[0]}",
    ]);
    assert_eq!(
        output.status.code(),
        Some(141),
        "yes must die of SIGPIPE (128 + 13); stderr:\n{}",
        text(&output.stderr)
    );
    assert!(!text(&output.stderr).contains("Broken pipe"));
}

#[test]
fn sighup_ends_record_all_with_its_summary_and_end_mark() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let file = dir.join("hup.shmtrace");
    let summary = dir.join("summary.txt");
    let mut recorder = Background::start(
        &["record", "--all", "-o", file.to_str().unwrap()],
        Stdio::from(std::fs::File::create(&summary).unwrap()),
    );
    recorder.wait_until_tracing();
    recorder.signal(Signal::SIGHUP);
    let (status, stderr) = recorder.finish();
    let summary = std::fs::read_to_string(summary).unwrap();
    assert_ne!(status.code(), None, "killed by a signal: {stderr}");
    assert!(summary.contains("wrote"), "no summary: {summary}{stderr}");
    assert!(
        summary.contains("events lost"),
        "no summary: {summary}{stderr}"
    );
    let show = run(&["show", file.to_str().unwrap()]);
    let shown = text(&show.stdout);
    assert!(show.status.success(), "{}", text(&show.stderr));
    assert!(!shown.contains("ends early"), "no end mark: {shown}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sigusr1_makes_the_flight_recorder_write_and_keep_running() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let base = dir.join("flight.shmtrace");
    // An idle process: no failure of another test's workload may write a file first.
    let mut idle = Command::new("sleep").arg("60").spawn().unwrap();
    let idle_pid = idle.id().to_string();
    let mut recorder = Background::start(
        &[
            "record",
            "--on-failure",
            "--tail",
            "0.2",
            "--pid",
            &idle_pid,
            "-o",
            base.to_str().unwrap(),
        ],
        Stdio::from(std::fs::File::create(dir.join("summary.txt")).unwrap()),
    );
    recorder.wait_until_tracing();
    recorder.signal(Signal::SIGUSR1);
    recorder.wait_for_line("writing the moments before it to");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        recorder.child.try_wait().unwrap().is_none(),
        "SIGUSR1 ended the recorder"
    );
    recorder.signal(Signal::SIGINT);
    let (_, stderr) = recorder.finish();
    let _ = idle.kill();
    let _ = idle.wait();
    let summary = std::fs::read_to_string(dir.join("summary.txt")).unwrap();
    assert!(
        summary.contains("1 failure file written"),
        "{summary}{stderr}"
    );
    let dump = dir.join("flight.000000.shmtrace");
    let report = run(&["report", dump.to_str().unwrap()]);
    assert!(
        text(&report.stdout).contains("flight recorder file after: manual"),
        "{}",
        text(&report.stdout)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// In a plain recording SIGUSR1 only marks the moment: reading the file back names the mark
/// where it falls, and a finished file's summary is not that of a cut one.
#[test]
fn sigusr1_marks_a_plain_recording_and_show_names_the_mark() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let file = dir.join("marked.shmtrace");
    let mut idle = Command::new("sleep").arg("60").spawn().unwrap();
    let idle_pid = idle.id().to_string();
    let mut recorder = Background::start(
        &["record", "--pid", &idle_pid, "-o", file.to_str().unwrap()],
        Stdio::from(std::fs::File::create(dir.join("summary.txt")).unwrap()),
    );
    recorder.wait_until_tracing();
    recorder.signal(Signal::SIGUSR1);
    // The mark is written by the reader's loop; give it a few of its 100 ms ticks.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        recorder.child.try_wait().unwrap().is_none(),
        "SIGUSR1 ended the recorder"
    );
    recorder.signal(Signal::SIGINT);
    let (status, stderr) = recorder.finish();
    let _ = idle.kill();
    let _ = idle.wait();
    assert_ne!(status.code(), None, "killed by a signal: {stderr}");
    let show = run(&["show", "--json", file.to_str().unwrap()]);
    assert!(show.status.success(), "{}", text(&show.stderr));
    let lines = text(&show.stdout) + &text(&show.stderr);
    assert!(
        lines.contains("marked here by the user while recording: SIGUSR1"),
        "the mark is not shown: {lines}"
    );
    let summary = lines
        .lines()
        .find(|l| l.contains(r#""event":"summary""#))
        .unwrap_or_else(|| panic!("no summary: {lines}"));
    assert!(summary.contains(r#""cut":false"#), "{summary}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_closed_stdout_ends_a_host_wide_trace_quietly() {
    let _guard = serial();
    require_root();
    let mut tracer = Background::start(&["--all"], Stdio::piped());
    tracer.wait_until_tracing();
    // `| head -1` that has read its line: the pipe's reader is gone.
    drop(tracer.child.stdout.take());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = 0;
    while tracer.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "still running with nobody reading"
        );
        let name = format!("/dev/shm/harden-epipe-{}-{i}", std::process::id());
        std::fs::write(&name, b"x").unwrap();
        std::fs::remove_file(&name).unwrap();
        i += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, stderr) = tracer.finish();
    assert!(
        matches!(status.code(), Some(0) | Some(141)),
        "{status:?}: {stderr}"
    );
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}
