//! Files that are empty, foreign, truncated, corrupt or newer: a clear error naming the byte
//! offset and the reason, and every good record before it.
use super::*;
use crate::record::{
    Reason, TraceWriter, WriterOptions,
    format::{FrameKind, PREAMBLE_LEN, encode_frame},
    no_carry,
};

/// A file of `n` kernel records, flushed every `per_block` records; returns its bytes and the
/// offset of each record's frame.
fn sample(dir: &TempDir, compression: Option<i32>, n: u64, per_block: u64) -> (Vec<u8>, Vec<u64>) {
    let path = dir.join("good.shmtrace");
    let options = WriterOptions {
        compression,
        ..WriterOptions::default()
    };
    let mut writer = TraceWriter::create(&path, test_header(), options).unwrap();
    for i in 0..n {
        writer.write_kernel(&fork(i, 1, 1000 + i as u32)).unwrap();
        if i % per_block == per_block - 1 {
            writer.flush(&mut no_carry).unwrap();
        }
    }
    writer.finish(&mut no_carry).unwrap();
    let (entries, error) = read_all(&path);
    assert!(error.is_none());
    (
        std::fs::read(&path).unwrap(),
        entries.iter().map(|e| e.offset).collect(),
    )
}

fn read_bytes(dir: &TempDir, bytes: &[u8]) -> (Vec<Entry>, Option<crate::record::ReadError>) {
    let path = dir.join("bad.shmtrace");
    std::fs::write(&path, bytes).unwrap();
    read_all(&path)
}

#[test]
fn empty_file() {
    let dir = TempDir::new("empty");
    let (entries, error) = read_bytes(&dir, b"");
    let error = error.unwrap();
    assert!(entries.is_empty());
    assert_eq!(error.offset, 0);
    assert!(matches!(error.reason, Reason::Empty));
    let text = error.to_string();
    assert!(
        text.contains("bad.shmtrace: at byte offset 0: the file is empty"),
        "{text}"
    );
}

#[test]
fn foreign_files() {
    let dir = TempDir::new("foreign");
    let elf = std::fs::read("/proc/self/exe").unwrap();
    let (_, error) = read_bytes(&dir, &elf[..4096]);
    let error = error.unwrap();
    assert!(matches!(error.reason, Reason::Foreign { .. }));
    let text = error.to_string();
    assert!(
        text.contains("not a shmtrace trace file (it starts with 7f 45 4c 46"),
        "{text}"
    );
    let (_, error) = read_bytes(&dir, b"{\"");
    assert!(matches!(error.unwrap().reason, Reason::Foreign { .. }));
}

#[test]
fn truncated_header() {
    let dir = TempDir::new("short-header");
    let (bytes, offsets) = sample(&dir, None, 3, 10);
    for cut in [3, 8, 15, PREAMBLE_LEN + 5, offsets[0] as usize - 1] {
        let (entries, error) = read_bytes(&dir, &bytes[..cut]);
        let error = error.unwrap();
        assert!(entries.is_empty());
        assert!(error.is_truncation(), "cut {cut}: {error}");
        assert_eq!(error.offset, cut as u64, "cut {cut}");
        assert!(
            error.to_string().contains("ends inside its header"),
            "{error}"
        );
    }
}

#[test]
fn newer_format_version() {
    let dir = TempDir::new("newer");
    let (mut bytes, _) = sample(&dir, None, 3, 10);
    bytes[8..10].copy_from_slice(&2u16.to_le_bytes());
    let (entries, error) = read_bytes(&dir, &bytes);
    let error = error.unwrap();
    assert!(entries.is_empty());
    assert_eq!(error.offset, 8);
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "trace format version 2 (written by shmtrace {}), and this shmtrace",
            env!("CARGO_PKG_VERSION")
        )) && text.contains("upgrade shmtrace"),
        "{text}"
    );
}

#[test]
fn corrupt_header() {
    let dir = TempDir::new("bad-header");
    let (mut bytes, _) = sample(&dir, None, 3, 10);
    bytes[PREAMBLE_LEN + 3] ^= 0x20;
    let (_, error) = read_bytes(&dir, &bytes);
    let error = error.unwrap();
    assert!(
        matches!(error.reason, Reason::HeaderChecksum { .. }),
        "{error}"
    );
    assert_eq!(error.offset, 0);
}

#[test]
fn truncated_record_keeps_everything_before() {
    let dir = TempDir::new("truncated");
    let (bytes, offsets) = sample(&dir, None, 10, 2);
    for k in [1usize, 5, 9] {
        for into in [1usize, 19, 20, 30] {
            let cut = offsets[k] as usize + into;
            let (entries, error) = read_bytes(&dir, &bytes[..cut]);
            let error = error.unwrap();
            assert_eq!(entries.len(), k, "cut at {cut}");
            assert!(error.is_truncation());
            assert_eq!(error.offset, offsets[k]);
            assert!(
                error.to_string().contains(&format!(
                    "at byte offset {}: the file ends inside",
                    offsets[k]
                )),
                "{error}"
            );
        }
    }
    // Cut exactly between records: a clean end.
    let (entries, error) = read_bytes(&dir, &bytes[..offsets[4] as usize]);
    assert_eq!(entries.len(), 4);
    assert!(error.is_none());
}

#[test]
fn corrupt_record_keeps_everything_before() {
    let dir = TempDir::new("corrupt");
    let (bytes, offsets) = sample(&dir, None, 10, 2);
    let mut bad = bytes.clone();
    bad[offsets[6] as usize + 40] ^= 0x01;
    let (entries, error) = read_bytes(&dir, &bad);
    let error = error.unwrap();
    assert_eq!(entries.len(), 6);
    assert_eq!(error.offset, offsets[6]);
    assert!(matches!(error.reason, Reason::Checksum { .. }));
    assert!(error.to_string().contains("the record is corrupt"));

    // A length field gone wild is refused before anything is allocated.
    let mut bad = bytes;
    let at = offsets[3] as usize + 4;
    bad[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let (entries, error) = read_bytes(&dir, &bad);
    assert_eq!(entries.len(), 3);
    assert!(matches!(error.unwrap().reason, Reason::Oversized { .. }));
}

#[test]
fn corrupt_compressed_block_keeps_the_blocks_before() {
    let dir = TempDir::new("corrupt-zstd");
    let (bytes, offsets) = sample(&dir, Some(3), 12, 3);
    // Records in a block share the block's offset: four blocks of three.
    let blocks: Vec<u64> = offsets.chunks(3).map(|c| c[0]).collect();
    assert_eq!(blocks.len(), 4);
    assert!(offsets.chunks(3).all(|c| c.iter().all(|o| *o == c[0])));
    let mut bad = bytes.clone();
    bad[blocks[2] as usize + 30] ^= 0x80;
    let (entries, error) = read_bytes(&dir, &bad);
    assert_eq!(entries.len(), 6);
    assert_eq!(error.unwrap().offset, blocks[2]);

    let (entries, error) = read_bytes(&dir, &bytes[..blocks[3] as usize + 25]);
    assert_eq!(entries.len(), 9);
    let error = error.unwrap();
    assert!(error.is_truncation());
    assert_eq!(error.offset, blocks[3]);
}

#[test]
fn unknown_record_kinds_stop_unless_skippable() {
    let dir = TempDir::new("kinds");
    let (bytes, _) = sample(&dir, None, 2, 10);
    let end = bytes.len() as u64;

    let mut skippable = bytes.clone();
    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::User, 7, b"future");
    frame[0] = 0x85;
    let crc = crate::record::format::FrameHead::expected_crc(
        frame[..20].try_into().unwrap(),
        &frame[20..],
    );
    frame[16..20].copy_from_slice(&crc.to_le_bytes());
    skippable.extend_from_slice(&frame);
    // Then the last kernel record again (the fork before the writer's end mark).
    let fork_end = bytes.len() - end_mark_len();
    skippable.extend_from_slice(
        &bytes[fork_end - (20 + size_of::<shmtrace_common::ForkEvent>())..fork_end],
    );
    let path = dir.join("skip.shmtrace");
    std::fs::write(&path, &skippable).unwrap();
    let mut reader = TraceReader::open(&path).unwrap();
    assert_eq!(reader.by_ref().filter(|e| e.is_ok()).count(), 3);
    assert_eq!(reader.skipped(), 1);

    let mut unknown = bytes;
    frame[0] = 0x05;
    let crc = crate::record::format::FrameHead::expected_crc(
        frame[..20].try_into().unwrap(),
        &frame[20..],
    );
    frame[16..20].copy_from_slice(&crc.to_le_bytes());
    unknown.extend_from_slice(&frame);
    let (entries, error) = read_bytes(&dir, &unknown);
    assert_eq!(entries.len(), 2);
    let error = error.unwrap();
    assert_eq!(error.offset, end);
    assert!(
        error.to_string().contains("unknown record kind 5"),
        "{error}"
    );
}

#[test]
fn a_rotated_set_from_another_recording_is_refused() {
    let dir = TempDir::new("mixed");
    let base = dir.join("trace.shmtrace");
    for sequence in 0..2 {
        let path = crate::record::rotation::numbered(&base, sequence);
        let mut writer =
            TraceWriter::create(&path, test_header(), WriterOptions::default()).unwrap();
        writer
            .write_kernel(&fork(u64::from(sequence), 1, 2))
            .unwrap();
        writer.finish(&mut no_carry).unwrap();
    }
    let (entries, error) = read_entries(crate::record::TraceSet::open(&base).unwrap());
    assert_eq!(entries.len(), 1);
    let error = error.unwrap();
    assert!(
        error.to_string().contains("belongs to another recording"),
        "{error}"
    );
}

/// Bytes of the end mark a finished file ends with.
fn end_mark_len() -> usize {
    let mut frame = Vec::new();
    encode_frame(&mut frame, FrameKind::User, 0, &UserRecord::End.to_cbor());
    frame.len()
}

/// A file whose kernel records were laid out by a different build is refused, naming both
/// layouts and the writer; a file from before the layout hash existed still reads.
#[test]
fn other_record_layout() {
    let dir = TempDir::new("layout");
    let write = |name: &str, layout: Option<u64>| {
        let path = dir.join(name);
        let mut header = test_header();
        header.tool_version = "9.9.9\x1b[2J".into();
        header.record_layout = layout;
        let mut writer = TraceWriter::create(&path, header, WriterOptions::default()).unwrap();
        writer.write_kernel(&fork(1, 1, 1000)).unwrap();
        writer.finish(&mut no_carry).unwrap();
        read_all(&path)
    };
    let (entries, error) = write("other.shmtrace", Some(shmtrace_common::LAYOUT_HASH ^ 1));
    let error = error.expect("refused");
    assert!(entries.is_empty());
    assert!(matches!(error.reason, Reason::OtherLayout { .. }));
    let text = error.to_string();
    assert!(text.contains("laid out differently"), "{text}");
    assert!(text.contains("written by shmtrace 9.9.9"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "the writer's version is escaped: {text}"
    );
    let (entries, error) = write("older.shmtrace", None);
    assert!(error.is_none(), "{error:?}");
    assert_eq!(entries.len(), 1);
}
