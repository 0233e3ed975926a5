//! Diagnoses of real workloads (tests/workloads/) run out of a real small /dev/shm: a 1 MiB
//! tmpfs in a private mount namespace, traced by the real binary with `--json` (root and BPF
//! only; the same in a Docker container is in `docker_diagnosis.rs`). Each test checks that the
//! diagnosis names the right process, file, size and cause; that the summary accounts for it;
//! and, where /dev/shm size is the cause, that the recommended size is enough: the same
//! workload rerun with /dev/shm of exactly `recommendation.min_bytes` succeeds, with nothing
//! left to diagnose.
use serde_json::Value;
use shmtrace_tests::{
    diagnosis::*,
    serial,
    workload::{MIB, Workload},
};

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
            // PyTorch's one-byte write fails first (the README says so) and it raises. Or it
            // faults too, but the trainer's shutdown ends it before its handler's re-raise
            // does: its SIGTERM handler exits 0 (PyTorch's does the same), or the trace ends
            // with the trainer. Seen once in a CI run; either way its fault is in its object.
            for failure in failures {
                if failure["kind"] == "fault" {
                    eprintln!("a worker faulted and was not killed by it: {d}");
                    assert_fault(failure, &own, 384 << 10);
                } else {
                    assert_call(failure, "write", "ENOSPC", &own, 1);
                }
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
            // A rank that failed exits 1, unless the launcher, reading the other rank's
            // failure first, stops it with SIGTERM before it gets there.
            let ending = &d["ending"];
            assert!(
                ending["exit_code"] == 1 || (failed.len() == 2 && ending["signal"] == "SIGTERM"),
                "{d}"
            );
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
    if !legacy {
        assert!(
            failed.iter().any(|d| d["ending"]["exit_code"] == 1),
            "no rank exited 1: {}",
            dump()
        );
    }
    // The launcher exits 1 because of the rank that failed first, and says so. Two ranks that
    // fail within a few milliseconds of each other (under qemu, often) reach the reader from
    // different CPUs a little out of order: then either may be the one it names.
    let earliest = failed.iter().map(|d| first_failure_ts(d)).min().unwrap();
    let followed = diagnoses(&trace.records)
        .into_iter()
        .find(|d| pid(d) == launcher)
        .map(|d| d["follows_pid"].clone());
    let first = failed
        .iter()
        .find(|d| {
            Some(d["pid"].clone()) == followed && first_failure_ts(d) <= earliest + 50_000_000
        })
        .or_else(|| failed.iter().min_by_key(|d| first_failure_ts(d)))
        .unwrap();
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
