//! A diagnosis, for people (a block of aligned lines) and for programs (one JSON record).
use serde_json::{Value, json};

use super::json::SCHEMA_VERSION;
use crate::{
    clock::Clock,
    diagnose::{Cause, Diagnosis, FailureKind, FailureRun, RoleKind, runs},
    event::{ExitStatus, names},
    model::ContainerInfo,
    size::{count, human},
};

pub const TITLE: &str = "━━━ shmtrace diagnosis ━━━";
/// Characters of a process title the block shows.
const TITLE_SHOWN: usize = 200;

/// The block's lines after the title, as `(label, text)`; an empty label continues the line
/// above.
pub fn lines(d: &Diagnosis) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut add = |label: &'static str, text: String| out.push((label, text));
    add("", headline(d));
    if let Some(pid) = d.follows {
        let whose = if d.role.kind == RoleKind::Trainer {
            "DataLoader worker"
        } else {
            "child"
        };
        add(
            "because",
            format!("its {whose} pid {pid} failed first (diagnosed above)"),
        );
        return out;
    }
    for run in runs(&d.failures) {
        add("failed", run_line(&run));
        if run.count > 1 {
            add("", format!("the first: {}", run.first.headline()));
        }
    }
    if let Some(title) = &d.title {
        // A raylet's runs to kilobytes; the JSON has it whole.
        add("title", crate::event::escape::truncate(title, TITLE_SHOWN));
    }
    if let Some((pid, argv)) = &d.trainer {
        let command = if argv.is_empty() {
            "(command line unknown)".to_owned()
        } else {
            argv.join(" ")
        };
        add("trainer", format!("pid {pid}: {command}"));
    }
    add(
        "where",
        d.container
            .as_ref()
            .map(ContainerInfo::describe)
            .unwrap_or_else(|| d.place.clone()),
    );
    if let Some(capacity) = d.capacity {
        let percent = (capacity.used * 100)
            .checked_div(capacity.size)
            .unwrap_or(0);
        add(
            "/dev/shm",
            format!(
                "{}, {} used when it failed ({percent}%)",
                human(capacity.size),
                human(capacity.used)
            ),
        );
    }
    if let Some(usage) = &d.usage {
        let mut text = format!(
            "{} in {} of traced processes",
            human(usage.demand),
            count(usage.objects, "live object")
        );
        if d.workers_allocating > 0 {
            text.push_str(&format!(
                "; {} allocating",
                count(d.workers_allocating, "DataLoader worker")
            ));
        }
        add("demand", text);
    }
    if let Some(leftovers) = &d.leftovers {
        add(
            "leftovers",
            format!(
                "{} of it held by {} that processes now gone left behind:",
                human(leftovers.bytes),
                count(leftovers.files.len() as u64, "file")
            ),
        );
        for file in leftovers.files.iter().take(10) {
            add(
                "",
                format!(
                    "{} ({}), made by pid {} {} ({})",
                    file.path,
                    human(file.bytes),
                    file.creator_pid,
                    file.creator_comm,
                    file.creator_ending
                ),
            );
        }
        if leftovers.files.len() > 10 {
            add("", format!("... and {} more", leftovers.files.len() - 10));
        }
    }
    if let Some(others) = &d.others {
        for (label, text) in super::others::lines(others) {
            add(label, text);
        }
    }
    match (&d.recommendation, &d.explanation) {
        (Some(r), _) => {
            add(
                "cause",
                "/dev/shm is too small for what was asked of it".to_owned(),
            );
            add(
                "needs",
                format!("at least {}: {}", human(r.min_bytes), r.basis),
            );
            if let Some(bound) = &r.bound {
                add("bound", bound.clone());
            }
            let mut forms = vec![
                ("docker", r.docker.clone()),
                ("compose", r.compose.clone()),
                ("kubernetes", format!("Kubernetes: {}", r.kubernetes)),
            ];
            // The way this container was started first.
            forms.sort_by_key(|(kind, _)| Some(*kind) != r.preferred);
            for (i, (_, form)) in forms.into_iter().enumerate() {
                add(if i == 0 { "fix" } else { "" }, form);
            }
            if let Some(owner) = d.others.as_ref().and_then(|o| o.owner.as_ref()) {
                add(
                    "on",
                    format!(
                        "container {owner}, whose /dev/shm this is: --shm-size given to a \
                         container that joins it (--ipc=container:{owner}) changes nothing"
                    ),
                );
            }
            for alternative in &r.alternatives {
                add("or", alternative.clone());
            }
            add("note", r.memory_note.clone());
        }
        (None, Some(explanation)) => add("cause", explanation.clone()),
        (None, None) => {}
    }
    if let Some(files) = &d.files {
        add(
            "needs",
            format!(
                "a file count of at least {}: {}",
                files.min_files, files.basis
            ),
        );
        let mut forms = vec![
            ("docker", files.docker.clone()),
            ("compose", files.compose.clone()),
            ("podman", files.podman.clone()),
            ("kubernetes", files.kubernetes.clone()),
        ];
        forms.sort_by_key(|(kind, _)| Some(*kind) != files.preferred);
        for (i, (_, form)) in forms.into_iter().enumerate() {
            add(if i == 0 { "fix" } else { "" }, form);
        }
        for alternative in &files.alternatives {
            add("or", alternative.clone());
        }
    }
    if let Some(leftovers) = &d.leftovers {
        if leftovers.enough_without {
            add(
                "cause",
                "/dev/shm is big enough: files of dead processes filled it".to_owned(),
            );
        } else {
            add(
                "note",
                "even without those files /dev/shm would have been too small".to_owned(),
            );
        }
        add(
            "remove",
            format!(
                "{} (no traced process has them open or mapped; check with fuser first if \
                 others may use them)",
                leftovers.remove
            ),
        );
        if let Some(avoid) = leftovers.avoid {
            add("avoid", avoid.to_owned());
        }
    }
    for alternative in &d.program_alternatives {
        add("or", alternative.clone());
    }
    if d.lost_events > 0 {
        add(
            "warning",
            format!(
                "{} lost before this diagnosis: the counts above may be short",
                count(d.lost_events, "event")
            ),
        );
    }
    out
}

/// One run of like failures: the failure itself, or `209 openat calls on /dev/shm/torch_*
/// returned ENOSPC (the last 4.73 s after the first)`.
fn run_line(run: &FailureRun<'_>) -> String {
    match (&run.first.kind, run.count) {
        (_, 1) => run.first.headline(),
        (FailureKind::Call { syscall, errno, .. }, n) => format!(
            "{n} {syscall} calls{} returned {errno} ({})",
            run.pattern
                .as_ref()
                .map(|p| format!(" on {p}"))
                .unwrap_or_default(),
            spread(run)
        ),
        (FailureKind::Fault { signal, .. }, n) => format!(
            "{n} {signal} faults{} ({})",
            run.pattern
                .as_ref()
                .map(|p| format!(" in {p}"))
                .unwrap_or_default(),
            spread(run)
        ),
        _ => run.first.headline(),
    }
}

fn spread(run: &FailureRun<'_>) -> String {
    let seconds = run.last_ts_ns.saturating_sub(run.first.ts_ns) as f64 / 1e9;
    format!("the last {seconds:.2} s after the first")
}

/// The failures as JSON: one entry per run of like ones, the first of them with `count`,
/// `last_ts_ns` and `pattern` when there are several.
fn failures_json(d: &Diagnosis) -> Value {
    runs(&d.failures)
        .into_iter()
        .map(|run| {
            let mut value = serde_json::to_value(run.first).unwrap_or(Value::Null);
            if run.count > 1
                && let Value::Object(map) = &mut value
            {
                map.insert("count".to_owned(), json!(run.count));
                map.insert("last_ts_ns".to_owned(), json!(run.last_ts_ns));
                map.insert("pattern".to_owned(), json!(run.pattern));
            }
            value
        })
        .collect()
}

fn headline(d: &Diagnosis) -> String {
    let role = if d.role.kind == RoleKind::Other {
        String::new()
    } else {
        format!(", {}", d.role.describe())
    };
    let ending = match d.ending {
        Some(ExitStatus::Code(code)) => format!(", exited with status {code}"),
        Some(ExitStatus::Signal { signo, .. }) => {
            format!(", killed by {}", names::signal_name(signo))
        }
        None => ", still running".to_owned(),
    };
    let pids = match d.container_pid {
        Some(inside) => format!("pid {}, pid {inside} in its container", d.pid),
        None => format!("pid {}", d.pid),
    };
    let role = match (d.program, &d.program_role) {
        (Some(program), Some(part)) => format!(", {} {part}", program.program),
        _ => role,
    };
    format!("{} ({pids}){role}{ending}", d.comm)
}

/// The block as text lines, the title first.
pub fn text(d: &Diagnosis) -> Vec<String> {
    let mut text = vec![TITLE.to_owned()];
    for (label, line) in lines(d) {
        if label.is_empty() && text.len() == 1 {
            text.push(line);
        } else {
            text.push(format!("  {label:<9} {line}"));
        }
    }
    text
}

pub fn json(d: &Diagnosis, clock: &Clock) -> Value {
    let ending = match d.ending {
        Some(ExitStatus::Code(code)) => json!({"exit_code": code}),
        Some(ExitStatus::Signal { signo, core_dumped }) => {
            json!({"signal": names::signal_name(signo), "core_dumped": core_dumped})
        }
        None => Value::Null,
    };
    json!({
        "v": SCHEMA_VERSION,
        "event": "diagnosis",
        "ts": clock.rfc3339(d.ts_ns),
        "pid": d.pid,
        "container_pid": d.container_pid,
        "comm": d.comm,
        "title": d.title,
        "program": d.program.map(|k| k.program),
        "program_role": d.program_role,
        "role": d.role.kind,
        "worker_index": d.role.worker_index,
        "trainer_pid": d.trainer.as_ref().map(|(pid, _)| pid),
        "trainer_argv": d.trainer.as_ref().map(|(_, argv)| argv),
        "place": d.place,
        "container": d.container,
        "ending": ending,
        "cause": d.cause,
        "shm_is_the_cause": d.cause == Cause::ShmFull,
        "failures": failures_json(d),
        "follows_pid": d.follows,
        "shm": d.capacity.map(|c| json!({"size": c.size, "used": c.used})),
        "demand": d.usage.as_ref().map(|u| json!({
            "bytes": u.demand,
            "objects": u.objects,
            "workers_allocating": d.workers_allocating,
        })),
        "recommendation": d.recommendation,
        "files": d.files,
        "removed": d.removed,
        "explanation": d.explanation,
        "leftovers": d.leftovers.as_ref().map(|l| json!({
            "files": l.files,
            "bytes": l.bytes,
            "enough_without_them": l.enough_without,
            "remove": l.remove,
            "avoid": l.avoid,
        })),
        "others": d.others.as_ref().map(super::others::json),
        "program_alternatives": d.program_alternatives,
        "lost_events": d.lost_events,
        "text": text(d),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::Role;

    /// A process that failed only because its child (or worker) did, as the diagnoser marks it.
    fn follower(kind: RoleKind) -> Diagnosis {
        Diagnosis {
            ts_ns: 0,
            pid: 200,
            container_pid: None,
            comm: "python3".to_owned(),
            title: None,
            program: None,
            program_role: None,
            role: Role {
                kind,
                worker_index: None,
                trainer: None,
            },
            argv: vec!["/usr/bin/python3".to_owned(), "writers.py".to_owned()],
            trainer: None,
            place: "host".to_owned(),
            container: None,
            ending: Some(ExitStatus::Code(1)),
            cause: Cause::ShmFull,
            failures: Vec::new(),
            follows: Some(201),
            capacity: None,
            usage: None,
            workers_allocating: 0,
            recommendation: None,
            files: None,
            removed: None,
            explanation: None,
            leftovers: None,
            others: None,
            program_alternatives: Vec::new(),
            lost_events: 0,
        }
    }

    #[test]
    fn a_follower_points_at_the_child_that_failed_first() {
        let text = text(&follower(RoleKind::PythonMultiprocessing)).join("\n");
        assert!(text.contains("its child pid 201 failed first"), "{text}");
    }

    #[test]
    fn a_trainer_points_at_its_worker_that_failed_first() {
        let text = text(&follower(RoleKind::Trainer)).join("\n");
        assert!(
            text.contains("its DataLoader worker pid 201 failed first"),
            "{text}"
        );
    }
}
