//! A trace file from a stranger: the reader, every record it yields, and the decoder of the
//! kernel records inside.
#![no_main]
use libfuzzer_sys::fuzz_target;
use shmtrace_core::record::{Record, TraceReader};

fuzz_target!(|data: &[u8]| {
    let Ok(reader) = TraceReader::new(data) else {
        return;
    };
    for entry in reader.take(100_000) {
        let Ok(entry) = entry else { break };
        if let Record::Kernel(bytes) = &entry.record {
            let _ = shmtrace_core::event::decode(bytes);
        }
    }
});
