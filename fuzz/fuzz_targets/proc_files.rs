//! /proc/PID/stat, status, maps and mountinfo: see `live::proc_scan::fuzz_proc_files`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shmtrace::live::proc_scan::fuzz_proc_files(data));
