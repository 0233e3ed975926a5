//! Signals, as a shell, a supervisor or a pipe deliver them (issue 11): the traced command keeps
//! the dispositions it would have without shmtrace; SIGHUP ends a recording with its summary and
//! end mark; SIGUSR1 makes the flight recorder write; a closed stdout ends a trace quietly;
//! SIGTERM sent to shmtrace alone reaches the traced command, and the trace ends with its
//! result (issue 25).
//! Real probes, root.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
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

/// `sh -c` script for the stop tests: 1 MiB written to a /dev/shm file, then a long sleep in the
/// background, whose pid is written to `$2` once it runs (the file the test waits for), and the
/// shell waits for it. `$1` is the /dev/shm file.
const WRITE_THEN_SLEEP: &str = "dd if=/dev/zero of=\"$1\" bs=1M count=1 2>/dev/null; \
     sleep 1000 & echo $! > \"$2.tmp\"; mv \"$2.tmp\" \"$2\"; wait";

/// What a stop test leaves: the sleep (which, as without shmtrace, does not get the signal
/// the shell dies of), the /dev/shm file, the directory. Removed even when the test fails.
struct Leftovers {
    dir: PathBuf,
    shm: String,
    sleeper: PathBuf,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if let Some(pid) = std::fs::read_to_string(&self.sleeper)
            .ok()
            .and_then(|pid| pid.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = std::fs::remove_file(&self.shm);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `shmtrace ARGS -- sh -c WRITE_THEN_SLEEP` in the background, waits until the sleep runs,
/// and sends SIGTERM to shmtrace alone, as `docker stop` does to a container's PID 1 or a CI
/// timeout to its job. Returns shmtrace's status, its stderr and stdout.
fn stop_with_sigterm(args: &[&str], tag: &str) -> (std::process::ExitStatus, String, String) {
    let dir = tempdir();
    let left = Leftovers {
        shm: format!("/dev/shm/harden-stop-{tag}-{}", std::process::id()),
        sleeper: dir.join("sleeper.pid"),
        dir,
    };
    let stdout = left.dir.join("stdout.txt");
    let mut command: Vec<&str> = args.to_vec();
    command.extend(["--", "sh", "-c", WRITE_THEN_SLEEP, "sh", &left.shm]);
    command.push(left.sleeper.to_str().unwrap());
    let tracer = Background::start(
        &command,
        Stdio::from(std::fs::File::create(&stdout).unwrap()),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !left.sleeper.exists() {
        assert!(Instant::now() < deadline, "the command never ran its sleep");
        std::thread::sleep(Duration::from_millis(50));
    }
    tracer.signal(Signal::SIGTERM);
    let (status, stderr) = tracer.finish();
    let stdout = std::fs::read_to_string(&stdout).unwrap();
    (status, stderr, stdout)
}

/// Issue 25, item 5: SIGTERM to shmtrace alone used to stay with it: the command ran on and the
/// trace never ended. It is passed on to the command, which dies of it; the trace then ends
/// with the command's status and the summary.
#[test]
fn sigterm_to_shmtrace_alone_reaches_the_command_and_the_summary_is_printed() {
    let _guard = serial();
    require_root();
    let (status, stderr, _) = stop_with_sigterm(&[], "trace");
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "shmtrace must exit as the command did (killed by SIGTERM); stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("passed SIGTERM on to the traced command"),
        "{stderr}"
    );
    assert!(stderr.contains("command killed by SIGTERM"), "{stderr}");
    assert!(stderr.contains("events lost"), "no summary:\n{stderr}");
}

/// The same for `shmtrace size`, whose result is printed only once the trace ends.
#[test]
fn sigterm_to_shmtrace_size_alone_reaches_the_command_and_the_size_is_printed() {
    let _guard = serial();
    require_root();
    let (status, stderr, stdout) = stop_with_sigterm(&["size", "--json"], "size");
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "stderr:\n{stderr}"
    );
    let report: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("no size result ({e}): {stdout:?}; stderr:\n{stderr}"));
    let peak = report["shm"][0]["peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        peak >= 1 << 20,
        "the 1 MiB written is not measured: {report}"
    );
}

/// Runs shmtrace on a terminal (a pty), presses Ctrl-C once the command runs, and prints all
/// it showed: the command traps SIGINT and counts it, and runs on for 8 s. `--show-all`: the
/// exec of `sleep`, which touches no /dev/shm, is the sign that the command runs.
const CTRL_C_ON_A_PTY: &str = r#"
import os, pty, sys, time
script = "n=0; trap 'n=$((n+1)); echo got INT $n' INT; i=0; while [ $i -lt 40 ]; do sleep 0.2; i=$((i+1)); done"
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], ["shmtrace", "--show-all", "--", "sh", "-c", script])
out = b""
deadline = time.time() + 30
pressed = False
while time.time() < deadline:
    try:
        data = os.read(fd, 4096)
    except OSError:
        break
    if not data:
        break
    out += data
    if not pressed and b'execve("/usr/bin/sleep"' in out:
        os.write(fd, b"\x03")
        pressed = True
os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace"))
"#;

/// Ctrl-C reaches the command itself (the terminal signals its foreground process group,
/// which the command shares with shmtrace): shmtrace must not send it again.
#[test]
fn ctrl_c_on_a_terminal_reaches_the_command_once() {
    let _guard = serial();
    require_root();
    let output = Command::new(shmtrace_tests::workload::PYTHON)
        .args(["-c", CTRL_C_ON_A_PTY])
        .arg(shmtrace_tests::shmtrace_bin())
        .output()
        .unwrap();
    let shown = text(&output.stdout);
    assert!(shown.contains("got INT 1"), "{shown}");
    assert!(
        !shown.contains("got INT 2"),
        "SIGINT delivered twice: {shown}"
    );
    assert!(
        shown.contains("SIGINT from the terminal reached the traced command"),
        "{shown}"
    );
}
