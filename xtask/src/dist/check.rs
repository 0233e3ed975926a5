//! `cargo xtask dist --check`: the release artifacts installed and run as users would run
//! them, each judged by what it did.
//! - the x86-64 wheel, `pip install`ed into a fresh venv: `shmtrace demo` from its PATH, and,
//!   run by an ordinary user, a command traced with ptrace; the arm64 wheel installed by pip as
//!   for arm64 (`--platform`), holding the arm64 binary;
//! - the x86-64 binary inside Debian 11's root file system (glibc 2.31): `shmtrace demo`;
//! - the x86-64 image, run as the DaemonSet runs it beside a real container that fills its
//!   /dev/shm: its metrics must count that container's failure, by name.
//!
//! The arm64 artifacts cannot run on this x86-64 host: the kernel matrix runs the arm64
//! binary, and the demo from the arm64 image's root file system, in its arm64 guests
//! (docs/kernels.md).
use std::{
    fs,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::run;

/// The demo's output explains both of its failures.
fn judge_demo(output: &std::process::Output, how: &str) -> Result<()> {
    let text = String::from_utf8_lossy(&output.stdout);
    let explained = text.contains("ENOSPC (No space left on device)")
        && text.contains("+++ killed by SIGBUS +++")
        && text.contains("shmtrace diagnosis");
    if !output.status.success() || !explained {
        bail!(
            "`shmtrace demo` {how} exited with {} without explaining both failures:\n{text}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    println!("`shmtrace demo` {how}: both failures explained");
    Ok(())
}

/// `pip install` of the wheel into a fresh venv, then `shmtrace` from that venv's PATH.
pub fn wheel(wheel: &Path, scratch: &Path) -> Result<()> {
    let venv = scratch.join("venv");
    let _ = fs::remove_dir_all(&venv);
    fs::create_dir_all(scratch)?;
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--no-index"])
        .arg(wheel))?;
    let bin = venv.join("bin");
    let path = format!(
        "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        bin.display()
    );
    let output = Command::new("shmtrace")
        .args(["demo", "--color", "never"])
        .env("PATH", &path)
        .output()
        .context("running shmtrace from the venv's PATH")?;
    judge_demo(&output, &format!("from a venv with {}", wheel.display()))?;
    unprivileged(&venv.join("bin/shmtrace"), &path)
}

/// The installed `shmtrace`, run by an ordinary user with no capability, as in a notebook or
/// a training image: `--help` starts with the ptrace source, and a command is traced with it,
/// its status passed through, with the one line that says so.
fn unprivileged(installed: &Path, path: &str) -> Result<()> {
    // The installed file, where nobody can reach it whatever the checkout's permissions.
    let dir = std::env::temp_dir().join(format!("shmtrace-wheel-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let shmtrace = dir.join("shmtrace");
    fs::copy(installed, &shmtrace).context("copying the installed shmtrace")?;
    let result = run_unprivileged(&shmtrace, path);
    let _ = fs::remove_dir_all(&dir);
    result
}

fn run_unprivileged(shmtrace: &Path, path: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(
        shmtrace.parent().context("a directory")?,
        fs::Permissions::from_mode(0o755),
    )?;
    let as_nobody = || {
        let mut command = Command::new("setpriv");
        command
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(shmtrace)
            .env("PATH", path);
        command
    };
    let help = as_nobody()
        .arg("--help")
        .output()
        .context("running the installed shmtrace as nobody")?;
    let first = String::from_utf8_lossy(&help.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    if !first.starts_with("Here: ptrace") {
        bail!("--help as an ordinary user starts with {first:?}, not the ptrace source");
    }
    let traced = as_nobody()
        .args(["--", "sh", "-c", "exit 5"])
        .output()
        .context("tracing a command as nobody")?;
    let stderr = String::from_utf8_lossy(&traced.stderr);
    if traced.status.code() != Some(5) || !stderr.contains("tracing with ptrace instead") {
        bail!(
            "the installed shmtrace, run by nobody, did not trace with ptrace ({}):\n{stderr}",
            traced.status
        );
    }
    println!("the installed shmtrace, run by an ordinary user: {first}");
    Ok(())
}

/// A wheel of another architecture, which cannot run here, installed as pip installs it on
/// that architecture (`--platform` with its manylinux tag, into a directory of its own): pip
/// must take it, and put there, on the `bin` path, exactly the release binary.
pub fn foreign_wheel(
    pip: &Path,
    wheel: &Path,
    binary: &Path,
    platform: &str,
    scratch: &Path,
) -> Result<()> {
    let target = scratch.join(format!("pip-{platform}"));
    let _ = fs::remove_dir_all(&target);
    fs::create_dir_all(scratch)?;
    run(Command::new(pip)
        .args(["install", "--quiet", "--no-index", "--no-deps"])
        .args(["--only-binary=:all:", "--platform", platform, "--target"])
        .arg(&target)
        .arg(wheel))
    .with_context(|| format!("pip refused {} for {platform}", wheel.display()))?;
    let installed = target.join("bin/shmtrace");
    if fs::read(&installed).ok() != Some(fs::read(binary)?) {
        bail!(
            "pip installed {} from {}, not the release binary {}",
            installed.display(),
            wheel.display(),
            binary.display()
        );
    }
    println!(
        "pip installs {} for {platform}: the release binary on its bin path",
        wheel.display()
    );
    Ok(())
}

/// The binary in a Debian 11 root file system, whose glibc is 2.31: made once with
/// debootstrap, then entered with chroot and the kernel's file systems mounted inside.
pub fn bullseye(binary: &Path, scratch: &Path) -> Result<()> {
    let rootfs = scratch.join("bullseye");
    // Written once debootstrap has finished: a broken run leaves a tree that looks whole.
    let made = scratch.join("bullseye.made");
    if !made.exists() {
        let _ = fs::remove_dir_all(&rootfs);
        run(Command::new("debootstrap")
            .args(["--variant=minbase", "bullseye"])
            .arg(&rootfs)
            .arg(crate::debian::debian_mirror()?))
        .context("making a Debian 11 root file system (apt-get install debootstrap)")?;
        fs::write(&made, "")?;
    }
    let glibc = Command::new("chroot")
        .arg(&rootfs)
        .args(["ldd", "--version"])
        .output()?;
    let glibc = String::from_utf8_lossy(&glibc.stdout);
    println!(
        "Debian 11 root file system: {}",
        glibc.lines().next().unwrap_or("?")
    );
    fs::copy(binary, rootfs.join("usr/local/bin/shmtrace"))?;
    let mounts = Mounts::new(&rootfs)?;
    let output = Command::new("chroot")
        .arg(&rootfs)
        .args(["/usr/local/bin/shmtrace", "demo", "--color", "never"])
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .output()?;
    drop(mounts);
    judge_demo(&output, "in Debian 11 (chroot)")
}

/// The root file system as a mount point, with the kernel's file systems the probes need
/// mounted inside, all unmounted, innermost first, when dropped.
struct Mounts {
    mounted: Vec<PathBuf>,
}

impl Mounts {
    fn new(rootfs: &Path) -> Result<Mounts> {
        let mut mounts = Mounts {
            mounted: Vec::new(),
        };
        // The root file system on itself first: the demo makes every mount private from `/`,
        // which the kernel refuses (EINVAL) unless `/` is a mount point, as it is not in a bare
        // chroot.
        run(Command::new("mount").arg("--bind").arg(rootfs).arg(rootfs))?;
        mounts.mounted.push(rootfs.to_owned());
        for (what, kind) in [
            ("/proc", None),
            ("/sys", None),
            ("/sys/kernel/tracing", None),
            ("/sys/fs/bpf", None),
            ("/dev", None),
            ("/dev/shm", Some("tmpfs")),
        ] {
            let at = rootfs.join(what.trim_start_matches('/'));
            fs::create_dir_all(&at)?;
            let mut command = Command::new("mount");
            match kind {
                Some(kind) => command.args(["-t", kind, kind]),
                None => command.args(["--bind", what]),
            };
            run(command.arg(&at))?;
            mounts.mounted.push(at);
        }
        Ok(mounts)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for at in self.mounted.iter().rev() {
            // shmtrace's detachers (docs/probes.md, Detaching) live on inside the chroot for
            // a second or two after it exits, keeping the root busy: wait for them, then let
            // the kernel finish the unmount itself.
            let unmounted = (0..10).any(|attempt| {
                if attempt > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
                Command::new("umount")
                    .arg(at)
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            });
            if !unmounted {
                let _ = Command::new("umount").arg("--lazy").arg(at).status();
            }
        }
    }
}

/// The name of the check's daemon container, and of the container that fails beside it.
const DAEMON: &str = "shmtrace-dist-check";
const WORKLOAD: &str = "shmtrace-dist-workload";

/// The image `tag` run as deploy/kubernetes/daemonset.yaml runs it: the host's pids, the
/// capabilities it adds and no others (but for their names, below), a read-only root, the kernel's BTF and tracefs, and the
/// runtime's socket. A busybox container then fills a 1 MiB /dev/shm; the daemon's metrics
/// must count that failure under the container's name.
pub fn image_runs(tag: &str) -> Result<()> {
    let _ = Command::new("docker")
        .args(["rm", "--force", DAEMON, WORKLOAD])
        .output();
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = format!("127.0.0.1:{port}");
    let mut daemon = Command::new("docker");
    daemon
        .args([
            "run",
            "--detach",
            "--name",
            DAEMON,
            "--pid=host",
            "--network=host",
        ])
        .args(["--read-only", "--cap-drop=ALL"])
        // The DaemonSet adds BPF and PERFMON, which Debian 12's Docker (20.10) cannot name;
        // SYS_ADMIN holds what they grant.
        .args(["SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"].map(|c| format!("--cap-add={c}")))
        // Only where this machine has it to give: some sandboxes' root lacks it, and runc
        // then fails to start the container.
        .args(host_has_capability(CAP_SYS_RESOURCE).then_some("--cap-add=SYS_RESOURCE"))
        .args([
            "--security-opt",
            "seccomp=unconfined",
            "--security-opt",
            "apparmor=unconfined",
        ])
        .args(["--volume", "/sys/kernel/btf:/sys/kernel/btf:ro"])
        .args(["--volume", "/sys/kernel/tracing:/sys/kernel/tracing:ro"])
        .args(["--volume", "/var/run/docker.sock:/var/run/docker.sock"])
        .arg(tag)
        .args(["daemon", "--listen", &addr]);
    run(&mut daemon).context("starting the image's daemon")?;
    let result = judge_daemon(&addr);
    if result.is_err() {
        let logs = Command::new("docker").args(["logs", DAEMON]).output()?;
        eprintln!(
            "the image's daemon said:\n{}{}",
            String::from_utf8_lossy(&logs.stdout),
            String::from_utf8_lossy(&logs.stderr)
        );
    }
    let _ = Command::new("docker")
        .args(["rm", "--force", DAEMON, WORKLOAD])
        .output();
    result
}

/// `CAP_SYS_RESOURCE`'s bit.
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process's bounding set holds capability `bit`.
fn host_has_capability(bit: u32) -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapBnd:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask >> bit & 1 == 1)
}

fn judge_daemon(addr: &str) -> Result<()> {
    wait_for(
        "the image's daemon to answer /healthz",
        Duration::from_secs(60),
        || Ok(get(addr, "/healthz").is_ok_and(|reply| reply.starts_with("HTTP/1.0 200"))),
    )?;
    let image = busybox_image()?;
    // A pause first, so that a survey of the runtimes names the container before it fails.
    let workload = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--name",
            WORKLOAD,
            "--network=none",
            "--shm-size=1m",
        ])
        .arg(&image)
        .args([
            "sh",
            "-c",
            "sleep 3; dd if=/dev/zero of=/dev/shm/fill bs=1M count=4",
        ])
        .output()
        .context("running the workload container")?;
    if workload.status.success() {
        bail!("dd filled 4 MiB of a 1 MiB /dev/shm without failing");
    }
    let series = format!("shmtrace_shm_failures_total{{container=\"{WORKLOAD}\",");
    wait_for(
        "the daemon's metrics to count the failure",
        Duration::from_secs(30),
        || {
            let metrics = get(addr, "/metrics")?;
            Ok(metrics
                .lines()
                .filter(|line| line.starts_with(&series) && line.contains("errno=\"ENOSPC\""))
                .any(|line| {
                    line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)
                }))
        },
    )?;
    println!("the image's daemon counted {WORKLOAD}'s ENOSPC under its name");
    Ok(())
}

/// A busybox image for the workload, made from the host's busybox-static (no registry here).
fn busybox_image() -> Result<String> {
    let tag = "shmtrace-dist-busybox:1".to_owned();
    let present = Command::new("docker")
        .args(["image", "inspect", &tag])
        .output()?
        .status
        .success();
    if present {
        return Ok(tag);
    }
    let staging = std::env::temp_dir().join(format!("shmtrace-busybox-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(staging.join("bin"))?;
    fs::copy("/bin/busybox", staging.join("bin/busybox"))
        .context("the workload's image is made of busybox: apt-get install busybox-static")?;
    for applet in ["sh", "dd", "sleep"] {
        std::os::unix::fs::symlink("busybox", staging.join("bin").join(applet))?;
    }
    let tar = staging.with_extension("tar");
    run(Command::new("tar")
        .arg("--create")
        .arg("--file")
        .arg(&tar)
        .arg("--directory")
        .arg(&staging)
        .arg("."))?;
    run(Command::new("docker").arg("import").arg(&tar).arg(&tag))?;
    let _ = fs::remove_dir_all(&staging);
    let _ = fs::remove_file(&tar);
    Ok(tag)
}

/// An HTTP/1.0 GET of `path`, the whole reply.
fn get(addr: &str, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok(reply)
}

/// Polls `done` until it says yes, for at most `limit`.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let started = Instant::now();
    loop {
        if done().unwrap_or(false) {
            return Ok(());
        }
        if started.elapsed() > limit {
            bail!("gave up waiting for {what} after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
