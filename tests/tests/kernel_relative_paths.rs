//! Names given relative to a directory descriptor are whole: a program that walks a /dev/shm
//! tree by descriptors (`openat(dirfd, "sub")`, `unlinkat(dirfd, "f")`, as Python's
//! `os.fwalk` does) names `/dev/shm/tree/sub/f`, not `/dev/shm/f`. The real binary on a
//! private tmpfs (root and BPF only).
//!
//! GNU's `find`, `du` and `rm -r` move each directory descriptor with `fcntl(F_DUPFD_CLOEXEC)`,
//! which is not traced, then open and remove relative to the copy: their names are whole by the
//! directory's inode, which the probes read behind the descriptor.
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

/// Makes /dev/shm/a/sub/deeper with a file in each, then walks it with GNU's fts tools.
const FTS: &str = "mkdir -p /dev/shm/a/sub/deeper; \
     touch /dev/shm/a/sub/f /dev/shm/a/sub/deeper/g; \
     find /dev/shm/a/sub >/dev/null; du -a /dev/shm/a/sub >/dev/null; rm -rf /dev/shm/a/sub";

#[test]
fn gnu_find_du_and_rm_name_whole_paths() {
    require_root();
    let _serial = serial();
    let dir = tempdir();
    let out = dir.join("trace.jsonl");
    let output = shmtrace()
        .args(["--json", "-o"])
        .arg(&out)
        .args(["--", "unshare", "-m", "sh", "-c", PRIVATE_SHM, "sh", FTS])
        .output()
        .expect("running shmtrace");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let records = read_json_lines(&out);
    let named = |comm: &str, event: &str| -> Vec<&str> {
        records
            .iter()
            .filter(|r| r["comm"] == comm && r["event"] == event)
            .filter_map(|r| r["path"].as_str())
            .collect()
    };
    for walker in ["find", "du", "rm"] {
        let opened = named(walker, "openat");
        assert!(
            opened.contains(&"/dev/shm/a/sub/deeper"),
            "{walker} did not open /dev/shm/a/sub/deeper so: {opened:?}"
        );
    }
    let removed = named("rm", "unlinkat");
    for whole in [
        "/dev/shm/a/sub/f",
        "/dev/shm/a/sub/deeper/g",
        "/dev/shm/a/sub/deeper",
        "/dev/shm/a/sub",
    ] {
        assert!(
            removed.contains(&whole),
            "{whole} not removed so: {removed:?}"
        );
    }
    let cut: Vec<&Value> = records
        .iter()
        .filter(|r| {
            r["path"].as_str().is_some_and(|p| {
                matches!(p, "/dev/shm/f" | "/dev/shm/g" | "/dev/shm/deeper") || p.contains('…')
            })
        })
        .collect();
    assert!(cut.is_empty(), "names cut from their directory: {cut:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}
