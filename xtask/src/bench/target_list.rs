//! The benchmark's targets, each named for what it bounds: [`TARGETS`] is the one list of
//! them, and docs/BENCHMARKS.md's targets table is written from it ([`catalogue`]) and checked
//! against it.
use super::{
    table::markdown,
    target::{Side, Target},
};

/// A traced workload's overhead (its median ratio to untraced, minus one) against the floor's
/// (empty programs on the same hooks): not judged when the floor's is not above noise.
pub const TRACED_OVERHEAD: Target = Target {
    bounds: "traced overhead",
    bound: "≤ 1.5× the floor's",
    side: Side::AtMost,
    limit: 1.5,
    how: "`shmtrace -o /dev/null` against the floor, each a median of round-by-round ratios to untraced over the timed rounds of a case: (traced − 1) ≤ 1.5 × (floor − 1); not judged when the floor's median is not above 1",
};
/// An untraced process while `shmtrace --all` runs (`-o /dev/null`), as a ratio to untraced.
pub const BESIDE_ALL: Target = Target {
    bounds: "untraced process while --all runs",
    bound: "≤ 1.08×",
    side: Side::AtMost,
    limit: 1.08,
    how: "the workload untraced while `shmtrace --all -o /dev/null` runs, median of round-by-round ratios to untraced, per case",
};
/// An untraced process while shmtrace traces another (`--pid OTHER`).
pub const BESIDE_OTHER: Target = Target {
    bounds: "untraced process while --pid OTHER runs",
    bound: "≤ 1.02×",
    side: Side::AtMost,
    limit: 1.02,
    how: "the workload untraced while `shmtrace --pid SLEEPER` runs, median of round-by-round ratios to untraced, per case",
};
/// shmtrace's peak RSS, tracing the workload or beside a storm.
pub const PEAK_RSS: Target = Target {
    bounds: "peak RSS of a live trace",
    bound: "≤ 32 MiB",
    side: Side::AtMost,
    limit: 32.0,
    how: "shmtrace's own `VmHWM` (largest over a case's runs of `shmtrace -o /dev/null`; beside a 10k storm for `--all`)",
};
/// SIGINT to exit, the slowest run.
pub const SIGINT_TO_EXIT: Target = Target {
    bounds: "SIGINT to exit",
    bound: "< 1000 ms",
    side: Side::Below,
    limit: 1000.0,
    how: "from SIGINT to `shmtrace --all`'s exit, the slowest run of a case, and after a 10k storm",
};
/// Events lost to a full ring buffer of the default size.
pub const NO_LOSS: Target = Target {
    bounds: "events lost with the default buffer",
    bound: "= 0",
    side: Side::AtMost,
    limit: 0.0,
    how: "records dropped because the ring buffer was full, over every shmtrace run of a case and each storm (failed probe reads are shown apart)",
};
/// shmtrace's CPU for a storm of ten times the processes.
pub const STORM_CPU: Target = Target {
    bounds: "tracer CPU for 10k processes against 1k",
    bound: "≤ 10×",
    side: Side::AtMost,
    limit: 10.0,
    how: "shmtrace's user + system time tracing a fork storm of 10 000 processes over one of 1 000 (medians of 3 rounds)",
};
/// A tracer's peak RSS through storms in a row: how much the later storms raise it. The limit
/// is how far apart two peaks of the same bounded memory land: the 10k storm's peak under
/// `--all` alone varied by 2.2 MiB over four runs (28.1-30.3 MiB).
pub const MEMORY_PLATEAU: Target = Target {
    bounds: "peak RSS raised by 100k processes more, after the first 100k, with no loss",
    bound: "≤ 2 MiB",
    side: Side::AtMost,
    limit: 2.0,
    how: "a fresh `--all`, and a fresh daemon, each beside four 50 000-process storms in a row: the peak after the fourth over the peak after the second, and no record lost",
};
/// From shmtrace's start to the traced command's (median).
pub const STARTUP: Target = Target {
    bounds: "traced command starts after shmtrace",
    bound: "≤ 200 ms",
    side: Side::AtMost,
    limit: 200.0,
    how: "`shmtrace -o /dev/null -- xtask stamp`, the stamp's clock minus the time just before shmtrace was spawned; median of 15 runs, after the last run's probes are released and back to back",
};
/// From the command's end to shmtrace's exit (median).
pub const TEARDOWN: Target = Target {
    bounds: "teardown after the command ends",
    bound: "< 200 ms",
    side: Side::Below,
    limit: 200.0,
    how: "shmtrace's exit minus the stamp's clock, median of the same runs",
};
/// `shmtrace show --json` of a recorded churn on one core, in millions of events a second.
pub const REPLAY_RATE: Target = Target {
    bounds: "replay: decode + JSON on one core",
    bound: "≥ 1M events/s",
    side: Side::AtLeast,
    limit: 1.0,
    how: "`taskset -c 0 shmtrace show --json` of a recorded 4 KiB churn of 100 000 objects to /dev/null, lines over seconds from spawn to exit",
};
/// `shmtrace report`'s time over a trace of ten times the processes: replay is linear.
pub const REPORT_SCALING: Target = Target {
    bounds: "report of a trace of 10× the processes",
    bound: "≤ 10× the time",
    side: Side::AtMost,
    limit: 10.0,
    how: "`taskset -c 0 shmtrace report` of a recorded fork storm of 1M processes over one of 100k (`--only-replay`)",
};
/// shmtrace's programs on a `write`, `close`, `mmap` or `munmap` of a process that holds no
/// /dev/shm file, under `--all` and the daemon, against an empty program on the same hook (the
/// worse of the two).
pub const BYSTANDER_CALL: Target = Target {
    bounds: "programs on a write, close, mmap or munmap of a process holding nothing, under --all and the daemon",
    bound: "≤ 1.5× an empty program",
    side: Side::AtMost,
    limit: 1.5,
    how: "BPF run-time statistics, nanoseconds per run of the program a call of a bystander loop runs, the worse of beside `--all` and beside the daemon, over an empty program's on the same hook",
};
/// The open of a file that is not on /dev/shm, judged at its exit by the file it made, by a
/// process whose descriptor table has not grown (≤ 64 descriptors).
pub const OPEN_CALL: Target = Target {
    bounds: "programs on an open of a file not on /dev/shm, ≤ 64 descriptors, under --all and the daemon",
    bound: "≤ 2× an empty program",
    side: Side::AtMost,
    limit: 2.0,
    how: "the same, for the open of the open and close loop",
};
/// A holder's `write`, `close` or `mmap` on a descriptor that is not /dev/shm.
pub const HOLDER_CALL: Target = Target {
    bounds: "programs on a write, close or mmap of a process holding /dev/shm, on another file, under --all and the daemon",
    bound: "≤ 2.0× an empty program",
    side: Side::AtMost,
    limit: 2.0,
    how: "the same, for the loops of a process holding an open, mapped /dev/shm file",
};
/// The open and the holder's calls of a process whose descriptor table has grown past 64
/// slots, whose file is read at its address.
pub const GROWN_TABLE_CALL: Target = Target {
    bounds: "programs on an open, or a holder's write, close or mmap, with a grown descriptor table, under --all and the daemon",
    bound: "≤ 4× an empty program",
    side: Side::AtMost,
    limit: 4.0,
    how: "the same, for the loops holding 100 more descriptors",
};
/// A bystander loop's wall time beside the daemon, against beside the floor.
pub const BYSTANDER_TIMED: Target = Target {
    bounds: "bystander loop's time beside the daemon, against beside empty programs",
    bound: "≤ 1.02×",
    side: Side::AtMost,
    limit: 1.02,
    how: "a bystander loop's median wall time beside the daemon over that beside empty programs, interleaved rounds",
};
/// A real server's throughput beside the daemon, against beside empty programs.
pub const SERVER_LOSS: Target = Target {
    bounds: "Redis on loopback's throughput lost beside the daemon",
    bound: "≤ 1% of beside empty programs",
    side: Side::AtMost,
    limit: 1.0,
    how: "`redis-benchmark` against `redis-server` on loopback, median requests a second beside the daemon against beside empty programs, interleaved rounds",
};

/// An idle `shmtrace daemon`'s CPU, as a share of one core.
pub const DAEMON_IDLE: Target = Target {
    bounds: "an idle daemon's CPU",
    bound: "≤ 1% of one core",
    side: Side::AtMost,
    limit: 1.0,
    how: "`shmtrace daemon` as a node agent (host-wide probes, a survey and a /dev/shm measurement every 2 s, `/metrics` scraped every 15 s) on a machine where nothing fails, its own CPU over 60 s after 5 s of warm-up",
};

/// `shmtrace daemon`'s resident memory through an hour of short-lived containers: its growth
/// from the end of the warm-up to the end (what weeks of churn would add), and its highest.
pub const CONTAINER_SOAK_GROWTH: Target = Target {
    bounds: "daemon RSS growth over an hour of container churn, after a 5-minute warm-up",
    bound: "≤ 16 MiB",
    side: Side::AtMost,
    limit: 16.0,
    how: "`cargo xtask bench --only-container-soak` (not in a full run): `shmtrace daemon` beside `docker run --rm` after `docker run --rm` for 60 min, names reused, every other container failing in a 1 MiB /dev/shm; its VmRSS at the end less that after 5 min",
};
pub const CONTAINER_SOAK_PEAK: Target = Target {
    bounds: "daemon RSS at most, through an hour of container churn",
    bound: "≤ 96 MiB",
    side: Side::AtMost,
    limit: 96.0,
    how: "the same soak: the highest VmRSS read, every 30 s and at the end",
};
/// Every failure of the soak's containers counted under its own name, none for a container that
/// cannot fail, none made up for records that were not lost (1 for a run that miscounted).
pub const CONTAINER_SOAK_COUNTS: Target = Target {
    bounds: "container churn's counts: each under its container, none made up",
    bound: "= 0 miscounted runs",
    side: Side::AtMost,
    limit: 0.0,
    how: "the same soak, at its end: the failing containers' names have exactly the failures that ran, the healthy ones' none, and nothing is unrecorded unless records were lost",
};
/// The ptrace source (no privilege) tracing the 256 KiB churn, as a ratio to untraced.
pub const PTRACE_CHURN: Target = Target {
    bounds: "ptrace source: traced churn",
    bound: "≤ 1.3× untraced",
    side: Side::AtMost,
    limit: 1.3,
    how: "`shmtrace --backend ptrace -o FILE` running the churn, median of round-by-round ratios to untraced over the timed rounds of the 256 KiB case (`--only-ptrace`, or a full run)",
};
/// Its overhead (ratio − 1) against `strace -f`'s on the same work.
pub const PTRACE_AGAINST_STRACE: Target = Target {
    bounds: "ptrace source: overhead",
    bound: "≤ 0.5× strace -f's",
    side: Side::AtMost,
    limit: 0.5,
    how: "(ptrace − 1) against (`strace -f -o /dev/null` − 1), each the median of its round-by-round ratios to untraced, in the same rounds",
};
/// From `shmtrace --backend ptrace`'s start to the traced command's first instruction (median).
pub const PTRACE_STARTUP: Target = Target {
    bounds: "ptrace source: command starts after shmtrace",
    bound: "≤ 100 ms",
    side: Side::AtMost,
    limit: 100.0,
    how: "from starting `shmtrace --backend ptrace -o /dev/null -- xtask stamp` to the monotonic clock the stamp prints first thing, median of 15 runs back to back",
};

/// Every target, in the order docs/BENCHMARKS.md lists them.
pub const TARGETS: [&Target; 25] = [
    &TRACED_OVERHEAD,
    &BESIDE_ALL,
    &BESIDE_OTHER,
    &PEAK_RSS,
    &SIGINT_TO_EXIT,
    &NO_LOSS,
    &STORM_CPU,
    &MEMORY_PLATEAU,
    &STARTUP,
    &TEARDOWN,
    &REPLAY_RATE,
    &REPORT_SCALING,
    &BYSTANDER_CALL,
    &OPEN_CALL,
    &HOLDER_CALL,
    &GROWN_TABLE_CALL,
    &BYSTANDER_TIMED,
    &SERVER_LOSS,
    &DAEMON_IDLE,
    &CONTAINER_SOAK_GROWTH,
    &CONTAINER_SOAK_PEAK,
    &CONTAINER_SOAK_COUNTS,
    &PTRACE_CHURN,
    &PTRACE_AGAINST_STRACE,
    &PTRACE_STARTUP,
];

/// docs/BENCHMARKS.md's table of the targets: what each bounds, its bound, and how it is
/// measured.
pub fn catalogue() -> String {
    let mut cells = vec![vec![
        "target".to_owned(),
        "bound".to_owned(),
        "measured".to_owned(),
    ]];
    for target in TARGETS {
        cells.push(vec![
            target.bounds.to_owned(),
            target.bound.to_owned(),
            target.how.to_owned(),
        ]);
    }
    markdown(&cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bound's words and its number are one fact: the words name the number, and the sign
    /// is the side.
    #[test]
    fn each_bound_names_its_limit() {
        for target in TARGETS {
            let number = if target.limit.fract() == 0.0 {
                format!("{:.0}", target.limit)
            } else {
                format!("{}", target.limit)
            };
            assert!(
                target.bound.contains(&number),
                "{target:?}: the bound does not name {number}"
            );
            let sign = match target.side {
                Side::AtMost if target.limit == 0.0 => "= ",
                Side::AtMost => "≤ ",
                Side::Below => "< ",
                Side::AtLeast => "≥ ",
            };
            assert!(target.bound.starts_with(sign), "{target:?}");
        }
    }

    /// A target is named for what it bounds, never for the issue that set it: an issue's
    /// number means nothing to a reader of the table.
    #[test]
    fn targets_are_named_for_what_they_bound() {
        for target in TARGETS {
            for text in [target.bounds, target.bound, target.how] {
                assert!(
                    !text.to_lowercase().contains("issue"),
                    "{target:?} cites an issue"
                );
            }
        }
    }
}
