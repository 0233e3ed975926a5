//! Helpers for the end-to-end tests: the real shmtrace binary, run as root against the real
//! kernel, its JSON output parsed; real Docker containers in `docker`.
pub mod daemon;
pub mod docker;
pub mod live;
pub mod postgres;
pub mod prometheus;
pub mod recording;
pub mod runtimes;
pub mod workload;
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use serde_json::Value;

/// Fails the test, loudly, unless it runs as root: these tests load eBPF programs and mount
/// file systems, and a skipped test would pass silently.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these end-to-end tests load eBPF programs and must run as root (sudo cargo xtask test)"
    );
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The shmtrace binary, built once per test run from the workspace's current sources.
pub fn shmtrace_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(workspace())
            .args([
                "build",
                "--quiet",
                "--package",
                "shmtrace",
                "--bin",
                "shmtrace",
            ])
            .status()
            .expect("running cargo build");
        assert!(status.success(), "building shmtrace failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace().join("target"));
        target.join("debug/shmtrace")
    })
}

/// The scenario program, which cargo builds next to the test binaries (`target/<profile>/`).
pub fn exerciser() -> PathBuf {
    let test_binary = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test_binary
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps");
    let path = profile_dir.join("shm-exerciser");
    assert!(
        path.exists(),
        "{} is missing: cargo builds it with the tests",
        path.display()
    );
    path
}

pub fn shmtrace() -> Command {
    Command::new(shmtrace_bin())
}

/// A finished trace: exit status, stderr, and the JSON records it wrote.
pub struct Trace {
    pub output: Output,
    pub records: Vec<Value>,
}

impl Trace {
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// Records whose `event` field is `name`.
    pub fn events(&self, name: &str) -> Vec<&Value> {
        self.records.iter().filter(|r| r["event"] == name).collect()
    }

    pub fn summary(&self) -> &Value {
        self.records
            .iter()
            .rev()
            .find(|r| r["event"] == "summary")
            .unwrap_or_else(|| panic!("no summary record; stderr:\n{}", self.stderr()))
    }

    /// Renders every record, for assertion messages.
    pub fn dump(&self) -> String {
        let mut text: Vec<String> = self.records.iter().map(Value::to_string).collect();
        text.push(format!("stderr: {}", self.stderr()));
        text.join("\n")
    }
}

/// Runs `shmtrace --json [flags] -- shm-exerciser ARGS` and parses its output.
pub fn trace_exerciser(flags: &[&str], args: &[&str]) -> Trace {
    require_root();
    let dir = tempdir();
    let out = dir.join("trace.jsonl");
    let output = shmtrace()
        .args(["--json", "-o"])
        .arg(&out)
        .args(flags)
        .arg("--")
        .arg(exerciser())
        .args(args)
        .output()
        .expect("running shmtrace");
    let records = read_json_lines(&out);
    let _ = std::fs::remove_dir_all(&dir);
    Trace { output, records }
}

pub fn read_json_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON line {line:?}: {e}"))
        })
        .collect()
}

/// A fresh directory for one test's files.
pub fn tempdir() -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("shmtrace-test-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The BPF programs loaded in the kernel now: (id, name).
pub fn loaded_bpf_programs() -> Vec<(u64, String)> {
    let output = Command::new("bpftool")
        .args(["prog", "list", "--json"])
        .output()
        .expect("bpftool (apt-get install bpftool)");
    let list: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    list.as_array()
        .map(|progs| {
            progs
                .iter()
                .filter_map(|p| Some((p["id"].as_u64()?, p["name"].as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a program name is one of shmtrace's (the kernel keeps 15 characters of it).
fn is_shmtrace_program(name: &str) -> bool {
    name.starts_with("sys_enter_")
        || name.starts_with("sys_exit_")
        || name == "signal_generate"
        || name.starts_with("sched_process_")
        || name == "task_rename"
        || name == "mark_victim"
}

/// The highest program id loaded now. Ids only grow: a program with a higher id was loaded
/// later.
pub fn bpf_program_watermark() -> u64 {
    loaded_bpf_programs()
        .iter()
        .map(|(id, _)| *id)
        .max()
        .unwrap_or(0)
}

/// Ids of the BPF programs some live process holds a descriptor to (`prog_id:` in
/// /proc/PID/fdinfo): a running tracer's programs.
fn held_bpf_programs() -> std::collections::HashSet<u64> {
    let mut held = std::collections::HashSet::new();
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return held;
    };
    for process in processes.filter_map(Result::ok) {
        let Ok(fds) = std::fs::read_dir(process.path().join("fdinfo")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            let Ok(info) = std::fs::read_to_string(fd.path()) else {
                continue;
            };
            held.extend(
                info.lines()
                    .filter_map(|line| line.strip_prefix("prog_id:"))
                    .filter_map(|id| id.trim().parse::<u64>().ok()),
            );
        }
    }
    held
}

/// Waits (up to 5 s: the kernel frees programs after an RCU grace period) until no shmtrace
/// program loaded after `watermark` is left that no live process holds: a tracer that exited
/// must leave nothing behind, while another one still running (another test's, say) keeps
/// its own.
pub fn assert_no_shmtrace_programs_left_since(watermark: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let held = held_bpf_programs();
        let left: Vec<(u64, String)> = loaded_bpf_programs()
            .into_iter()
            .filter(|(id, name)| *id > watermark && is_shmtrace_program(name))
            .filter(|(id, _)| !held.contains(id))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "shmtrace programs still loaded after exit: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Serialises the tests of one test binary: some of them check what is loaded in the kernel,
/// which other shmtrace processes running at the same time would disturb.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
