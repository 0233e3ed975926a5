//! `server`: the real-server check. What `shmtrace daemon` costs a server that never touches
//! /dev/shm, as its clients see it: Redis (Debian's `redis-server`) on loopback, driven by
//! `redis-benchmark` (SET and GET, 50 connections), its throughput beside the daemon against
//! beside the floor's empty programs, in interleaved rounds. Every request is a few system
//! calls (`read`, `write`, `epoll_wait`) in a process that holds no /dev/shm: what host-wide
//! tracing costs every server on a node.
use std::{
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{
    beside::{Beside, Tracer},
    stats::Spread,
    table::markdown,
    target::Row,
    variants::Setup,
    verdicts,
};

/// A `redis-server` on a free loopback port, saving nothing, stopped when dropped.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start() -> Result<Redis> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(
                "starting redis-server (Debian's redis-server package; .ci/run installs it)",
            )?;
        let mut redis = Redis { child, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if redis.child.try_wait()?.is_some() || started.elapsed() > Duration::from_secs(10) {
                bail!("redis-server did not start listening on port {port}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(redis)
    }

    /// Requests per second over a run of `requests` SETs and as many GETs.
    fn throughput(&self, requests: u64) -> Result<f64> {
        let output = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-t", "set,get", "-c", "50", "-n", &requests.to_string()])
            .args(["-q", "--csv"])
            .output()
            .context("running redis-benchmark (Debian's redis-tools)")?;
        if !output.status.success() {
            bail!(
                "redis-benchmark failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        total_throughput(&String::from_utf8_lossy(&output.stdout), requests)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Requests per second of all the tests `--csv` output lists (`"SET","84033.61",...`), each
/// `requests` long: their requests over their summed times.
fn total_throughput(csv: &str, requests: u64) -> Result<f64> {
    let mut seconds = 0.0;
    let mut tests = 0;
    for line in csv.lines() {
        let fields: Vec<&str> = line.split(',').map(|f| f.trim_matches('"')).collect();
        let Some(Ok(rps)) = fields.get(1).map(|rps| rps.parse::<f64>()) else {
            continue;
        };
        if rps > 0.0 {
            seconds += requests as f64 / rps;
            tests += 1;
        }
    }
    if tests == 0 {
        bail!("no throughput in redis-benchmark's output: {csv:?}");
    }
    Ok(tests as f64 * requests as f64 / seconds)
}

/// The section of the report, its target row, and the JSON saved.
pub fn measure(setup: &Setup, exe: &Path, quick: bool) -> Result<(String, Vec<Row>, Value)> {
    let requests: u64 = if quick { 50_000 } else { 200_000 };
    let rounds = if quick { 3 } else { 7 };
    let redis = Redis::start()?;
    // One run first, beside nothing, that the measured ones do not pay for a cold server.
    redis.throughput(requests / 10)?;
    let order = [Beside::Floor, Beside::Daemon];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); order.len()];
    for _ in 0..rounds {
        for (i, beside) in order.iter().enumerate() {
            let tracer = Tracer::start(*beside, setup, exe)?;
            // Let the tracer's start-up work (the daemon's first survey) pass.
            std::thread::sleep(Duration::from_millis(500));
            let measured = redis.throughput(requests);
            tracer.stop()?;
            runs[i].push(measured?);
        }
    }
    let (Some(floor), Some(daemon)) = (Spread::of(&runs[0]), Spread::of(&runs[1])) else {
        bail!("no throughput measured");
    };
    let loss = 1.0 - daemon.median / floor.median;
    let rps = |s: &Spread| format!("{:.0} ({:.0}–{:.0})", s.median, s.min, s.max);
    let cells = vec![
        vec![
            "server".to_owned(),
            "beside empty programs, requests/s".to_owned(),
            "beside the daemon".to_owned(),
            "lost".to_owned(),
        ],
        vec![
            "Redis on loopback, SET and GET, 50 connections".to_owned(),
            rps(&floor),
            rps(&daemon),
            format!("{:.2}%", loss * 100.0),
        ],
    ];
    let text = format!(
        "## server: a real server's throughput beside host-wide tracing\n\n\
         {rounds} rounds interleaved, {requests} SETs and as many GETs a run (median, range):\n\n{}\n",
        markdown(&cells)
    );
    let rows = vec![verdicts::server_loss(loss * 100.0, rounds)];
    Ok((
        text,
        rows,
        json!({ "requests": requests, "rps": { "floor": runs[0], "daemon": runs[1] } }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_of_redis_benchmarks_csv() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\"\n\"SET\",\"100000.00\",\"0.3\"\n\
                   \"GET\",\"50000.00\",\"0.5\"\n";
        // 1000 requests in 10 ms, 1000 in 20 ms: 2000 in 30 ms.
        let rps = total_throughput(csv, 1000).unwrap();
        assert!((rps - 66_666.67).abs() < 0.1, "{rps}");
        assert!(total_throughput("nothing", 1000).is_err());
    }
}
