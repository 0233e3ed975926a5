//! The corpus (`tests/corpus/`): trace files recorded once from real programs in real
//! containers, each beside the verdict it must replay to. `tests/corpus.rs` replays them all
//! (no root, no containers: seconds); the `corpus` binary (`src/bin/corpus.rs`) records them.
//!
//! A verdict is what a user acts on: which processes get a diagnosis, the cause of each,
//! whose diagnosis each follows, and the size advised, if any. Any change of it fails the
//! replay; a deliberate change updates the entry's expectation in the same commit.
use std::{
    fmt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::recording::replay;

/// The corpus directory.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// One process's diagnosis, as far as a user acts on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    pub pid: u64,
    pub comm: String,
    pub role: String,
    pub cause: String,
    /// The process whose diagnosis this one takes (a trainer after its worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follows: Option<u64>,
    /// The /dev/shm size advised, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advised: Option<u64>,
    /// The file count (`nr_inodes`) advised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} ({}, {}): {}",
            self.pid, self.comm, self.role, self.cause
        )?;
        if let Some(followed) = self.follows {
            write!(f, ", follows pid {followed}")?;
        }
        if let Some(files) = self.files {
            write!(f, ", advises nr_inodes={files}")?;
        }
        match self.advised {
            Some(bytes) => write!(f, ", advises {bytes} bytes"),
            None => write!(f, ", advises no size"),
        }
    }
}

/// The verdicts of every diagnosis record in a JSON stream, in order.
pub fn verdicts(records: &[Value]) -> Vec<Verdict> {
    records
        .iter()
        .filter(|r| r["event"] == "diagnosis")
        .map(|d| Verdict {
            pid: d["pid"].as_u64().unwrap_or(0),
            comm: d["comm"].as_str().unwrap_or_default().to_owned(),
            role: d["role"].as_str().unwrap_or_default().to_owned(),
            cause: d["cause"].as_str().unwrap_or_default().to_owned(),
            follows: d["follows_pid"].as_u64(),
            advised: d["recommendation"]["min_bytes"].as_u64(),
            files: d["files"]["min_files"].as_u64(),
        })
        .collect()
}

/// An entry's expectation: `tests/corpus/NAME.yaml`, beside `NAME.shmtrace`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    /// What ran, where, and what happened to it.
    pub about: String,
    /// Whether the program is real or a stand-in, and which release.
    pub program: String,
    /// The command that records the entry again.
    pub remake: String,
    /// When, on which kernel, with which shmtrace.
    pub recorded: String,
    /// The container's /dev/shm, in bytes (`null`: none, or not a size: `--ipc=none`).
    pub shm_bytes: Option<u64>,
    /// Whether the program succeeded in the recorded run.
    pub succeeded: bool,
    /// The /dev/shm size with which the program was then run again and succeeded: the
    /// advice applied once, or the size of a healthy run.
    pub works_at: Option<u64>,
    /// The file count (`nr_inodes`) with which the program was run again and succeeded: the
    /// advice applied once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_work_at: Option<u64>,
    /// How the remedy of a cause other than size was checked (the test that applies it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remedy_checked: Option<String>,
    pub verdicts: Vec<Verdict>,
}

/// One entry of the corpus.
pub struct Entry {
    pub name: String,
    pub trace: PathBuf,
    pub expectation: Expectation,
}

impl Entry {
    pub fn yaml(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{name}.yaml"))
    }

    pub fn trace(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{name}.shmtrace"))
    }
}

/// Every entry: each `NAME.yaml` with its `NAME.shmtrace`. A trace without an expectation, or
/// the reverse, is an error: the corpus is judged whole.
pub fn entries(dir: &Path) -> Vec<Entry> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|file| {
            file.strip_suffix(".yaml")
                .or_else(|| file.strip_suffix(".shmtrace"))
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let yaml = Entry::yaml(dir, &name);
            let trace = Entry::trace(dir, &name);
            assert!(trace.exists(), "{} has no trace file", yaml.display());
            let text = std::fs::read_to_string(&yaml).unwrap_or_else(|e| {
                panic!("{}: {e} (a trace without its verdict)", yaml.display())
            });
            let expectation =
                serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", yaml.display()));
            Entry {
                name,
                trace,
                expectation,
            }
        })
        .collect()
}

/// `shmtrace report FILE --json`'s verdicts; an error when the replay fails or warns.
pub fn replayed(trace: &Path) -> Result<Vec<Verdict>, String> {
    let report = replay("report", trace, &[]);
    if !report.output.status.success() {
        return Err(format!(
            "shmtrace report {} failed: {}",
            trace.display(),
            report.stderr()
        ));
    }
    Ok(verdicts(&report.records))
}

/// What differs between what an entry expects and what it replayed to, in words; empty when
/// they agree.
pub fn differences(expected: &[Verdict], got: &[Verdict]) -> Vec<String> {
    let mut out = Vec::new();
    for e in expected {
        match got.iter().find(|g| g.pid == e.pid) {
            None => out.push(format!("expected {e}; now no diagnosis")),
            Some(g) if g != e => out.push(format!("expected {e}; now {g}")),
            Some(_) => {}
        }
    }
    for g in got {
        if !expected.iter().any(|e| e.pid == g.pid) {
            out.push(format!("no diagnosis expected of pid {}; now {g}", g.pid));
        }
    }
    if out.is_empty() && expected != got {
        out.push(format!(
            "the diagnoses come in another order: expected {expected:?}, now {got:?}"
        ));
    }
    out
}
