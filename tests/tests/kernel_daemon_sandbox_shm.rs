//! The node agent forgets a sandbox's /dev/shm when the sandbox ends. An `unshare -m` sandbox,
//! in no container, mounts a tmpfs of its own on /dev/shm and leaves a file there; no runtime
//! says when it ends. The next tmpfs made takes its device number: a later sandbox (or
//! container) that fills its own /dev/shm on that number must not be told that the gone
//! sandbox's file takes its space. In an hour's container soak, three containers were told so
//! of an NCCL segment a test's sandbox had left. Real `dd`, real tmpfs mounts, the real
//! daemon (root and BPF only).
use std::{process::Command, time::Duration};

use shmtrace_tests::{daemon::Daemon, require_root, serial};

/// Runs `first`, then `dd ARGS` as the last process of a new sandbox with a 1 MiB tmpfs on
/// /dev/shm: (dd's pid, the tmpfs's device number).
fn in_sandbox(name: &str, first: &str, dd: &str) -> (u64, u64) {
    let script = format!(
        "mount --make-rprivate / && mount -t tmpfs -o size=1m {name} /dev/shm && {first} && \
         echo $$ $(stat -c %d /dev/shm) && exec dd if=/dev/zero {dd} 2>/dev/null"
    );
    let output = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let mut words = text.split_whitespace().map(|w| w.parse::<u64>());
    match (words.next(), words.next()) {
        (Some(Ok(pid)), Some(Ok(dev))) => (pid, dev),
        _ => panic!("the sandbox {name} said no pid and device: {output:?}"),
    }
}

#[test]
fn a_file_of_a_gone_sandbox_is_no_leftover_on_the_next_dev_shm_given_its_number() {
    let _guard = serial();
    require_root();
    let daemon = Daemon::start(&[]);
    // The kernel gives a freed device number to the next file system made; another test's
    // mount may come in between, so the pair is tried a few times.
    let mut tries = Vec::new();
    let filler = loop {
        // Two empty files first: the one left behind is not among the first inode numbers
        // the next tmpfs hands out (a create of a number the model knows tells it apart).
        let (_, left_on) = in_sandbox(
            "left",
            "touch /dev/shm/a /dev/shm/b",
            "of=/dev/shm/left-behind bs=64k count=8",
        );
        // Time for the sandbox's end to be seen, and its tmpfs to be torn down.
        std::thread::sleep(Duration::from_secs(3));
        let (filler, fill_on) = in_sandbox("fill", "true", "of=/dev/shm/fill bs=64k count=32");
        tries.push((left_on, fill_on));
        if left_on == fill_on {
            break filler;
        }
        assert!(
            tries.len() < 5,
            "the second tmpfs never took the first one's device number: {tries:?}"
        );
    };
    std::thread::sleep(Duration::from_secs(1));
    let (status, lines, stderr) = daemon.stop();
    assert!(status.success(), "{stderr}");
    let diagnosis = lines
        .iter()
        .find(|l| l["event"] == "diagnosis" && l["pid"] == filler)
        .unwrap_or_else(|| panic!("no diagnosis of dd {filler}: {lines:#?}\n{stderr}"));
    assert_eq!(diagnosis["cause"], "shm_full", "{diagnosis:#}");
    assert!(diagnosis["leftovers"].is_null(), "{diagnosis:#}");
    assert!(
        !diagnosis.to_string().contains("left-behind"),
        "{diagnosis:#}"
    );
}
