//! Assertions on diagnosis records, shared by the diagnosis tests of real workloads in a
//! private /dev/shm (`kernel_diagnosis.rs`) and in Docker containers (`docker_diagnosis.rs`).
use serde_json::Value;

use crate::{
    Trace,
    workload::{MIB, Workload},
};

// ---------------------------------------------------------------------------------------------
// Reading the records

pub fn diagnoses(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["event"] == "diagnosis")
        .collect()
}

pub fn summary(records: &[Value]) -> &Value {
    records
        .iter()
        .rev()
        .find(|r| r["event"] == "summary")
        .expect("a summary record")
}

pub fn pid(record: &Value) -> u64 {
    record["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid in {record}"))
}

pub fn u64_of(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

/// The process that exec'd the workload script itself: the trainer, launcher or creator.
pub fn main_pid(records: &[Value], script: &str) -> u64 {
    let exec = records
        .iter()
        .find(|r| {
            r["event"] == "exec"
                && r["argv"].as_array().is_some_and(|argv| {
                    argv.iter()
                        .any(|a| a.as_str().is_some_and(|a| a.ends_with(script)))
                })
        })
        .unwrap_or_else(|| panic!("no exec of {script}"));
    pid(exec)
}

/// The diagnoses whose cause is a full /dev/shm.
pub fn shm_full(records: &[Value]) -> Vec<&Value> {
    diagnoses(records)
        .into_iter()
        .filter(|d| d["cause"] == "shm_full" && !d["failures"].as_array().unwrap().is_empty())
        .collect()
}

/// The earliest failure of a diagnosis (they are sorted by cause, then time).
pub fn first_failure_ts(d: &Value) -> u64 {
    d["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| u64_of(&f["ts_ns"]))
        .min()
        .unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------------
// What every diagnosis of a full /dev/shm must say

/// Who failed (and how), where, and how big /dev/shm was: the parts every /dev/shm-size
/// diagnosis shares.
pub fn assert_shm_full(d: &Value, shm_size: u64, dump: &dyn Fn() -> String) {
    assert_eq!(d["cause"], "shm_full", "{d}\n{}", dump());
    assert_eq!(d["shm_is_the_cause"], true, "{d}");
    assert_eq!(d["explanation"], Value::Null, "{d}");
    assert_eq!(
        d["shm"]["size"],
        shm_size,
        "/dev/shm size at the failure: {d}\n{}",
        dump()
    );
    assert!(
        u64_of(&d["shm"]["used"]) <= shm_size,
        "used cannot exceed the size: {d}"
    );
    let failure = &d["failures"][0];
    assert_eq!(failure["pid"], d["pid"], "{d}");
    assert_eq!(failure["cause"], "shm_full", "{d}");
    // The kernel refused to allocate: fewer pages were free than the call needed (n bytes at
    // an unknown offset span at most ceil((n - 1) / 4096) + 1 pages), or for a fault inside a
    // file, none. The diagnosis's use "when it failed" must not say otherwise.
    let free_at_most = match failure["kind"].as_str() {
        Some("call") => (u64_of(&failure["request"]).max(1) - 1).div_ceil(4096) * 4096,
        _ => 0,
    };
    let used = u64_of(&d["shm"]["used"]);
    assert!(
        used + free_at_most >= shm_size,
        "{used} bytes used of {shm_size} when the kernel refused {failure}: {d}"
    );
    let r = &d["recommendation"];
    let min = u64_of(&r["min_bytes"]);
    assert!(min > shm_size, "a size above the one that failed: {d}");
    let mib = min.div_ceil(MIB);
    assert!(
        r["docker"]
            .as_str()
            .unwrap()
            .contains(&format!("--shm-size={mib}m")),
        "{r}"
    );
    assert!(
        r["compose"]
            .as_str()
            .unwrap()
            .contains(&format!("shm_size: \"{mib}m\"")),
        "{r}"
    );
    let kubernetes = r["kubernetes"].as_str().unwrap();
    assert!(
        kubernetes.contains("medium: Memory")
            && kubernetes.contains(&format!("sizeLimit: {mib}Mi"))
            && kubernetes.contains("mountPath: /dev/shm"),
        "{r}"
    );
}

/// A failed system call as a diagnosis reports it.
pub fn assert_call(failure: &Value, syscall: &str, errno: &str, path_prefix: &str, request: u64) {
    assert_eq!(failure["kind"], "call", "{failure}");
    assert_eq!(failure["syscall"], syscall, "{failure}");
    assert_eq!(failure["errno"], errno, "{failure}");
    let path = failure["path"].as_str().unwrap_or("");
    assert!(path.starts_with(path_prefix), "path {path:?} in {failure}");
    assert_eq!(failure["request"], request, "{failure}");
}

/// A fault inside a /dev/shm mapping as a diagnosis reports it.
pub fn assert_fault(failure: &Value, path_prefix: &str, file_size: u64) {
    assert_eq!(failure["kind"], "fault", "{failure}");
    assert_eq!(failure["signal"], "SIGBUS", "{failure}");
    assert_eq!(failure["code"], "BUS_ADRERR", "{failure}");
    let path = failure["path"].as_str().unwrap_or("");
    assert!(path.starts_with(path_prefix), "path {path:?} in {failure}");
    assert_eq!(failure["file_size"], file_size, "{failure}");
    let offset = u64_of(&failure["offset"]);
    assert!(
        offset < file_size,
        "the fault is inside the file: {failure}"
    );
    assert!(u64_of(&failure["addr"]) > 0, "{failure}");
}

pub fn assert_killed_by_sigbus(d: &Value) {
    assert_eq!(d["ending"]["signal"], "SIGBUS", "{d}");
}

/// A DataLoader worker of `trainer` (its pid and the script it runs).
pub fn assert_worker_of(d: &Value, trainer: u64, script: &str, workers: u64) {
    assert_eq!(d["role"], "dataloader_worker", "{d}");
    assert_eq!(d["comm"], "pt_data_worker", "{d}");
    assert_eq!(
        d["trainer_pid"], trainer,
        "the trainer, not an intermediate: {d}"
    );
    assert!(
        d["trainer_argv"]
            .as_array()
            .is_some_and(|argv| argv.iter().any(|a| a.as_str().unwrap().ends_with(script))),
        "the trainer's command line: {d}"
    );
    assert!(u64_of(&d["worker_index"]) < workers, "{d}");
}

/// The trainer's own diagnosis: it died (exit status 1) because a worker failed, and says so
/// by pointing at the worker that failed first.
pub fn assert_trainer_follows(records: &[Value], trainer: u64, failed: &[&Value]) {
    let all = diagnoses(records);
    let d = all
        .iter()
        .find(|d| pid(d) == trainer)
        .unwrap_or_else(|| panic!("no diagnosis for the trainer {trainer}: {all:?}"));
    assert_eq!(d["role"], "trainer", "{d}");
    assert_eq!(d["ending"]["exit_code"], 1, "{d}");
    let first = failed
        .iter()
        .min_by_key(|w| first_failure_ts(w))
        .expect("a failed worker");
    assert_eq!(
        d["follows_pid"], first["pid"],
        "the trainer follows the worker that failed first: {d}\nworkers: {failed:?}"
    );
    // It died of its worker's failure: the same cause, not "not a /dev/shm problem".
    assert_eq!(d["cause"], first["cause"], "{d}");
    assert_eq!(d["shm_is_the_cause"], first["shm_is_the_cause"], "{d}");
    assert_eq!(d["failures"], serde_json::json!([]), "{d}");
}

/// A parent (not a trainer) that exited 1 after its child failed: its diagnosis points to the
/// child and carries the child's cause and recommendation.
pub fn assert_parent_follows(records: &[Value], parent: u64, child: &Value) {
    let all = diagnoses(records);
    let d = all
        .iter()
        .find(|d| pid(d) == parent)
        .unwrap_or_else(|| panic!("no diagnosis for the parent {parent}: {all:?}"));
    assert_eq!(d["ending"]["exit_code"], 1, "{d}");
    assert_eq!(d["follows_pid"], child["pid"], "{d}");
    assert_eq!(d["cause"], child["cause"], "{d}");
    assert_eq!(d["recommendation"], child["recommendation"], "{d}");
    let text = d["text"].to_string();
    assert!(
        text.contains(&format!("its child pid {} failed first", child["pid"])),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// The summary record

/// Per place and role, the summary counts the failures the diagnoses list and the deaths they
/// report; it repeats the largest recommendation of each place, and none without a /dev/shm
/// failure.
pub fn assert_summary(records: &[Value]) {
    let s = summary(records);
    let rows = s["roles"].as_array().expect("summary.roles");
    let row = |place: &Value, role: &Value| {
        rows.iter()
            .find(|r| r["place"] == *place && r["role"] == *role)
            .unwrap_or_else(|| panic!("no summary row for {place} {role}: {s}"))
    };
    let all = diagnoses(records);
    let mut groups: Vec<(&Value, &Value)> = all.iter().map(|d| (&d["place"], &d["role"])).collect();
    groups.dedup();
    for (place, role) in groups {
        let ours = all
            .iter()
            .filter(|d| d["place"] == *place && d["role"] == *role);
        let failures: u64 = ours
            .clone()
            .flat_map(|d| d["failures"].as_array().unwrap())
            // A run of like failures is one entry, with its count.
            .map(|f| f["count"].as_u64().unwrap_or(1))
            .sum();
        let deaths = ours
            .filter(|d| d["ending"].is_object() && d["ending"]["exit_code"] != 0)
            .count() as u64;
        let r = row(place, role);
        assert_eq!(r["failures"], failures, "failures of {place} {role}: {s}");
        assert!(
            u64_of(&r["deaths"]) >= deaths,
            "deaths of {place} {role}: {s}"
        );
        assert!(u64_of(&r["processes"]) >= 1, "{r}");
    }
    let recommendations = s["recommendations"]
        .as_array()
        .expect("summary.recommendations");
    let full = shm_full(records);
    if full.is_empty() {
        assert!(
            recommendations.is_empty(),
            "no /dev/shm failure, no size: {s}"
        );
        return;
    }
    for d in full {
        let place = &d["place"];
        let largest = diagnoses(records)
            .iter()
            .filter(|o| o["place"] == *place)
            .filter_map(|o| o["recommendation"]["min_bytes"].as_u64())
            .max()
            .unwrap();
        // One piece of advice per /dev/shm: places that share one are listed together, and
        // get the largest size any of them needs.
        let r = recommendations
            .iter()
            .find(|r| {
                r["place"]
                    .as_str()
                    .is_some_and(|p| p.split(", ").any(|one| Some(one) == place.as_str()))
            })
            .unwrap_or_else(|| panic!("no recommendation for {place} in the summary: {s}"));
        if r["place"] == *place {
            assert_eq!(r["min_bytes"], largest, "{s}");
        } else {
            assert!(u64_of(&r["min_bytes"]) >= largest, "{s}");
        }
        assert!(r["docker"].as_str().unwrap().contains("--shm-size="), "{r}");
        assert!(
            r["kubernetes"].as_str().unwrap().contains("sizeLimit"),
            "{r}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Is the recommended size enough?

/// The smallest size any diagnosis recommends, after checking each against what the workload
/// really needs (`--required-shm`, the README's formula): at least that, since the workload
/// fails with one page less, and not absurdly more.
pub fn recommended(workload: &Workload, records: &[Value]) -> u64 {
    let required = workload.required_shm();
    let sizes: Vec<u64> = shm_full(records)
        .iter()
        .map(|d| u64_of(&d["recommendation"]["min_bytes"]))
        .collect();
    assert!(!sizes.is_empty(), "no /dev/shm-size diagnosis");
    eprintln!(
        "{} {:?}: needs {required} bytes, shmtrace recommends {sizes:?}",
        workload.script, workload.args
    );
    for size in &sizes {
        assert!(
            *size >= required,
            "{workload:?} needs {required} bytes; shmtrace recommended {size}"
        );
        // Headroom and rounding up to whole MiB may double a small need; more is waste.
        assert!(
            *size <= 3 * required,
            "{workload:?} needs {required} bytes; {size} is more than 3 times that"
        );
    }
    *sizes.iter().min().unwrap()
}

/// The workload, rerun and traced with /dev/shm of exactly `size` bytes, succeeds, and
/// shmtrace finds nothing to diagnose.
pub fn assert_enough_in_private_shm(workload: &Workload, size: u64) {
    let trace = workload.trace_in_private_shm(size);
    assert_eq!(
        trace.output.status.code(),
        Some(0),
        "{workload:?} with the recommended {size} bytes of /dev/shm:\n{}",
        trace.dump()
    );
    assert_nothing_to_diagnose(&trace.records, &|| trace.dump());
}

pub fn assert_nothing_to_diagnose(records: &[Value], dump: &dyn Fn() -> String) {
    assert!(diagnoses(records).is_empty(), "{}", dump());
    let s = summary(records);
    assert_eq!(s["failed_calls"], 0, "{s}");
    assert_eq!(s["recommendations"], serde_json::json!([]), "{s}");
}

pub fn exit_code(trace: &Trace) -> Option<i32> {
    trace.output.status.code()
}
