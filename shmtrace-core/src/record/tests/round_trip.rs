//! Records written and read back: bytes unchanged, replayed through the same decoder and model
//! as a live trace; compression; flush policy; rotation.
use std::time::{Duration, Instant};

use super::*;
use crate::{
    event::{Body, LostCounts, decode},
    model::World,
    record::{
        LostCounters, Rotation, TraceSet, TraceWriter, WriteError, WriterOptions, no_carry,
        rotation,
    },
};

fn write_sample(path: &Path, compression: Option<i32>) -> Vec<Vec<u8>> {
    let records = dataloader_records(1_000_000_000);
    let options = WriterOptions {
        compression,
        ..WriterOptions::default()
    };
    let mut writer = TraceWriter::create(path, test_header(), options).unwrap();
    writer.write_user(999_000_000, &snapshot(4242)).unwrap();
    for record in &records {
        writer.write_kernel(record).unwrap();
    }
    let mut lost = LostCounts::default();
    lost.add(shmtrace_common::Loss::RingFull(EventKind::Syscall), 3);
    writer
        .write_user(1_000_010_000, &UserRecord::Lost(LostCounters::from(&lost)))
        .unwrap();
    let stats = writer.finish(&mut no_carry).unwrap();
    assert_eq!(stats.records, records.len() as u64 + 2);
    assert_eq!(stats.records_dropped, 0);
    records
}

fn check_sample(path: &Path, records: &[Vec<u8>], compressed: bool) {
    let (entries, error) = read_all(path);
    assert!(error.is_none(), "{error:?}");
    let reader = TraceReader::open(path).unwrap();
    assert_eq!(reader.header().compressed, compressed);
    assert_eq!(
        reader.header().target.command.as_ref().unwrap()[1],
        "train.py"
    );
    assert_eq!(entries.len(), records.len() + 2);
    assert_eq!(entries[0].record, Record::User(snapshot(4242)));
    for (entry, original) in entries[1..].iter().zip(records) {
        // Byte for byte, and the timestamp taken from the kernel header.
        assert_eq!(&kernel(entry)[..], &original[..]);
        assert_eq!(entry.ts_ns, decode(original).unwrap().ts_ns);
        assert_eq!(decode(kernel(entry)).unwrap(), decode(original).unwrap());
    }

    // Replayed into the model the way `report` will: snapshots seed, kernel records apply.
    let mut world = World::new();
    for entry in &entries {
        match &entry.record {
            Record::Kernel(bytes) => {
                world.apply(&decode(bytes).unwrap());
            }
            Record::User(UserRecord::Snapshot(s)) => world.seed(&s.to_model(), entry.ts_ns),
            Record::User(_) => {}
        }
    }
    assert_eq!(world.totals().failed_calls, 1);
    assert_eq!(world.totals().deaths_by_signal, 1);
    assert_eq!(world.process(4243).unwrap().comm, "pt_data_worker");
    let Record::User(UserRecord::Lost(lost)) = &entries.last().unwrap().record else {
        panic!("lost counters last")
    };
    assert_eq!(lost.to_counts().0.total(), 3);
}

#[test]
fn kernel_records_round_trip_uncompressed() {
    let dir = TempDir::new("plain");
    let path = dir.join("trace.shmtrace");
    let records = write_sample(&path, None);
    check_sample(&path, &records, false);
}

#[test]
fn kernel_records_round_trip_compressed() {
    let dir = TempDir::new("zstd");
    let path = dir.join("trace.shmtrace");
    let records = write_sample(&path, Some(3));
    check_sample(&path, &records, true);
}

#[test]
fn compression_shrinks_kernel_records() {
    let dir = TempDir::new("ratio");
    let mut sizes = Vec::new();
    for compression in [None, Some(3)] {
        let path = dir.join(&format!("{compression:?}.shmtrace"));
        let options = WriterOptions {
            compression,
            ..WriterOptions::default()
        };
        let mut writer = TraceWriter::create(&path, test_header(), options).unwrap();
        for i in 0..2000u64 {
            let name = format!("/dev/shm/torch_4243_{i}");
            writer
                .write_kernel(&openat(i * 1000, 4243, &name, 11, i))
                .unwrap();
        }
        writer.finish(&mut no_carry).unwrap();
        sizes.push(std::fs::metadata(&path).unwrap().len());
        let (entries, error) = read_all(&path);
        assert!(error.is_none());
        assert_eq!(entries.len(), 2000);
    }
    assert!(
        sizes[1] * 10 < sizes[0],
        "zstd {} vs plain {}",
        sizes[1],
        sizes[0]
    );
}

#[test]
fn nothing_reaches_the_file_before_a_flush_and_flushes_fall_due() {
    let dir = TempDir::new("flush");
    let path = dir.join("trace.shmtrace");
    let options = WriterOptions {
        flush_interval: Duration::from_millis(50),
        ..WriterOptions::default()
    };
    let mut writer = TraceWriter::create(&path, test_header(), options).unwrap();
    let header_only = std::fs::metadata(&path).unwrap().len();
    assert_eq!(read_all(&path).0.len(), 0);
    writer.write_kernel(&fork(1, 1, 2)).unwrap();
    let now = Instant::now();
    assert!(!writer.flush_due(now));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), header_only);
    let later = now + Duration::from_millis(60);
    assert!(writer.flush_due(later));
    assert_eq!(
        writer.flush_if_due(later, &mut no_carry).unwrap().records,
        1
    );
    assert_eq!(read_all(&path).0.len(), 1);
    assert!(writer.flush_deadline().is_none());
}

#[test]
fn a_record_too_large_is_dropped_counted_and_recorded_as_a_hole() {
    let dir = TempDir::new("large");
    let path = dir.join("trace.shmtrace");
    let mut writer = TraceWriter::create(&path, test_header(), WriterOptions::default()).unwrap();
    let huge = vec![0u8; super::super::writer::MAX_RECORD + 1];
    assert!(matches!(
        writer.write_kernel(&huge),
        Err(WriteError::TooLarge { .. })
    ));
    writer.write_kernel(&fork(5, 1, 2)).unwrap();
    let stats = writer.finish(&mut no_carry).unwrap();
    assert_eq!(stats.records_dropped, 1);
    let (entries, error) = read_all(&path);
    assert!(error.is_none());
    let Record::User(UserRecord::WriterLoss(loss)) = &entries[0].record else {
        panic!("the hole is recorded first: {entries:?}")
    };
    assert_eq!(loss.records, 1);
    assert_eq!(entries.len(), 2);
}

#[test]
fn rotation_keeps_the_newest_files_each_readable_alone() {
    for compression in [None, Some(3)] {
        let dir = TempDir::new("rotate");
        let base = dir.join("trace.shmtrace");
        let options = WriterOptions {
            compression,
            rotation: Some(Rotation {
                max_size: 64 << 10,
                keep: Some(3),
            }),
            ..WriterOptions::default()
        };
        let mut writer = TraceWriter::create(&base, test_header(), options).unwrap();
        let mut rotations = 0;
        let total = if compression.is_some() {
            30_000u64
        } else {
            6000
        };
        for i in 0..total {
            // Distinct names, so that compression leaves enough bytes to rotate.
            let name = format!("/dev/shm/torch_4243_{}", i.wrapping_mul(0x9e3779b97f4a7c15));
            writer
                .write_kernel(&openat(i + 1, 4243, &name, 11, i))
                .unwrap();
            if i % 100 == 99 {
                let flushed = writer.flush(&mut || vec![(i, snapshot(4242))]).unwrap();
                rotations += flushed.rotated_to.len();
            }
        }
        let stats = writer
            .finish(&mut || vec![(total, snapshot(4242))])
            .unwrap();
        assert!(
            rotations >= 3,
            "{compression:?}: only {rotations} rotations"
        );
        assert_eq!(stats.files as usize, rotations + 1);
        assert_eq!(stats.files_removed as usize, rotations + 1 - 3);

        let files = rotation::discover(&base).unwrap();
        assert_eq!(files.len(), 3);
        let mut sorted = files.clone();
        sorted.sort();
        assert_eq!(files, sorted, "names sort in recording order");
        let mut sequences = Vec::new();
        for file in &files {
            assert!(std::fs::metadata(file).unwrap().len() <= 64 << 10);
            let reader = TraceReader::open(file).unwrap();
            sequences.push(reader.header().sequence);
            let (entries, error) = read_entries(reader);
            assert!(error.is_none(), "{error:?}");
            // Each file starts with the state carried over from the one before.
            assert_eq!(entries[0].record, Record::User(snapshot(4242)));
        }
        assert_eq!(
            sequences,
            [rotations as u32 - 2, rotations as u32 - 1, rotations as u32]
        );

        // As one stream: the newest records, in order, ending with the last one written.
        let set = TraceSet::open(&base).unwrap();
        let (entries, error) = read_entries(set);
        assert!(error.is_none());
        let ts: Vec<u64> = entries
            .iter()
            .filter(|e| matches!(e.record, Record::Kernel(_)))
            .map(|e| e.ts_ns)
            .collect();
        let gaps: Vec<_> = ts.windows(2).filter(|w| w[1] != w[0] + 1).collect();
        assert!(gaps.is_empty(), "{compression:?}: gaps {gaps:?}");
        assert_eq!(*ts.last().unwrap(), total);

        // A new recording refuses to mix with these files.
        assert!(matches!(
            TraceWriter::create(
                &base,
                test_header(),
                WriterOptions {
                    rotation: Some(Rotation {
                        max_size: 64 << 10,
                        keep: None
                    }),
                    ..WriterOptions::default()
                }
            ),
            Err(WriteError::Exists { .. })
        ));
    }
}

/// Files whose kernel records go back in time are named, and files that do not are not, even
/// though each file's carried-over processes are stamped when the writer flushed: one flush can
/// fill several files, stamping all their carry-overs alike and after the records that follow.
#[test]
fn going_back_in_time_is_judged_by_kernel_records() {
    let ms = 1_000_000;
    let flushed_at = 1000 * ms;
    let set_of = |starts: [u64; 3]| {
        let dir = TempDir::new("back-in-time");
        let base = dir.join("trace.shmtrace");
        let header = test_header();
        for (sequence, start) in (0u32..).zip(starts) {
            let path = rotation::numbered(&base, sequence);
            let mut header = header.clone();
            header.sequence = sequence;
            let mut writer = TraceWriter::create(&path, header, WriterOptions::default()).unwrap();
            writer.write_user(flushed_at, &snapshot(4242)).unwrap();
            for i in 0..10 {
                writer
                    .write_kernel(&fork((start + i) * ms, 4242, 5000 + i as u32))
                    .unwrap();
            }
            writer.finish(&mut no_carry).unwrap();
        }
        let mut set = TraceSet::open(&base).unwrap();
        let (entries, error) = read_entries(&mut set);
        assert!(error.is_none(), "{error:?}");
        assert_eq!(entries.len(), 3 * 11, "every record");
        (set.gaps().to_vec(), dir)
    };
    let (in_order, _dir) = set_of([100, 200, 300]);
    assert!(in_order.is_empty(), "{in_order:?}");
    let (swapped, _dir) = set_of([100, 300, 200]);
    assert_eq!(swapped.len(), 1, "{swapped:?}");
    assert!(
        swapped[0].contains("000002.shmtrace starts 0.109 s before the end of"),
        "{swapped:?}"
    );
}

#[test]
fn decoded_bodies_are_what_the_probes_meant() {
    // A guard on the fixtures themselves: they are the kernel layouts the decoder expects.
    let events: Vec<_> = dataloader_records(0)
        .iter()
        .map(|r| decode(r).unwrap())
        .collect();
    assert!(matches!(&events[0].body, Body::Exec(e) if e.argv.len() == 4));
    assert!(matches!(&events[4].body, Body::Call(c) if c.errno() == Some(libc::ENOSPC)));
}

#[test]
fn finish_names_the_file_written_last_when_its_flush_rotates() {
    // A burst faster than the flush interval leaves much queued for `finish`, whose flush
    // rotates several times: the stats must name the newest file, not the one open before.
    let dir = TempDir::new("rotate-at-finish");
    let base = dir.join("trace.shmtrace");
    let options = WriterOptions {
        rotation: Some(Rotation {
            max_size: 64 << 10,
            keep: Some(3),
        }),
        ..WriterOptions::default()
    };
    let mut writer = TraceWriter::create(&base, test_header(), options).unwrap();
    let first = writer.path().to_owned();
    for i in 0..4_000u64 {
        writer
            .write_kernel(&Bytes::from(openat(i, 4242, "/dev/shm/burst", 5, i)))
            .unwrap();
    }
    let stats = writer.finish(&mut no_carry).unwrap();
    assert!(stats.files > 3, "{stats:?}");
    let files = rotation::discover(&base).unwrap();
    assert_eq!(stats.last_path, *files.last().unwrap());
    assert_ne!(stats.last_path, first);
}

#[test]
fn finished_files_end_with_the_end_mark_and_cut_ones_do_not() {
    let dir = TempDir::new("end-mark");
    let path = dir.join("trace.shmtrace");
    write_sample(&path, None);
    let mut reader = TraceReader::open(&path).unwrap();
    let entries: Vec<_> = reader.by_ref().collect::<Result<_, _>>().unwrap();
    assert!(reader.closed());
    // The mark is the reader's own business, not a record.
    assert!(
        entries
            .iter()
            .all(|e| e.record != Record::User(UserRecord::End))
    );

    // Cut exactly at the mark, as a SIGKILL between two flushes leaves a file: it reads
    // without error, and says it was cut short.
    let bytes = std::fs::read(&path).unwrap();
    let mut mark = Vec::new();
    crate::record::format::encode_frame(
        &mut mark,
        crate::record::format::FrameKind::User,
        0,
        &UserRecord::End.to_cbor(),
    );
    let cut = dir.join("cut.shmtrace");
    std::fs::write(&cut, &bytes[..bytes.len() - mark.len()]).unwrap();
    let mut reader = TraceReader::open(&cut).unwrap();
    let again: Vec<_> = reader.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(again, entries);
    assert!(!reader.closed());

    // A redacted copy is as complete as its input.
    let copy = dir.join("copy.shmtrace");
    let stats = crate::record::redact_file(&cut, &copy, WriterOptions::default()).unwrap();
    assert!(stats.input_cut_short);
    let mut set = TraceSet::open(&copy).unwrap();
    for _ in set.by_ref() {}
    assert!(!set.closed());
    let whole = dir.join("whole.shmtrace");
    let stats = crate::record::redact_file(&path, &whole, WriterOptions::default()).unwrap();
    assert!(!stats.input_cut_short);
    let mut set = TraceSet::open(&whole).unwrap();
    for _ in set.by_ref() {}
    assert!(set.closed());
}

#[test]
fn every_rotated_file_is_closed_and_so_is_the_set() {
    let dir = TempDir::new("end-mark-rotated");
    let base = dir.join("trace.shmtrace");
    let options = WriterOptions {
        rotation: Some(Rotation {
            max_size: 64 << 10,
            keep: None,
        }),
        ..WriterOptions::default()
    };
    let mut writer = TraceWriter::create(&base, test_header(), options).unwrap();
    for i in 0..2_000u64 {
        writer
            .write_kernel(&openat(i, 4242, "/dev/shm/burst", 5, i))
            .unwrap();
        if i % 100 == 99 {
            writer.flush(&mut no_carry).unwrap();
        }
    }
    writer.finish(&mut no_carry).unwrap();
    let files = rotation::discover(&base).unwrap();
    assert!(files.len() > 2);
    for file in &files {
        assert!(std::fs::metadata(file).unwrap().len() <= 64 << 10);
        let mut reader = TraceReader::open(file).unwrap();
        for entry in reader.by_ref() {
            entry.unwrap();
        }
        assert!(reader.closed(), "{}", file.display());
    }
    let mut set = TraceSet::open(&base).unwrap();
    assert_eq!(set.by_ref().filter(|e| e.is_ok()).count(), 2_000);
    assert!(set.closed());
}

/// Records across many read-ahead chunks, one larger than a chunk, and the file cut anywhere:
/// every record comes back whole and in order, and a cut one is a truncation after all those
/// before it.
#[test]
fn records_across_read_ahead_chunks_and_cut_anywhere_read_back() {
    let dir = TempDir::new("read-ahead");
    let path = dir.join("t.shmtrace");
    let mut writer = TraceWriter::create(&path, test_header(), WriterOptions::default()).unwrap();
    let big = "x".repeat(600 << 10);
    let mut records = Vec::new();
    for i in 0..3000u64 {
        let record = openat(
            1_000_000_000 + i,
            4242,
            &format!("/dev/shm/torch_{i}"),
            3,
            i,
        );
        writer.write_kernel(&record).unwrap();
        records.push(record);
        if i == 1500 {
            let note = UserRecord::Note { text: big.clone() };
            writer.write_user(1_000_000_000 + i, &note).unwrap();
        }
    }
    writer.finish(&mut no_carry).unwrap();
    let (entries, error) = read_all(&path);
    assert!(error.is_none(), "{error:?}");
    let kernel: Vec<&[u8]> = entries
        .iter()
        .filter_map(|e| match &e.record {
            Record::Kernel(bytes) => Some(&bytes[..]),
            _ => None,
        })
        .collect();
    assert_eq!(
        kernel,
        records.iter().map(Vec::as_slice).collect::<Vec<_>>()
    );
    assert!(
        entries
            .iter()
            .any(|e| e.record == Record::User(UserRecord::Note { text: big.clone() }))
    );

    let whole = std::fs::read(&path).unwrap();
    let cut_path = dir.join("cut.shmtrace");
    for cut in [
        300_000,
        262_144,
        262_145,
        700_000,
        1_000_001,
        whole.len() - 1,
    ] {
        std::fs::write(&cut_path, &whole[..cut]).unwrap();
        let (entries, error) = read_all(&cut_path);
        let error = error.expect("a cut file ends in an error");
        assert!(error.is_truncation(), "cut at {cut}: {error}");
        assert!(error.offset < cut as u64, "cut at {cut}: {error}");
        let read = entries
            .iter()
            .filter(|e| matches!(e.record, Record::Kernel(_)))
            .count();
        assert_eq!(
            entries
                .iter()
                .filter_map(|e| match &e.record {
                    Record::Kernel(bytes) => Some(&bytes[..]),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            records[..read]
                .iter()
                .map(Vec::as_slice)
                .collect::<Vec<_>>(),
            "cut at {cut}"
        );
    }
}
