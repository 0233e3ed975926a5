//! A shmtrace running in the background (`--pid`, `--container`, `--all`), stopped with
//! Ctrl-C like a user would, its JSON output read back.
use std::{
    io::{BufRead, BufReader, Read},
    path::PathBuf,
    process::{Child, ChildStderr, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

use crate::{read_json_lines, shmtrace, tempdir};

pub struct LiveTracer {
    child: Child,
    stderr: BufReader<ChildStderr>,
    /// Every stderr line so far.
    pub log: Vec<String>,
    out: PathBuf,
}

impl LiveTracer {
    /// Starts `shmtrace --json -o FILE ARGS` and waits until it says it is tracing.
    pub fn start(args: &[&str]) -> LiveTracer {
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
        tracer.wait_for_line("shmtrace: tracing");
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
        let deadline = Instant::now() + Duration::from_secs(15);
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
        (status, log, records)
    }
}

impl Drop for LiveTracer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
