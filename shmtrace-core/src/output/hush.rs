//! What the text stream leaves out unless asked (`--show-all`): POSIX semaphore traffic
//! (`/dev/shm/sem.*`, a page each, dozens per Python process), and processes that touched no
//! /dev/shm object, failed nothing and started none that did (a shell's `sleep`, the `gcc`
//! and `ld` that Python's `ctypes.util.find_library` runs). Each becomes one line of the
//! summary instead.
//!
//! Whether a process matters is known only later, at its first /dev/shm call or failure, so
//! its lifecycle lines (its fork, exec, renames) wait until then: they are shown, with their
//! own times, just before the line that made it matter, together with those of its
//! ancestors. A process that ends without mattering takes its lines with it.
use std::{borrow::Cow, collections::BTreeMap};

use super::human::{Line, Severity};
use crate::{
    diagnose::known::is_posix_semaphore,
    event::{Body, Event},
    model::{Annotation, FastMap, FastSet, World},
    units::count,
};

/// Lines kept per process while it does not matter yet: its fork, exec and a few renames.
const HELD_PER_PROCESS: usize = 16;
/// Distinct program names counted for the summary line.
const NAMES_COUNTED: usize = 64;
/// Ancestors looked at when a process comes to matter (pids can be reused: no endless loop).
const MAX_ANCESTORS: usize = 64;

/// A line and the place shown beside it.
pub type Placed = (Line, String);

#[derive(Default)]
pub struct Hush {
    /// Show everything (`--show-all`).
    off: bool,
    /// Processes that matter: their lines go out at once.
    shown: FastSet<u32>,
    /// Lines of processes that do not matter yet, oldest first, with their times.
    held: FastMap<u32, Vec<(u64, Placed)>>,
    semaphore_events: u64,
    semaphores: FastSet<String>,
    semaphore_processes: FastSet<u32>,
    hidden_processes: u64,
    hidden_names: BTreeMap<String, u64>,
}

impl Hush {
    /// Everything is shown, as it happens.
    pub fn off() -> Hush {
        Hush {
            off: true,
            ..Hush::default()
        }
    }

    /// `note` as the event's line shows it: without the semaphores it freed, left out like the
    /// rest of their traffic (Python unlinks its semaphores at once, so a process's exit
    /// frees them).
    pub fn visible<'a>(&self, note: &'a Annotation) -> Cow<'a, Annotation> {
        if self.off || !note.freed.iter().any(|path| is_posix_semaphore(path)) {
            return Cow::Borrowed(note);
        }
        let mut visible = note.clone();
        visible.freed.retain(|path| !is_posix_semaphore(path));
        Cow::Owned(visible)
    }

    /// The lines to print now for `line`, the line of `event`: none, or the lines held for
    /// the process it is about and its ancestors, then it.
    pub fn admit(
        &mut self,
        event: &Event,
        note: &Annotation,
        line: Line,
        place: &str,
        world: &World,
    ) -> Vec<Placed> {
        if self.off {
            return vec![(line, place.to_owned())];
        }
        if let Some(name) = semaphore_of(event, note)
            && line.severity != Severity::Failure
        {
            self.semaphore_events += 1;
            if self.semaphores.len() < 100_000 {
                self.semaphores.insert(name);
            }
            self.semaphore_processes.insert(event.pid);
            return Vec::new();
        }
        let subject = subject(event);
        // A role (a DataLoader worker, known from its rename) matters too; a fork's line
        // carries the parent's role, not the child's.
        let matters = matches!(event.body, Body::Call(_) | Body::Oom { .. })
            || matches!(line.severity, Severity::Failure | Severity::Death)
            || (!matches!(event.body, Body::Fork { .. }) && !line.role.is_empty());
        let exit = matches!(event.body, Body::Exit(_));
        if matters && !self.shown.contains(&subject) {
            let mut out = self.reveal(subject, world);
            out.push((line, place.to_owned()));
            if exit {
                self.shown.remove(&subject);
            }
            return out;
        }
        if self.shown.contains(&subject) {
            if exit {
                self.shown.remove(&subject);
            }
            return vec![(line, place.to_owned())];
        }
        if exit {
            // It ends without having mattered: its lines go with it.
            self.held.remove(&subject);
            self.hidden_processes += 1;
            let name = &line.comm;
            if let Some(n) = self.hidden_names.get_mut(name) {
                *n += 1;
            } else if self.hidden_names.len() < NAMES_COUNTED {
                self.hidden_names.insert(name.clone(), 1);
            }
            return Vec::new();
        }
        let held = self.held.entry(subject).or_default();
        if held.len() < HELD_PER_PROCESS {
            held.push((event.ts_ns, (line, place.to_owned())));
        }
        Vec::new()
    }

    /// `pid` and its ancestors matter from now on: their held lines, in time order.
    fn reveal(&mut self, pid: u32, world: &World) -> Vec<Placed> {
        let mut out: Vec<(u64, Placed)> = Vec::new();
        let mut next = Some(pid);
        for _ in 0..MAX_ANCESTORS {
            let Some(pid) = next else { break };
            if !self.shown.insert(pid) {
                break; // the rest of the line was revealed before
            }
            out.extend(self.held.remove(&pid).unwrap_or_default());
            next = world.process(pid).and_then(|p| p.parent);
        }
        // Stable: a process's own lines keep their order when two share a time.
        out.sort_by_key(|(ts, _)| *ts);
        out.into_iter().map(|(_, placed)| placed).collect()
    }

    /// The summary's lines about what was left out: one for semaphores, one for processes.
    pub fn summary_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.semaphore_events > 0 {
            lines.push(format!(
                "shmtrace: not shown: {} on {} (/dev/shm/sem.*, a page each) of {}; \
                 --show-all shows them",
                count(self.semaphore_events, "event"),
                count(self.semaphores.len() as u64, "POSIX semaphore"),
                count(self.semaphore_processes.len() as u64, "process"),
            ));
        }
        if self.hidden_processes > 0 {
            let mut names: Vec<(&String, &u64)> = self.hidden_names.iter().collect();
            names.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
            let names: Vec<String> = names
                .iter()
                .take(6)
                .map(|(name, n)| match n {
                    1 => (*name).clone(),
                    n => format!("{n} {name}"),
                })
                .collect();
            let more = if self.hidden_names.len() > 6 {
                ", ..."
            } else {
                ""
            };
            lines.push(format!(
                "shmtrace: not shown: {} that touched no /dev/shm object, failed nothing and \
                 started none that did ({}{more}); --show-all shows them",
                count(self.hidden_processes, "process"),
                names.join(", ")
            ));
        }
        lines
    }
}

/// The process a line is about: a fork's child, a signal's receiver.
fn subject(event: &Event) -> u32 {
    match &event.body {
        Body::Fork { child_pid } => *child_pid,
        Body::Signal(signal) => signal.target_pid,
        Body::Rename { pid, .. } => *pid,
        Body::Oom { victim_pid } => *victim_pid,
        Body::Call(_) | Body::Exec(_) | Body::Exit(_) => event.pid,
    }
}

/// The semaphore a call acts on, if it acts on one.
fn semaphore_of(event: &Event, note: &Annotation) -> Option<String> {
    let Body::Call(call) = &event.body else {
        return None;
    };
    let path = note.object_path.as_deref().or(call.path.as_deref())?;
    is_posix_semaphore(path).then(|| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        clock::Clock,
        diagnose::Role,
        event::{Call, Exec, ExitStatus, FileRef, InodeId, Syscall},
        output::human,
    };

    fn event(ts_ns: u64, pid: u32, comm: &str, body: Body) -> Event {
        Event {
            ts_ns,
            cpu: 0,
            pid,
            tid: pid,
            comm: comm.to_owned(),
            mntns: 1,
            cgroup_id: 1,
            container_match: false,
            body,
        }
    }

    fn openat(path: &str, ino: u64) -> Body {
        Body::Call(Call {
            syscall: Syscall::Openat,
            fd: Some(3),
            ret: 3,
            args: [
                libc::AT_FDCWD as u64,
                0,
                (libc::O_CREAT | libc::O_RDWR | libc::O_CLOEXEC) as u64,
                0o600,
                0,
                0,
            ],
            file: Some(FileRef {
                inode: InodeId { dev: 47, ino },
                mode: libc::S_IFREG | 0o600,
                size: 0,
                allocated: 0,
            }),
            path: Some(path.to_owned()),
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        })
    }

    fn unlink(path: &str) -> Body {
        Body::Call(Call::unlink(path))
    }

    fn exec(path: &str) -> Body {
        Body::Exec(Exec {
            filename: path.to_owned(),
            argv: vec![path.to_owned()],
            argv_truncated: false,
        })
    }

    fn exit(code: i32) -> Body {
        Body::Exit(ExitStatus::Code(code).into())
    }

    /// Runs the events through a world and `hush`: the texts of the lines printed.
    fn shown(hush: &mut Hush, events: &[Event]) -> Vec<String> {
        let clock = Clock::with_offset(0, jiff::tz::TimeZone::UTC);
        let mut world = World::new();
        let mut out = Vec::new();
        for event in events {
            let note = world.apply(event);
            let Some(line) = human::format(event, &hush.visible(&note), &Role::OTHER, &clock)
            else {
                continue;
            };
            for (line, _) in hush.admit(event, &note, line, "host", &world) {
                out.push(format!("{} {}", line.pid, line.text));
            }
        }
        out
    }

    fn trace() -> Vec<Event> {
        vec![
            event(1, 10, "sh", exec("/bin/sh")),
            // A shell's sleep, and a compiler probe that fails on its own: neither matters.
            event(2, 10, "sh", Body::Fork { child_pid: 11 }),
            event(3, 11, "sleep", exec("/bin/sleep")),
            event(4, 11, "sleep", exit(0)),
            event(5, 10, "sh", Body::Fork { child_pid: 12 }),
            event(6, 12, "python", exec("/usr/bin/python")),
            event(7, 12, "python", openat("/dev/shm/sem.mp-1", 1)),
            event(8, 12, "python", Body::Fork { child_pid: 13 }),
            event(9, 13, "gcc", exec("/usr/bin/gcc")),
            event(10, 13, "gcc", exit(1)),
            event(11, 12, "python", Body::Fork { child_pid: 14 }),
            // The worker's first /dev/shm object: it, its parent and the shell matter.
            event(12, 14, "python", openat("/dev/shm/torch_1", 2)),
            event(13, 14, "python", exit(0)),
            event(14, 12, "python", exit(1)),
        ]
    }

    #[test]
    fn lines_of_a_process_wait_until_it_matters_and_bring_its_ancestors() {
        let mut hush = Hush::default();
        let shown = shown(&mut hush, &trace());
        let pids: Vec<&str> = shown.iter().map(|l| l.split(' ').next().unwrap()).collect();
        // sh's exec, its fork of python, python's exec and fork of the worker, the worker's
        // open and exit, python's exit; nothing of sleep, gcc or the semaphore.
        assert_eq!(
            pids,
            ["10", "10", "12", "12", "14", "14", "12"],
            "{shown:#?}"
        );
        assert!(shown[4].contains("/dev/shm/torch_1"), "{shown:#?}");
        assert!(
            !shown
                .iter()
                .any(|l| l.contains("sem.") || l.contains("gcc"))
        );
        let summary = hush.summary_lines().join("\n");
        assert!(
            summary.contains("1 event on 1 POSIX semaphore") && summary.contains("of 1 process;"),
            "{summary}"
        );
        assert!(
            summary.contains("2 processes that touched no /dev/shm object"),
            "{summary}"
        );
        assert!(summary.contains("(gcc, sleep)"), "{summary}");
    }

    /// CI, stop 42: the trainer's exit line named the semaphores its exit freed, though the
    /// stream leaves semaphores out.
    #[test]
    fn an_exit_line_names_the_files_it_freed_but_not_the_semaphores() {
        let trace = [
            event(1, 20, "python", openat("/dev/shm/sem.mp-1", 1)),
            event(2, 20, "python", unlink("/dev/shm/sem.mp-1")),
            event(3, 20, "python", {
                let mut torch = openat("/dev/shm/torch_1", 2);
                if let Body::Call(call) = &mut torch {
                    (call.fd, call.ret) = (Some(4), 4);
                }
                torch
            }),
            event(4, 20, "python", unlink("/dev/shm/torch_1")),
            event(5, 20, "python", exit(1)),
        ];
        let exit_line = |hush: &mut Hush| {
            let shown = shown(hush, &trace);
            shown
                .into_iter()
                .find(|l| l.contains("+++ exited"))
                .unwrap_or_else(|| panic!("no exit line"))
        };
        let hushed = exit_line(&mut Hush::default());
        assert!(hushed.contains("[freed /dev/shm/torch_1]"), "{hushed}");
        assert!(!hushed.contains("sem."), "{hushed}");
        let everything = exit_line(&mut Hush::off());
        assert!(
            everything.contains("[freed /dev/shm/sem.mp-1]")
                && everything.contains("[freed /dev/shm/torch_1]"),
            "{everything}"
        );
    }

    #[test]
    fn show_all_shows_everything_as_it_comes() {
        let mut hush = Hush::off();
        let shown = shown(&mut hush, &trace());
        assert_eq!(shown.len(), trace().len(), "{shown:#?}");
        assert!(hush.summary_lines().is_empty());
    }

    #[test]
    fn a_failed_semaphore_is_shown() {
        let mut hush = Hush::default();
        let mut failing = openat("/dev/shm/sem.x", 1);
        if let Body::Call(call) = &mut failing {
            call.ret = -i64::from(libc::ENOSPC);
            call.file = None;
        }
        let shown = shown(&mut hush, &[event(1, 20, "python", failing)]);
        assert_eq!(shown.len(), 1, "{shown:#?}");
        assert!(shown[0].contains("ENOSPC"), "{shown:#?}");
    }
}
