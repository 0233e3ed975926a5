//! Which file systems are taken for a /dev/shm (the probes' `SHM_SUPERS`):
//! - not a disk's where /dev/shm is a plain directory (in a chroot, or a container with no
//!   /dev/shm mounted). Probes that judged opens by their path once learned that file system
//!   as a /dev/shm from an open of `/dev/shm/x` there, and from then on every file of it
//!   counted as one: in an hour of container churn the node agent followed 31,000 of
//!   dockerd's, containerd's and runc's files on the host's root file system;
//! - a tmpfs only while mounted at a /dev/shm: the kernel gives an unmounted tmpfs's device
//!   number to the next file system mounted;
//! - and a device node on a file system that got such a number (a container's /dev, its
//!   /dev/null) is no /dev/shm file.
//!
//! The real binary, a real chroot and mount namespace (root and BPF only).
use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use serde_json::Value;
use shmtrace_tests::{
    daemon::Daemon, live::LiveTracer, require_root, serial, tempdir, trace_command,
};

/// After the chroot's open of its `/dev/shm/x`, and of its `/dev/shm` directory (`ls`), a file
/// of the same file system, outside any /dev/shm, is grown by ftruncate and fallocate: calls
/// the probes report only on a /dev/shm.
const GROW: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o600)
os.ftruncate(fd, 1 << 20)
os.posix_fallocate(fd, 0, 1 << 20)
os.close(fd)
"#;

/// The static busybox the chroots run.
fn busybox() -> &'static str {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("no busybox: install busybox-static (.ci/run does)")
}

/// A chroot holding an empty `dev/shm` and `bin/busybox`, in a fresh directory on the root file
/// system (not a tmpfs, as /tmp may be): that directory, and the chroot's root in it.
fn busybox_chroot(name: &str) -> (PathBuf, PathBuf) {
    let dir = Path::new("/var/tmp").join(format!("shmtrace-{name}-{}", std::process::id()));
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("dev/shm")).unwrap();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(busybox(), root.join("bin/busybox")).unwrap();
    (dir, root)
}

#[test]
fn a_dev_shm_path_on_a_disk_file_system_does_not_make_it_a_dev_shm() {
    require_root();
    let _serial = serial();
    let (dir, root) = busybox_chroot("fs");
    let statfs = nix::sys::statfs::statfs(&dir).unwrap();
    assert_ne!(
        statfs.filesystem_type(),
        nix::sys::statfs::TMPFS_MAGIC,
        "/var/tmp is a tmpfs here: this test needs a disk's file system"
    );
    let grown = dir.join("grown");
    let script = format!(
        "chroot {} /bin/busybox sh -c 'echo x > /dev/shm/x && /bin/busybox ls /dev/shm' \
         && python3 -c '{GROW}' {}",
        root.display(),
        grown.display()
    );
    let trace = trace_command(&[], &["sh", "-c", &script]);
    assert!(trace.output.status.success(), "{}", trace.stderr());
    let records = trace.records;
    // The chroot's commands ran traced: its `ls /dev/shm` is in the trace.
    assert!(
        records.iter().any(|r| r["event"] == "exec"
            && r["argv"].as_array().is_some_and(
                |argv| argv.iter().any(|a| a == "ls") && argv.iter().any(|a| a == "/dev/shm")
            )),
        "the chroot's ls of /dev/shm is not in the trace: {records:#?}"
    );
    // Its /dev/shm/x is a file of the disk's, not of a /dev/shm: an open is judged by the file
    // it made, not by the path it was given (docs/probes.md, "Which file systems are a
    // /dev/shm").
    let taken: Vec<_> = records
        .iter()
        .filter(|r| r["path"].as_str() == Some("/dev/shm/x"))
        .collect();
    assert!(
        taken.is_empty(),
        "the chroot's /dev/shm/x, on a disk's file system, was taken for a /dev/shm file: \
         {taken:#?}"
    );
    let dev = std::fs::metadata(&grown).unwrap().dev();
    let on_disk: Vec<_> = records
        .iter()
        .filter(|r| r["comm"] == "python3")
        .filter(|r| matches!(r["event"].as_str(), Some("ftruncate" | "fallocate")))
        .collect();
    assert!(
        on_disk.is_empty(),
        "calls on {} (device {dev:#x}, not a tmpfs) were taken for /dev/shm calls: {on_disk:#?}",
        grown.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process uses a tmpfs at its /dev/shm, which is then unmounted; a scratch tmpfs mounted
/// next gets its device number. Its `fallocate` is nothing of /dev/shm's, and neither the node
/// agent nor a host-wide trace (`--all`) reports it, at once: the mount that made the scratch
/// tmpfs made the probes forget their verdicts (docs/probes.md, "Which file systems are a
/// /dev/shm").
const REUSE: &str = r#"
import os, subprocess, sys, time
scratch, pause = sys.argv[1], float(sys.argv[2])
def mount(target):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "shmtrace-test", target], check=True)
def fill(path):
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.posix_fallocate(fd, 0, 2 << 20)
    except OSError:
        pass
    os.close(fd)
# The scratch tmpfs is mounted at once: the lowest free number is the one just freed, unless
# another mount on the machine freed a lower one in between (then again).
for attempt in range(10):
    mount("/dev/shm")
    fill("/dev/shm/x")
    gone = os.stat("/dev/shm").st_dev
    # The agent measures a /dev/shm where a call failed, through /proc/PID/root, for a
    # moment: until then the unmount is refused (busy).
    for _ in range(50):
        if subprocess.run(["umount", "/dev/shm"]).returncode == 0:
            break
        time.sleep(0.1)
    else:
        sys.exit("/dev/shm stayed busy for 5 s")
    mount(scratch)
    if os.stat(scratch).st_dev == gone:
        break
    subprocess.run(["umount", scratch], check=True)
print(os.getpid(), gone, os.stat(scratch).st_dev, attempt + 1, flush=True)
time.sleep(pause)
fill(scratch + "/y")
"#;

#[test]
fn the_node_agent_forgets_an_unmounted_dev_shm_before_its_number_names_another() {
    require_root();
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let reused = a_scratch_tmpfs_gets_the_number_of_a_dev_shm_unmounted();
    let (_, lines, stderr) = daemon.stop();
    only_the_dev_shm_failure_is_reported(&lines, &reused, &stderr);
}

#[test]
fn so_does_a_host_wide_trace() {
    require_root();
    let _serial = serial();
    let tracer = LiveTracer::start(&["--all"]);
    let reused = a_scratch_tmpfs_gets_the_number_of_a_dev_shm_unmounted();
    let (_, stderr, records) = tracer.stop();
    only_the_dev_shm_failure_is_reported(&records, &reused, &stderr);
}

/// What [`REUSE`] did.
struct Reused {
    pid: u64,
    /// The number its /dev/shm had and the scratch tmpfs got.
    dev: u64,
    /// Its /dev/shm's mounted, each with its failed `fallocate`, until one's number was reused.
    attempts: usize,
}

/// Runs [`REUSE`] in a mount namespace of its own.
fn a_scratch_tmpfs_gets_the_number_of_a_dev_shm_unmounted() -> Reused {
    let scratch = tempdir().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    // No pause before the scratch tmpfs is used: nothing waits for a sweep of the mount tables.
    let output = std::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "python3",
            "-c",
            REUSE,
        ])
        .arg(&scratch)
        .arg("0")
        .output()
        .expect("running unshare");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let said = String::from_utf8_lossy(&output.stdout);
    let [pid, gone, next, attempts] = said
        .split_whitespace()
        .map(|n| n.parse::<u64>().unwrap())
        .collect::<Vec<_>>()[..]
    else {
        panic!("the workload said {said:?}")
    };
    assert_eq!(
        gone, next,
        "in 10 tries, the kernel gave the scratch tmpfs another number than the /dev/shm \
         unmounted just before it (other mounts took it in between): this test needs the \
         number reused"
    );
    Reused {
        pid,
        dev: next,
        attempts: attempts as usize,
    }
}

fn only_the_dev_shm_failure_is_reported(lines: &[Value], reused: &Reused, stderr: &str) {
    let failed: Vec<_> = lines
        .iter()
        .filter(|l| l["pid"].as_u64() == Some(reused.pid) && l["event"] == "fallocate")
        .collect();
    // The /dev/shm's own failures are seen: the process was followed and its /dev/shm learned.
    // The scratch tmpfs's file has the number of the /dev/shm's (a tmpfs numbers its inodes
    // from the same start), so it would be named /dev/shm/x too: it is told apart by count.
    assert!(
        !failed.is_empty(),
        "the failure on /dev/shm/x is not in the lines: {failed:#?}\n{stderr}"
    );
    assert_eq!(
        failed.len(),
        reused.attempts,
        "{} /dev/shm failed, and the scratch tmpfs's fallocate (device {:#x}, the number of a \
         /dev/shm unmounted just before it) was taken for a /dev/shm call: {failed:#?}",
        reused.attempts,
        reused.dev
    );
}

/// Issue 37: in an hour of container churn, busybox `dd`s that filled their /dev/shm were
/// diagnosed "no /dev/shm failure was seen". dd writes its error to its stderr at once,
/// `2>/dev/null`, a device node on the container's /dev: a tmpfs that had the number of
/// another container's /dev/shm unmounted moments before. That write was taken for a fallback
/// from the refused one. Here a tmpfs mounted at /dev/shm is used, then unmounted; a scratch
/// tmpfs mounted next gets its number and a `null` device node; dd fills a new /dev/shm with
/// its stderr on that node, before the probes can have forgotten the number.
const DEVICE_NODE: &str = r#"
import os, stat, subprocess, sys
scratch, busybox = sys.argv[1], sys.argv[2]
def mount(target, size):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "shmtrace-test", target],
                   check=True)
for attempt in range(10):
    mount("/dev/shm", "1m")
    open("/dev/shm/x", "w").close()
    gone = os.stat("/dev/shm").st_dev
    subprocess.run(["umount", "/dev/shm"], check=True)
    mount(scratch, "64k")
    if os.stat(scratch).st_dev == gone:
        break
    subprocess.run(["umount", scratch], check=True)
null = scratch + "/null"
os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
mount("/dev/shm", "1m")
with open(null, "w") as stderr:
    dd = subprocess.Popen([busybox, "dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=64k",
                           "count=32"], stderr=stderr)
    dd.wait()
print(dd.pid, gone, os.stat(scratch).st_dev, dd.returncode, flush=True)
"#;

#[test]
fn a_write_to_a_device_node_on_a_dev_shm_s_old_number_takes_no_failure_back() {
    require_root();
    let _serial = serial();
    let busybox = busybox();
    let scratch = tempdir().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let daemon = Daemon::start(&[]);
    let output = std::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "python3",
            "-c",
            DEVICE_NODE,
        ])
        .arg(&scratch)
        .arg(busybox)
        .output()
        .expect("running unshare");
    let (_, lines, stderr) = daemon.stop();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let said = String::from_utf8_lossy(&output.stdout);
    let [pid, gone, next, status] = said
        .split_whitespace()
        .map(|n| n.parse::<u64>().unwrap())
        .collect::<Vec<_>>()[..]
    else {
        panic!("the workload said {said:?}")
    };
    assert_eq!(
        gone, next,
        "in 10 tries, the kernel gave the scratch tmpfs another number than the /dev/shm \
         unmounted just before it (other mounts took it in between): this test needs the \
         number reused"
    );
    assert_eq!(status, 1, "dd was to fail: {said}");
    let of_dd: Vec<_> = lines
        .iter()
        .filter(|l| l["pid"].as_u64() == Some(pid))
        .collect();
    assert!(
        of_dd
            .iter()
            .any(|l| l["event"] == "write" && l["errno"] == "ENOSPC"),
        "dd's refused write is not in the lines: {of_dd:#?}\n{stderr}"
    );
    let diagnosis = of_dd
        .iter()
        .find(|l| l["event"] == "diagnosis")
        .unwrap_or_else(|| panic!("no diagnosis of dd (pid {pid}): {of_dd:#?}\n{stderr}"));
    assert_eq!(
        diagnosis["cause"], "shm_full",
        "dd's write of its error to a device node on a file system with the number {next:#x} \
         of a /dev/shm unmounted just before took its failure back: {diagnosis:#}"
    );
}

/// A tmpfs mounted at a chroot's /dev/shm is the /dev/shm of every program in that chroot (a
/// build root, an old distribution's, as the release check runs the demo in), though from the
/// namespace's root it sits at `<chroot>/dev/shm`. The probes judge a tmpfs's mounts from the
/// root of the program that meets it: judged from the namespace's root, none of the chroot's
/// opens, writes or fallocates there were seen, only its unlinks (judged by path).
#[test]
fn a_tmpfs_at_a_chroot_s_dev_shm_is_its_dev_shm() {
    require_root();
    let _serial = serial();
    let (dir, root) = busybox_chroot("chroot");
    // 2 MiB into a 1 MiB /dev/shm; the chroot has no /dev/zero, so it is opened outside.
    let script = format!(
        "mount -t tmpfs -o size=1m shmtrace-test {root}/dev/shm && \
         chroot {root} /bin/busybox dd of=/dev/shm/fill bs=64k count=32 < /dev/zero",
        root = root.display()
    );
    let trace = trace_command(
        &[],
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !trace.output.status.success(),
        "dd was to fill the chroot's 1 MiB /dev/shm and fail: {}",
        trace.stderr()
    );
    let of_dd: Vec<_> = trace
        .records
        .iter()
        .filter(|r| r["comm"] == "busybox")
        .collect();
    assert!(
        of_dd
            .iter()
            .any(|r| r["event"] == "write" && r["errno"] == "ENOSPC"),
        "dd's refused write to the chroot's /dev/shm/fill is not in the trace: {of_dd:#?}\n{}",
        trace.stderr()
    );
    let diagnosis = of_dd
        .iter()
        .find(|r| r["event"] == "diagnosis")
        .unwrap_or_else(|| panic!("no diagnosis of dd: {of_dd:#?}\n{}", trace.stderr()));
    assert_eq!(diagnosis["cause"], "shm_full", "{diagnosis:#}");
}
