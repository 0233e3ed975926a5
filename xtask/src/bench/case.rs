//! One case of the benchmark (one object size): the workload's command line, how many
//! objects and rounds, the timed rounds themselves, and what each variant's runs gave.
use std::{collections::BTreeMap, ffi::OsString, sync::atomic::Ordering};

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::{
    BenchArgs, INTERRUPTED, churn, neighbours,
    stats::Spread,
    variants::{self, Outcome, Setup, Variant},
};

/// One object size: the workload's command line and how often to run it.
pub(super) struct Case {
    pub(super) title: String,
    pub(super) size: u64,
    pub(super) iterations: u64,
    pub(super) rounds: u32,
    /// Objects the workload makes in all (iterations × workers).
    pub(super) objects: u64,
    pub(super) tag: String,
    pub(super) workload: Vec<OsString>,
}

impl Case {
    pub(super) fn new(args: &BenchArgs, size: u64, exe: &std::path::Path, tag: &str) -> Case {
        let iterations = args
            .iterations
            .unwrap_or_else(|| default_iterations(size, args.quick));
        let rounds = args.rounds.unwrap_or(if args.quick { 3 } else { 5 }).max(1);
        let mut workload: Vec<OsString> = vec![exe.into(), "churn".into()];
        for (flag, value) in [
            ("--size", size.to_string()),
            ("--iterations", iterations.to_string()),
            ("--workers", args.workers.to_string()),
            ("--tag", tag.to_owned()),
        ] {
            workload.push(flag.into());
            workload.push(value.into());
        }
        let mut extras = String::new();
        if args.write_call {
            workload.push("--write-call".into());
            extras += ", with write(2)";
        }
        if args.fill {
            workload.push("--fill".into());
            extras += ", filling each mapping";
        }
        let plural = |n: u64, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        Case {
            title: format!(
                "{} objects × {iterations} per worker, {}, {}{extras}",
                shmtrace_core::units::human(size),
                plural(args.workers as u64, "worker"),
                plural(rounds as u64, "round"),
            ),
            size,
            iterations,
            rounds,
            objects: iterations * args.workers as u64,
            tag: tag.to_owned(),
            workload,
        }
    }
}

/// Runs every available variant once a round, in an order that rotates each round.
pub(super) fn run_rounds(
    case: &Case,
    setup: &Setup,
    selected: &[&'static Variant],
    unavailable: &[Option<String>],
    others: &mut BTreeMap<u32, String>,
) -> Result<Vec<VariantResult>> {
    let mut results: Vec<VariantResult> = selected
        .iter()
        .zip(unavailable)
        .map(|(variant, unavailable)| VariantResult {
            variant,
            outcomes: Vec::new(),
            rounds: Vec::new(),
            errors: Vec::new(),
            unavailable: unavailable.clone(),
        })
        .collect();
    // A discarded warm-up: the first run pays for cold caches and /dev/shm growth.
    let _ = Variant::run(&variants::ALL[0], setup, &case.workload);
    churn::remove_leftovers(&case.tag);
    for round in 0..case.rounds {
        others.extend(neighbours::foreign_bpf_holders());
        eprint!("round {}/{}:", round + 1, case.rounds);
        let n = results.len();
        for k in 0..n {
            // Rotate the order each round, so no variant always follows the same one.
            let result = &mut results[(k + round as usize) % n];
            if result.unavailable.is_some() {
                continue;
            }
            if INTERRUPTED.load(Ordering::SeqCst) {
                bail!("interrupted");
            }
            eprint!(" {}", result.variant.name);
            match result.variant.run(setup, &case.workload) {
                Ok(outcome) => {
                    result.outcomes.push(outcome);
                    result.rounds.push(round);
                }
                Err(error) => result.errors.push(format!("{error:#}")),
            }
            churn::remove_leftovers(&case.tag);
        }
        eprintln!();
    }
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(results)
}

/// Enough objects for a run to last a second or two untraced (about 3 GiB worth, at most
/// 30000: strace takes ten times as long); a sixth of that for --quick.
pub(super) fn default_iterations(size: u64, quick: bool) -> u64 {
    let (bytes, low, high) = if quick {
        (512u64 << 20, 300, 5_000)
    } else {
        (3u64 << 30, 2_000, 30_000)
    };
    (bytes / size.max(1)).clamp(low, high)
}

/// The workload holds at most one object per worker at a time.
pub(super) fn check_room(size: u64, workers: u32) -> Result<()> {
    // SAFETY: an all-zero statvfs is valid; statvfs fills it.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out-pointer.
    if unsafe { libc::statvfs(c"/dev/shm".as_ptr(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error()).context("statvfs /dev/shm");
    }
    let free = fs.f_bavail as u64 * fs.f_frsize as u64;
    let needed = size * workers as u64;
    if free < needed * 2 {
        bail!(
            "/dev/shm has {} free; the workload needs {} at a time",
            shmtrace_core::units::human(free),
            shmtrace_core::units::human(needed)
        );
    }
    Ok(())
}

/// All runs of one variant in one case.
pub struct VariantResult {
    pub(super) variant: &'static Variant,
    pub(super) outcomes: Vec<Outcome>,
    /// The round each of `outcomes` ran in.
    pub(super) rounds: Vec<u32>,
    pub(super) errors: Vec<String>,
    pub(super) unavailable: Option<String>,
}

impl VariantResult {
    pub(super) fn spread(&self, value: impl Fn(&Outcome) -> Option<f64>) -> Option<Spread> {
        Spread::of(&self.outcomes.iter().filter_map(value).collect::<Vec<_>>())
    }
    /// Each of this variant's outcomes beside `base`'s of the same round (a round `base` did
    /// not complete is left out): every ratio to a base is taken round by round, so that load
    /// that drifts between rounds weighs on both sides of it alike.
    pub(super) fn beside<'a>(
        &'a self,
        base: &'a VariantResult,
    ) -> impl Iterator<Item = (&'a Outcome, &'a Outcome)> {
        self.rounds
            .iter()
            .zip(&self.outcomes)
            .filter_map(|(round, outcome)| {
                let i = base.rounds.iter().position(|r| r == round)?;
                Some((outcome, &base.outcomes[i]))
            })
    }
    /// This variant's `value` over `base`'s, round by round, and the median of those ratios.
    pub(super) fn paired_ratio(
        &self,
        base: &VariantResult,
        value: impl Fn(&Outcome) -> f64,
    ) -> Option<f64> {
        let ratios: Vec<f64> = self
            .beside(base)
            .map(|(outcome, base)| value(outcome) / value(base))
            .collect();
        Spread::of(&ratios).map(|s| s.median)
    }
    pub(super) fn loop_times(&self) -> Option<Spread> {
        self.spread(|o| Some(o.workload.loop_seconds))
    }
    pub(super) fn wall_times(&self) -> Option<Spread> {
        self.spread(|o| Some(o.top.wall_seconds))
    }
    pub(super) fn tracer_cpu(&self) -> Option<Spread> {
        self.spread(|o| o.tracer.as_ref().map(|t| t.cpu_seconds))
    }
    pub(super) fn tracer_peak_rss_kb(&self) -> Option<u64> {
        self.outcomes
            .iter()
            .filter_map(|o| o.tracer.as_ref().map(|t| t.peak_rss_kb))
            .max()
    }
    pub(super) fn events(&self) -> Option<u64> {
        self.spread(|o| o.reported.events.map(|e| e as f64))
            .map(|s| s.median as u64)
    }
    pub(super) fn lost(&self) -> Option<u64> {
        self.outcomes.iter().filter_map(|o| o.reported.lost).max()
    }
    /// `ok` when every run's tracer output matched the calls made, else the first mismatch.
    pub(super) fn calls_seen(&self) -> String {
        if self.outcomes.iter().all(|o| o.reported.per_call.is_none()) {
            return "-".into();
        }
        let bad: Vec<String> = self.outcomes.iter().filter_map(Outcome::mismatch).collect();
        match bad.first() {
            None => "ok".into(),
            Some(first) => format!("{} of {} runs: {first}", bad.len(), self.outcomes.len()),
        }
    }
}

pub(super) fn raw_runs(results: &[VariantResult]) -> serde_json::Value {
    results
        .iter()
        .map(|r| {
            json!({
                "variant": r.variant.name,
                "unavailable": r.unavailable,
                "errors": r.errors,
                "runs": r.outcomes.iter().map(|o| json!({
                    "loop_seconds": o.workload.loop_seconds,
                    "wall_seconds": o.top.wall_seconds,
                    "workload_cpu_seconds": o.workload.cpu_seconds,
                    "tracer_cpu_seconds": o.tracer.as_ref().map(|t| t.cpu_seconds),
                    "tracer_peak_rss_kb": o.tracer.as_ref().map(|t| t.peak_rss_kb),
                    "events": o.reported.events,
                    "lost": o.reported.lost,
                    "per_call": o.reported.per_call,
                    "calls": o.workload.calls,
                    "mismatch": o.mismatch(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_iterations_stay_in_range() {
        assert_eq!(default_iterations(1 << 20, false), 3072);
        assert_eq!(default_iterations(4096, false), 30_000);
        assert_eq!(default_iterations(1 << 30, false), 2_000);
        assert_eq!(default_iterations(4096, true), 5_000);
    }
}
