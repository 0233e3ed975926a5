//! A bounded fuzz run of the reader, in plain `cargo test`: random bytes, truncations, bit
//! flips, and payloads mutated behind a recomputed checksum (so that the CBOR and zstd decoders
//! see hostile input too). The reader must never panic, must stop, and must never return a
//! record that was not written.
use std::sync::OnceLock;

use proptest::prelude::*;

use super::*;
use crate::record::{
    TraceWriter, WriterOptions,
    format::{FRAME_HEAD_LEN, FrameHead, MAGIC},
    no_carry,
};

struct Sample {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
}

/// A small real trace, written once: plain (0) and compressed (1).
fn sample(compressed: bool) -> &'static Sample {
    static SAMPLES: OnceLock<[Sample; 2]> = OnceLock::new();
    &SAMPLES.get_or_init(|| [make(None), make(Some(3))])[usize::from(compressed)]
}

fn make(compression: Option<i32>) -> Sample {
    let dir = TempDir::new("fuzz");
    let path = dir.join("sample.shmtrace");
    let options = WriterOptions {
        compression,
        ..WriterOptions::default()
    };
    let mut writer = TraceWriter::create(&path, test_header(), options).unwrap();
    writer.write_user(1, &snapshot(4242)).unwrap();
    for (i, record) in dataloader_records(10).iter().enumerate() {
        writer.write_kernel(record).unwrap();
        if i % 3 == 2 {
            writer.flush(&mut no_carry).unwrap();
        }
    }
    writer
        .write_user(
            99,
            &UserRecord::Note {
                text: "done".into(),
            },
        )
        .unwrap();
    writer.finish(&mut no_carry).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (entries, error) = read_all(&path);
    assert!(error.is_none());
    Sample { bytes, entries }
}

/// Reads `bytes` to the end; checks that whatever came out is a prefix of `expected`.
fn read_checked(
    bytes: &[u8],
    expected: Option<&[Entry]>,
) -> (usize, Option<crate::record::ReadError>) {
    let reader = match TraceReader::new(bytes) {
        Ok(reader) => reader,
        Err(error) => {
            assert!(error.offset <= bytes.len() as u64);
            return (0, Some(error));
        }
    };
    let (entries, error) = read_entries(reader);
    if let Some(expected) = expected {
        assert!(entries.len() <= expected.len());
        for (got, want) in entries.iter().zip(expected) {
            assert_eq!(got.record, want.record);
        }
    }
    if let Some(error) = &error {
        assert!(error.offset <= bytes.len() as u64, "{error}");
        let _ = error.to_string();
    }
    (entries.len(), error)
}

/// Offsets of the top-level frames of a sample.
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut at = sample_body_start(bytes);
    let mut out = Vec::new();
    while at + FRAME_HEAD_LEN <= bytes.len() {
        let head = FrameHead::parse(bytes[at..at + FRAME_HEAD_LEN].try_into().unwrap());
        out.push((at, head.len as usize));
        at += FRAME_HEAD_LEN + head.len as usize;
    }
    out
}

fn sample_body_start(bytes: &[u8]) -> usize {
    20 + u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..2048), with_magic in any::<bool>()) {
        let mut bytes = if with_magic { MAGIC.to_vec() } else { Vec::new() };
        bytes.extend_from_slice(&tail);
        read_checked(&bytes, None);
    }

    #[test]
    fn random_bodies_after_a_good_header_never_panic(
        body in proptest::collection::vec(any::<u8>(), 0..4096),
        compressed in any::<bool>(),
    ) {
        let sample = sample(compressed);
        let mut bytes = sample.bytes[..sample_body_start(&sample.bytes)].to_vec();
        bytes.extend_from_slice(&body);
        read_checked(&bytes, None);
    }

    #[test]
    fn truncations_keep_a_prefix(cut in any::<prop::sample::Index>(), compressed in any::<bool>()) {
        let sample = sample(compressed);
        let cut = cut.index(sample.bytes.len() + 1);
        let (read, error) = read_checked(&sample.bytes[..cut], Some(&sample.entries));
        if cut == sample.bytes.len() {
            prop_assert!(error.is_none());
            prop_assert_eq!(read, sample.entries.len());
        } else if let Some(error) = error {
            prop_assert!(error.is_truncation() || cut == 0, "{}", error);
        }
    }

    #[test]
    fn bit_flips_are_caught(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..8),
        compressed in any::<bool>(),
    ) {
        let sample = sample(compressed);
        let mut bytes = sample.bytes.clone();
        for (at, mask) in flips {
            let at = at.index(bytes.len());
            bytes[at] ^= mask;
        }
        // The checksums stop the reader at the damage: what it returns was written.
        read_checked(&bytes, Some(&sample.entries));
    }

    #[test]
    fn hostile_headers_behind_a_good_checksum(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
    ) {
        let sample = sample(false);
        let mut bytes = sample.bytes.clone();
        let end = sample_body_start(&bytes);
        for (i, value) in &edits {
            bytes[20 + i.index(end - 20)] = *value;
        }
        let crc = crate::record::format::preamble_crc(&bytes[..16], &bytes[20..end]);
        bytes[16..20].copy_from_slice(&crc.to_le_bytes());
        read_checked(&bytes, None);
    }

    #[test]
    fn hostile_payloads_behind_good_checksums(
        frame in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        compressed in any::<bool>(),
    ) {
        let sample = sample(compressed);
        let mut bytes = sample.bytes.clone();
        let frames = frames(&bytes);
        let (at, len) = frames[frame.index(frames.len())];
        if len > 0 {
            for (i, value) in &edits {
                bytes[at + FRAME_HEAD_LEN + i.index(len)] = *value;
            }
            let head: [u8; FRAME_HEAD_LEN] = bytes[at..at + FRAME_HEAD_LEN].try_into().unwrap();
            let crc = FrameHead::expected_crc(&head, &bytes[at + FRAME_HEAD_LEN..at + FRAME_HEAD_LEN + len]);
            bytes[at + 16..at + 20].copy_from_slice(&crc.to_le_bytes());
        }
        // Kernel payloads are opaque to the reader and may come back changed; nothing panics.
        read_checked(&bytes, None);
    }
}
