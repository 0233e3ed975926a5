//! A real full disk under the writer: a child process in its own mount namespace writes into a
//! 256 KiB tmpfs until the disk is full. The lost records are counted, the file stays readable
//! up to its last good block, and once space is back a `writer_loss` record marks the hole.
//!
//! The child runs in a user namespace of its own (`unshare --map-root-user`), where it may
//! mount a tmpfs: the test needs no root, only unprivileged user namespaces (Debian's default).
use std::process::Command;

use super::*;
use crate::record::{TraceWriter, WriteError, WriterOptions, no_carry};

const ENV: &str = "SHMTRACE_FULL_DISK_CHILD";

#[test]
fn full_disk_child() {
    if std::env::var_os(ENV).is_none() {
        return; // Only runs when `a_full_disk_is_counted_and_marked` starts it.
    }
    use nix::mount::{MsFlags, mount};
    // Without a namespace of its own there is no private tmpfs to fill: fail, do not skip.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect(
        "a private mount namespace for the full tmpfs (are user namespaces disabled? \
         sysctl kernel.unprivileged_userns_clone=1)",
    );
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .unwrap();
    let dir = TempDir::new("full");
    mount(
        Some("tmpfs"),
        dir.path(),
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=256k"),
    )
    .unwrap();
    let ballast = dir.join("ballast");
    std::fs::write(&ballast, vec![1u8; 64 << 10]).unwrap();

    let path = dir.join("trace.shmtrace");
    let mut writer = TraceWriter::create(&path, test_header(), WriterOptions::default()).unwrap();
    let mut i = 0u64;
    let mut written_before = 0;
    let dropped = loop {
        written_before = writer.stats().records.max(written_before);
        for _ in 0..50 {
            writer
                .write_kernel(&openat(i, 1, "/dev/shm/torch_1_1", 3, i))
                .unwrap();
            i += 1;
        }
        match writer.flush(&mut no_carry) {
            Ok(_) => assert!(i < 100_000, "the tmpfs never filled"),
            Err(WriteError::Write {
                dropped,
                error: source,
                ..
            }) => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
                break dropped;
            }
            Err(other) => panic!("{other}"),
        }
    };
    // What fit of the 50 was kept; the rest is counted.
    let written = writer.stats().records;
    assert_eq!(dropped + (written - written_before), 50);
    assert_eq!(writer.stats().records_dropped, dropped);
    let stopped = writer.stats().stopped.clone().expect("where it stopped");
    assert!(stopped.reason.contains("No space left"), "{stopped:?}");
    let (entries, error) = read_all(&path);
    assert!(
        error.is_none(),
        "cut back to the last good block: {error:?}"
    );
    assert_eq!(entries.len() as u64, written);

    std::fs::remove_file(&ballast).unwrap();
    writer.write_kernel(&fork(i, 1, 2)).unwrap();
    writer.finish(&mut no_carry).unwrap();
    let (entries, error) = read_all(&path);
    assert!(error.is_none());
    assert_eq!(entries.len() as u64, written + 2);
    let Record::User(UserRecord::WriterLoss(loss)) = &entries[written as usize].record else {
        panic!("the hole is marked where it is")
    };
    assert_eq!(loss.records, dropped);
    assert!(loss.reason.contains("No space left"), "{}", loss.reason);
    println!("full disk ok: {written} records written, {dropped} counted lost and marked");

    // One big flush into the little space left: what fits is kept, not the header alone.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&ballast, vec![1u8; 192 << 10]).unwrap();
    let free = nix::sys::statvfs::statvfs(dir.path()).unwrap();
    let free_bytes = free.blocks_available() * free.fragment_size();
    let second = dir.join("big-flush.shmtrace");
    let mut writer = TraceWriter::create(&second, test_header(), WriterOptions::default()).unwrap();
    for j in 0..4000 {
        writer
            .write_kernel(&openat(j, 1, "/dev/shm/torch_1_1", 3, j))
            .unwrap();
    }
    let (stats, error) = writer.finish_anyway(&mut no_carry);
    assert!(
        error.is_some(),
        "{free_bytes} bytes free cannot hold 4000 records"
    );
    let (entries, _) = read_all(&second);
    assert_eq!(entries.len() as u64, stats.records);
    let size = std::fs::metadata(&second).unwrap().len();
    assert!(
        size > free_bytes / 2,
        "kept {size} bytes ({} records) of {free_bytes} free",
        stats.records
    );
    assert_eq!(stats.records + stats.records_dropped, 4000);
    println!(
        "big flush ok: {} of 4000 records kept in {size} bytes",
        stats.records
    );
}

#[test]
fn a_full_disk_is_counted_and_marked() {
    // util-linux's unshare makes the user namespace: it must be done before any thread
    // starts, which the test harness in the child does not allow.
    let output = Command::new("unshare")
        .args(["--user", "--map-root-user", "--"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "record::tests::full_disk::full_disk_child",
            "--nocapture",
        ])
        .env(ENV, "1")
        .output()
        .expect("running util-linux's unshare (Debian: apt-get install util-linux)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("full disk ok"), "{stdout}");
    assert!(stdout.contains("big flush ok"), "{stdout}");
}
