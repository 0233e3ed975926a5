//! Helpers for the hardening tests (`kernel_output_safety`, `kernel_signals`,
//! `kernel_hostile_input`, `kernel_privileges`): small real recordings; shmtrace in the
//! background with its stderr read line by line, signalled as a user or a supervisor would; and
//! the byte surgery that turns a real trace file into a damaged or hostile one.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};

use crate::{command::ShmtraceChild, recording::wait_for, shmtrace, tempdir};

/// A script that makes `n` /dev/shm objects, each created and removed: events to record.
pub fn shm_churn(n: u32) -> String {
    format!(
        "i=0; while [ $i -lt {n} ]; do : > /dev/shm/harden-$$-$i; rm /dev/shm/harden-$$-$i; \
         i=$((i+1)); done"
    )
}

/// `shmtrace ARGS`, its output captured.
pub fn run(args: &[&str]) -> Output {
    shmtrace().args(args).output().expect("running shmtrace")
}

/// Bytes a command printed, as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `shmtrace record -o FILE FLAGS -- sh -c SCRIPT`, which must succeed.
pub fn record(file: &Path, flags: &[&str], script: &str) -> Output {
    let output = shmtrace()
        .arg("record")
        .arg("-o")
        .arg(file)
        .args(flags)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    output
}

/// A small finished trace, in a fresh directory.
pub fn small_trace() -> (PathBuf, PathBuf) {
    let dir = tempdir();
    let file = dir.join("harden.shmtrace");
    record(&file, &[], &shm_churn(3));
    (dir, file)
}

/// `shmtrace ARGS` in the background, its stderr read line by line; its BPF objects are checked
/// to be released when it ends.
pub struct Background {
    pub child: ShmtraceChild,
    lines: mpsc::Receiver<String>,
    seen: String,
}

impl Background {
    pub fn start(args: &[&str], stdout: Stdio) -> Background {
        let mut child = shmtrace()
            .args(args)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Background {
            child,
            lines,
            seen: String::new(),
        }
    }

    /// Waits for shmtrace to say it is tracing, and checks that it then holds BPF objects (so
    /// that the leak check at the end has something to check).
    pub fn wait_until_tracing(&mut self) {
        self.wait_for_line("shmtrace: tracing");
        assert!(
            !self.child.bpf_objects().is_empty(),
            "shmtrace says it is tracing but holds no BPF object"
        );
    }

    /// Waits (30 s at most) for a stderr line containing `needle`.
    pub fn wait_for_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "no line with {needle:?} within 30 s; stderr:\n{}",
            self.seen
        );
    }

    pub fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Waits for the exit and checks the BPF objects are released; returns the status and all
    /// of stderr.
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let status = wait_for(&mut self.child, Duration::from_secs(60));
        self.child.assert_released();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(300)) {
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
        (status, self.seen.clone())
    }
}

/// The preamble's length (the header's CBOR starts there), and where in it the header's
/// length is (docs/trace-format.md).
pub const PREAMBLE_LEN: usize = 20;
const HEADER_LEN_AT: std::ops::Range<usize> = 12..16;
/// A frame's head, and where in it the payload's length is.
pub const FRAME_HEAD_LEN: usize = 20;
const PAYLOAD_LEN_AT: std::ops::Range<usize> = 4..8;

fn u32_at(bytes: &[u8], at: std::ops::Range<usize>) -> usize {
    u32::from_le_bytes(bytes[at].try_into().expect("4 bytes")) as usize
}

/// Where each frame of an uncompressed trace file starts, by walking the lengths the format
/// documents (docs/trace-format.md): the bytes a damaged-file test cuts or changes.
pub fn frame_starts(file: &[u8]) -> Vec<usize> {
    const COMPRESSED: u8 = 1 << 1;
    assert_eq!(
        file[10] & COMPRESSED,
        0,
        "a compressed trace: its frames are inside blocks"
    );
    let mut at = PREAMBLE_LEN + u32_at(file, HEADER_LEN_AT);
    let mut starts = Vec::new();
    while at + FRAME_HEAD_LEN <= file.len() {
        starts.push(at);
        at += FRAME_HEAD_LEN + u32_at(&file[at..], PAYLOAD_LEN_AT);
    }
    assert_eq!(at, file.len(), "the frames do not end where the file does");
    starts
}

/// The trace file with its header's CBOR changed by `change`, and the header's checksum made
/// right again (CRC-32 of the preamble's first 16 bytes and of the CBOR): a file whose header
/// is hostile rather than damaged.
pub fn with_header(file: &[u8], change: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut file = file.to_vec();
    let header = PREAMBLE_LEN..PREAMBLE_LEN + u32_at(&file, HEADER_LEN_AT);
    change(&mut file[header.clone()]);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&file[..16]);
    crc.update(&file[header]);
    file[16..PREAMBLE_LEN].copy_from_slice(&crc.finalize().to_le_bytes());
    file
}

/// `file` with its header's CBOR replaced by `cbor` (of any length), the header's length and
/// checksum made right for it: a header that is well formed as bytes and bad as CBOR.
pub fn with_header_cbor(file: &[u8], cbor: &[u8]) -> Vec<u8> {
    let old_end = PREAMBLE_LEN + u32_at(file, HEADER_LEN_AT);
    let mut out = file[..PREAMBLE_LEN].to_vec();
    out[HEADER_LEN_AT].copy_from_slice(&(cbor.len() as u32).to_le_bytes());
    out.extend_from_slice(cbor);
    out.extend_from_slice(&file[old_end..]);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[..16]);
    crc.update(cbor);
    out[16..PREAMBLE_LEN].copy_from_slice(&crc.finalize().to_le_bytes());
    out
}

/// The CBOR of `file`'s header.
pub fn header_cbor(file: &[u8]) -> &[u8] {
    &file[PREAMBLE_LEN..PREAMBLE_LEN + u32_at(file, HEADER_LEN_AT)]
}

/// Where the value of the CBOR text key `key` starts in `header`.
pub fn cbor_value_of(header: &[u8], key: &str) -> usize {
    // A short text string: major type 3 with its length in the low bits.
    let mut encoded = vec![0x60 | key.len() as u8];
    encoded.extend(key.as_bytes());
    let at = header
        .windows(encoded.len())
        .position(|w| w == encoded)
        .unwrap_or_else(|| panic!("no {key:?} in the header"));
    at + encoded.len()
}
