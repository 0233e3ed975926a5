//! What the tests of the container runtimes' clients share (`tests/tests/*_runtimes.rs`): a
//! busybox image made here and imported with `docker import` (no registry), unique names, and
//! waiting for a runtime to come up.
use std::{
    path::Path,
    process::{Command, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

pub const SOCKET: &str = "/var/run/docker.sock";
pub const IMAGE: &str = "shmtrace-container-test:1";

/// Runs the docker CLI; panics with its stderr when it fails.
pub fn docker(args: &[&str]) -> String {
    cli("docker", &[], args, "install docker.io")
}

/// Runs a container runtime's CLI with `global` options before `args`, and returns its
/// trimmed stdout; panics with its stderr when it fails, or with `install` when it is missing.
pub fn cli(program: &str, global: &[&str], args: &[&str], install: &str) -> String {
    let output = Command::new(program)
        .args(global)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}); {install}"));
    assert!(
        output.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Checks the daemon answers and makes the test image, once per test process.
pub fn image() -> &'static str {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        let version = Command::new("docker")
            .args(["version", "--format", "{{.Server.Version}}"])
            .output();
        match version {
            Ok(out) if out.status.success() => {}
            other => panic!(
                "Docker is not reachable at {SOCKET}, and these tests need it: start it with \
                 `dockerd --bridge=none --iptables=false &` (as root). ({other:?})"
            ),
        }
        import_busybox_image(IMAGE, &[]);
    });
    IMAGE
}

/// `docker import` of a root file system holding a static busybox and its applet links, as
/// `tag`, with Dockerfile-like `changes` (`ENTRYPOINT [...]`).
pub fn import_busybox_image(tag: &str, changes: &[&str]) {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("no busybox: install busybox-static");
    let root = std::env::temp_dir().join(unique("rootfs"));
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // List the applets with the host's busybox, never by running the copy: a thread of this
    // test process that forks while the copy is still open for writing lends its child that
    // descriptor, and exec of the copy then fails with ETXTBSY.
    let applets = Command::new(busybox).arg("--list").output().unwrap();
    assert!(applets.status.success(), "{busybox} --list failed");
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    for applet in String::from_utf8_lossy(&applets.stdout).lines() {
        let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
    }
    for dir in ["dev", "proc", "sys", "tmp", "etc"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .expect("tar");
    let mut args = vec!["import"];
    for change in changes {
        args.extend(["--change", change]);
    }
    args.extend(["-", tag]);
    let import = Command::new("docker")
        .args(&args)
        .stdin(tar.stdout.take().unwrap())
        .output()
        .expect("docker import");
    assert!(
        tar.wait().unwrap().success(),
        "tar of the test root file system"
    );
    assert!(
        import.status.success(),
        "docker import failed: {}",
        String::from_utf8_lossy(&import.stderr)
    );
    let _ = std::fs::remove_dir_all(&root);
}

pub fn unique(what: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "shmtrace-test-{}-{}-{what}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Polls `ready` for up to a minute: containerd and podman take many seconds to start on a
/// loaded 2-core machine.
pub fn wait_for(mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting");
        std::thread::sleep(Duration::from_millis(100));
    }
}
