//! Real Docker containers for the end-to-end tests: a busybox image made locally with
//! `docker import` (no registry is needed), the scenario program bind-mounted with the host's
//! libraries, and containers removed when their handle drops, even when a test fails.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use crate::{exerciser, tempdir};

pub const IMAGE: &str = "shmtrace-e2e:1";
/// Busybox applets the tests' shell scripts use.
const APPLETS: [&str; 12] = [
    "sh", "sleep", "dd", "touch", "cat", "ls", "rm", "test", "true", "echo", "mkdir", "[",
];

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("running docker (apt-get install docker.io)")
}

/// Fails loudly unless a Docker daemon answers: these tests must not pass by skipping.
pub fn require_docker() {
    let output = docker(&["version", "--format", "{{.Server.Version}}"]);
    assert!(
        output.status.success(),
        "no Docker daemon answers: start it (dockerd --bridge=none --iptables=false &), as \
         .ci/run does: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The test image, imported once per run from the host's static busybox.
pub fn image() -> &'static str {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        require_docker();
        if docker(&["image", "inspect", IMAGE]).status.success() {
            return;
        }
        let root = tempdir().join("rootfs");
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for dir in ["dev/shm", "tmp", "proc", "sys", "work", "x"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        std::fs::copy("/bin/busybox", bin.join("busybox"))
            .expect("/bin/busybox (apt-get install busybox-static)");
        for applet in APPLETS {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
        }
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "tar -C {} -c . | docker import - {IMAGE} >/dev/null",
                root.display()
            ))
            .status()
            .unwrap();
        assert!(status.success(), "docker import of the test image failed");
        let _ = std::fs::remove_dir_all(root);
    });
    IMAGE
}

/// A running container; removed on drop.
pub struct Container {
    pub name: String,
    /// Host directory mounted at /work in the container.
    pub work: PathBuf,
}

impl Container {
    /// `docker run -d` of `script` (busybox sh) with `extra` docker flags. The scenario program
    /// is at /x/shm-exerciser, with the host's /lib, /lib64 and /usr read-only so it runs.
    pub fn run(prefix: &str, extra: &[&str], script: &str) -> Container {
        let name = format!("{prefix}-{}-{}", std::process::id(), unique());
        let work = tempdir();
        let exerciser = exerciser();
        let mut args = vec![
            "run".to_owned(),
            "-d".to_owned(),
            "--name".to_owned(),
            name.clone(),
            "--network".to_owned(),
            "none".to_owned(),
        ];
        for (host, inside) in [("/lib", "/lib"), ("/lib64", "/lib64"), ("/usr", "/usr")] {
            args.push("-v".to_owned());
            args.push(format!("{host}:{inside}:ro"));
        }
        args.push("-v".to_owned());
        args.push(format!("{}:/x/shm-exerciser:ro", exerciser.display()));
        args.push("-v".to_owned());
        args.push(format!("{}:/work", work.display()));
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args.push(image().to_owned());
        args.extend(["sh".to_owned(), "-c".to_owned(), script.to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = docker(&args);
        assert!(
            output.status.success(),
            "docker run failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Container { name, work }
    }

    /// Creates /work/NAME, which the container's script may wait for.
    pub fn signal(&self, file: &str) {
        std::fs::write(self.work.join(file), b"").unwrap();
    }

    pub fn exec(&self, command: &[&str]) -> Output {
        let mut args = vec!["exec", self.name.as_str()];
        args.extend(command);
        docker(&args)
    }

    pub fn restart(&self) {
        let output = docker(&["restart", "-t", "0", &self.name]);
        assert!(output.status.success(), "docker restart failed");
    }

    /// Waits for the container to stop, and returns its exit code.
    pub fn wait(&self) -> i64 {
        let output = docker(&["wait", &self.name]);
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap_or(-1)
    }

    pub fn pid(&self) -> u32 {
        let output = docker(&["inspect", "--format", "{{.State.Pid}}", &self.name]);
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.name]);
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

fn unique() -> usize {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Waits until `path` exists (a script's "I am ready" mark), up to ten seconds.
pub fn wait_for(path: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
