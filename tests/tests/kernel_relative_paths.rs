//! Names given relative to a directory descriptor are whole: a program that walks a /dev/shm
//! tree by descriptors (`openat(dirfd, "sub")`, `unlinkat(dirfd, "f")`, as Python's
//! `os.fwalk` does) names `/dev/shm/tree/sub/f`, not `/dev/shm/f`. The real binary on a
//! private tmpfs (root and BPF only).
//!
//! GNU's `find`, `du` and `rm -r` move each directory descriptor with `fcntl(F_DUPFD_CLOEXEC)`,
//! which is not traced: their names stay cut until the probes record the directory's inode
//! (docs/fleet.md, "Limitations").
use serde_json::Value;
use shmtrace_tests::{read_json_lines, require_root, serial, shmtrace, tempdir};

/// Mounts a 1 MiB tmpfs on /dev/shm in a fresh mount namespace, then runs `$1` there.
const PRIVATE_SHM: &str = "set -e; mount --make-rprivate /; \
     mount -t tmpfs -o size=1m shmtrace-test /dev/shm; sh -c \"$1\"";

/// Makes /dev/shm/tree/sub, then works in it by descriptors only.
const WALK: &str = r#"
import os
os.makedirs("/dev/shm/tree/sub")
top = os.open("/dev/shm/tree", os.O_RDONLY | os.O_DIRECTORY)
sub = os.open("sub", os.O_RDONLY | os.O_DIRECTORY, dir_fd=top)
os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=sub))
os.unlink("f", dir_fd=sub)
os.rmdir("sub", dir_fd=top)
"#;

#[test]
fn names_relative_to_a_directory_descriptor_are_named_whole() {
    require_root();
    let _serial = serial();
    let dir = tempdir();
    let out = dir.join("trace.jsonl");
    let script = format!("python3 -c '{WALK}'");
    let output = shmtrace()
        .args(["--json", "-o"])
        .arg(&out)
        .args([
            "--",
            "unshare",
            "-m",
            "sh",
            "-c",
            PRIVATE_SHM,
            "sh",
            &script,
        ])
        .output()
        .expect("running shmtrace");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let records = read_json_lines(&out);
    let named = |event: &str| -> Vec<&str> {
        records
            .iter()
            .filter(|r| r["comm"] == "python3" && r["event"] == event)
            .filter_map(|r| r["path"].as_str())
            .collect()
    };
    let opened = named("openat");
    for whole in ["/dev/shm/tree", "/dev/shm/tree/sub", "/dev/shm/tree/sub/f"] {
        assert!(opened.contains(&whole), "{whole} not opened so: {opened:?}");
    }
    let removed = named("unlinkat");
    for whole in ["/dev/shm/tree/sub/f", "/dev/shm/tree/sub"] {
        assert!(
            removed.contains(&whole),
            "{whole} not removed so: {removed:?}"
        );
    }
    let cut: Vec<&Value> = records
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| matches!(p, "/dev/shm/f" | "/dev/shm/sub"))
        })
        .collect();
    assert!(cut.is_empty(), "names cut from their directory: {cut:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}
