//! A shmtrace running in the background (`--pid`, `--container`, `--all`), stopped with
//! Ctrl-C like a user would, its JSON output read back.
use std::{
    io::{BufRead, BufReader, Read},
    path::PathBuf,
    process::{ChildStderr, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

use crate::{command::ShmtraceChild, read_json_lines, shmtrace, tempdir};

/// How long shmtrace may take to load, attach and say it is tracing, on a loaded machine.
const START_LIMIT: Duration = Duration::from_secs(60);

pub struct LiveTracer {
    child: ShmtraceChild,
    stderr: BufReader<ChildStderr>,
    /// Every stderr line so far.
    pub log: Vec<String>,
    out: PathBuf,
}

impl LiveTracer {
    /// Starts `shmtrace --json -o FILE ARGS` and waits until it says it is tracing.
    pub fn start(args: &[&str]) -> LiveTracer {
        LiveTracer::start_until(args, "shmtrace: tracing")
    }

    /// Starts `shmtrace --json -o FILE ARGS` and waits until it prints a line starting with
    /// `ready` (with `--wait`: "shmtrace: waiting for container").
    pub fn start_until(args: &[&str], ready: &str) -> LiveTracer {
        let out = tempdir().join("trace.jsonl");
        let mut child = shmtrace()
            .args(["--json", "-o"])
            .arg(&out)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting shmtrace");
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut tracer = LiveTracer {
            child,
            stderr,
            log: Vec::new(),
            out,
        };
        // Bounded: a shmtrace that never gets to tracing is killed, which ends the wait below.
        let (watchdog, started) = std::sync::mpsc::channel::<()>();
        let pid = Pid::from_raw(tracer.child.id() as i32);
        std::thread::spawn(move || {
            if started.recv_timeout(START_LIMIT).is_err() {
                eprintln!("shmtrace did not start tracing within {START_LIMIT:?}: killing it");
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            }
        });
        tracer.wait_for_line(ready);
        let _ = watchdog.send(());
        // Tracing: every program is loaded and attached, so the leak check knows them all.
        assert!(
            !tracer.child.bpf_objects().is_empty(),
            "shmtrace says it is tracing but holds no BPF object"
        );
        tracer
    }

    /// Reads stderr until a line starts with `prefix`; panics if shmtrace ends first.
    pub fn wait_for_line(&mut self, prefix: &str) -> String {
        loop {
            let mut line = String::new();
            let n = self.stderr.read_line(&mut line).unwrap();
            assert!(
                n > 0,
                "shmtrace ended before printing {prefix:?}:\n{}",
                self.log.join("")
            );
            self.log.push(line.clone());
            if line.starts_with(prefix) {
                return line;
            }
        }
    }

    /// Waits (up to a minute) until the output holds a record for which `wanted` is true,
    /// and returns it. shmtrace flushes its output every 100 ms.
    pub fn wait_for_record(&self, wanted: impl Fn(&Value) -> bool) -> Value {
        self.find_record(wanted, Duration::from_secs(60))
            .unwrap_or_else(|text| panic!("no such record within a minute; output so far:\n{text}"))
    }

    /// As [`LiveTracer::wait_for_record`], for up to `within`; the output so far if none came.
    pub fn find_record(
        &self,
        wanted: impl Fn(&Value) -> bool,
        within: Duration,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + within;
        loop {
            let text = std::fs::read_to_string(&self.out).unwrap_or_default();
            // The last line may be half written: only whole lines count.
            let whole = text.rfind('\n').map_or("", |end| &text[..end]);
            if let Some(found) = whole
                .lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .find(|record| wanted(record))
            {
                return Ok(found);
            }
            if Instant::now() >= deadline {
                return Err(text);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Ctrl-C, then the exit status, the rest of stderr and every JSON record.
    pub fn stop(mut self) -> (ExitStatus, String, Vec<Value>) {
        // Let the last events through the ring buffer before interrupting.
        std::thread::sleep(Duration::from_millis(300));
        if self.child.try_wait().unwrap().is_none() {
            nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT).unwrap();
        }
        self.finish("shmtrace did not stop after Ctrl-C")
    }

    /// Waits for shmtrace to end by itself (every traced process exited), then as `stop`.
    pub fn wait(self) -> (ExitStatus, String, Vec<Value>) {
        self.finish("shmtrace did not end after its targets exited")
    }

    fn finish(mut self, complaint: &str) -> (ExitStatus, String, Vec<Value>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "{complaint}");
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut rest = String::new();
        let _ = self.stderr.read_to_string(&mut rest);
        let log = self.log.join("") + &rest;
        let records = read_json_lines(&self.out);
        self.child.assert_released();
        (status, log, records)
    }
}

impl Drop for LiveTracer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
