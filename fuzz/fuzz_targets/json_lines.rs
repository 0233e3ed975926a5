//! Kernel records from a stranger, shown as JSON lines (`shmtrace show --json`): each line
//! must be what serde_json writes for the value it holds, byte for byte (parsed, then written
//! again in its order: `preserve_order`). Event lines are written by a short path of their own
//! (`output/flat_value.rs`, with unchecked copies and an eight-bytes-at-a-time escape check)
//! instead of serde_json's: this holds it to serde_json on names, paths and command lines no
//! test thought of. It cannot tell a string copied wrong into another valid string: the copies
//! are checked at every length by `flat_value`'s unit tests.
//!
//! The input is records, each after its length (u16, little-endian), not a trace file: a trace
//! file's frames carry CRCs, which nearly every mutation of a name would break.
#![no_main]
use std::{
    io::{self, Write},
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shmtrace_core::{
    clock::Clock,
    diagnose::Diagnoser,
    model::World,
    output::{Format, Output, filter::Filter},
    pipeline::{Pipeline, Recorded},
};

/// The output, kept to be read back.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let lines = Lines::default();
    let output = Output::new(
        Box::new(lines.clone()),
        Format::Json,
        Clock::with_offset(0, jiff::tz::TimeZone::UTC),
        false,
    );
    let mut pipeline = Pipeline::new(World::new(), Diagnoser::new(0), output, Filter::default());
    let mut rest = data;
    while let [low, high, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*low, *high])).min(tail.len());
        let (record, after) = tail.split_at(len);
        rest = after;
        // An error is the pipeline's answer to a record it refuses; the lines it wrote before
        // are checked all the same.
        let _ = pipeline.kernel_record(&Bytes::copy_from_slice(record), &mut Recorded);
    }
    drop(pipeline);
    let text = lines.0.lock().unwrap().clone();
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let value: serde_json::Value = serde_json::from_slice(line).unwrap_or_else(|error| {
            panic!("not JSON ({error}): {}", String::from_utf8_lossy(line))
        });
        let again = serde_json::to_vec(&value).expect("a parsed value is written");
        assert!(
            again == line,
            "a line is not as serde_json writes it:\n  {}\n  {}",
            String::from_utf8_lossy(line),
            String::from_utf8_lossy(&again)
        );
    }
});
