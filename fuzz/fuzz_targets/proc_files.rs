//! /proc/PID/stat, status, maps and mountinfo: see `proc_scan::fuzz_proc_files`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shmtrace_fuzz::proc_scan::fuzz_proc_files(data));
