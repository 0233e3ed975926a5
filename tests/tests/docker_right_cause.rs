//! The right cause on real programs in real Docker containers, for the kinds of issue 32: each
//! failing run is traced, its diagnosis must have the recipe's cause, its advice is applied
//! once and the program run again (it must succeed), and the healthy run of the same program
//! must get no diagnosis. The runs are the corpus's recipes (`src/bin/corpus.rs`), run again
//! with `corpus check`, which leaves tests/corpus as it is.
use std::process::Command;

use shmtrace_tests::{docker::require_docker, require_root, serial};

fn check(entries: &[&str]) {
    let _guard = serial();
    require_root();
    require_docker();
    let output = Command::new(env!("CARGO_BIN_EXE_corpus"))
        .arg("check")
        .args(entries)
        .output()
        .expect("running the corpus recorder");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    eprintln!("{log}");
}

/// PyTorch's file_system strategy in a 256 MiB /dev/shm of 200 files: inodes_full, the
/// nr_inodes advised works; with enough files, no diagnosis.
#[test]
fn out_of_files_not_bytes() {
    check(&[
        "pytorch-file-system-out-of-files",
        "healthy-pytorch-file-system-enough-files",
    ]);
}

/// multiprocessing.shared_memory's name removed by rm while held: name_removed; kept, no
/// diagnosis.
#[test]
fn a_name_removed_by_another_process() {
    check(&[
        "shared-memory-name-removed",
        "healthy-shared-memory-name-kept",
    ]);
}

/// Eight writers growing files by write() in 8 MiB: no size the trace shows too small; the
/// size shmtrace size measures on a roomy /dev/shm works; in 64 MiB, no diagnosis.
#[test]
fn files_grown_by_write() {
    check(&[
        "writers-growing-files-by-write",
        "healthy-writers-growing-files-by-write",
    ]);
}

/// A missing directory under /dev/shm is not a missing /dev/shm; made, no diagnosis.
#[test]
fn a_missing_directory_under_dev_shm() {
    check(&[
        "missing-directory-under-dev-shm",
        "healthy-directory-under-dev-shm",
    ]);
}
