//! The flight recorder: windows before a trigger, tails after, later triggers, memory bound,
//! context for processes older than the window.
use std::time::Duration;

use super::*;
use crate::record::{
    FlightOptions, FlightRecorder, Trigger, TriggerReason, Triggered, WriterOptions, rotation,
};

const S: u64 = 1_000_000_000;

fn options(window: u64, tail: u64) -> FlightOptions {
    FlightOptions {
        window: Duration::from_secs(window),
        tail: Duration::from_secs(tail),
        writer: WriterOptions::default(),
        ..FlightOptions::default()
    }
}

fn enospc(pid: u32) -> Trigger {
    Trigger {
        reason: TriggerReason::Enospc,
        pid: Some(pid),
        detail: "fallocate = -ENOSPC".into(),
    }
}

/// A record that is not context: an object opened at second `t`.
fn filler(t: u64) -> Bytes {
    openat(t * S, 4242, "/dev/shm/torch_4242_1", 11, t).into()
}

fn kernel_ts(path: &Path) -> Vec<u64> {
    let (entries, error) = read_all(path);
    assert!(error.is_none(), "{error:?}");
    entries
        .iter()
        .filter(|e| matches!(e.record, Record::Kernel(_)))
        .map(|e| e.ts_ns / S)
        .collect()
}

/// A record at 20 s, a trigger then, and the dump it started, read back.
fn dump_at_20s(mut recorder: FlightRecorder) -> (PathBuf, Vec<Entry>) {
    recorder.push(20 * S, Record::Kernel(filler(20))).unwrap();
    let Triggered::Started(path) = recorder.trigger(20 * S, enospc(2)).unwrap() else {
        panic!("a new dump")
    };
    recorder.finish().unwrap();
    let (entries, _) = read_all(&path);
    (path, entries)
}

#[test]
fn a_trigger_writes_the_window_then_the_tail_then_waits_for_the_next() {
    let dir = TempDir::new("flight");
    let base = dir.join("incident.shmtrace");
    let mut recorder = FlightRecorder::new(&base, test_header(), options(10, 3)).unwrap();
    // The main process is seen at the start, long before any window.
    recorder.push(0, Record::User(snapshot(4242))).unwrap();
    recorder
        .push(
            0,
            Record::Kernel(exec(0, 4242, "/usr/bin/python3", &["python3"]).into()),
        )
        .unwrap();
    for t in 1..=40 {
        assert_eq!(
            recorder.push(t * S, Record::Kernel(filler(t))).unwrap(),
            None
        );
    }
    assert!(recorder.capturing().is_none());
    assert!(
        !base.exists() && rotation::discover(&base).unwrap().is_empty(),
        "no file before a failure"
    );

    let first = rotation::numbered(&base, 0);
    assert_eq!(
        recorder.trigger(40 * S, enospc(4243)).unwrap(),
        Triggered::Started(first.clone())
    );
    // The window is on disk at once, before the tail.
    assert_eq!(
        kernel_ts(&first),
        [0, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]
    );

    for t in 41..=43 {
        assert_eq!(
            recorder.push(t * S, Record::Kernel(filler(t))).unwrap(),
            None
        );
    }
    // A second failure during the tail extends it.
    assert_eq!(
        recorder.trigger(43 * S, enospc(4244)).unwrap(),
        Triggered::Extended(first.clone())
    );
    for t in 44..=46 {
        assert_eq!(
            recorder.push(t * S, Record::Kernel(filler(t))).unwrap(),
            None
        );
    }
    let done = recorder.push(47 * S, Record::Kernel(filler(47))).unwrap();
    assert_eq!(done, Some(first.clone()));
    assert!(recorder.capturing().is_none());

    let (entries, _) = read_all(&first);
    let header = TraceReader::open(&first).unwrap().header().clone();
    let flight = header.flight.unwrap();
    assert_eq!(
        (
            flight.reason.as_str(),
            flight.trigger_ts_ns,
            flight.window_start_ns
        ),
        ("ENOSPC", 40 * S, 30 * S)
    );
    // Context first: the snapshot and exec from t=0 name the process.
    assert_eq!(entries[0].record, Record::User(snapshot(4242)));
    assert_eq!(
        kernel_ts(&first),
        (30..=46).fold(vec![0], |mut v, t| {
            v.push(t);
            v
        })
    );
    let triggers = entries
        .iter()
        .filter(|e| matches!(e.record, Record::User(UserRecord::Trigger(_))))
        .count();
    assert_eq!(triggers, 2);

    // Recording goes on; a later failure makes a later file with its own window.
    for t in 48..=60 {
        recorder.push(t * S, Record::Kernel(filler(t))).unwrap();
    }
    let second = rotation::numbered(&base, 1);
    assert_eq!(
        recorder.trigger(60 * S, enospc(4245)).unwrap(),
        Triggered::Started(second.clone())
    );
    // With no more records, time alone ends the tail.
    assert_eq!(recorder.tick(62 * S).unwrap(), None);
    assert_eq!(recorder.tick(64 * S).unwrap(), Some(second.clone()));
    assert_eq!(
        kernel_ts(&second),
        (50..=60).fold(vec![0], |mut v, t| {
            v.push(t);
            v
        })
    );
    assert_eq!(TraceReader::open(&second).unwrap().header().sequence, 1);
    assert_eq!(recorder.stats().dumps, 2);
    assert_eq!(rotation::discover(&base).unwrap(), [first, second]);
}

#[test]
fn the_memory_bound_shortens_the_window_and_says_so() {
    let dir = TempDir::new("flight-memory");
    let base = dir.join("incident.shmtrace");
    let record_cost = openat(0, 1, "/dev/shm/x", 3, 1).len() + 20 + 64;
    let mut recorder = FlightRecorder::new(
        &base,
        test_header(),
        FlightOptions {
            max_window_bytes: 100 * record_cost,
            ..options(3600, 1)
        },
    )
    .unwrap();
    for i in 0..1000u64 {
        recorder
            .push(
                i * 1000,
                Record::Kernel(openat(i * 1000, 1, "/dev/shm/x", 3, i).into()),
            )
            .unwrap();
    }
    let (held, bytes) = recorder.window_size();
    assert!(
        held > 50 && held < 200 && bytes <= 100 * record_cost,
        "{held} records, {bytes} bytes"
    );
    let Triggered::Started(path) = recorder.trigger(999_000, enospc(1)).unwrap() else {
        panic!("a new dump")
    };
    assert_eq!(recorder.finish().unwrap(), Some(path.clone()));
    let flight = TraceReader::open(&path)
        .unwrap()
        .header()
        .flight
        .clone()
        .unwrap();
    assert_eq!(flight.evicted_for_memory, 1000 - held as u64);
    assert_eq!(kernel_ts(&path).len(), held);
}

#[test]
fn an_exited_process_leaves_the_context() {
    let dir = TempDir::new("flight-exit");
    let base = dir.join("incident.shmtrace");
    let mut recorder = FlightRecorder::new(&base, test_header(), options(5, 1)).unwrap();
    recorder.push(0, Record::User(snapshot(4242))).unwrap();
    recorder
        .push(S, Record::Kernel(rename(S, 4243, "pt_data_worker").into()))
        .unwrap();
    recorder
        .push(2 * S, Record::Kernel(exit(2 * S, 4242, 0).into()))
        .unwrap();
    let (path, entries) = dump_at_20s(recorder);
    // 4242's snapshot is gone with it; the worker's rename stays.
    assert!(
        !entries
            .iter()
            .any(|e| e.record == Record::User(snapshot(4242)))
    );
    assert_eq!(kernel_ts(&path), [1, 20]);
}

#[test]
fn a_name_planted_where_the_next_dump_goes_is_skipped_not_written_through() {
    use std::os::unix::fs::symlink;
    let dir = TempDir::new("flight-planted");
    let base = dir.join("incident.shmtrace");
    let mut recorder = FlightRecorder::new(&base, test_header(), options(10, 3)).unwrap();
    recorder.push(S, Record::Kernel(filler(1))).unwrap();
    // Planted after the recorder started: a file where dump 0 goes, a link where dump 1 goes.
    std::fs::write(rotation::numbered(&base, 0), b"planted").unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    symlink(&victim, rotation::numbered(&base, 1)).unwrap();

    let started = recorder.trigger(2 * S, enospc(4242)).unwrap();
    let dump = rotation::numbered(&base, 2);
    assert_eq!(started, Triggered::Started(dump.clone()));
    assert_eq!(recorder.stats().names_skipped, 2);
    recorder.finish().unwrap();
    assert_eq!(
        kernel_ts(&dump),
        vec![1],
        "the incident is in the next free name"
    );
    assert_eq!(
        std::fs::read(rotation::numbered(&base, 0)).unwrap(),
        b"planted"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

/// A container that stopped long before the window: a dump names its namespace number no more
/// (another container may have it now), while a running one's description stays.
#[test]
fn a_dump_after_a_containers_end_does_not_name_its_namespace() {
    let dir = TempDir::new("flight-container-end");
    let base = dir.join("incident.shmtrace");
    let mut recorder = FlightRecorder::new(&base, test_header(), options(5, 1)).unwrap();
    let described = |id: &str, mntns: u32| {
        UserRecord::Container(Box::new(crate::record::ContainerDescription {
            id: id.into(),
            name: Some(format!("name-{id}")),
            mntns: Some(mntns),
            ..Default::default()
        }))
    };
    recorder
        .push(0, Record::User(described("old", 77)))
        .unwrap();
    recorder
        .push(0, Record::User(described("running", 78)))
        .unwrap();
    recorder
        .push(S, Record::User(UserRecord::ContainerEnd { mntns: 77 }))
        .unwrap();
    let (_, entries) = dump_at_20s(recorder);
    let named: Vec<&str> = entries
        .iter()
        .filter_map(|e| match &e.record {
            Record::User(UserRecord::Container(c)) => Some(c.id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(named, ["running"]);
}
