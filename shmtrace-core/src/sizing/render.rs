//! `shmtrace size` as text.
use super::SizeReport;
use crate::{event::escape, size::human};

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
        // Per role, an object mapped counts by its size: its pages written through the
        // mapping show in no system call.
        for role in &shm.roles {
            add(
                "  by role",
                format!("{:<24}{}", role.role, human(role.peak_bytes)),
            );
        }
        let more = shm
            .live_at_peak_total
            .saturating_sub(shm.live_at_peak.len());
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
    for failure in &report.failures {
        add(
            "failed",
            format!("{failure}: the peak is what fitted, not what was needed"),
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
            if budget.fits {
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
