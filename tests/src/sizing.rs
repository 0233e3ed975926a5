//! Checking sizing advice as a user would: run a real workload in a real container with a
//! /dev/shm that is too small, apply the size shmtrace advises, run it again; find the smallest
//! `--shm-size` that works by bisection; and run `shmtrace size` on a roomy /dev/shm.
use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

use crate::{
    docker::{Container, require_docker},
    live::LiveTracer,
    postgres::{FORCE_PARALLEL, Postgres},
    require_root, shmtrace, tempdir,
};

pub const MIB: u64 = 1 << 20;

/// A workload that runs in a container whose /dev/shm has a given size.
pub trait Job {
    /// What it is, for messages and the docs' table.
    fn describe(&self) -> String;
    /// Starts its container with `--shm-size=<shm_bytes>b`, ready to work.
    fn start(&self, shm_bytes: u64) -> Box<dyn Started>;
}

/// A started job.
pub trait Started {
    fn container(&self) -> &str;
    /// Does the work; whether it succeeded.
    fn go(&mut self) -> bool;
}

/// A shell command in a container of the busybox test image, run when told.
pub struct Script {
    pub what: String,
    /// Extra docker flags (bind mounts, environment).
    pub flags: Vec<String>,
    pub command: String,
}

struct StartedScript(Container);

impl Job for Script {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn start(&self, shm_bytes: u64) -> Box<dyn Started> {
        let mut flags = vec![format!("--shm-size={shm_bytes}b")];
        flags.extend(self.flags.iter().cloned());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let script = format!(
            "while [ ! -e /work/go ]; do sleep 0.05; done; {}",
            self.command
        );
        Box::new(StartedScript(Container::run("sizing", &flags, &script)))
    }
}

impl Started for StartedScript {
    fn container(&self) -> &str {
        &self.0.name
    }

    fn go(&mut self) -> bool {
        self.0.signal("go");
        self.0.wait() == 0
    }
}

/// A PostgreSQL server (Debian's package) that runs one query when told.
pub struct PostgresQuery {
    pub what: String,
    /// Server settings (`-c NAME=VALUE`).
    pub settings: Vec<String>,
    /// Run once the server is up, before the traced part (creating tables).
    pub setup: String,
    pub query: String,
}

struct StartedPostgres {
    server: Postgres,
    query: String,
}

impl Job for PostgresQuery {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn start(&self, shm_bytes: u64) -> Box<dyn Started> {
        let shm = format!("--shm-size={shm_bytes}b");
        let settings: Vec<&str> = self.settings.iter().map(String::as_str).collect();
        let server = Postgres::start("sizing-pg", &[&shm], &settings);
        server.query(&self.setup);
        Box::new(StartedPostgres {
            server,
            query: format!("{FORCE_PARALLEL} {}", self.query),
        })
    }
}

impl Started for StartedPostgres {
    fn container(&self) -> &str {
        &self.server.container.name
    }

    fn go(&mut self) -> bool {
        self.server.psql(&self.query).status.success()
    }
}

/// Whether `job` succeeds with a /dev/shm of `shm_bytes`.
pub fn works(job: &dyn Job, shm_bytes: u64) -> bool {
    job.start(shm_bytes).go()
}

/// How many runs in a row a size must pass before bisection calls it working. A workload whose
/// peak depends on timing (a fast DataLoader trainer) passes now and then with less than it
/// usually needs; one lucky pass made the reference smaller than any size a user could rely on.
const RUNS_TO_WORK: usize = 3;

/// Whether `job` succeeds with `shm_bytes` in each of [`RUNS_TO_WORK`] runs.
fn works_every_time(job: &dyn Job, shm_bytes: u64) -> bool {
    (0..RUNS_TO_WORK).all(|_| works(job, shm_bytes))
}

/// The smallest /dev/shm, in steps of `step` bytes, with which `job` succeeds every time, by
/// bisection between `fails` (where it must fail) and `works_at` (where it must succeed).
pub fn smallest_working(job: &dyn Job, fails: u64, works_at: u64, step: u64) -> u64 {
    let (mut lo, mut hi) = (fails / step, works_at.div_ceil(step));
    assert!(
        works(job, hi * step),
        "{} fails even with {} MiB of /dev/shm",
        job.describe(),
        hi * step / MIB
    );
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if works_every_time(job, mid * step) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi * step
}

/// What shmtrace advised after the job failed.
pub struct Failed {
    pub succeeded: bool,
    /// The largest size any diagnosis advised.
    pub advised: Option<u64>,
    pub basis: String,
    pub log: String,
    /// What shmtrace wrote (`--json`).
    pub records: Vec<Value>,
}

/// Runs `job` with `shm_bytes` traced by `shmtrace --container`, and reads the advice.
pub fn advice_after_failure(job: &dyn Job, shm_bytes: u64) -> Failed {
    require_root();
    require_docker();
    let mut started = job.start(shm_bytes);
    let tracer = LiveTracer::start(&["--container", started.container()]);
    let succeeded = started.go();
    let (_, log, records) = tracer.stop();
    let best = records
        .iter()
        .filter(|r| r["event"] == "diagnosis")
        .filter_map(|r| {
            let rec = &r["recommendation"];
            Some((
                rec["min_bytes"].as_u64()?,
                rec["basis"].as_str()?.to_owned(),
            ))
        })
        .max();
    Failed {
        succeeded,
        advised: best.as_ref().map(|(bytes, _)| *bytes),
        basis: best.map(|(_, basis)| basis).unwrap_or_default(),
        log: log
            + &records
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        records,
    }
}

/// What `shmtrace size` said.
pub struct Sized {
    pub succeeded: bool,
    /// shmtrace's exit status: 130 after Ctrl-C; with --budget 0 fits, 3 over budget, 4 the
    /// command failed.
    pub status: Option<i32>,
    pub report: Value,
    pub log: String,
}

impl Sized {
    /// The size advised for the job's /dev/shm.
    pub fn advised(&self) -> u64 {
        self.report["shm"][0]["advice"]["min_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("no advice in {}\n{}", self.report, self.log))
    }
}

/// `shmtrace size --json --container NAME [extra]` around one run of `job` with a roomy
/// /dev/shm of `shm_bytes`, stopped with Ctrl-C once it finished.
pub fn size(job: &dyn Job, shm_bytes: u64, extra: &[&str]) -> Sized {
    require_root();
    require_docker();
    let mut started = job.start(shm_bytes);
    let out = tempdir().join("size.json");
    let mut child = shmtrace()
        .args(["size", "--json", "-o"])
        .arg(&out)
        .args(["--container", started.container()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting shmtrace size");
    let mut log = wait_until_tracing(&mut child);
    let succeeded = started.go();
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = wait(&mut child);
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut rest);
    log.push_str(&rest);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let report = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("shmtrace size wrote {text:?} ({e}); stderr:\n{log}"));
    let _ = std::fs::remove_file(&out);
    Sized {
        succeeded,
        status,
        report,
        log,
    }
}

fn wait_until_tracing(child: &mut Child) -> String {
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    loop {
        let mut line = String::new();
        let n = stderr.read_line(&mut line).unwrap();
        assert!(n > 0, "shmtrace size ended before tracing:\n{log}");
        log.push_str(&line);
        if line.starts_with("shmtrace: tracing") {
            break;
        }
    }
    child.stderr = Some(stderr.into_inner());
    log
}

fn wait(child: &mut Child) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "shmtrace size did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Docker flags that mount the workload scripts (`tests/workloads`) at /w.
pub fn workloads_mount() -> Vec<String> {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "workloads"].iter().collect();
    vec!["-v".to_owned(), format!("{}:/w:ro", dir.display())]
}
