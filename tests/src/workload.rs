//! The Python workloads of `tests/workloads/` (stdlib only, see its README), run against a real
//! small /dev/shm: a tmpfs of an exact size in a private mount namespace, or a Docker container
//! with `--shm-size`; traced by the real binary or not.
use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    Trace,
    command::ShmtraceCommand,
    docker::{Container, require_docker},
    live::LiveTracer,
    read_json_lines, require_root, shmtrace, shmtrace_bin, tempdir,
};

/// Debian's interpreter: the `python3` on PATH may be a pyenv shim, a shell script that forks
/// helpers the tracer would follow. Containers see the same file through the /usr bind mount.
pub const PYTHON: &str = "/usr/bin/python3";

/// No workload runs longer than this (their own timeouts are 5 s); a hung one fails the test.
const DEADLINE: Duration = Duration::from_secs(90);

/// Mounts a tmpfs of `$1` bytes on /dev/shm in the current (fresh) mount namespace, then runs
/// the rest of the arguments there.
const PRIVATE_SHM: &str = "set -e; mount --make-rprivate /; \
     mount -t tmpfs -o size=\"$1\" shmtrace-test /dev/shm; shift; exec \"$@\"";

/// The ordinary user the unprivileged runs are made as, with no capability at all.
pub const USER: &str = "1000";

pub const MIB: u64 = 1 << 20;

fn workloads_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads")
}

/// One invocation of a workload script.
#[derive(Clone, Debug)]
pub struct Workload {
    pub script: &'static str,
    pub args: Vec<String>,
    /// Extra environment variables (`NCCL_SHM_DISABLE=1`).
    pub env: Vec<(String, String)>,
}

impl Workload {
    pub fn new(script: &'static str, args: &[&str]) -> Workload {
        assert!(
            Path::new(PYTHON).exists(),
            "{PYTHON} is missing (apt-get install python3)"
        );
        Workload {
            script,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: Vec::new(),
        }
    }

    /// The same invocation with `key=value` in its environment.
    pub fn env(mut self, key: &str, value: &str) -> Workload {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// `python3 -B DIR/SCRIPT ARGS`, with the scripts in `dir`.
    fn argv(&self, dir: &Path) -> Vec<String> {
        let mut argv = vec![
            PYTHON.to_owned(),
            "-B".to_owned(),
            dir.join(self.script).display().to_string(),
        ];
        argv.extend(self.args.iter().cloned());
        argv
    }

    /// The /dev/shm bytes this invocation needs, as the script computes them
    /// (`--required-shm`; the README's formulas, measured tight).
    pub fn required_shm(&self) -> u64 {
        let mut query = self.clone();
        query.args.push("--required-shm".to_owned());
        let text = query.output();
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{query:?} printed {text:?}, not a size"))
    }

    /// Runs the script on the host, untraced, and returns what it printed; for the flags that
    /// only compute (`--required-shm`, `--required-nofile`).
    pub fn output(&self) -> String {
        let argv = self.argv(&workloads_dir());
        let output = Command::new(&argv[0])
            .args(&argv[1..])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("running a workload");
        assert!(
            output.status.success(),
            "{argv:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `shmtrace --json -- unshare -m ... python3 SCRIPT`: the workload in a private mount
    /// namespace whose /dev/shm is a tmpfs of exactly `shm_bytes`; shmtrace stays in the host's
    /// namespace, as it would beside a container.
    pub fn trace_in_private_shm(&self, shm_bytes: u64) -> Trace {
        require_root();
        let dir = tempdir();
        let out = dir.join("trace.jsonl");
        let mut command = shmtrace();
        command
            .args(["--json", "-o"])
            .arg(&out)
            .args(["--", "unshare", "-m", "sh", "-c", PRIVATE_SHM, "sh"])
            .arg(shm_bytes.to_string())
            .args(self.argv(&workloads_dir()))
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        let output = run(command, &dir);
        let records = read_json_lines(&out);
        let _ = std::fs::remove_dir_all(&dir);
        Trace { output, records }
    }

    /// As [`Workload::trace_in_private_shm`], but shmtrace runs inside the namespace as an
    /// ordinary user (uid 1000, no capability), so that its ptrace source traces the workload.
    pub fn trace_unprivileged_in_private_shm(&self, shm_bytes: u64) -> Trace {
        require_root();
        let dir = tempdir();
        // The ordinary user writes the trace there.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let out = dir.join("trace.jsonl");
        let mut command = ShmtraceCommand::from_command(Command::new("unshare"));
        command
            .args(["-m", "sh", "-c", PRIVATE_SHM, "sh"])
            .arg(shm_bytes.to_string())
            .args([
                "setpriv",
                "--reuid",
                USER,
                "--regid",
                USER,
                "--clear-groups",
            ])
            .args(["--inh-caps=-all", "--bounding-set=-all"])
            .arg(shmtrace_bin())
            .args(["--backend", "ptrace", "--json", "-o"])
            .arg(&out)
            .arg("--")
            .args(self.argv(&workloads_dir()))
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        let output = run(command, &dir);
        let records = read_json_lines(&out);
        let _ = std::fs::remove_dir_all(&dir);
        Trace { output, records }
    }

    /// The workload in a Docker container with `--shm-size <shm_bytes>b`, traced from its start
    /// with `shmtrace --container NAME`. Returns the container's name, its exit code and the
    /// trace.
    pub fn trace_in_docker(&self, shm_bytes: u64) -> DockerRun {
        require_root();
        require_docker();
        let shm_size = format!("{shm_bytes}b");
        let mount = format!("{}:/w:ro", workloads_dir().display());
        let command = self
            .argv(Path::new("/w"))
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ");
        // PID 1 is the shell, as in most images' entrypoints: the workload is not PID 1, whose
        // signal handling differs.
        let script = format!("while [ ! -e /work/go ]; do sleep 0.05; done; {command}");
        let mut flags = vec!["--shm-size".to_owned(), shm_size, "-v".to_owned(), mount];
        for (key, value) in &self.env {
            flags.extend(["-e".to_owned(), format!("{key}={value}")]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let container = Container::run("shmtrace-diag", &flags, &script);
        let tracer = LiveTracer::start(&["--container", &container.name]);
        container.signal("go");
        let exit_code = wait_container(&container);
        let (status, log, records) = tracer.stop();
        assert_eq!(
            status.code(),
            Some(130),
            "shmtrace stops on Ctrl-C with 130:\n{log}"
        );
        DockerRun {
            name: container.name.clone(),
            exit_code,
            records,
            log,
        }
    }
}

/// A traced container run.
pub struct DockerRun {
    pub name: String,
    pub exit_code: i64,
    pub records: Vec<Value>,
    /// shmtrace's stderr.
    pub log: String,
}

impl DockerRun {
    pub fn dump(&self) -> String {
        let mut text: Vec<String> = self.records.iter().map(Value::to_string).collect();
        text.push(format!("shmtrace stderr: {}", self.log));
        text.join("\n")
    }
}

/// `docker wait`, bounded by [`DEADLINE`].
fn wait_container(container: &Container) -> i64 {
    let mut child = Command::new("docker")
        .args(["wait", &container.name])
        .stdout(Stdio::piped())
        .spawn()
        .expect("running docker wait");
    // On a timeout the container is removed when its handle drops.
    wait_deadline(&mut child, &format!("container {}", container.name), || {});
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("docker wait printed {out:?}"))
}

/// Runs `command` with stdout and stderr in files under `dir` (so a chatty child cannot block
/// on a full pipe), bounded by [`DEADLINE`].
/// It runs in a process group of its own, which a timeout kills whole: a hung workload must not
/// outlive its test.
fn run(mut command: ShmtraceCommand, dir: &Path) -> Output {
    let stdout = dir.join("stdout");
    let stderr = dir.join("stderr");
    let mut child = command
        .stdout(File::create(&stdout).unwrap())
        .stderr(File::create(&stderr).unwrap())
        .process_group(0)
        .spawn()
        .expect("starting shmtrace");
    let group = child.id() as i32;
    let status = wait_deadline(&mut child, &format!("{command:?}"), || {
        // SAFETY: kill has no memory-safety preconditions; -group names the process group.
        unsafe { libc::kill(-group, libc::SIGKILL) };
    });
    child.assert_released();
    Output {
        status,
        stdout: std::fs::read(&stdout).unwrap_or_default(),
        stderr: std::fs::read(&stderr).unwrap_or_default(),
    }
}

fn wait_deadline(
    child: &mut std::process::Child,
    what: &str,
    kill: impl FnOnce(),
) -> std::process::ExitStatus {
    let limit = crate::scaled(DEADLINE);
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            kill();
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn shell_quote(arg: &str) -> String {
    if arg
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./=".contains(c))
    {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}
