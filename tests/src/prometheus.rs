//! A real Prometheus (Debian's `prometheus` package) for the fleet tests: started on 127.0.0.1
//! with a free port and its own config and data directory, scraping one target every second,
//! queried through its HTTP API.
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{daemon::http_get, tempdir};

/// A port nobody listens on now (the kernel picks it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding a free port")
        .port()
}

pub struct Prometheus {
    child: Child,
    pub addr: String,
    dir: PathBuf,
}

impl Prometheus {
    /// Scrapes `target` (ADDR:PORT) every second, under job `job`.
    pub fn start(job: &str, target: &str) -> Prometheus {
        // Prometheus cannot be told to choose its own port and say which: a free one is picked
        // here, and if another process takes it first, Prometheus exits and another is tried.
        for _ in 0..5 {
            if let Some(prometheus) = Prometheus::try_start(job, target) {
                return prometheus;
            }
        }
        panic!("prometheus found its port taken five times in a row");
    }

    /// `None` when the port was taken before Prometheus could bind it.
    fn try_start(job: &str, target: &str) -> Option<Prometheus> {
        let dir = tempdir();
        let addr = format!("127.0.0.1:{}", free_port());
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus is not installed (apt-get install prometheus; .ci/run does)");
        let mut prometheus = Prometheus { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = prometheus.child.try_wait().unwrap() {
                let log = prometheus.log();
                if log.contains("address already in use") {
                    return None;
                }
                panic!("prometheus ended ({status}): {log}");
            }
            // Ready, and this Prometheus: the one whose storage is in our directory.
            if let Ok((200, _)) = http_get(&prometheus.addr, "/-/ready")
                && let Ok((200, flags)) = http_get(&prometheus.addr, "/api/v1/status/flags")
                && flags.contains(&prometheus.dir.join("data").display().to_string())
            {
                return Some(prometheus);
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready: {}",
                prometheus.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query: the `result` array of `/api/v1/query`.
    pub fn query(&self, expr: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", percent_encode(expr));
        let (status, body) = http_get(&self.addr, &path).expect("querying prometheus");
        assert_eq!(status, 200, "query {expr}: {body}");
        let answer: Value = serde_json::from_str(&body).expect("prometheus answers JSON");
        assert_eq!(answer["status"], "success", "{body}");
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits (up to `limit`) until `expr` has a result; returns it.
    pub fn wait_for(&self, expr: &str, limit: Duration) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let result = self.query(expr);
            if !result.is_empty() {
                return result;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus has nothing for {expr} after {limit:?}; targets: {}",
                http_get(&self.addr, "/api/v1/targets")
                    .map(|(_, b)| b)
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The value of one sample of a query result.
pub fn value(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
