//! What shmtrace says when the machine does not let it trace (issue 11): a user with CAP_BPF
//! and CAP_PERFMON but not root, who cannot read tracefs, is told that, not that tracefs is
//! missing; a missing tracefs is named with the command that mounts it, and shmtrace does not
//! mount it itself. Real tracefs, real capabilities (setpriv), real mount namespaces; root.
use std::{
    io::{BufRead, BufReader},
    os::unix::fs::PermissionsExt,
    process::{Command, Stdio},
};

use shmtrace_tests::{
    command::ShmtraceCommand, hardening::text, require_root, serial, shmtrace_bin,
};

const TRACEFS: &str = "/sys/kernel/tracing";

#[test]
fn a_capable_user_who_cannot_read_tracefs_is_told_so() {
    let _guard = serial();
    require_root();
    let mode = std::fs::metadata(TRACEFS)
        .unwrap_or_else(|e| panic!("{TRACEFS}: {e}: tracefs must be mounted for this test"))
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o005,
        0,
        "{TRACEFS} is mode {:o}: others may read it, so this test cannot show an unreadable \
         tracefs (the kernel's default is 700)",
        mode & 0o777
    );
    // nobody, with CAP_BPF and CAP_PERFMON kept through exec (ambient).
    let mut setpriv = Command::new("setpriv");
    setpriv
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=+bpf,+perfmon",
            "--ambient-caps=+bpf,+perfmon",
            "--",
        ])
        .arg(shmtrace_bin());
    // setpriv execs shmtrace: the leak check watches shmtrace itself. The probes are asked for
    // (by default, shmtrace would fall back to ptrace, saying why in one line).
    let output = ShmtraceCommand::from_command(setpriv)
        .args(["--backend", "ebpf", "--", "true"])
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "tracefs is mounted at {TRACEFS} but this process cannot read it"
        )) && stderr.contains("CAP_BPF and CAP_PERFMON but not root"),
        "{stderr}"
    );
    assert!(!stderr.contains("not mounted"), "{stderr}");
}

#[test]
fn a_missing_tracefs_is_named_and_not_mounted_behind_the_users_back() {
    let _guard = serial();
    require_root();
    // A mount namespace of its own (private: the host keeps its tracefs) without tracefs,
    // held open by `sleep` so that its mounts can be read after shmtrace has run in it.
    let mut holder = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &format!("umount -l {TRACEFS} && echo ready && exec sleep 120"),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "unmounting tracefs in a namespace");
    let namespace = holder.id().to_string();
    let mut nsenter = Command::new("nsenter");
    nsenter
        .args(["--target", &namespace, "--mount", "--"])
        .arg(shmtrace_bin());
    // nsenter execs shmtrace: the leak check watches shmtrace itself.
    let output = ShmtraceCommand::from_command(nsenter)
        .args(["--backend", "ebpf", "--", "true"])
        .output()
        .unwrap();
    let mounts = std::fs::read_to_string(format!("/proc/{namespace}/mountinfo")).unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("tracefs is not mounted")
            && stderr.contains(&format!("mount -t tracefs nodev {TRACEFS}")),
        "{stderr}"
    );
    let tracefs: Vec<&str> = mounts
        .lines()
        .filter(|l| l.contains(" - tracefs "))
        .collect();
    assert!(
        tracefs.is_empty(),
        "shmtrace mounted tracefs itself: {tracefs:?}"
    );
}
