//! Without root in rootless Podman (issue 34), run by an ordinary user of this machine:
//! shmtrace traces with ptrace by itself and diagnoses as it does in Docker (the scenarios of
//! `shmtrace_tests::without_root`).
use shmtrace_tests::{require_root, unprivileged::Runtime, without_root};

#[test]
fn dataloader_failure_is_diagnosed_and_the_advice_works() {
    require_root();
    let verdict = without_root::dataloader_fails_and_replays(Runtime::RootlessPodman);
    without_root::advice_makes_it_pass(Runtime::RootlessPodman, verdict.min_bytes);
}

#[test]
fn healthy_training_has_no_diagnosis() {
    require_root();
    without_root::healthy_training_has_no_diagnosis(Runtime::RootlessPodman);
}

#[test]
fn sigbus_is_tied_to_its_file_and_offset() {
    require_root();
    without_root::sigbus_is_tied_to_its_file(Runtime::RootlessPodman);
}
