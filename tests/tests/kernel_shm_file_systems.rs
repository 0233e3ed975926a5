//! Only a tmpfs is taken for a /dev/shm. A `/dev/shm/x` opened where /dev/shm is a plain
//! directory (in a chroot, or a container with no /dev/shm mounted) is on a disk's file system;
//! the probes once learned that file system as a /dev/shm from such an open, and from then on
//! every file of it counted as one: in an hour of container churn the node agent followed
//! 31,000 of dockerd's, containerd's and runc's files on the host's root file system. The real
//! binary, a real chroot (root and BPF only).
use std::{os::unix::fs::MetadataExt, path::Path};

use shmtrace_tests::{read_json_lines, require_root, serial, shmtrace};

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

#[test]
fn a_dev_shm_path_on_a_disk_file_system_does_not_make_it_a_dev_shm() {
    require_root();
    let _serial = serial();
    // On the root file system, not a tmpfs: /tmp may be one.
    let dir = Path::new("/var/tmp").join(format!("shmtrace-fs-{}", std::process::id()));
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("dev/shm")).unwrap();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("no busybox: install busybox-static (.ci/run does)");
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    let statfs = nix::sys::statfs::statfs(&dir).unwrap();
    assert_ne!(
        statfs.filesystem_type(),
        nix::sys::statfs::TMPFS_MAGIC,
        "/var/tmp is a tmpfs here: this test needs a disk's file system"
    );
    let grown = dir.join("grown");
    let out = dir.join("trace.jsonl");
    let script = format!(
        "chroot {} /bin/busybox sh -c 'echo x > /dev/shm/x && /bin/busybox ls /dev/shm' \
         && python3 -c '{GROW}' {}",
        root.display(),
        grown.display()
    );
    let output = shmtrace()
        .args(["--json", "-o"])
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .output()
        .expect("running shmtrace");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let records = read_json_lines(&out);
    // The chroot's open is seen: the trace ran, and the path is a /dev/shm path.
    assert!(
        records
            .iter()
            .any(|r| r["path"].as_str() == Some("/dev/shm/x")),
        "the chroot's open of /dev/shm/x is not in the trace: {records:#?}"
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
