//! See `container::fuzzing::mountinfo`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shmtrace::container::fuzzing::mountinfo(data));
