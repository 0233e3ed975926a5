//! `shmtrace daemon` as the benchmark runs it: on a free local port, its output in the scratch
//! directory, its metrics read over HTTP, stopped with SIGTERM as a DaemonSet would stop it.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub struct Daemon {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Daemon {
    /// Starts it, with its output in `scratch/NAME.jsonl` and `scratch/NAME.log`, and waits
    /// until it answers /healthz.
    pub fn start(shmtrace: &Path, scratch: &Path, name: &str) -> Result<Daemon> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let log = scratch.join(format!("{name}.log"));
        let child = Command::new(shmtrace)
            .args(["daemon", "--listen", &addr])
            .stdout(std::fs::File::create(
                scratch.join(format!("{name}.jsonl")),
            )?)
            .stderr(std::fs::File::create(&log)?)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} daemon", shmtrace.display()))?;
        let mut daemon = Daemon { child, addr, log };
        let started = Instant::now();
        while daemon.get("/healthz").is_err() {
            if daemon.child.try_wait()?.is_some() || started.elapsed() > Duration::from_secs(30) {
                bail!(
                    "shmtrace daemon did not start: {}",
                    std::fs::read_to_string(&daemon.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(daemon)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn metrics(&self) -> Result<String> {
        self.get("/metrics")
    }

    /// Waits until the daemon has handled every record the probes gave it: its event count
    /// stays the same over half a second (at most `limit`). Returns the last metrics read.
    pub fn settle(&self, limit: Duration) -> Result<String> {
        let started = Instant::now();
        let mut last = self.metrics()?;
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let now = self.metrics()?;
            let steady =
                sample(&now, "shmtrace_events_total") == sample(&last, "shmtrace_events_total");
            if steady || started.elapsed() > limit {
                return Ok(now);
            }
            last = now;
        }
    }

    fn get(&self, path: &str) -> Result<String> {
        let mut stream = TcpStream::connect(&self.addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr)?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signalling the child we started and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// The value of the series `name` with no labels (0 if absent).
pub fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of every series of `name`, whatever its labels.
pub fn sum_of(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.rsplit_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.parse::<f64>().ok()
        })
        .sum()
}

/// A `kB` field of /proc/PID/status (`VmRSS`, `VmHWM`), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_with_and_without_labels() {
        let text = "# HELP x\nshmtrace_events_total 12\n\
                    shmtrace_events_lost_total{kind=\"path\"} 2\n\
                    shmtrace_events_lost_total{kind=\"call\"} 3\n\
                    shmtrace_events_lost_totally 9\n";
        assert_eq!(sample(text, "shmtrace_events_total"), 12.0);
        assert_eq!(sum_of(text, "shmtrace_events_lost_total"), 5.0);
        assert_eq!(sum_of(text, "shmtrace_missing"), 0.0);
    }
}
