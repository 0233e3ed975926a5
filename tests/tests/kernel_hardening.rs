//! Hardening, as an attacker or an unlucky user meets it (issue 11): outputs that refuse planted
//! links and their own input, two recorders on one file, the traced command's signals, SIGHUP,
//! SIGUSR1 and a closed stdout, a full disk, gaps in a rotated set, hostile names in a trace
//! file, and every bad argument of `show`. Real probes, real files, root.
use std::{
    io::{BufRead, BufReader},
    os::unix::fs::{PermissionsExt, symlink},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use shmtrace_tests::{
    command::{ShmtraceChild, ShmtraceCommand},
    recording::wait_for,
    require_root, serial, shmtrace, tempdir,
};

/// A script that makes `n` /dev/shm objects, each created and removed: events to record.
fn shm_churn(n: u32) -> String {
    format!(
        "i=0; while [ $i -lt {n} ]; do : > /dev/shm/harden-$$-$i; rm /dev/shm/harden-$$-$i; \
         i=$((i+1)); done"
    )
}

fn run(args: &[&str]) -> Output {
    shmtrace().args(args).output().expect("running shmtrace")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `shmtrace record -o FILE FLAGS -- sh -c SCRIPT`, which must succeed.
fn record(file: &Path, flags: &[&str], script: &str) -> Output {
    let output = shmtrace()
        .arg("record")
        .arg("-o")
        .arg(file)
        .args(flags)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    output
}

/// A small finished trace, in a fresh directory.
fn small_trace() -> (PathBuf, PathBuf) {
    let dir = tempdir();
    let file = dir.join("harden.shmtrace");
    record(&file, &[], &shm_churn(3));
    (dir, file)
}

/// `shmtrace ARGS` in the background, its stderr read line by line; its BPF objects are checked
/// to be released when it ends.
struct Background {
    child: ShmtraceChild,
    lines: mpsc::Receiver<String>,
    seen: String,
}

impl Background {
    fn start(args: &[&str], stdout: Stdio) -> Background {
        let mut child = shmtrace()
            .args(args)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Background {
            child,
            lines,
            seen: String::new(),
        }
    }

    /// Waits for shmtrace to say it is tracing, and checks that it then holds BPF objects (so
    /// that the leak check at the end has something to check).
    fn wait_until_tracing(&mut self) {
        self.wait_for_line("shmtrace: tracing");
        assert!(
            !self.child.bpf_objects().is_empty(),
            "shmtrace says it is tracing but holds no BPF object"
        );
    }

    /// Waits (30 s at most) for a stderr line containing `needle`.
    fn wait_for_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "no line with {needle:?} within 30 s; stderr:\n{}",
            self.seen
        );
    }

    fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Waits for the exit and checks the BPF objects are released; returns the status and all
    /// of stderr.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        let status = wait_for(&mut self.child, Duration::from_secs(60));
        self.child.assert_released();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(300)) {
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
        (status, self.seen.clone())
    }
}

#[test]
fn report_never_writes_over_its_own_input() {
    let _guard = serial();
    require_root();
    let (dir, file) = small_trace();
    let before = std::fs::read(&file).unwrap();
    let link = dir.join("hard-link-of-input");
    std::fs::hard_link(&file, &link).unwrap();
    let file_arg = file.to_str().unwrap();
    for flags in [
        vec!["-o", file_arg],
        vec!["--html", file_arg],
        vec!["--perfetto", file_arg],
        vec!["-o", link.to_str().unwrap()],
        vec!["--redact", "-o", link.to_str().unwrap()],
    ] {
        let mut args = vec!["report", file_arg];
        args.extend(&flags);
        let output = run(&args);
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{flags:?} succeeded: {stderr}");
        assert!(
            stderr.contains("is the file being read")
                || stderr.contains("another file than the trace"),
            "{flags:?}: {stderr}"
        );
        assert_eq!(
            std::fs::read(&file).unwrap(),
            before,
            "{flags:?} changed the input"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn no_output_is_written_through_a_planted_symlink() {
    let _guard = serial();
    require_root();
    let (dir, file) = small_trace();
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let planted = shared.join("out");
    symlink(&victim, &planted).unwrap();
    let out = planted.to_str().unwrap();
    let file_arg = file.to_str().unwrap();
    let attempts: Vec<Vec<&str>> = vec![
        vec!["record", "-o", out, "--", "true"],
        vec!["-o", out, "--", "true"],
        vec!["report", file_arg, "-o", out],
        vec!["report", file_arg, "--html", out],
        vec!["report", file_arg, "--perfetto", out],
        vec!["report", file_arg, "--redact", "-o", out],
        vec!["show", file_arg, "-o", out],
    ];
    for args in attempts {
        let output = run(&args);
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded: {stderr}");
        assert!(stderr.contains("symbolic link"), "{args:?}: {stderr}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "{args:?}");
    }
    // Rotation: numbered files are opened the same way, so one planted later is refused too.
    let base = shared.join("rot.shmtrace");
    symlink(&victim, shared.join("rot.000001.shmtrace")).unwrap();
    let output = shmtrace()
        .args(["record", "--max-size", "64K", "-o"])
        .arg(&base)
        .args(["--", "sh", "-c", &shm_churn(1)])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_second_recorder_on_the_same_file_fails_clearly() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let file = dir.join("same.shmtrace");
    let file_arg = file.to_str().unwrap();
    let summary = dir.join("summary.txt");
    let mut first = Background::start(
        &["record", "--all", "-o", file_arg],
        Stdio::from(std::fs::File::create(&summary).unwrap()),
    );
    first.wait_until_tracing();
    let second = run(&["record", "-o", file_arg, "--", "true"]);
    let stderr = text(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    assert!(
        stderr.contains("being written by another process"),
        "{stderr}"
    );
    first.signal(Signal::SIGINT);
    let (_, stderr) = first.finish();
    let summary = std::fs::read_to_string(summary).unwrap();
    assert!(summary.contains("wrote"), "{summary}{stderr}");
    let show = run(&["show", file_arg]);
    assert!(show.status.success(), "{}", text(&show.stderr));
    assert!(
        !text(&show.stdout).contains("ends early"),
        "the first recording was damaged"
    );
    let _ = std::fs::remove_dir_all(dir);
}

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

#[test]
fn a_full_disk_keeps_what_fit_and_still_prints_the_summary() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let small = dir.join("small-disk");
    std::fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=128k", "harden-full"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a 128 KiB tmpfs");
    let file = small.join("full.shmtrace");
    let output = shmtrace()
        .args(["record", "-o"])
        .arg(&file)
        .args(["--", "sh", "-c", &shm_churn(2000)])
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    let show = run(&["show", file.to_str().unwrap(), "--json"]);
    let shown = text(&show.stdout);
    let _ = Command::new("umount").arg(&small).status();
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("writing first failed at byte"), "{stderr}");
    assert!(stderr.contains("records could not be written"), "{stderr}");
    assert!(stderr.contains("events lost"), "no summary: {stderr}");
    let openats = shown.lines().filter(|l| l.contains("\"openat\"")).count();
    assert!(openats > 50, "only {openats} calls kept:\n{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_missing_or_repeated_rotated_file_is_reported() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let base = dir.join("rot.shmtrace");
    record(&base, &["--max-size", "64K"], &shm_churn(1500));
    let numbered = |n: u32| dir.join(format!("rot.{n:06}.shmtrace"));
    assert!(
        numbered(3).exists(),
        "the recording made fewer than 4 files"
    );
    std::fs::remove_file(numbered(1)).unwrap();
    let show = run(&["show", base.to_str().unwrap()]);
    let shown = text(&show.stdout) + &text(&show.stderr);
    assert!(
        shown.contains("1 file is missing between file 0 and file 2"),
        "{shown}"
    );
    // A second copy of file 2, numbered as if it came later.
    let mut last = 3;
    while numbered(last + 1).exists() {
        last += 1;
    }
    std::fs::copy(numbered(2), numbered(last + 1)).unwrap();
    let show = run(&["show", base.to_str().unwrap()]);
    let shown = text(&show.stdout) + &text(&show.stderr);
    assert!(shown.contains("repeats file 2"), "{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn hostile_names_in_a_trace_file_are_escaped_in_text() {
    let _guard = serial();
    require_root();
    let dir = tempdir();
    let file = dir.join("hostile.shmtrace");
    let hostname = "evil\x1b]0;TITLE\x07\x1b[2J\x1b[31mX";
    let mut unshare = Command::new("unshare");
    unshare
        // Through /proc: the kernel takes any bytes, hostname(1) would refuse them.
        .args([
            "--uts",
            "sh",
            "-c",
            r#"printf '%s' "$0" > /proc/sys/kernel/hostname && exec "$@""#,
            hostname,
        ])
        .arg(shmtrace_tests::shmtrace_bin());
    // `exec` keeps the pid: the leak check watches shmtrace itself.
    let output = ShmtraceCommand::from_command(unshare)
        .arg("record")
        .arg("-o")
        .arg(&file)
        .args(["--", "sh", "-c", &shm_churn(1)])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    for args in [vec!["report"], vec!["show"]] {
        let mut all = args.clone();
        all.push(file.to_str().unwrap());
        let output = run(&all);
        assert!(output.status.success(), "{}", text(&output.stderr));
        let printed = [output.stdout.as_slice(), output.stderr.as_slice()].concat();
        assert!(
            !printed.iter().any(|b| *b == 0x1b || *b == 0x07),
            "{args:?} printed raw control bytes: {:?}",
            text(&printed)
        );
        assert!(
            text(&printed).contains("evil\\x1b]0;TITLE"),
            "{}",
            text(&printed)
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn show_rejects_bad_times_and_event_names_and_reads_pipes() {
    let _guard = serial();
    require_root();
    let (dir, file) = small_trace();
    let file_arg = file.to_str().unwrap();
    for bad in ["1e30", "inf", "NaN", "-1"] {
        for flag in ["--since", "--until"] {
            let output = run(&["show", file_arg, flag, bad]);
            assert!(!output.status.success(), "{flag} {bad} was accepted");
            assert!(
                text(&output.stderr).contains(bad),
                "{}",
                text(&output.stderr)
            );
        }
    }
    let output = run(&["show", file_arg, "--event", "bogus"]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("bogus") && stderr.contains("fallocate"),
        "{stderr}"
    );

    let output = run(&["show", dir.to_str().unwrap()]);
    assert!(
        text(&output.stderr).contains("not a trace file (a directory)"),
        "{}",
        text(&output.stderr)
    );

    let expected = run(&["show", file_arg, "--json"]);
    assert!(expected.status.success());
    let events = |output: &Output| {
        text(&output.stdout)
            .lines()
            .filter(|l| l.contains("\"openat\""))
            .count()
    };
    assert!(events(&expected) > 0);
    for source in ["-", "/dev/stdin"] {
        let output = shmtrace()
            .args(["show", source, "--json"])
            .stdin(Stdio::from(std::fs::File::open(&file).unwrap()))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{source}: {}",
            text(&output.stderr)
        );
        assert_eq!(events(&output), events(&expected), "{source}");
    }
    // Through a pipe and a FIFO, which cannot seek.
    let mut cat = Command::new("cat")
        .arg(&file)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let output = shmtrace()
        .args(["show", "-", "--json"])
        .stdin(Stdio::from(cat.stdout.take().unwrap()))
        .output()
        .unwrap();
    cat.wait().unwrap();
    assert_eq!(
        events(&output),
        events(&expected),
        "{}",
        text(&output.stderr)
    );
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let writer = {
        let (fifo, file) = (fifo.clone(), file.clone());
        std::thread::spawn(move || std::fs::write(&fifo, std::fs::read(&file).unwrap()))
    };
    let output = run(&["show", fifo.to_str().unwrap(), "--json"]);
    writer.join().unwrap().unwrap();
    assert_eq!(
        events(&output),
        events(&expected),
        "{}",
        text(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_zombie_pid_is_refused_at_once() {
    let _guard = serial();
    require_root();
    // `sleep 0.3 &` exits after the shell that started it became `sleep 30`, which never
    // reaps it.
    let mut parent = Command::new("bash")
        .args(["-c", "sleep 0.3 & echo $!; exec sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(parent.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let zombie = line.trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{zombie}/stat"))
        .unwrap_or_default()
        .contains(") Z")
    {
        assert!(
            Instant::now() < deadline,
            "pid {zombie} never became a zombie"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = Instant::now();
    let mut tracer = shmtrace()
        .args(["--pid", &zombie])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(&mut tracer, Duration::from_secs(20));
    tracer.assert_released();
    let _ = parent.kill();
    let _ = parent.wait();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut tracer.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("zombie"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20));
}
