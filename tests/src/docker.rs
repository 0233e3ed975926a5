//! Real Docker containers for the end-to-end tests: a busybox image made locally with
//! `docker import` (no registry is needed), the scenario program bind-mounted with the host's
//! libraries, and containers removed when their handle drops, even when a test fails.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use crate::{exerciser, tempdir};

/// The test image's repository; its tag is a digest of what goes into it (see [`image`]).
pub const IMAGE_REPOSITORY: &str = "shmtrace-e2e";
/// Busybox applets the tests' shell scripts use.
const APPLETS: [&str; 12] = [
    "sh", "sleep", "dd", "touch", "cat", "ls", "rm", "test", "true", "echo", "mkdir", "[",
];
/// Directories of the image's root file system.
const DIRS: [&str; 6] = ["dev/shm", "tmp", "proc", "sys", "work", "x"];
const BUSYBOX: &str = "/bin/busybox";

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

/// The test image, imported once from the host's static busybox, as
/// `shmtrace-e2e:<digest>`. The tag is a digest of the image's content (busybox, applets,
/// directories): test runs of different checkouts on one machine, at the same time or not,
/// share an image only when it is the same, and an image from an older checkout that lacks
/// an applet is never taken for this one's.
pub fn image() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        require_docker();
        let busybox = std::fs::read(BUSYBOX)
            .unwrap_or_else(|e| panic!("{BUSYBOX}: {e} (apt-get install busybox-static)"));
        let tag = format!("{IMAGE_REPOSITORY}:{:016x}", content_digest(&busybox));
        if docker(&["image", "inspect", &tag]).status.success() {
            return tag;
        }
        let root = tempdir().join("rootfs");
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for dir in DIRS {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        // Never executed here (only in containers, from Docker's copy): no ETXTBSY.
        std::fs::write(bin.join("busybox"), &busybox).unwrap();
        std::fs::set_permissions(
            bin.join("busybox"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        for applet in APPLETS {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
        }
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "tar -C {} -c . | docker import - {tag} >/dev/null",
                root.display()
            ))
            .status()
            .unwrap();
        assert!(status.success(), "docker import of the test image failed");
        let _ = std::fs::remove_dir_all(root);
        tag
    })
}

/// FNV-1a over everything the image is made of: stable across runs and Rust versions.
fn content_digest(busybox: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let parts = APPLETS.iter().chain(DIRS.iter()).map(|s| s.as_bytes());
    for part in parts.chain([busybox]) {
        for byte in part.iter().chain([&0u8]) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
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
        Container::run_named(&Container::name_for(prefix), extra, script)
    }

    /// A name no other container of any test run has: `prefix`, this process, a counter.
    pub fn name_for(prefix: &str) -> String {
        format!("{prefix}-{}-{}", std::process::id(), unique())
    }

    /// As [`Container::run`], under exactly this name (one shmtrace waits for).
    pub fn run_named(name: &str, extra: &[&str], script: &str) -> Container {
        let name = name.to_owned();
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

/// Waits until `path` exists (a script's "I am ready" mark), up to a minute.
pub fn wait_for(path: &Path) {
    // Generous: container start and exec are slow on a loaded 2-core machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
