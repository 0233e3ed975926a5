//! Diagnoses of real workloads (tests/workloads/) run out of a real small /dev/shm: a 1 MiB
//! tmpfs in a private mount namespace, and a Docker container with `--shm-size 1m`, traced by
//! the real binary with `--json`. Each test checks that the diagnosis names the right process,
//! file, size and cause; that the summary accounts for it; and, where /dev/shm size is the
//! cause, that the recommended size is enough: the same workload rerun with /dev/shm of exactly
//! `recommendation.min_bytes` succeeds, with nothing left to diagnose.
use serde_json::Value;
use shmtrace_tests::{
    Trace, serial,
    workload::{MIB, Workload},
};

// ---------------------------------------------------------------------------------------------
// Reading the records

fn diagnoses(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["event"] == "diagnosis")
        .collect()
}

fn summary(records: &[Value]) -> &Value {
    records
        .iter()
        .rev()
        .find(|r| r["event"] == "summary")
        .expect("a summary record")
}

fn pid(record: &Value) -> u64 {
    record["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid in {record}"))
}

fn u64_of(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

/// The process that exec'd the workload script itself: the trainer, launcher or creator.
fn main_pid(records: &[Value], script: &str) -> u64 {
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
fn shm_full(records: &[Value]) -> Vec<&Value> {
    diagnoses(records)
        .into_iter()
        .filter(|d| d["cause"] == "shm_full" && !d["failures"].as_array().unwrap().is_empty())
        .collect()
}

/// The earliest failure of a diagnosis (they are sorted by cause, then time).
fn first_failure_ts(d: &Value) -> u64 {
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
fn assert_shm_full(d: &Value, shm_size: u64, dump: &dyn Fn() -> String) {
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
fn assert_call(failure: &Value, syscall: &str, errno: &str, path_prefix: &str, request: u64) {
    assert_eq!(failure["kind"], "call", "{failure}");
    assert_eq!(failure["syscall"], syscall, "{failure}");
    assert_eq!(failure["errno"], errno, "{failure}");
    let path = failure["path"].as_str().unwrap_or("");
    assert!(path.starts_with(path_prefix), "path {path:?} in {failure}");
    assert_eq!(failure["request"], request, "{failure}");
}

/// A fault inside a /dev/shm mapping as a diagnosis reports it.
fn assert_fault(failure: &Value, path_prefix: &str, file_size: u64) {
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

fn assert_killed_by_sigbus(d: &Value) {
    assert_eq!(d["ending"]["signal"], "SIGBUS", "{d}");
}

/// A DataLoader worker of `trainer` (its pid and the script it runs).
fn assert_worker_of(d: &Value, trainer: u64, script: &str, workers: u64) {
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
fn assert_trainer_follows(records: &[Value], trainer: u64, failed: &[&Value]) {
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
fn assert_parent_follows(records: &[Value], parent: u64, child: &Value) {
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
fn assert_summary(records: &[Value]) {
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
            .map(|d| d["failures"].as_array().unwrap().len() as u64)
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
        let r = recommendations
            .iter()
            .find(|r| r["place"] == *place)
            .unwrap_or_else(|| panic!("no recommendation for {place} in the summary: {s}"));
        assert_eq!(r["min_bytes"], largest, "{s}");
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
fn recommended(workload: &Workload, records: &[Value]) -> u64 {
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
fn assert_enough_in_private_shm(workload: &Workload, size: u64) {
    let trace = workload.trace_in_private_shm(size);
    assert_eq!(
        trace.output.status.code(),
        Some(0),
        "{workload:?} with the recommended {size} bytes of /dev/shm:\n{}",
        trace.dump()
    );
    assert_nothing_to_diagnose(&trace.records, &|| trace.dump());
}

fn assert_nothing_to_diagnose(records: &[Value], dump: &dyn Fn() -> String) {
    assert!(diagnoses(records).is_empty(), "{}", dump());
    let s = summary(records);
    assert_eq!(s["failed_calls"], 0, "{s}");
    assert_eq!(s["recommendations"], serde_json::json!([]), "{s}");
}

fn exit_code(trace: &Trace) -> Option<i32> {
    trace.output.status.code()
}

// ---------------------------------------------------------------------------------------------
// The tests

/// PyTorch >= 2.10: workers renamed `pt_data_worker` fallocate each batch into a new
/// `torch_*` object; in 1 MiB the fallocate returns ENOSPC.
fn pytorch_fallocate(start_method: &str) {
    let _guard = serial();
    let script = "pytorch_fallocate.py";
    let workload = Workload::new(script, &["--start-method", start_method]);
    let trace = workload.trace_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let trainer = main_pid(&trace.records, script);

    let failed = shm_full(&trace.records);
    assert!(!failed.is_empty(), "no /dev/shm diagnosis:\n{}", dump());
    for d in &failed {
        assert_worker_of(d, trainer, script, 2);
        assert_shm_full(d, MIB, &dump);
        // Each failed allocation of that worker: its own torch_<pid>_ file, one 256 KiB batch.
        for failure in d["failures"].as_array().unwrap() {
            let own = format!("/dev/shm/torch_{}_", pid(d));
            assert_call(failure, "fallocate", "ENOSPC", &own, 256 << 10);
        }
        let alternatives = d["recommendation"]["alternatives"].to_string();
        assert!(alternatives.contains("num_workers"), "{alternatives}");
    }
    assert_trainer_follows(&trace.records, trainer, &failed);
    assert_summary(&trace.records);
    let worker_row = summary(&trace.records)["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "dataloader_worker")
        .cloned()
        .unwrap();
    assert_eq!(worker_row["processes"], 2, "{worker_row}");

    if start_method == "forkserver" {
        // The workers really are the forkserver's children, not the trainer's.
        for d in &failed {
            let fork = trace
                .records
                .iter()
                .find(|r| r["event"] == "fork" && r["child_pid"] == d["pid"])
                .expect("the worker's fork");
            let parent = pid(fork);
            assert_ne!(parent, trainer, "{fork}");
            let forkserver = trace
                .records
                .iter()
                .find(|r| r["event"] == "exec" && pid(r) == parent)
                .expect("the forkserver's exec");
            assert!(
                forkserver["argv"]
                    .to_string()
                    .contains("multiprocessing.forkserver"),
                "{forkserver}"
            );
        }
    }

    let size = recommended(&workload, &trace.records);
    assert_enough_in_private_shm(&workload, size);
}

#[test]
fn pytorch_fallocate_enospc_in_a_worker() {
    pytorch_fallocate("fork");
}

#[test]
fn pytorch_forkserver_workers_are_linked_to_their_trainer() {
    pytorch_fallocate("forkserver");
}

/// PyTorch <= 2.9: ftruncate, mmap, then the worker's write into the mapping faults; its
/// handler re-raises SIGBUS and it dies; the trainer sees it killed by signal 7 and exits 1.
#[test]
fn pytorch_mmap_sigbus_kills_a_worker() {
    let _guard = serial();
    let script = "pytorch_mmap_sigbus.py";
    // Workers wait 20 ms before each batch so that none dies while the trainer is still
    // queueing its first indices: the workload's SIGCHLD handler raising inside Queue.put
    // leaves the queue's lock held and the trainer hangs at exit (about 1 run in 25 without).
    let workload = Workload::new(script, &["--load-ms", "20"]);
    let trace = workload.trace_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let trainer = main_pid(&trace.records, script);

    let failed = shm_full(&trace.records);
    let mut killed = Vec::new();
    for d in &failed {
        assert_worker_of(d, trainer, script, 2);
        assert_shm_full(d, MIB, &dump);
        let failures = d["failures"].as_array().unwrap();
        let own = format!("/dev/shm/torch_{}_", pid(d));
        if d["ending"]["signal"].is_string() {
            assert_killed_by_sigbus(d);
            // One failure: the fault, not the handler's re-raise (tgkill, no address).
            assert_eq!(failures.len(), 1, "{d}");
            assert_fault(&failures[0], &own, 384 << 10);
            killed.push(*d);
        } else {
            // The other worker may find the tmpfs exactly full when it starts a batch: then
            // PyTorch's one-byte write fails first (the README says so) and it raises.
            for failure in failures {
                assert_call(failure, "write", "ENOSPC", &own, 1);
            }
        }
    }
    assert!(
        !killed.is_empty(),
        "no worker killed by SIGBUS:\n{}",
        dump()
    );
    // The kernel's word for it: the worker exited by SIGBUS.
    for d in &killed {
        let exit = trace
            .records
            .iter()
            .find(|r| r["event"] == "exit" && r["pid"] == d["pid"])
            .expect("the worker's exit");
        assert_eq!(exit["signal"], "SIGBUS", "{exit}");
    }
    assert_trainer_follows(&trace.records, trainer, &failed);
    assert_summary(&trace.records);
    let s = summary(&trace.records);
    assert!(u64_of(&s["deaths_by_signal"]) >= 1, "{s}");
    let rows = s["roles"].as_array().unwrap();
    let worker_row = rows
        .iter()
        .find(|r| r["role"] == "dataloader_worker")
        .unwrap();
    assert!(u64_of(&worker_row["deaths"]) >= 1, "{s}");
    let trainer_row = rows.iter().find(|r| r["role"] == "trainer").unwrap();
    assert_eq!(trainer_row["deaths"], 1, "{s}");

    let size = recommended(&workload, &trace.records);
    assert_enough_in_private_shm(&workload, size);
}

/// NCCL-like ranks creating `/dev/shm/nccl-XXXXXX` segments: `fallocate(size + 4)` ENOSPC
/// (NCCL >= 2.19), or with `--legacy` SIGBUS in the memset (2.12-2.18).
fn nccl(legacy: bool) {
    let _guard = serial();
    let script = "nccl_shm.py";
    let args: &[&str] = if legacy { &["--legacy"] } else { &[] };
    let workload = Workload::new(script, args);
    let trace = workload.trace_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let launcher = main_pid(&trace.records, script);

    // Usually one rank fails and the launcher stops the other (SIGTERM); two ranks writing
    // their last segments at once may both fail first.
    let failed = shm_full(&trace.records);
    assert!((1..=2).contains(&failed.len()), "{}", dump());
    for d in &failed {
        assert_eq!(d["role"], "nccl", "{d}");
        assert_ne!(pid(d), launcher, "a rank, not the launcher: {d}");
        assert_shm_full(d, MIB, &dump);
        let failure = &d["failures"][0];
        if legacy {
            assert_killed_by_sigbus(d);
            assert_fault(failure, "/dev/shm/nccl-", 320 << 10);
        } else {
            assert_eq!(d["ending"]["exit_code"], 1, "{d}");
            let request = (320 << 10) + 4;
            assert_call(failure, "fallocate", "ENOSPC", "/dev/shm/nccl-", request);
        }
        // mkstemp's name: nccl- and six characters.
        let name = failure["path"].as_str().unwrap();
        assert_eq!(name.len(), "/dev/shm/nccl-XXXXXX".len(), "{name}");
        let alternatives = d["recommendation"]["alternatives"].to_string();
        assert!(
            alternatives.contains("NCCL_SHM_DISABLE=1"),
            "{alternatives}"
        );
    }
    // The launcher exits 1 because of the rank that failed first, and says so.
    let first = failed.iter().min_by_key(|d| first_failure_ts(d)).unwrap();
    assert_parent_follows(&trace.records, launcher, first);
    assert_summary(&trace.records);

    let size = recommended(&workload, &trace.records);
    assert_enough_in_private_shm(&workload, size);
    // The alternative works too: without SHM segments the same 1 MiB is enough.
    let disabled = workload.clone().env("NCCL_SHM_DISABLE", "1");
    assert_enough_in_private_shm(&disabled, MIB);
}

#[test]
fn nccl_fallocate_enospc() {
    nccl(false);
}

#[test]
fn nccl_legacy_sigbus() {
    nccl(true);
}

/// `multiprocessing.shared_memory`: a 2 MiB `psm_*` segment written in full faults at 1 MiB;
/// the writer dies by SIGBUS (shell status 135).
#[test]
fn shared_memory_sigbus() {
    let _guard = serial();
    let script = "shared_memory_sigbus.py";
    let workload = Workload::new(script, &[]);
    let trace = workload.trace_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(128 + 7), "{}", dump());
    let creator = main_pid(&trace.records, script);

    let failed = shm_full(&trace.records);
    assert_eq!(failed.len(), 1, "{}", dump());
    let d = failed[0];
    assert_eq!(pid(d), creator, "{d}");
    assert_eq!(d["role"], "python_multiprocessing", "{d}");
    assert_shm_full(d, MIB, &dump);
    assert_killed_by_sigbus(d);
    let failure = &d["failures"][0];
    assert_fault(failure, "/dev/shm/psm_", 2 * MIB);
    // Everything below the fault fitted: it happens where the 1 MiB tmpfs ran out.
    assert!(u64_of(&failure["offset"]) <= MIB, "{failure}");
    assert_summary(&trace.records);

    let size = recommended(&workload, &trace.records);
    assert_enough_in_private_shm(&workload, size);
}

/// The same with `--workers 2`: children attach to the segment by name and write a slice
/// each; one dies by SIGBUS, and the parent raises and exits 1 because of it.
#[test]
fn shared_memory_sigbus_in_a_child() {
    let _guard = serial();
    let script = "shared_memory_sigbus.py";
    let workload = Workload::new(script, &["--workers", "2"]);
    let trace = workload.trace_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let parent = main_pid(&trace.records, script);

    // One writer faults, or both: they write their 1 MiB slices at the same time.
    let failed = shm_full(&trace.records);
    assert!((1..=2).contains(&failed.len()), "{}", dump());
    for d in &failed {
        assert_ne!(pid(d), parent, "a writer, not the parent: {d}");
        // Its role is not asserted: shmtrace calls a process that only attached to a psm_*
        // segment (opened it without O_CREAT) `other`, not `python_multiprocessing`.
        assert_shm_full(d, MIB, &dump);
        assert_killed_by_sigbus(d);
        assert_fault(&d["failures"][0], "/dev/shm/psm_", 2 * MIB);
    }
    let first = failed.iter().min_by_key(|d| first_failure_ts(d)).unwrap();
    assert_parent_follows(&trace.records, parent, first);
    assert_summary(&trace.records);

    let size = recommended(&workload, &trace.records);
    assert_enough_in_private_shm(&workload, size);
}

/// glibc's sem_open writes 32 bytes into a new `sem.XXXXXX`; with /dev/shm already full (a
/// filler process took 1 MiB) the write returns ENOSPC and multiprocessing raises OSError.
#[test]
fn semaphore_write_enospc() {
    let _guard = serial();
    let script = "semaphore_enospc.py";
    let workload = Workload::new(script, &["--fill-bytes", "1M"]);
    let trace = workload.trace_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let main = main_pid(&trace.records, script);

    // The filler's file, left behind when it exited, is what filled /dev/shm: without it the
    // semaphores fit, so the size is not blamed and the file is named.
    let all = diagnoses(&trace.records);
    let d = all
        .iter()
        .find(|d| pid(d) == main)
        .unwrap_or_else(|| panic!("no diagnosis of the main process:\n{}", dump()));
    assert_eq!(d["cause"], "leftovers", "{d}");
    assert_eq!(d["role"], "python_multiprocessing", "{d}");
    assert_eq!(d["ending"]["exit_code"], 1, "{d}");
    assert!(d["recommendation"].is_null(), "{d}");
    assert_call(&d["failures"][0], "write", "ENOSPC", "/dev/shm/sem.", 32);
    let files = d["leftovers"]["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{d}");
    assert!(
        files[0]["path"]
            .as_str()
            .unwrap()
            .starts_with("/dev/shm/filler-"),
        "{d}"
    );
    assert_eq!(files[0]["creator_comm"], "shm_filler", "{d}");
    assert_eq!(d["leftovers"]["enough_without_them"], true, "{d}");
    assert_summary(&trace.records);

    // Without the leftover (a filler too small to matter), the same run fits in 1 MiB.
    let without = Workload::new(script, &["--fill-bytes", "4K"]);
    assert_enough_in_private_shm(&without, MIB);
}

/// Out of file descriptors, not of /dev/shm (about 200 KiB of 1 MiB used): the trainer's
/// recvmsg drops the descriptor a worker sends (MSG_CTRUNC), then an open fails with EMFILE.
/// No size is recommended; the explanation says what to change, and that change works.
#[test]
fn fd_limit_is_not_blamed_on_shm() {
    let _guard = serial();
    let script = "fd_limit.py";
    let workload = Workload::new(script, &[]);
    let trace = workload.trace_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let trainer = main_pid(&trace.records, script);

    let all = diagnoses(&trace.records);
    assert!(shm_full(&trace.records).is_empty(), "{}", dump());
    let d = all
        .iter()
        .find(|d| pid(d) == trainer)
        .unwrap_or_else(|| panic!("no diagnosis of the trainer:\n{}", dump()));
    assert_eq!(d["role"], "trainer", "{d}");
    assert_fd_limit(d);
    let failures = d["failures"].as_array().unwrap();
    assert_eq!(failures[0]["syscall"], "recvmsg", "{d}");
    assert_eq!(failures[0]["errno"], "MSG_CTRUNC", "{d}");
    assert!(
        failures
            .iter()
            .any(|f| f["syscall"] == "openat" && f["errno"] == "EMFILE"),
        "{d}"
    );
    assert_summary(&trace.records);

    // The fix the explanation gives (a higher descriptor limit) works in the same 1 MiB.
    let nofile = workload_output(&workload, "--required-nofile");
    let raised = Workload::new(script, &["--nofile", nofile.trim()]);
    assert_enough_in_private_shm(&raised, MIB);
}

/// The worker-side variant: the worker's own openat of `/dev/shm/torch_*` fails with EMFILE,
/// a failing /dev/shm call that must still not be blamed on its size.
#[test]
fn fd_limit_in_a_worker_opening_its_torch_object() {
    let _guard = serial();
    let script = "fd_limit.py";
    let args = [
        "--tensors-per-batch",
        "64",
        "--batch-bytes",
        "256K",
        "--batches",
        "2",
    ];
    let workload = Workload::new(script, &args);
    let trace = workload.trace_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let trainer = main_pid(&trace.records, script);
    assert!(shm_full(&trace.records).is_empty(), "{}", dump());

    let failed: Vec<&Value> = diagnoses(&trace.records)
        .into_iter()
        .filter(|d| d["role"] == "dataloader_worker")
        .collect();
    assert!(!failed.is_empty(), "{}", dump());
    for d in &failed {
        assert_worker_of(d, trainer, script, 2);
        assert_fd_limit(d);
        let own = format!("/dev/shm/torch_{}_", pid(d));
        assert_call(&d["failures"][0], "openat", "EMFILE", &own, 0);
    }
    assert_trainer_follows(&trace.records, trainer, &failed);
    assert_summary(&trace.records);
}

fn assert_fd_limit(d: &Value) {
    assert_eq!(d["cause"], "fd_limit", "{d}");
    assert_eq!(d["shm_is_the_cause"], false, "{d}");
    assert_eq!(d["recommendation"], Value::Null, "{d}");
    let explanation = d["explanation"].as_str().unwrap_or("");
    assert!(
        explanation.contains("file descriptors") && explanation.contains("ulimit -n"),
        "{d}"
    );
}

/// What the workload prints with one more flag (`--required-nofile`).
fn workload_output(workload: &Workload, flag: &str) -> String {
    let mut w = workload.clone();
    w.args.push(flag.to_owned());
    w.output()
}

/// A real Docker container with `--shm-size 1m`, traced by name from the start: the PyTorch
/// fallocate failure, diagnosed with the container's name and its /dev/shm; rerun in a
/// container with `--shm-size <min_bytes>b`, it succeeds.
#[test]
fn docker_container_with_a_1m_shm() {
    let _guard = serial();
    let script = "pytorch_fallocate.py";
    let workload = Workload::new(script, &[]);
    let run = workload.trace_in_docker(MIB);
    let dump = || run.dump();
    assert_eq!(run.exit_code, 1, "{}", dump());
    let trainer = main_pid(&run.records, script);

    let failed = shm_full(&run.records);
    assert!(!failed.is_empty(), "no /dev/shm diagnosis:\n{}", dump());
    for d in &failed {
        assert_worker_of(d, trainer, script, 2);
        assert_shm_full(d, MIB, &dump);
        assert_eq!(d["container"]["name"], run.name.as_str(), "{d}");
        assert_eq!(d["container"]["runtime"], "docker", "{d}");
        assert_eq!(d["container"]["shm_size"], MIB, "{d}");
        assert_eq!(d["place"], run.name.as_str(), "{d}");
        assert_eq!(d["recommendation"]["preferred"], "docker", "{d}");
        // torch_<pid>_: the pid inside the container, not the host's.
        assert_call(
            &d["failures"][0],
            "fallocate",
            "ENOSPC",
            "/dev/shm/torch_",
            256 << 10,
        );
    }
    assert_trainer_follows(&run.records, trainer, &failed);
    assert_summary(&run.records);

    let size = recommended(&workload, &run.records);
    let rerun = workload.trace_in_docker(size);
    assert_eq!(
        rerun.exit_code,
        0,
        "with --shm-size {size}b:\n{}",
        rerun.dump()
    );
    assert_nothing_to_diagnose(&rerun.records, &|| rerun.dump());
}
