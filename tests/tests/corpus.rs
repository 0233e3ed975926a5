//! The corpus (`tests/corpus/`, see its README): every recording replays to the verdict kept
//! beside it. No root and no containers: the files hold what the machine said, so this runs
//! anywhere `cargo test` does, in seconds.
use shmtrace_tests::corpus::{self, Verdict, differences, entries, replayed};

#[test]
fn every_recording_replays_to_its_verdict() {
    let entries = entries(&corpus::dir());
    assert!(
        entries.len() >= 12,
        "the corpus has {} entries: tests/corpus is incomplete",
        entries.len()
    );
    let mut wrong = Vec::new();
    for entry in &entries {
        let expected = &entry.expectation.verdicts;
        match replayed(&entry.trace) {
            Err(error) => wrong.push(format!("{}: {error}", entry.name)),
            Ok(got) => wrong.extend(
                differences(expected, &got)
                    .into_iter()
                    .map(|d| format!("{}: {d}", entry.name)),
            ),
        }
        // A size advised is the size shown to work.
        let advised = expected.iter().filter_map(|v| v.advised).max();
        if advised.is_some() && advised != entry.expectation.works_at {
            wrong.push(format!(
                "{}: advises {advised:?} bytes, but works_at says {:?} was the size shown to \
                 work",
                entry.name, entry.expectation.works_at
            ));
        }
        let files = expected.iter().filter_map(|v| v.files).max();
        if files != entry.expectation.files_work_at {
            wrong.push(format!(
                "{}: advises nr_inodes={files:?}, but files_work_at says {:?} was shown to work",
                entry.name, entry.expectation.files_work_at
            ));
        }
        // A healthy run has no diagnosis.
        if entry.expectation.succeeded && !expected.is_empty() {
            wrong.push(format!(
                "{}: the program succeeded, yet {} diagnoses are expected",
                entry.name,
                expected.len()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the corpus replays to other verdicts (a deliberate change updates tests/corpus/NAME.yaml \
         in the same commit, with the reason):\n  {}",
        wrong.join("\n  ")
    );
}

/// A wrong verdict planted in a copy of an expectation.
type Plant = fn(&mut Vec<Verdict>);

/// The comparison catches a planted wrong verdict of each kind: another cause, another process
/// followed, a size advised or not, a diagnosis more or fewer.
#[test]
fn a_planted_wrong_verdict_fails() {
    let entries = entries(&corpus::dir());
    let failing = entries
        .iter()
        .find(|e| e.expectation.verdicts.iter().any(|v| v.advised.is_some()))
        .expect("an entry with advice");
    let got = replayed(&failing.trace).unwrap();
    assert!(differences(&failing.expectation.verdicts, &got).is_empty());
    let plants: [(&str, Plant); 5] = [
        ("another cause", |v| v[0].cause = "sysv_limit".to_owned()),
        ("another size", |v| {
            v[0].advised = v[0].advised.map(|b| b + 4096).or(Some(4096))
        }),
        ("no size", |v| v.iter_mut().for_each(|v| v.advised = None)),
        ("one diagnosis fewer", |v| {
            v.pop();
        }),
        ("another followed", |v| v[0].follows = Some(1)),
    ];
    for (what, plant) in plants {
        let mut planted = failing.expectation.verdicts.clone();
        plant(&mut planted);
        assert!(
            !differences(&planted, &got).is_empty(),
            "{what} went unnoticed in {}",
            failing.name
        );
    }
    let healthy = entries
        .iter()
        .find(|e| e.expectation.succeeded)
        .expect("a healthy entry");
    let mut planted = healthy.expectation.verdicts.clone();
    planted.push(got[0].clone());
    assert!(!differences(&planted, &replayed(&healthy.trace).unwrap()).is_empty());
}
