//! A trace file from a stranger, with arbitrary bytes in every string it holds, replayed the way
//! a user would (`report` to text, HTML and Perfetto; `show --json`): the text holds no control
//! byte shmtrace did not put there, the JSON parses, and the HTML holds no markup from the data.
use std::{fs, path::Path};

use proptest::prelude::*;
use shmtrace_common::{self as common, EventKind, Header, PathEvent, Syscall, SyscallEvent};

use super::replay;
use crate::cli::{ColorWhen, OutputArgs, ReportArgs, ShowArgs};
use shmtrace_core::record::{
    ContainerDescription, FlightInfo, ProcessSnapshot, SnapshotFdRecord, SnapshotMappingRecord,
    TargetDescription, TraceHeader, TraceWriter, Trigger, TriggerReason, UserRecord, WriterLoss,
    WriterOptions,
};

/// A fresh directory, removed afterwards.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn join(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn bytes_of<T>(value: &T) -> Vec<u8> {
    // SAFETY: the shmtrace-common structs are repr(C) integers and byte arrays.
    unsafe { std::slice::from_raw_parts(value as *const T as *const u8, size_of::<T>()) }.to_vec()
}

/// Always hostile (a tag, a terminal escape, a newline, a bidi override), then anything.
fn hostile() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..40).prop_map(|tail| {
        let mut bytes = b"<x-evil a='1'>\x1b]0;T\x07\x1b[2J\n\r".to_vec();
        bytes.extend_from_slice("\u{202e}\u{9b}".as_bytes());
        bytes.extend(tail);
        bytes
    })
}

/// A header and record strings hold UTF-8 (CBOR text); the kernel's fields hold raw bytes.
fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn fixed<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let len = bytes.len().min(N - 1);
    out[..len].copy_from_slice(&bytes[..len]);
    out
}

fn kernel_open(ts_ns: u64, pid: u32, name: &[u8], path: &[u8]) -> Vec<u8> {
    bytes_of(&PathEvent {
        call: SyscallEvent {
            header: Header {
                kind: EventKind::Path as u16,
                flags: common::flags::FILE,
                cpu: 0,
                ts_ns,
                pid,
                tid: pid,
                mntns: 4026532400,
                _pad: 0,
                cgroup_id: 1,
                comm: fixed(name),
            },
            syscall: Syscall::Openat as u16,
            _pad: 0,
            fd: 5,
            ret: -(libc::ENOSPC as i64),
            args: [(-100i64) as u64, 0, libc::O_CREAT as u64, 0o600, 0, 0],
            file: common::FileRef {
                dev: 26,
                mode: 0o100600,
                ino: 9,
                size: 0,
                blocks: 0,
            },
        },
        path: fixed(path),
    })
}

/// Writes a trace whose every string is hostile.
fn hostile_trace(path: &Path, s: &[Vec<u8>]) {
    let text = |i: usize| lossy(&s[i % s.len()]);
    let mut header = TraceHeader::for_this_host(TargetDescription::default()).unwrap();
    header.hostname = Some(text(0));
    header.kernel_release = text(1);
    header.target.command = Some(vec![text(2), text(3)]);
    header.flight = Some(FlightInfo {
        reason: text(4),
        ..FlightInfo::default()
    });
    let mut writer = TraceWriter::create(path, header, WriterOptions::default()).unwrap();
    let t0 = 1_000_000_000;
    writer
        .write_user(
            t0,
            &UserRecord::Container(Box::new(ContainerDescription {
                id: text(5),
                name: Some(text(6)),
                runtime: Some(text(7)),
                image: Some(text(8)),
                hostname: Some(text(9)),
                mntns: Some(4026532400),
                labels: [(text(10), text(11))].into_iter().collect(),
                ..ContainerDescription::default()
            })),
        )
        .unwrap();
    writer
        .write_user(
            t0,
            &UserRecord::Snapshot(ProcessSnapshot {
                pid: 4242,
                ppid: Some(1),
                comm: text(12),
                exe: Some(text(13)),
                argv: vec![text(14), text(15)],
                mntns: 4026532400,
                nspid: Some(7),
                fds: vec![SnapshotFdRecord {
                    fd: 5,
                    dev: 26,
                    ino: 9,
                    path: text(16),
                    deleted: false,
                    cloexec: false,
                    size: 4096,
                }],
                mappings: vec![SnapshotMappingRecord {
                    start: 0x7f00_0000_0000,
                    len: 4096,
                    offset: 0,
                    dev: 26,
                    ino: 9,
                    path: text(17),
                    deleted: false,
                }],
            }),
        )
        .unwrap();
    writer
        .write_kernel(&kernel_open(
            t0 + 1000,
            4242,
            &s[18 % s.len()],
            &s[19 % s.len()],
        ))
        .unwrap();
    writer
        .write_user(
            t0 + 2000,
            &UserRecord::WriterLoss(WriterLoss {
                records: 3,
                bytes: 300,
                reason: text(20),
            }),
        )
        .unwrap();
    writer
        .write_user(
            t0 + 3000,
            &UserRecord::Trigger(Trigger {
                reason: TriggerReason::Manual,
                pid: Some(4242),
                detail: text(21),
            }),
        )
        .unwrap();
    writer
        .write_user(t0 + 4000, &UserRecord::Note { text: text(22) })
        .unwrap();
    writer.finish(&mut shmtrace_core::record::no_carry).unwrap();
}

/// Text as a terminal would get it: only the newlines are shmtrace's own control bytes.
fn assert_clean_text(what: &str, text: &[u8]) {
    let text = String::from_utf8_lossy(text);
    for c in text.chars() {
        let control = ((c as u32) < 0x20 && c != '\n')
            || c == '\x7f'
            || (0x80..=0x9f).contains(&(c as u32))
            || matches!(c as u32, 0x202a..=0x202e | 0x2066..=0x2069);
        assert!(!control, "{what} holds {c:?}:\n{text}");
    }
}

fn check(strings: &[Vec<u8>]) {
    let dir = TempDir::new("harden-escape");
    let trace = dir.join("hostile.shmtrace");
    hostile_trace(&trace, strings);
    let (text, html, perfetto, json) = (
        dir.join("report.txt"),
        dir.join("report.html"),
        dir.join("report.json"),
        dir.join("show.jsonl"),
    );
    replay::report(&ReportArgs {
        file: trace.clone(),
        json: false,
        redact: false,
        output: Some(text.clone()),
        html: Some(html.clone()),
        perfetto: Some(perfetto.clone()),
        // Hostile names on every object drawn, semaphores' too.
        show_all: true,
        color: ColorWhen::Never,
        size: false,
        budget: None,
    })
    .unwrap();
    replay::show(&ShowArgs {
        file: trace.clone(),
        pid: Vec::new(),
        role: Vec::new(),
        event: Vec::new(),
        container: Vec::new(),
        failed: false,
        since: None,
        until: None,
        output: OutputArgs {
            json: true,
            output: Some(json.clone()),
            color: ColorWhen::Never,
            show_all: false,
            verbose: false,
        },
    })
    .unwrap();
    let shown = dir.join("show.txt");
    replay::show(&ShowArgs {
        file: trace,
        pid: Vec::new(),
        role: Vec::new(),
        event: Vec::new(),
        container: Vec::new(),
        failed: false,
        since: None,
        until: None,
        output: OutputArgs {
            json: false,
            output: Some(shown.clone()),
            color: ColorWhen::Never,
            // Every line, hostile names in processes that did nothing else too.
            show_all: true,
            verbose: false,
        },
    })
    .unwrap();

    let report_text = fs::read(&text).unwrap();
    assert!(!report_text.is_empty());
    assert_clean_text("report", &report_text);
    assert_clean_text("show", &fs::read(&shown).unwrap());
    let lines = fs::read_to_string(&json).unwrap();
    assert!(lines.lines().count() > 0);
    for line in lines.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("show --json: {e}: {line}"));
    }
    serde_json::from_slice::<serde_json::Value>(&fs::read(&perfetto).unwrap())
        .expect("the Perfetto file parses");
    let page = fs::read_to_string(&html).unwrap().to_ascii_lowercase();
    assert!(
        !page.contains("<x-evil"),
        "markup from the data in the HTML"
    );
    assert!(
        page.contains("&lt;x-evil"),
        "the data was not in the page at all"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn hostile_strings_are_escaped_in_every_output(
        strings in prop::collection::vec(hostile(), 1..24)
    ) {
        check(&strings);
    }
}
