//! See `container::fuzzing::cgroup_lines`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shmtrace::container::fuzzing::cgroup_lines(data));
