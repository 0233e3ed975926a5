//! `shmtrace size` as text.
use super::SizeReport;
use crate::{
    event::escape,
    units::{count, human},
};

/// Failures listed one by one; the rest are counted.
const MAX_FAILURES_LISTED: usize = 8;

/// The report for people; `time` turns a kernel timestamp into a wall-clock time.
pub fn text(report: &SizeReport, time: &dyn Fn(u64) -> String) -> String {
    let mut out = String::from("━━━ shmtrace size ━━━\n");
    let mut add = |label: &str, value: String| {
        out.push_str(&format!("  {label:<10}{value}\n"));
    };
    if report.shm.is_empty() {
        add(
            "peak",
            "nothing: the workload allocated no /dev/shm memory while it was traced".to_owned(),
        );
    }
    for shm in &report.shm {
        add(
            "/dev/shm",
            format!(
                "{} ({}){}",
                escape::text(&shm.place),
                shm.dev,
                shm.size
                    .map(|size| format!(", {} in size", human(size)))
                    .unwrap_or_default()
            ),
        );
        add(
            "peak",
            format!(
                "{} allocated at {} ({:.3} s after the start), measured by {}",
                human(shm.peak_bytes),
                time(shm.peak_ns),
                shm.peak_after_s,
                shm.measured_by
            ),
        );
        // What made up the peak, by the role of the process that made each object: rows
        // that add up to it.
        for role in &shm.roles {
            if role.role == super::UNSEEN {
                add(
                    "  unseen",
                    format!(
                        "{:<24}{:>10}  pages statfs counted that the traced calls had not shown \
                         (calls still running, writes through mappings, processes not traced)",
                        "",
                        human(role.bytes_at_peak)
                    ),
                );
            } else {
                add(
                    "  made by",
                    format!("{:<24}{:>10}", role.role, human(role.bytes_at_peak)),
                );
            }
        }
        if shm.roles.len() > 1 {
            add(
                "",
                "(by the role of the process that made each object; the closing table counts \
                 what each role's processes held, a batch for its worker and for the trainer)"
                    .to_owned(),
            );
        }
        let listed: usize = shm
            .live_at_peak
            .iter()
            .map(|o| {
                o.name
                    .split_once(" POSIX semaphores")
                    .and_then(|(n, _)| n.parse().ok())
                    .unwrap_or(1)
            })
            .sum();
        let more = shm.live_at_peak_total.saturating_sub(listed);
        for (i, object) in shm.live_at_peak.iter().enumerate() {
            add(
                if i == 0 { "live then" } else { "" },
                format!(
                    "{:>10}  {}  ({}{}{})",
                    human(object.bytes),
                    escape::text(&object.name),
                    if object.mapped && object.size > object.bytes {
                        format!("mapped, {} in size, ", human(object.size))
                    } else {
                        String::new()
                    },
                    object.role,
                    object.pid.map(|p| format!(", pid {p}")).unwrap_or_default()
                ),
            );
        }
        if more > 0 {
            add("", format!("and {more} smaller"));
        }
        let advice = &shm.advice;
        add(
            "advice",
            format!("{}: {}", human(advice.min_bytes), advice.basis),
        );
        if let Some(bound) = shm.dataloader_bound {
            add(
                "bound",
                format!(
                    "{} by the DataLoader rule of thumb (workers x prefetch_factor + 3 \
                     batches), for comparison only: the measured peak is what it used",
                    human(bound)
                ),
            );
        }
        add("docker", advice.docker.clone());
        add("compose", advice.compose.clone());
        add("k8s", advice.kubernetes.clone());
        add("note", advice.memory_note.clone());
        if shm.near_full {
            add(
                "warning",
                "the peak came within 10% of this /dev/shm's size: the workload may have \
                 needed more than it could get; measure again with a bigger one"
                    .to_owned(),
            );
        }
    }
    let short: Vec<&super::SizeFailure> = report
        .failures
        .iter()
        .filter(|f| f.for_lack_of_shm())
        .collect();
    if !short.is_empty() {
        let sizes: Vec<String> = report
            .shm
            .iter()
            .filter_map(|shm| shm.size.map(human))
            .collect();
        add(
            "failed",
            format!(
                "{} failed for lack of /dev/shm while it was measured: the peak is what fitted{}, \
                 not what the workload needs",
                count(short.len() as u64, "process"),
                match sizes.as_slice() {
                    [size] => format!(" in its {size}"),
                    _ => String::new(),
                }
            ),
        );
    }
    let others = report.failures.iter().filter(|f| !f.for_lack_of_shm());
    for (i, failure) in short.iter().copied().chain(others).enumerate() {
        if i == MAX_FAILURES_LISTED {
            add(
                "",
                format!(
                    "... and {} more",
                    report.failures.len() - MAX_FAILURES_LISTED
                ),
            );
            break;
        }
        add(
            if short.is_empty() && i == 0 {
                "failed"
            } else {
                ""
            },
            format!("{} (pid {}): {}", failure.comm, failure.pid, failure.what),
        );
    }
    if report.lost_events > 0 {
        add(
            "lost",
            format!(
                "{} events the kernel could not deliver: the peak may be low (raise \
                 --buffer-size)",
                report.lost_events
            ),
        );
    }
    if let Some(command) = &report.command {
        add(
            "command",
            match (command.exit_code, &command.signal) {
                (Some(code), _) => format!("exited with status {code}"),
                (None, Some(signal)) => format!("killed by {signal}"),
                (None, None) => "ended".to_owned(),
            },
        );
    }
    if let Some(budget) = &report.budget {
        add(
            "budget",
            if budget.unmeasured {
                format!(
                    "NOT MEASURED: the workload ran out of /dev/shm, so this run cannot tell \
                     whether {} is enough (it needed more than it got); run it again on a \
                     /dev/shm of at least {} and check again",
                    human(budget.bytes),
                    human(budget.measure_on.unwrap_or(budget.bytes))
                )
            } else if budget.fits {
                format!(
                    "fits: {} needed with headroom, {} allowed",
                    human(budget.needed),
                    human(budget.bytes)
                )
            } else {
                format!(
                    "DOES NOT FIT: {} needed with headroom, {} allowed",
                    human(budget.needed),
                    human(budget.bytes)
                )
            },
        );
    }
    out
}
