//! Helpers for the recording tests: `shmtrace record` in the background, stopped as a user
//! would (Ctrl-C) or killed; `report` and `show` of what it wrote; clocks to compare a kill
//! with the last record; headless Chromium for the HTML report.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

use crate::{
    command::{ShmtraceChild, ShmtraceCommand},
    read_json_lines, shmtrace, tempdir,
};

/// `shmtrace record ...` running in the background.
pub struct Recorder {
    child: ShmtraceChild,
    stderr: Arc<Mutex<String>>,
    /// Says when the stderr reader reached the end of the pipe.
    stderr_done: mpsc::Receiver<()>,
}

impl Recorder {
    /// Starts `shmtrace record ARGS`, its stdout to `stdout`, and waits (up to 30 s) until its
    /// stderr has a line starting with `ready` (e.g. `shmtrace: tracing`).
    pub fn start(args: &[&str], stdout: &Path, ready: &str) -> Recorder {
        let mut command = shmtrace();
        command.arg("record").args(args);
        Recorder::spawn(command, stdout, ready)
    }

    /// Like [`start`](Self::start), in a UTS namespace of its own whose host name is
    /// `hostname`: the name the trace file's header records.
    pub fn start_on_host(hostname: &str, args: &[&str], stdout: &Path, ready: &str) -> Recorder {
        let mut command = Command::new("unshare");
        command
            .args([
                "--uts",
                "sh",
                "-c",
                r#"hostname "$0" && exec "$@""#,
                hostname,
            ])
            .arg(crate::shmtrace_bin())
            .arg("record")
            .args(args);
        // `exec` keeps the pid: the leak check watches shmtrace itself.
        Recorder::spawn(ShmtraceCommand::from_command(command), stdout, ready)
    }

    fn spawn(mut command: ShmtraceCommand, stdout: &Path, ready: &str) -> Recorder {
        let mut child = command
            .stdout(std::fs::File::create(stdout).unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting shmtrace record");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let (done_tx, stderr_done) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        let text = stderr.clone();
        let marker = ready.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let is_ready = line.starts_with(&marker);
                text.lock().unwrap().push_str(&format!("{line}\n"));
                if is_ready {
                    let _ = tx.send(());
                }
            }
            let _ = done_tx.send(());
        });
        let recorder = Recorder {
            child,
            stderr,
            stderr_done,
        };
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            panic!(
                "shmtrace record did not print {ready:?} within 30 s; stderr:\n{}",
                recorder.stderr()
            );
        }
        assert!(
            !recorder.child.bpf_objects().is_empty(),
            "shmtrace printed {ready:?} but holds no BPF object"
        );
        recorder
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Ctrl-C, then waits for it to write its summary and exit.
    pub fn interrupt(mut self) -> (ExitStatus, String) {
        self.signal(Signal::SIGINT);
        let status = wait_for(&mut self.child, Duration::from_secs(60));
        self.child.assert_released();
        self.wait_for_stderr_end();
        (status, self.stderr())
    }

    /// Waits until the reading thread has taken the last lines. The traced command shares the
    /// pipe and may outlive shmtrace (after a kill), so the wait is bounded.
    fn wait_for_stderr_end(&self) {
        let _ = self.stderr_done.recv_timeout(Duration::from_secs(10));
    }

    /// `kill -9`.
    pub fn kill(mut self) -> String {
        self.signal(Signal::SIGKILL);
        wait_for(&mut self.child, Duration::from_secs(10));
        self.child.assert_released();
        self.wait_for_stderr_end();
        self.stderr()
    }

    fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // A failed test must not leave a recorder tracing behind it.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn wait_for(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "process {} did not exit within {limit:?}; killed",
                child.id()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `shmtrace report|show FILE --json ...` printed: its records, and its stderr (where
/// notices go with --json).
pub struct Replay {
    pub output: Output,
    pub records: Vec<Value>,
}

impl Replay {
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    pub fn of(&self, event: &str) -> Vec<&Value> {
        self.records
            .iter()
            .filter(|r| r["event"] == event)
            .collect()
    }

    /// Fails with the command's stderr unless it exited 0.
    pub fn assert_ok(&self) -> &Replay {
        assert!(
            self.output.status.success(),
            "exit {:?}; stderr:\n{}",
            self.output.status,
            self.stderr()
        );
        self
    }
}

/// `shmtrace SUBCOMMAND FILE --json -o OUT EXTRA...`.
pub fn replay(subcommand: &str, file: &Path, extra: &[&str]) -> Replay {
    let dir = tempdir();
    let out = dir.join("out.jsonl");
    let output = shmtrace()
        .arg(subcommand)
        .arg(file)
        .arg("--json")
        .arg("-o")
        .arg(&out)
        .args(extra)
        .output()
        .expect("running shmtrace");
    let records = read_json_lines(&out);
    let _ = std::fs::remove_dir_all(dir);
    Replay { output, records }
}

/// The diagnosis records of a JSON stream, without their `ts`: that one is boot time turned
/// into wall-clock time with an offset measured when each process started, which may differ
/// by microseconds.
pub fn diagnoses_without_time(records: &[Value]) -> Vec<Value> {
    records
        .iter()
        .filter(|r| r["event"] == "diagnosis")
        .map(|r| {
            let mut r = r.clone();
            r.as_object_mut().unwrap().remove("ts");
            r
        })
        .collect()
}

/// Seconds between two RFC 3339 UTC times (`2026-11-29T17:51:23.105986428Z`).
pub fn seconds_between(a: &str, b: &str) -> f64 {
    (rfc3339_seconds(b) - rfc3339_seconds(a)) as f64 / 1e9
}

/// Nanoseconds since the Unix epoch of an RFC 3339 UTC time, without a date library.
pub fn rfc3339_seconds(text: &str) -> i128 {
    let (date, time) = text
        .split_once('T')
        .unwrap_or_else(|| panic!("not a time: {text}"));
    let time = time.strip_suffix('Z').expect("UTC (Z) times");
    let mut d = date.split('-').map(|p| p.parse::<i64>().unwrap());
    let (y, m, day) = (d.next().unwrap(), d.next().unwrap(), d.next().unwrap());
    // Days since 1970-01-01 (Howard Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let mut t = time.split(':');
    let (h, min) = (
        t.next().unwrap().parse::<i128>().unwrap(),
        t.next().unwrap().parse::<i128>().unwrap(),
    );
    let sec = t.next().unwrap();
    let (whole, frac) = sec.split_once('.').unwrap_or((sec, "0"));
    let nanos: i128 = format!("{frac:0<9}")[..9].parse().unwrap();
    (i128::from(days) * 86_400 + h * 3600 + min * 60 + whole.parse::<i128>().unwrap())
        * 1_000_000_000
        + nanos
}

/// Wall-clock time now, in ns since the Unix epoch.
pub fn wall_now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

/// Debian's Chromium, which the HTML tests render with; fails loudly when missing.
pub fn chromium() -> PathBuf {
    let path = PathBuf::from("/usr/bin/chromium");
    assert!(
        path.exists(),
        "/usr/bin/chromium is missing: apt-get install chromium (as .ci/run does)"
    );
    path
}

/// Runs headless Chromium on a local file with no network and a fresh profile.
fn headless(page: &Path, mode: &[&str]) -> Output {
    let profile = tempdir();
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(mode)
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting chromium");
    // Read both pipes on threads, so that neither can fill up while we wait.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = wait_for(&mut child, Duration::from_secs(90));
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let _ = std::fs::remove_dir_all(profile);
    Output {
        status,
        stdout,
        stderr,
    }
}

/// The page's DOM after Chromium loaded and laid it out (`--dump-dom`).
pub fn rendered_dom(page: &Path) -> String {
    let output = headless(page, &["--dump-dom"]);
    assert!(
        output.status.success(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("a UTF-8 DOM")
}

/// A PNG of the page, `width` x `height` pixels.
pub fn screenshot(page: &Path, png: &Path, width: u32, height: u32) {
    let output = headless(
        page,
        &[
            &format!("--screenshot={}", png.display()),
            &format!("--window-size={width},{height}"),
        ],
    );
    assert!(
        output.status.success() && png.exists(),
        "chromium --screenshot failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
