//! Running shmtrace as the users of issue 34 do: inside an ordinary container, with no
//! privilege, the test binary bind-mounted at /x/shmtrace.
//!
//! - Docker: as user 1000, every capability dropped, `no-new-privileges`, Docker's default
//!   seccomp profile.
//! - Rootless Podman, run by an ordinary user of this machine ([`ROOTLESS_USER`], with its
//!   /etc/subuid and /etc/subgid ranges, made here as .ci/run makes them, idempotently); inside,
//!   Podman's default capabilities in its user namespace, and its default seccomp profile.
//!
//! Both get the host's libraries, Python and the PyTorch venv read-only, a /tmp of their own
//! (a 1777 directory: the test image's /tmp is root's) and a /work directory the test reads.
use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use crate::{
    docker::{self, require_docker},
    pytorch, shmtrace_bin, tempdir,
};

/// The ordinary user that runs rootless Podman.
pub const ROOTLESS_USER: &str = "shmtrace-rootless";
/// Its subordinate id ranges.
const SUBIDS: &str = "300000:65536";

/// A container runtime, run without privilege.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    Docker,
    RootlessPodman,
}

impl Runtime {
    /// `docker` as root (the daemon), or `podman` as [`ROOTLESS_USER`].
    fn command(self) -> Command {
        match self {
            Runtime::Docker => {
                require_docker();
                Command::new("docker")
            }
            Runtime::RootlessPodman => {
                let user = rootless_user();
                let mut command = Command::new("setpriv");
                command
                    .arg(format!("--reuid={}", user.uid))
                    .arg(format!("--regid={}", user.gid))
                    .arg("--init-groups")
                    .arg("env")
                    .arg(format!("HOME={}", user.home.display()))
                    .arg(format!("USER={ROOTLESS_USER}"))
                    .arg(format!("XDG_RUNTIME_DIR=/run/user/{}", user.uid))
                    .arg("podman")
                    // No systemd here: cgroups are managed through their file system.
                    .arg("--cgroup-manager=cgroupfs");
                command
            }
        }
    }

    /// The test image, in this runtime's store.
    fn image(self) -> &'static str {
        match self {
            Runtime::Docker => docker::image(),
            Runtime::RootlessPodman => {
                static IMAGE: OnceLock<String> = OnceLock::new();
                IMAGE.get_or_init(|| {
                    let tag = docker::image();
                    let local = format!("localhost/{tag}");
                    let present = Runtime::RootlessPodman
                        .command()
                        .args(["image", "exists", &local])
                        .status()
                        .is_ok_and(|s| s.success());
                    if !present {
                        // Docker's copy, saved for the ordinary user to load.
                        let dir = shared_dir();
                        let archive = dir.join("image.tar");
                        let saved = Command::new("docker")
                            .args(["save", "-o"])
                            .arg(&archive)
                            .arg(tag)
                            .status()
                            .unwrap();
                        assert!(saved.success(), "docker save {tag}");
                        make_readable(&archive);
                        let loaded = Runtime::RootlessPodman
                            .command()
                            .args(["load", "-i"])
                            .arg(&archive)
                            .output()
                            .unwrap();
                        assert!(
                            loaded.status.success(),
                            "rootless podman load: {}",
                            String::from_utf8_lossy(&loaded.stderr)
                        );
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                    local
                })
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Runtime::Docker => "Docker",
            Runtime::RootlessPodman => "rootless Podman",
        }
    }
}

/// The rootless user's ids and home.
struct User {
    uid: u32,
    gid: u32,
    home: PathBuf,
}

/// Makes the rootless user if it is missing, with its subordinate ids and runtime directory,
/// as .ci/run does.
fn rootless_user() -> &'static User {
    static USER: OnceLock<User> = OnceLock::new();
    USER.get_or_init(|| {
        let id = |flag: &str| -> Option<u32> {
            let out = Command::new("id")
                .args([flag, ROOTLESS_USER])
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        };
        if id("-u").is_none() {
            let made = Command::new("useradd")
                .args(["--create-home", "--shell", "/bin/sh", ROOTLESS_USER])
                .status()
                .expect("running useradd");
            assert!(made.success(), "useradd {ROOTLESS_USER}");
        }
        for file in ["/etc/subuid", "/etc/subgid"] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if !text
                .lines()
                .any(|l| l.starts_with(&format!("{ROOTLESS_USER}:")))
            {
                let mut text = text;
                text.push_str(&format!("{ROOTLESS_USER}:{SUBIDS}\n"));
                std::fs::write(file, text).unwrap();
            }
        }
        assert!(
            Path::new("/usr/bin/newuidmap").exists(),
            "rootless Podman needs newuidmap: apt-get install uidmap (.ci/run does)"
        );
        let uid = id("-u").expect("the rootless user's uid");
        let gid = id("-g").expect("the rootless user's gid");
        let runtime_dir = PathBuf::from(format!("/run/user/{uid}"));
        std::fs::create_dir_all(&runtime_dir).unwrap();
        nix::unistd::chown(
            &runtime_dir,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .unwrap();
        std::fs::set_permissions(&runtime_dir, PermissionsExt::from_mode(0o700)).unwrap();
        User {
            uid,
            gid,
            home: PathBuf::from(format!("/home/{ROOTLESS_USER}")),
        }
    })
}

/// A directory every user may read and write (the rootless user, the containers' users).
fn shared_dir() -> PathBuf {
    let dir = tempdir();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o1777)).unwrap();
    dir
}

fn make_readable(path: &Path) {
    std::fs::set_permissions(path, PermissionsExt::from_mode(0o644)).unwrap();
}

/// The rootless user must reach the binary: it is copied where anyone can read it.
fn shmtrace_for(runtime: Runtime) -> PathBuf {
    match runtime {
        Runtime::Docker => shmtrace_bin().to_owned(),
        Runtime::RootlessPodman => {
            static COPY: OnceLock<PathBuf> = OnceLock::new();
            COPY.get_or_init(|| {
                let dir = shared_dir();
                let copy = dir.join("shmtrace");
                std::fs::copy(shmtrace_bin(), &copy).unwrap();
                std::fs::set_permissions(&copy, PermissionsExt::from_mode(0o755)).unwrap();
                copy
            })
            .clone()
        }
    }
}

/// A container run to its end.
pub struct Run {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    /// Its /work, kept until the run is dropped.
    pub work: PathBuf,
    tmp: PathBuf,
}

impl Run {
    pub fn dump(&self) -> String {
        format!(
            "status {}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    /// The JSON lines shmtrace wrote among the workload's own stderr.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.stderr
            .lines()
            .filter(|line| line.starts_with('{'))
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// The flags every unprivileged container gets, mounting `work` at /work and `tmp` at /tmp.
fn flags(runtime: Runtime, work: &Path, tmp: &Path) -> Vec<String> {
    let mut flags: Vec<String> = ["--network", "none"].map(String::from).to_vec();
    for dir in ["/lib", "/lib64", "/usr"] {
        flags.push("-v".into());
        flags.push(format!("{dir}:{dir}:ro"));
    }
    flags.push("-v".into());
    flags.push(format!("{}:/work", work.display()));
    flags.extend(own_flags(runtime, tmp));
    flags
}

/// The user, the binary, /tmp and the workloads: what [`docker::Container::run`] does not
/// give a container itself.
fn own_flags(runtime: Runtime, tmp: &Path) -> Vec<String> {
    let mut flags = Vec::new();
    if runtime == Runtime::Docker {
        flags.extend(
            [
                "--user",
                "1000:1000",
                "--cap-drop",
                "ALL",
                "--security-opt",
                "no-new-privileges",
            ]
            .map(String::from),
        );
    }
    flags.push("-v".into());
    flags.push(format!(
        "{}:/x/shmtrace:ro",
        shmtrace_for(runtime).display()
    ));
    flags.push("-v".into());
    flags.push(format!("{}:/tmp", tmp.display()));
    flags.push("-v".into());
    flags.push(format!(
        "{}:/w:ro",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("workloads")
            .display()
    ));
    flags
}

/// The PyTorch venv, for containers that import torch.
pub fn pytorch_flags() -> Vec<String> {
    pytorch::docker_mounts()
}

/// Runs `script` (busybox sh) in an unprivileged container of `runtime`, to its end.
pub fn run(runtime: Runtime, prefix: &str, extra: &[&str], script: &str) -> Run {
    let (work, tmp) = (shared_dir(), shared_dir());
    let name = docker::Container::name_for(&format!("ptrace-{prefix}"));
    let mut command = runtime.command();
    command.args(["run", "--rm", "--name", &name]);
    command.args(flags(runtime, &work, &tmp));
    command.args(extra);
    command.arg(runtime.image());
    command.args(["sh", "-c", script]);
    let output: Output = command.output().expect("running the container runtime");
    Run {
        status: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        work,
        tmp,
    }
}

/// A Docker container that waits for /work/go before `script`, detached, so that shmtrace
/// on the host can follow it from its start; removed on drop.
pub struct Waiting {
    pub container: docker::Container,
    tmp: PathBuf,
}

impl Waiting {
    pub fn start(prefix: &str, extra: &[&str], script: &str) -> Waiting {
        let tmp = shared_dir();
        let mut all = own_flags(Runtime::Docker, &tmp);
        all.extend(extra.iter().map(|s| s.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let script = format!("while [ ! -e /work/go ]; do sleep 0.05; done; {script}");
        let container = docker::Container::run(&format!("ptrace-{prefix}"), &all, &script);
        // The ordinary user in it reads /work/go and writes there.
        std::fs::set_permissions(&container.work, PermissionsExt::from_mode(0o1777)).unwrap();
        Waiting { container, tmp }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// `docker logs` of a container: its stdout and its stderr.
pub fn docker_logs(name: &str) -> (String, String) {
    let output = Command::new("docker")
        .args(["logs", name])
        .output()
        .expect("running docker logs");
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
