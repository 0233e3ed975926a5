//! A diagnosis, for people (a block of aligned lines) and for programs (one JSON record).
use serde_json::{Value, json};

use super::json::SCHEMA_VERSION;
use crate::{
    clock::Clock,
    diagnose::{Cause, Diagnosis, FailureKind, FailureRun, RoleKind, runs},
    event::{ExitStatus, names},
    model::ContainerInfo,
    units::{count, human},
};

pub const TITLE: &str = "━━━ shmtrace diagnosis ━━━";
/// Characters of a process title the block shows.
const TITLE_SHOWN: usize = 200;
/// Failures (or processes, in a block of several) listed; the rest are counted.
const MAX_FAILURES: usize = 10;

/// The block's lines after the title, as `(label, text)`; an empty label continues the line
/// above.
pub fn lines(d: &Diagnosis) -> Vec<(&'static str, String)> {
    block_lines(&[d])
}

/// The lines of one block: one diagnosis, or several that tell the same story
/// ([`super::group::same_story`]), the one whose failure came first leading. What the block
/// says beyond who and what failed is the leader's.
pub fn block_lines(block: &[&Diagnosis]) -> Vec<(&'static str, String)> {
    let d = block[0];
    let mut out = Vec::new();
    let mut add = |label: &'static str, text: String| out.push((label, text));
    if block.len() == 1 {
        add("", headline(d));
    } else {
        add("", group_headline(block));
    }
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
    if let Some(why) = exit_zero(d) {
        add("status 0", why.to_owned());
    }
    if block.len() == 1 {
        for run in runs(&d.failures) {
            add("failed", run_line(&run));
            if run.count > 1 {
                add("", format!("the first: {}", run.first.headline()));
            }
        }
    } else {
        for (i, member) in block.iter().enumerate().take(MAX_FAILURES) {
            let Some(first) = member.failures.first() else {
                continue;
            };
            let tag = member.role.tag();
            let who = match (tag.is_empty(), i) {
                (true, 0) => format!("pid {}, first", member.pid),
                (true, _) => format!("pid {}", member.pid),
                (false, 0) => format!("pid {}, {tag}, first", member.pid),
                (false, _) => format!("pid {}, {tag}", member.pid),
            };
            let more = match member.failures.len() {
                1 => String::new(),
                2 => ", and 1 more failure".to_owned(),
                n => format!(", and {} more failures", n - 1),
            };
            add(
                if i == 0 { "failed" } else { "" },
                format!("{who}: {}{more}", first.headline()),
            );
        }
        if block.len() > MAX_FAILURES {
            add(
                "",
                format!(
                    "... and {} more",
                    count((block.len() - MAX_FAILURES) as u64, "process")
                ),
            );
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
        add("/dev/shm", arithmetic(d, capacity));
    }
    if let Some(usage) = &d.usage {
        // Pages, counting a mapped object by its size: no more than the /dev/shm holds.
        let held = d.failures.first().map_or(usage.allocated, |f| f.held);
        let held = d.capacity.map_or(held, |c| held.min(c.size));
        let mut text = format!(
            "{} held in pages, {} by their sizes, by {} of traced processes",
            human(held),
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
        for (label, text) in super::untraced_section::lines(others) {
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
    let pids = match d.container_pid {
        Some(inside) => format!("pid {}, pid {inside} in its container", d.pid),
        None => format!("pid {}", d.pid),
    };
    let role = match (d.program, &d.program_role) {
        (Some(program), Some(part)) => format!(", {} {part}", program.program),
        _ => role,
    };
    format!("{} ({pids}){role}, {}", d.comm, ending(d.ending))
}

/// `exited with status 1`, `killed by SIGBUS`, `still running`.
fn ending(ending: Option<ExitStatus>) -> String {
    match ending {
        Some(ExitStatus::Code(code)) => format!("exited with status {code}"),
        Some(ExitStatus::Signal { signo, .. }) => {
            format!("killed by {}", names::signal_name(signo))
        }
        None => "still running".to_owned(),
    }
}

/// The head of a block of several processes: who they are, what they each did, how they
/// ended. `DataLoader workers 0-3 of trainer pid 23593 (pt_data_worker, pids ...), each
/// failed to fallocate 46.0 MiB (ENOSPC) and exited with status 0`.
fn group_headline(block: &[&Diagnosis]) -> String {
    let d = block[0];
    let mut pids: Vec<u32> = block.iter().map(|m| m.pid).collect();
    pids.sort_unstable();
    let mut inside: Vec<u32> = block.iter().filter_map(|m| m.container_pid).collect();
    inside.sort_unstable();
    let inside = if inside.len() == block.len() {
        format!("; {} in their container", list(&inside))
    } else {
        String::new()
    };
    let comm = if block.iter().all(|m| m.comm == d.comm) {
        format!("{}, ", d.comm)
    } else {
        String::new()
    };
    let who = match (d.role.kind, d.role.trainer, d.program, &d.program_role) {
        (RoleKind::DataloaderWorker, Some(trainer), _, _) => {
            let mut indices: Vec<u32> = block.iter().filter_map(|m| m.role.worker_index).collect();
            indices.sort_unstable();
            if indices.len() == block.len() {
                format!(
                    "DataLoader workers {} of trainer pid {trainer}",
                    list(&indices)
                )
            } else {
                format!(
                    "{} DataLoader workers of trainer pid {trainer}",
                    block.len()
                )
            }
        }
        (_, _, Some(program), Some(part)) => {
            format!("{} processes, each {} {part}", block.len(), program.program)
        }
        (RoleKind::Other, ..) => format!("{} processes", block.len()),
        (kind, ..) => format!("{} processes, each {}", block.len(), kind.describe()),
    };
    let what = d
        .failures
        .first()
        .map(|f| match &f.kind {
            FailureKind::Call {
                syscall,
                errno,
                request,
                ..
            } if *request > 0 => {
                let sizes: Vec<u64> = block
                    .iter()
                    .filter_map(|m| match m.failures.first().map(|f| &f.kind) {
                        Some(FailureKind::Call { request, .. }) => Some(*request),
                        _ => None,
                    })
                    .collect();
                let (low, high) = (
                    sizes.iter().min().copied().unwrap_or(*request),
                    sizes.iter().max().copied().unwrap_or(*request),
                );
                let size = if low == high {
                    human(low)
                } else {
                    format!("{} to {}", human(low), human(high))
                };
                format!("each failed to {syscall} {size} ({errno}) and ")
            }
            FailureKind::Call { syscall, errno, .. } => {
                format!("each failed in {syscall} ({errno}) and ")
            }
            FailureKind::Fault { signal, .. } => format!("each took a {signal} and "),
            FailureKind::OomKill | FailureKind::SpaceCheck { .. } => "each ".to_owned(),
        })
        .unwrap_or_default();
    format!(
        "{who} ({comm}pids {}{inside}), {what}{}",
        list(&pids),
        ending(d.ending)
    )
}

/// `0-3`, or `1, 4, 7`.
fn list(numbers: &[u32]) -> String {
    let consecutive = numbers.windows(2).all(|w| w[1] == w[0] + 1);
    match numbers {
        [] => String::new(),
        [one] => one.to_string(),
        [first, .., last] if consecutive && numbers.len() > 2 => format!("{first}-{last}"),
        _ => numbers
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// What exit status 0 means after a failure, which the headline alone would read as success.
fn exit_zero(d: &Diagnosis) -> Option<&'static str> {
    if d.ending != Some(ExitStatus::Code(0)) || d.failures.is_empty() {
        return None;
    }
    Some(if d.role.kind == RoleKind::DataloaderWorker {
        "not a success: PyTorch's DataLoader workers send the error to the trainer, which \
         raises it, and then exit with status 0"
    } else {
        "the failure did not end it: it exited normally afterwards (it may have given up on \
         the work, or gone on without what it asked for)"
    })
}

/// The arithmetic of the failure: what the call asked, what was free of how much, who else
/// asked at once. A failure whose request would have fitted in what was measured free is
/// explained by the others asking at the same moment, or by the measurement coming after.
fn arithmetic(d: &Diagnosis, capacity: crate::capacity::Capacity) -> String {
    let free = capacity.size.saturating_sub(capacity.used);
    let asked = d.failures.first().and_then(|f| match &f.kind {
        FailureKind::Call {
            syscall,
            errno,
            request,
            ..
        } if *request > 0
            && errno == "ENOSPC"
            && matches!(d.cause, Cause::ShmFull | Cause::Leftovers) =>
        {
            Some((*syscall, *request))
        }
        _ => None,
    });
    let Some((syscall, request)) = asked else {
        let percent = (capacity.used * 100)
            .checked_div(capacity.size)
            .unwrap_or(0);
        return format!(
            "{}, {} used when it failed ({percent}%)",
            human(capacity.size),
            human(capacity.used)
        );
    };
    let mut text = format!(
        "{syscall} asked {}; {} free of {} ({} used, measured just after)",
        human(request),
        human(free),
        human(capacity.size),
        human(capacity.used)
    );
    let burst = d.burst;
    if burst.processes > 1 {
        let who = if d.role.kind == RoleKind::DataloaderWorker {
            "workers"
        } else {
            "processes"
        };
        text.push_str(&format!(
            "; {} {who} asked at once, {} in all",
            burst.processes,
            human(burst.requested.max(request))
        ));
    } else if free >= request {
        text.push_str(
            "; what was free then was taken by others before the call, or freed after it",
        );
    }
    text
}

/// The block as text lines, the title first.
pub fn text(d: &Diagnosis) -> Vec<String> {
    block_text(&[d])
}

/// [`block_lines`] as text lines, the title first.
pub fn block_text(block: &[&Diagnosis]) -> Vec<String> {
    let mut text = vec![TITLE.to_owned()];
    for (label, line) in block_lines(block) {
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
        "asked_at_once": (d.burst.processes > 0).then(|| json!({
            "processes": d.burst.processes,
            "bytes": d.burst.requested,
        })),
        "demand": d.usage.as_ref().map(|u| json!({
            "bytes": u.demand,
            "held_bytes": d.failures.first().map_or(u.allocated, |f| f.held),
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
        "others": d.others.as_ref().map(super::untraced_section::json),
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
            burst: Default::default(),
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

    const MIB: u64 = 1 << 20;

    /// DataLoader worker `index` of trainer 100, which failed to fallocate a 46 MiB batch at
    /// `failed_ns` in a 64 MiB /dev/shm with 18 MiB used, and exited 0 at `ended_ns`.
    fn worker(index: u32, failed_ns: u64, ended_ns: u64) -> Diagnosis {
        let pid = 300 + index;
        let capacity = crate::capacity::Capacity {
            dev: 47,
            size: 64 * MIB,
            used: 18 * MIB,
            ts_ns: failed_ns,
            files: None,
        };
        let failure = crate::diagnose::Failure {
            ts_ns: failed_ns,
            pid,
            tid: pid,
            comm: "pt_data_worker".to_owned(),
            cause: Cause::ShmFull,
            kind: FailureKind::Call {
                syscall: "fallocate",
                errno: "ENOSPC".to_owned(),
                path: Some(format!("/dev/shm/torch_{pid}_0")),
                request: 46 * MIB,
            },
            dev: Some(47),
            usage: None,
            capacity: Some(capacity),
            workers_allocating: 4,
            unmet: 46 * MIB,
            held: 0,
            peers: 0,
            leftovers: Vec::new(),
            others: Vec::new(),
            removal: None,
        };
        Diagnosis {
            ts_ns: ended_ns,
            pid,
            container_pid: Some(80 + index),
            comm: "pt_data_worker".to_owned(),
            role: Role {
                kind: RoleKind::DataloaderWorker,
                worker_index: Some(index),
                trainer: Some(100),
            },
            ending: Some(ExitStatus::Code(0)),
            failures: vec![failure],
            follows: None,
            capacity: Some(capacity),
            burst: crate::diagnose::Burst {
                processes: 4,
                requested: 4 * 46 * MIB,
                unmet: 4 * 46 * MIB,
            },
            ..follower(RoleKind::DataloaderWorker)
        }
    }

    #[test]
    fn workers_that_failed_together_get_one_block_led_by_the_first() {
        let second = 1_000_000_000;
        let all = vec![
            worker(2, 3 * second, 20 * second),
            worker(0, 2 * second, 20 * second + 1000),
            worker(1, 4 * second, 20 * second + 2000),
            worker(3, 5 * second, 20 * second + 3000),
        ];
        let blocks = super::super::group::blocks(&all);
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0][0].pid, 300, "worker 0 failed first");
        let text = block_text(&blocks[0]).join("\n");
        assert!(
            text.contains(
                "DataLoader workers 0-3 of trainer pid 100 (pt_data_worker, pids 300-303; 80-83 \
                 in their container), each failed to fallocate 46.0 MiB (ENOSPC) and exited \
                 with status 0"
            ),
            "{text}"
        );
        assert!(text.contains("status 0  not a success"), "{text}");
        assert!(
            text.contains(
                "/dev/shm  fallocate asked 46.0 MiB; 46.0 MiB free of 64.0 MiB (18.0 MiB used, \
                 measured just after); 4 workers asked at once, 184.0 MiB in all"
            ),
            "{text}"
        );
        assert_eq!(text.matches(TITLE).count(), 1, "{text}");
        // Each still its own in JSON.
        let clock = Clock::with_offset(0, jiff::tz::TimeZone::UTC);
        assert_eq!(json(&all[0], &clock)["pid"], 302);
    }

    #[test]
    fn a_failure_later_or_of_another_kind_is_another_block() {
        let second = 1_000_000_000;
        let mut killed = worker(1, 2 * second, 20 * second);
        killed.ending = Some(ExitStatus::Signal {
            signo: libc::SIGBUS,
            core_dumped: false,
        });
        let all = vec![
            worker(0, 2 * second, 20 * second),
            killed,
            worker(2, 2 * second, 30 * second),
        ];
        let blocks = super::super::group::blocks(&all);
        assert_eq!(blocks.len(), 3);
        // Alone, a worker's exit status 0 is still explained.
        let text = block_text(&blocks[2]).join("\n");
        assert!(
            text.contains("DataLoader worker 2 of trainer pid 100, exited with status 0"),
            "{text}"
        );
        assert!(text.contains("status 0  not a success"), "{text}");
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
