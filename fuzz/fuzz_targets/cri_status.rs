//! See `container::fuzzing::cri_status`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shmtrace::container::fuzzing::cri_status(data));
