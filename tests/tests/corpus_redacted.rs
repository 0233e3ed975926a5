//! A redacted recording keeps its diagnosis: every entry of the corpus (`tests/corpus/`, real
//! programs' failures and healthy runs in real containers: PostgreSQL, PyTorch, Ray, Chromium,
//! Open MPI, Python multiprocessing) is redacted with `shmtrace report --redact`, and the copy
//! replays to the entry's verdicts. Only the names of processes the diagnosis does not know may
//! differ. No root, no containers. (Each known program's objects and process names surviving
//! redaction is a unit test of `record/pseudonym.rs`.)
use shmtrace_tests::{
    corpus::{self, Verdict, differences, entries, replayed},
    shmtrace, tempdir,
};

/// `verdicts` with the process names left out where redaction may change them.
fn without_names(verdicts: &[Verdict]) -> Vec<Verdict> {
    verdicts
        .iter()
        .map(|v| Verdict {
            comm: String::new(),
            ..v.clone()
        })
        .collect()
}

#[test]
fn every_redacted_recording_replays_to_its_verdict() {
    let entries = entries(&corpus::dir());
    assert!(entries.len() >= 12, "{} entries", entries.len());
    let dir = tempdir();
    let mut wrong = Vec::new();
    for entry in &entries {
        let redacted = dir.join(format!("{}.shmtrace", entry.name));
        let output = shmtrace()
            .arg("report")
            .arg(&entry.trace)
            .arg("--redact")
            .arg("-o")
            .arg(&redacted)
            .output()
            .expect("running shmtrace report --redact");
        if !output.status.success() {
            wrong.push(format!(
                "{}: --redact failed: {}",
                entry.name,
                String::from_utf8_lossy(&output.stderr)
            ));
            continue;
        }
        let expected = without_names(&entry.expectation.verdicts);
        match replayed(&redacted) {
            Err(error) => wrong.push(format!("{}: {error}", entry.name)),
            Ok(got) => wrong.extend(
                differences(&expected, &without_names(&got))
                    .into_iter()
                    .map(|d| format!("{} redacted: {d}", entry.name)),
            ),
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        wrong.is_empty(),
        "redaction changed diagnoses:\n  {}",
        wrong.join("\n  ")
    );
}
