//! `kill -9` of a real writer process: everything up to its last flush reads back.
//!
//! The test binary runs itself again as the writer (`crash_child`, active only when
//! `SHMTRACE_CRASH_CHILD` names a file). The child writes records non-stop, flushing every 50
//! and reporting each flush on stdout; the parent kills it with SIGKILL mid-stream.
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use super::*;
use crate::record::{TraceWriter, WriterOptions, no_carry};

const ENV: &str = "SHMTRACE_CRASH_CHILD";
const PER_FLUSH: u64 = 50;

#[test]
fn crash_child() {
    let Some(path) = std::env::var_os(ENV) else {
        return; // Only a writer when the crash tests start it.
    };
    let compression = std::env::var("SHMTRACE_CRASH_ZSTD").ok().map(|_| 3);
    let options = WriterOptions {
        compression,
        ..WriterOptions::default()
    };
    let mut writer = TraceWriter::create(Path::new(&path), test_header(), options).unwrap();
    let mut i = 0u64;
    loop {
        for _ in 0..PER_FLUSH {
            let name = format!("/dev/shm/torch_4243_{i}");
            writer.write_kernel(&openat(i, 4243, &name, 11, i)).unwrap();
            i += 1;
        }
        writer.flush(&mut no_carry).unwrap();
        println!("flushed {i}");
    }
}

fn kill_mid_write(compressed: bool) {
    let dir = TempDir::new("crash");
    let path = dir.join("trace.shmtrace");
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "record::tests::crash::crash_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if compressed {
        command.env("SHMTRACE_CRASH_ZSTD", "1");
    } else {
        command.env_remove("SHMTRACE_CRASH_ZSTD");
    }
    let mut child = command.spawn().unwrap();
    // A thread keeps draining the child's reports, so the child never blocks on its pipe and
    // is killed while it is busy writing.
    let stdout = child.stdout.take().unwrap();
    let reported = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let drain = {
        let reported = reported.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("flushed ") {
                    reported.store(n.parse().unwrap(), std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    // Bounded, and never waiting on a child that already ended: on a loaded machine the child
    // may be slow, and a child that failed must fail the test, not hang it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while reported.load(std::sync::atomic::Ordering::SeqCst) < 20_000 {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the writing child ended before it was killed: {status}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the writing child flushed only {} records in two minutes",
            reported.load(std::sync::atomic::Ordering::SeqCst)
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    drain.join().unwrap();
    let flushed = reported.load(std::sync::atomic::Ordering::SeqCst);

    let (entries, error) = read_all(&path);
    assert!(
        entries.len() as u64 >= flushed,
        "read {} records, {flushed} were flushed",
        entries.len()
    );
    for (i, entry) in entries.iter().enumerate() {
        assert_eq!(entry.ts_ns, i as u64, "records in order, none missing");
        crate::event::decode(kernel(entry)).unwrap();
    }
    // The child dies between or inside writes: a clean end or a torn last block.
    if let Some(error) = error {
        assert!(error.is_truncation(), "{error}");
    }
    // Either way the file lacks the end mark, so a reader can say it was cut short.
    let mut reader = crate::record::TraceReader::open(&path).unwrap();
    for _ in reader.by_ref() {}
    assert!(!reader.closed());
    eprintln!(
        "kill -9 ({}): {flushed} records reported flushed, {} read back",
        if compressed { "zstd" } else { "plain" },
        entries.len()
    );
}

#[test]
fn kill_9_loses_nothing_flushed() {
    kill_mid_write(false);
}

#[test]
fn kill_9_loses_nothing_flushed_compressed() {
    kill_mid_write(true);
}
