//! Without root in Docker (issue 34): as user 1000 with every capability dropped,
//! `no-new-privileges` and Docker's default seccomp profile, shmtrace traces with ptrace by
//! itself, and says the same as the eBPF probes do of the same failure. The scenarios are in
//! `shmtrace_tests::without_root`, shared with rootless Podman.
use shmtrace_tests::{
    live::LiveTracer,
    read_json_lines, require_root,
    unprivileged::{Runtime, Waiting, pytorch_flags},
    without_root::{self, DATALOADER, FALLBACK, Verdict, python},
};

#[test]
fn dataloader_failure_is_diagnosed_and_the_advice_works() {
    require_root();
    let verdict = without_root::dataloader_fails_and_replays(Runtime::Docker);
    without_root::advice_makes_it_pass(Runtime::Docker, verdict.min_bytes);
}

/// One failure, seen twice: by shmtrace's ptrace source inside the container, and by the
/// probes from the host (`--container`). Both diagnose it alike.
#[test]
fn the_diagnosis_is_the_one_the_probes_make() {
    require_root();
    let flags = [
        vec!["--shm-size".to_owned(), "64m".to_owned()],
        pytorch_flags(),
    ]
    .concat();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let waiting = Waiting::start(
        "both",
        &flags,
        &format!(
            "cd /w && /x/shmtrace --json -o /work/ptrace.jsonl -- {} 2>/work/stderr",
            python(DATALOADER)
        ),
    );
    let probes = LiveTracer::start(&["--container", &waiting.container.name]);
    waiting.container.signal("go");
    let status = waiting.container.wait();
    let (_, log, records) = probes.stop();
    let inside = read_json_lines(&waiting.container.work.join("ptrace.jsonl"));
    let stderr = std::fs::read_to_string(waiting.container.work.join("stderr")).unwrap_or_default();
    let dump = || format!("status {status}\n--- inside\n{stderr}\n--- probes\n{log}");
    assert_eq!(status, 1, "{}", dump());
    assert!(stderr.contains(FALLBACK), "{}", dump());
    let by_ptrace = Verdict::of(&inside, &dump);
    let by_probes = Verdict::of(&records, &dump);
    eprintln!("ptrace inside: {by_ptrace:?}; probes from the host: {by_probes:?}");
    assert_eq!(by_ptrace, by_probes, "{}", dump());
}

#[test]
fn healthy_training_has_no_diagnosis() {
    require_root();
    without_root::healthy_training_has_no_diagnosis(Runtime::Docker);
}

#[test]
fn sigbus_is_tied_to_its_file_and_offset() {
    require_root();
    without_root::sigbus_is_tied_to_its_file(Runtime::Docker);
}
