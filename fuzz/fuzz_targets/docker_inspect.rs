//! See `container::fuzzing::docker_inspect`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shmtrace::container::fuzzing::docker_inspect(data));
