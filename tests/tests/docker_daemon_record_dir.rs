//! `shmtrace daemon --record-dir` on file systems that cannot take a recording (issue 25,
//! item 9): a read-only one is refused at start, saying why; on a full one, an incident whose
//! recording fails is counted and leaves no empty file behind. Each daemon runs in a private
//! mount namespace (`unshare -m`) holding a real tmpfs at the record dir. Needs root and
//! Docker; fails loudly without them.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use shmtrace_tests::{
    command::ShmtraceCommand,
    daemon::{Daemon, http_get, sample},
    docker::{self, Container},
    recording::wait_for,
    require_root, serial, shmtrace_bin, tempdir,
};

/// `unshare -m` mounting `mount_options`' tmpfs at DIR and preparing it with `prepare`, then
/// exec'ing shmtrace with the arguments that follow.
fn in_private_tmpfs(dir: &std::path::Path, mount_options: &str, prepare: &str) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o {mount_options} tmpfs \"$0\" && {prepare} && exec \"$@\""
        ))
        .arg(dir)
        .arg(shmtrace_bin());
    command
}

#[test]
fn a_read_only_record_dir_is_refused_at_start() {
    require_root();
    let _serial = serial();
    let dir = tempdir().join("incidents");
    std::fs::create_dir(&dir).unwrap();
    let mut child = ShmtraceCommand::from_command(in_private_tmpfs(&dir, "ro,mode=0750", "true"))
        .args(["daemon", "--listen", "127.0.0.1:0", "--record-dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Before the fix it started, and served, and would fail at the first incident.
    let status = wait_for(&mut child, Duration::from_secs(30));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    println!("{status}: {stderr}");
    assert!(!status.success(), "it started: {stderr}");
    assert!(
        stderr.contains(&format!("--record-dir {} is not writable", dir.display()))
            && stderr.contains("Read-only file system")
            && stderr.contains("writable file system"),
        "{stderr}"
    );
}

#[test]
fn an_incident_on_a_full_record_dir_is_counted_and_leaves_no_empty_file() {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let dir = tempdir().join("incidents");
    std::fs::create_dir(&dir).unwrap();
    // Full: dd stops at ENOSPC (its failure is expected; `; true` keeps the chain going).
    let fill = "{ dd if=/dev/zero of=\"$0/fill.bin\" bs=4k 2>/dev/null; true; }";
    let command = in_private_tmpfs(&dir, "size=256k,mode=0750", fill);
    let daemon = Daemon::start_via(
        ShmtraceCommand::from_command(command),
        &[
            "--interval",
            "1s",
            "--tail",
            "1",
            "--record-dir",
            dir.to_str().unwrap(),
        ],
    );
    // The daemon's tmpfs, seen from here through its root.
    let seen: PathBuf = format!("/proc/{}/root{}", daemon.pid(), dir.display()).into();
    assert!(
        seen.join("fill.bin").exists(),
        "the tmpfs is not where the daemon sees it"
    );

    let failing = Container::run(
        "daemon-fullrec",
        &["--shm-size", "1m"],
        "while [ ! -e /work/go ]; do sleep 0.1; done; dd if=/dev/zero of=/dev/shm/fill bs=2M count=1; sleep 600",
    );
    std::thread::sleep(Duration::from_secs(3));
    failing.signal("go");
    let text = daemon.wait_for_metric(Duration::from_secs(30), |l| {
        l.starts_with("shmtrace_recording_errors_total") && !l.ends_with(" 0")
    });
    let errors = sample(&text, "shmtrace_recording_errors_total", &[]).unwrap();
    let left: Vec<(String, u64)> = std::fs::read_dir(&seen)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".shmtrace"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    println!("{errors} recording errors; recordings left: {left:?}");
    assert!(
        left.iter().all(|(_, bytes)| *bytes > 0),
        "a failed incident left an empty file: {left:?}"
    );
    // Still serving, and the failure still named.
    assert!(matches!(http_get(&daemon.addr, "/healthz"), Ok((200, _))));
    drop(failing);
    let (status, lines, stderr) = daemon.stop();
    assert!(status.success(), "daemon exit {status}: {stderr}");
    let said = lines
        .iter()
        .find(|l| l["event"] == "recording_error")
        .unwrap_or_else(|| panic!("no recording_error line: {lines:?}"));
    assert!(
        said["error"].as_str().unwrap().contains("No space left"),
        "{said}"
    );
}
