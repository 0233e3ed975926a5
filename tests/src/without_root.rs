//! What a user without root sees in a container (issue 34), for each runtime
//! (`docker_ptrace.rs`, `podman_ptrace.rs`): shmtrace falls back to ptrace by itself, and
//! diagnoses the real PyTorch DataLoader failure, whose advice, applied once, lets the same
//! run pass; a SIGBUS is tied to its file and offset; a healthy run gets no diagnosis; and a
//! recording made there replays to the same diagnosis.
use std::process::Command;

use serde_json::Value;

use crate::{
    diagnosis::{assert_fault, diagnoses, pid, shm_full, u64_of},
    pytorch, shmtrace_bin,
    unprivileged::{Run, Runtime, pytorch_flags, run},
    workload::MIB,
};

/// A DataLoader whose two workers, two batches ahead each, need more than 64 MiB: their
/// `fallocate`s fail with ENOSPC in Docker's default /dev/shm. The trainer gives up after 5 s
/// without a batch.
pub const DATALOADER: &str = "torch_dataloader.py --workers 2 --batch-bytes 24M --prefetch 2 --batches 12 --step 0 --timeout 5";

/// The line that says the fallback happened.
pub const FALLBACK: &str = "tracing with ptrace instead";

/// `python -B SCRIPT` of the venv.
pub fn python(script: &str) -> String {
    format!("{}/bin/python -B {script}", pytorch::venv().display())
}

/// The diagnosis of a /dev/shm too small for a DataLoader worker's batches: what a test
/// compares between two of them.
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    pub cause: String,
    pub role: String,
    pub failed_call: String,
    pub min_bytes: u64,
}

impl Verdict {
    /// From the records of a trace of [`DATALOADER`]: its first worker diagnosis.
    pub fn of(records: &[Value], dump: &dyn Fn() -> String) -> Verdict {
        let failed = shm_full(records);
        let d = failed
            .iter()
            .find(|d| d["role"] == "dataloader_worker")
            .unwrap_or_else(|| panic!("no diagnosis of a worker:\n{}", dump()));
        let failure = &d["failures"][0];
        assert_eq!(failure["errno"], "ENOSPC", "{d}");
        // PyTorch names the object after the pid its process sees: the container's, when
        // the probes look from the host.
        let own = d["container_pid"].as_u64().unwrap_or_else(|| pid(d));
        assert!(
            failure["path"]
                .as_str()
                .is_some_and(|p| p.starts_with(&format!("/dev/shm/torch_{own}_"))),
            "{d}"
        );
        assert_eq!(failure["request"], 24 * MIB, "{d}");
        Verdict {
            cause: d["cause"].as_str().unwrap_or("").to_owned(),
            role: d["role"].as_str().unwrap_or("").to_owned(),
            failed_call: failure["syscall"].as_str().unwrap_or("").to_owned(),
            min_bytes: u64_of(&d["recommendation"]["min_bytes"]),
        }
    }
}

/// `shmtrace report FILE --json` on the host, of a recording made in a container.
pub fn replay(file: &std::path::Path) -> (String, Vec<Value>) {
    let output = Command::new(shmtrace_bin())
        .arg("report")
        .arg(file)
        .arg("--json")
        .output()
        .expect("running shmtrace report");
    let records = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (
        String::from_utf8_lossy(&output.stderr).into_owned(),
        records,
    )
}

/// The DataLoader run recorded with `shmtrace record --json` in `runtime`, its diagnoses on
/// stderr; the recording replayed on the host. Returns the live verdict.
pub fn dataloader_fails_and_replays(runtime: Runtime) -> Verdict {
    let flags = [
        vec!["--shm-size".to_owned(), "64m".to_owned()],
        pytorch_flags(),
    ]
    .concat();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let failed = run(
        runtime,
        "dataloader",
        &flags,
        &format!(
            "cd /w && /x/shmtrace record --json -o /work/run.shmtrace -- {}",
            python(DATALOADER)
        ),
    );
    let dump = || failed.dump();
    assert_eq!(failed.status, 1, "the DataLoader gave up: {}", dump());
    assert!(failed.stderr.contains(FALLBACK), "{}", dump());
    let live = Verdict::of(&failed.json_lines(), &dump);
    assert_eq!(live.cause, "shm_full", "{}", dump());
    assert_eq!(live.failed_call, "fallocate", "{}", dump());

    // The recording says where it came from, and replays to the same diagnosis.
    let (log, records) = replay(&failed.work.join("run.shmtrace"));
    assert!(log.contains("with ptrace (unprivileged)"), "{log}");
    let replayed = Verdict::of(&records, &|| format!("{log}\n{records:?}"));
    assert_eq!(replayed, live, "{}", dump());
    eprintln!(
        "{}: the DataLoader failed as user without root; live and replayed diagnosis: {live:?}",
        runtime.name()
    );
    live
}

/// The same run with the advised /dev/shm passes, traced, with nothing to diagnose.
pub fn advice_makes_it_pass(runtime: Runtime, advised: u64) {
    let shm = format!("--shm-size={}m", advised.div_ceil(MIB));
    let flags = [vec![shm.clone()], pytorch_flags()].concat();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let fixed = run(
        runtime,
        "dataloader-fixed",
        &flags,
        &format!("cd /w && /x/shmtrace --json -- {}", python(DATALOADER)),
    );
    let dump = || fixed.dump();
    assert_eq!(fixed.status, 0, "with {shm}: {}", dump());
    assert!(diagnoses(&fixed.json_lines()).is_empty(), "{}", dump());
    eprintln!(
        "{}: with the advised {shm} the same DataLoader passed",
        runtime.name()
    );
}

/// Real PyTorch training in a /dev/shm it fits in: no failure, no diagnosis, and its batches
/// seen going through /dev/shm.
pub fn healthy_training_has_no_diagnosis(runtime: Runtime) {
    let flags = [
        vec!["--shm-size".to_owned(), "64m".to_owned()],
        pytorch_flags(),
    ]
    .concat();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let healthy = run(
        runtime,
        "training",
        &flags,
        &format!(
            "cd /w && /x/shmtrace --json -- {}",
            python("torch_training.py --workers 2 --epochs 3")
        ),
    );
    let dump = || healthy.dump();
    assert_eq!(healthy.status, 0, "{}", dump());
    let records = healthy.json_lines();
    assert!(diagnoses(&records).is_empty(), "{}", dump());
    assert!(
        !records.iter().any(|r| r["failure"] == true),
        "no failure: {}",
        dump()
    );
    let batches = records
        .iter()
        .filter(|r| r["event"] == "openat")
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/dev/shm/torch_"))
        })
        .count();
    // 4096 samples in batches of 256, for 3 epochs: 48 batches through /dev/shm.
    assert!(batches >= 48, "{batches} objects: {}", dump());
    eprintln!(
        "{}: healthy training, {batches} /dev/shm objects, no diagnosis",
        runtime.name()
    );
}

/// PyTorch <= 2.9's way: a worker's write into its mapping faults in a 1 MiB /dev/shm; the
/// fault is tied to the worker's own object and its offset.
pub fn sigbus_is_tied_to_its_file(runtime: Runtime) -> Run {
    let faulted = run(
        runtime,
        "sigbus",
        &["--shm-size", "1m"],
        "cd /w && /x/shmtrace --json -- /usr/bin/python3 -B pytorch_mmap_sigbus.py --load-ms 20",
    );
    let dump = || faulted.dump();
    assert_eq!(faulted.status, 1, "{}", dump());
    let records = faulted.json_lines();
    let killed: Vec<&Value> = shm_full(&records)
        .into_iter()
        .filter(|d| d["ending"]["signal"] == "SIGBUS")
        .collect();
    assert!(!killed.is_empty(), "a worker died of SIGBUS: {}", dump());
    for d in killed {
        // One failure, as the probes see it: the fault, not the handler's re-raise (tgkill).
        assert_eq!(d["failures"].as_array().unwrap().len(), 1, "{d}");
        let own = format!("/dev/shm/torch_{}_", pid(d));
        assert_fault(&d["failures"][0], &own, 384 << 10);
    }
    faulted
}
