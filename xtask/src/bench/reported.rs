//! What a tracer reports back: events per call, the total, and events lost, read from its
//! output; and whether that matches the calls the workload made.
use std::{collections::BTreeMap, fs, path::Path};

use anyhow::{Context, Result, bail};

use super::churn::CALLS;

/// What a tracer said it saw.
#[derive(Default)]
pub struct Reported {
    /// The event total from the tracer's own summary (shmtrace), or lines written (perf).
    pub events: Option<u64>,
    /// Records lost to a full ring buffer.
    pub lost: Option<u64>,
    /// Probe reads that failed (shmtrace's notices on stderr).
    pub failed_reads: Option<u64>,
    /// Events per call name, counted in the tracer's output.
    pub per_call: Option<BTreeMap<String, u64>>,
    /// How `per_call` should compare with the calls made: shmtrace must see exactly the
    /// /dev/shm calls (none with `--failed`, as all succeed); perf trace sees these calls on
    /// any file, so at least as many.
    pub expect: Expect,
}

#[derive(Default, Clone, Copy, PartialEq)]
pub enum Expect {
    #[default]
    Nothing,
    Exact,
    NoneShown,
    AtLeast,
}

/// Events per call, total and lost, from shmtrace's output file and its summary.
pub fn read_shmtrace_file(output: &Path, json: bool, failed: bool) -> Result<Reported> {
    let text = fs::read_to_string(output).context("reading shmtrace's output")?;
    let mut per_call: BTreeMap<String, u64> = BTreeMap::new();
    let mut events = None;
    let mut lost = None;
    for line in text.lines() {
        if json {
            let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            match record["event"].as_str() {
                Some("summary") => {
                    events = record["events"].as_u64();
                    lost = record["lost"].as_u64();
                }
                Some(name) => *per_call.entry(name.to_owned()).or_default() += 1,
                None => {}
            }
        } else if let Some(summary) = line.strip_prefix("shmtrace: ") {
            // "N events in 1.2s from P processes; F failed calls, K killed by a signal;
            // L events lost", then " (3 Syscall records (ring buffer full), ...)" when L > 0
            if let Some((n, rest)) = summary.split_once(" events in ") {
                events = n.trim().parse().ok();
                lost = rest
                    .rsplit("; ")
                    .next()
                    .and_then(|l| l.split_once(" events lost"))
                    .and_then(|(l, _)| l.trim().parse().ok());
            }
        } else if let Some(call) = human_call(line) {
            *per_call.entry(call.to_owned()).or_default() += 1;
        }
    }
    if events.is_none() {
        bail!("shmtrace's output has no summary");
    }
    Ok(Reported {
        events,
        lost,
        failed_reads: None,
        per_call: Some(per_call),
        expect: if failed {
            Expect::NoneShown
        } else {
            Expect::Exact
        },
    })
}

/// The call name of a human-format line: `TIME PID COMM [ROLE] call(args) = ret`, the role
/// being absent, one word (`trainer`) or two (`worker 1`).
fn human_call(line: &str) -> Option<&str> {
    line.split_whitespace().skip(3).take(3).find_map(|token| {
        let (name, _) = token.split_once('(')?;
        let is_call = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        is_call.then_some(name)
    })
}

/// Records shmtrace noticed it lost to a full ring buffer, from its notices on stderr:
/// "N events lost or incomplete (3 Syscall records (ring buffer full), 2 path reads failed; M
/// lost in all)". Failed probe reads are counted apart ([`failed_reads_from_notices`]): with
/// `--all` they come from every process on the host, most of them not /dev/shm calls at all.
pub fn lost_from_notices(stderr: &str) -> u64 {
    losses_from_notices(stderr).0
}

/// Probe reads shmtrace noticed failing (a path, a kernel field, an argument).
pub fn failed_reads_from_notices(stderr: &str) -> u64 {
    losses_from_notices(stderr).1
}

/// (ring buffer full, failed reads), summed over every notice.
fn losses_from_notices(stderr: &str) -> (u64, u64) {
    let mut ring = 0;
    let mut reads = 0;
    for line in stderr.lines() {
        let Some((_, rest)) = line.split_once("events lost or incomplete (") else {
            continue;
        };
        let Some((kinds, _)) = rest.split_once("; ") else {
            continue;
        };
        for item in kinds.split(", ") {
            let Some((count, what)) = item.split_once(' ') else {
                continue;
            };
            let count: u64 = count.parse().unwrap_or(0);
            if what.contains("ring buffer full") {
                ring += count;
            } else {
                reads += count;
            }
        }
    }
    (ring, reads)
}

#[cfg(test)]
mod notice_tests {
    use super::*;

    #[test]
    fn ring_losses_and_failed_reads_apart() {
        let stderr = "shmtrace: 5 events lost or incomplete (3 Syscall records (ring buffer full), \
                      2 path reads failed; 5 lost in all). If ...\n\
                      shmtrace: 1 events lost or incomplete (1 Fork records (ring buffer full); 6 \
                      lost in all). If ...\n";
        assert_eq!(lost_from_notices(stderr), 4);
        assert_eq!(failed_reads_from_notices(stderr), 2);
    }
}

/// perf trace lines: `TIME ( DURATION ms): COMM/PID call(args) = ret`, and `LOST N events!`.
pub fn read_perf_trace(output: &Path) -> Result<Reported> {
    let text = fs::read_to_string(output).context("reading perf trace's output")?;
    let mut per_call: BTreeMap<String, u64> = BTreeMap::new();
    let mut lost = 0;
    let mut events = 0;
    for line in text.lines() {
        if let Some(n) = line
            .trim()
            .strip_prefix("LOST ")
            .and_then(|r| r.split_whitespace().next())
        {
            lost += n.parse::<u64>().unwrap_or(0);
        } else if let Some((_, rest)) = line.split_once("): ") {
            let Some(call) = rest.split_whitespace().nth(1) else {
                continue;
            };
            if let Some((name, _)) = call.split_once('(') {
                *per_call.entry(name.to_owned()).or_default() += 1;
                events += 1;
            }
        }
    }
    Ok(Reported {
        events: Some(events),
        lost: Some(lost),
        failed_reads: None,
        per_call: Some(per_call),
        expect: Expect::AtLeast,
    })
}

impl Reported {
    /// `None` when the tracer saw what it should have of the calls `made`; otherwise what
    /// differs, such as `munmap 2999/3000`.
    pub fn mismatch(&self, made: &BTreeMap<String, u64>) -> Option<String> {
        let seen = self.per_call.as_ref()?;
        let differences: Vec<String> = CALLS
            .iter()
            .filter_map(|call| {
                let made = made.get(*call).copied().unwrap_or(0);
                let seen = seen.get(*call).copied().unwrap_or(0);
                let fine = match self.expect {
                    Expect::Nothing => true,
                    Expect::Exact => seen == made,
                    Expect::NoneShown => seen == 0,
                    Expect::AtLeast => seen >= made,
                };
                (!fine).then(|| format!("{call} {seen}/{made}"))
            })
            .collect();
        let shown: Vec<&str> = differences.iter().take(3).map(String::as_str).collect();
        let more = if differences.len() > 3 { ", …" } else { "" };
        (!differences.is_empty()).then(|| format!("{}{more}", shown.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_call_whatever_the_role_column_holds() {
        let line = |role: &str| {
            format!(
                "17:51:36.425526     7068 pt_data_worker  {role:<9} ftruncate(3</dev/shm/torch_1_2_0>, 384.0 KiB) = 0"
            )
        };
        assert_eq!(human_call(&line("")), Some("ftruncate"));
        assert_eq!(human_call(&line("trainer")), Some("ftruncate"));
        assert_eq!(human_call(&line("worker 12")), Some("ftruncate"));
        assert_eq!(
            human_call("17:51:36.1  7068 sh  fork() = 7069"),
            Some("fork")
        );
        assert_eq!(human_call("━━━ shmtrace diagnosis ━━━"), None);
    }

    #[test]
    fn reads_the_summary_line() {
        let dir = std::env::temp_dir().join(format!("xtask-reported-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("out.txt");
        fs::write(
            &file,
            "17:51:36.1  7068 pt_data_worker  worker 1  openat(AT_FDCWD, \"/dev/shm/x\", O_RDWR, 0600) = 3\n\
             shmtrace: 7 events in 0.1s from 1 processes; 0 failed calls, 0 killed by a signal; 3 events lost\n",
        )
        .unwrap();
        let reported = read_shmtrace_file(&file, false, false).unwrap();
        assert_eq!(reported.events, Some(7));
        assert_eq!(reported.lost, Some(3));
        assert_eq!(reported.per_call.unwrap().get("openat"), Some(&1));
        let _ = fs::remove_dir_all(dir);
    }
}
