//! A running `shmtrace daemon` for the fleet tests: started on a free port, its metrics read
//! over real HTTP, stopped with SIGTERM as a DaemonSet's kubelet would, its JSON lines read
//! back.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

use crate::{command::ShmtraceChild, read_json_lines, recording::wait_for, shmtrace, tempdir};

/// `GET path` over HTTP/1.0: (status code, body).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Its BPF objects are checked to be released when it stops (or is dropped).
pub struct Daemon {
    child: ShmtraceChild,
    pub addr: String,
    pub dir: PathBuf,
}

impl Daemon {
    /// `shmtrace daemon --listen 127.0.0.1:0 ARGS`; returns once /healthz answers on the port
    /// it says it bound. (A port chosen here and passed in could be taken by another test in
    /// between, and /healthz then answered by someone else's daemon.)
    pub fn start(args: &[&str]) -> Daemon {
        Daemon::start_via(shmtrace(), args)
    }

    /// As [`Daemon::start`], with its soft and hard open-files limits both `limit` (as after
    /// `ulimit -n LIMIT`), through util-linux's `prlimit`, which execs it.
    pub fn start_with_open_files(limit: u64, args: &[&str]) -> Daemon {
        let mut prlimit = std::process::Command::new("prlimit");
        prlimit
            .arg(format!("--nofile={limit}:{limit}"))
            .arg("--")
            .arg(crate::shmtrace_bin());
        Daemon::start_via(crate::command::ShmtraceCommand::from_command(prlimit), args)
    }

    /// As [`Daemon::start`], through `command`: a wrapper that ends up exec'ing shmtrace
    /// (`prlimit`, `unshare ... sh -c 'exec "$@"'`), given shmtrace's path as its last argument.
    pub fn start_via(mut command: crate::command::ShmtraceCommand, args: &[&str]) -> Daemon {
        let dir = tempdir();
        let child = command
            .args(["daemon", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(std::fs::File::create(dir.join("stdout.jsonl")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .stdin(Stdio::null())
            .spawn()
            .expect("starting shmtrace daemon");
        let mut daemon = Daemon {
            child,
            addr: String::new(),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if daemon.addr.is_empty()
                && let Some(addr) = daemon.stderr().split("metrics at http://").nth(1)
                && let Some((addr, _)) = addr.split_once("/metrics")
            {
                daemon.addr = addr.to_owned();
            }
            if !daemon.addr.is_empty()
                && let Ok((200, _)) = http_get(&daemon.addr, "/healthz")
            {
                return daemon;
            }
            if let Some(status) = daemon.child.try_wait().unwrap() {
                panic!(
                    "shmtrace daemon ended ({status}) before serving: {}",
                    daemon.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "shmtrace daemon did not answer (on {:?}): {}",
                daemon.addr,
                daemon.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// The metrics as Prometheus' text format.
    pub fn metrics(&self) -> String {
        let (status, body) = http_get(&self.addr, "/metrics").unwrap_or_else(|error| {
            // Say whether the daemon is still there, and what it said.
            let alive = std::fs::metadata(format!("/proc/{}", self.child.id())).is_ok();
            panic!(
                "GET {}/metrics: {error}; the daemon (pid {}) is {}; its stderr:\n{}",
                self.addr,
                self.child.id(),
                if alive { "running" } else { "gone" },
                self.stderr()
            )
        });
        assert_eq!(status, 200, "GET /metrics: {body}");
        body
    }

    /// Waits (up to `limit`) until a line of /metrics satisfies `wanted`; returns the text.
    pub fn wait_for_metric(&self, limit: Duration, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let text = self.metrics();
            if text.lines().any(&wanted) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "no such metric after {limit:?}:\n{text}\nstderr: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Resident memory, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// SIGTERM, then the leak check; the exit status and every JSON line it wrote.
    pub fn stop(mut self) -> (ExitStatus, Vec<Value>, String) {
        nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        let status = wait_for(&mut self.child, Duration::from_secs(20));
        self.child.assert_released();
        let lines = read_json_lines(&self.dir.join("stdout.jsonl"));
        (status, lines, self.stderr())
    }
}

/// The value of the first sample of `name` whose labels include every `label="value"` given.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples(text, name, labels).next()
}

/// The sum of every sample of `name` whose labels include every `label="value"` given.
pub fn total(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text, name, labels).sum()
}

fn samples<'a>(
    text: &'a str,
    name: &'a str,
    labels: &'a [(&str, &str)],
) -> impl Iterator<Item = f64> + 'a {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(move |l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(move |l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
}
