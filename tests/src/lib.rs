//! Helpers for the end-to-end tests: the real shmtrace binary, run as root against the real
//! kernel, its JSON output parsed; real Docker containers in `docker`.
pub mod bpf_objects;
pub mod command;
pub mod corpus;
pub mod daemon;
pub mod diagnosis;
pub mod docker;
pub mod flood;
pub mod hardening;
pub mod live;
pub mod postgres;
pub mod prometheus;
pub mod pytorch;
pub mod ray;
pub mod recording;
pub mod runtimes;
pub mod shared_shm;
pub mod sizing;
pub mod unprivileged;
pub mod venv;
pub mod watchdog;
pub mod without_root;
pub mod workload;
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use serde_json::Value;

/// Fails the test, loudly, unless it runs as root: these tests load eBPF programs and mount
/// file systems, and a skipped test would pass silently. A suite that needs root is declared
/// in tests/Cargo.toml with `required-features = ["root"]`, so that a plain `cargo test` leaves
/// it out; one that is not fails here even as root.
pub fn require_root() {
    if !cfg!(feature = "root") {
        panic!(
            "this suite needs root: declare it in tests/Cargo.toml with required-features = \
             [\"root\"] (cargo xtask test turns the feature on)"
        );
    }
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

/// The shmtrace binary, built once per test run from the workspace's current sources; or, in a
/// guest of the kernel matrix (`cargo xtask vm-test`), which has no cargo, the one
/// `SHMTRACE_BIN` names.
pub fn shmtrace_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(prebuilt) = std::env::var_os("SHMTRACE_BIN") {
            return PathBuf::from(prebuilt);
        }
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

/// `limit` stretched by `SHMTRACE_TEST_TIME_SCALE` (default 1): a guest of the kernel matrix
/// runs under software emulation, several times slower than the host, and sets it.
pub fn scaled(limit: std::time::Duration) -> std::time::Duration {
    let scale = std::env::var("SHMTRACE_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    limit * scale
}

/// The call `unlink(3)` makes, as the trace names it: arm64, like every architecture on the
/// generic system call table, has no `unlink` system call, and glibc's `unlink` calls
/// `unlinkat(AT_FDCWD, path, 0)` there.
pub const UNLINK: &str = if cfg!(target_arch = "x86_64") {
    "unlink"
} else {
    "unlinkat"
};

/// The scenario program, which cargo builds next to the test binaries (`target/<profile>/`).
pub fn exerciser() -> PathBuf {
    let test_binary = std::env::current_exe().expect("the test binary's path");
    // Test binaries live in target/<profile>/deps, the crate's own binaries (the corpus
    // recorder) beside it.
    let dir = test_binary.parent().expect("a binary's directory");
    let profile_dir = if dir.ends_with("deps") {
        dir.parent().expect("target/<profile>")
    } else {
        dir
    };
    let path = profile_dir.join("shm-exerciser");
    assert!(
        path.exists(),
        "{} is missing: cargo builds it with the tests",
        path.display()
    );
    path
}

/// A command running shmtrace, whose run is checked to leave no BPF object behind.
pub fn shmtrace() -> command::ShmtraceCommand {
    command::ShmtraceCommand::from_command(Command::new(shmtrace_bin()))
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
    let mut command = vec![exerciser().into_os_string()];
    command.extend(args.iter().map(Into::into));
    trace_command(flags, &command)
}

/// Runs `shmtrace --json [flags] -- COMMAND` and parses its output.
pub fn trace_command(flags: &[&str], command: &[impl AsRef<std::ffi::OsStr>]) -> Trace {
    require_root();
    let dir = tempdir();
    let out = dir.join("trace.jsonl");
    let output = shmtrace()
        .args(["--json", "-o"])
        .arg(&out)
        .args(flags)
        .arg("--")
        .args(command)
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

/// A fresh directory for one test's files, made by this call: never one a crashed earlier
/// run left behind (its files would pass for this run's) nor one planted by someone else in
/// the shared /tmp (tests run as root). The name holds the pid, a counter and the time, so
/// concurrent test processes, here or in other checkouts, never share one.
pub fn tempdir() -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    loop {
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "shmtrace-test-{}-{n}-{nanos:x}",
            std::process::id()
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("cannot make {}: {e}", dir.display()),
        }
    }
}

/// Serialises the tests of one test binary: host-wide tracing (`--all`) sees the /dev/shm
/// activity of every test running beside it, and the loss tests measure how a burst fills the
/// ring buffer. (The leak check needs no lock: it follows one shmtrace's own objects.)
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
