//! The pipeline's view, turned into counts: what the pipeline learns (events as the model
//! annotated them, measurements, diagnoses) goes to the fleet, for the container the daemon
//! placed the record in before the pipeline took it (`Fleet::place`).
use std::{cell::RefCell, rc::Rc};

use anyhow::Result;

use shmtrace_common::TallyKey;

use super::{
    fleet::Fleet,
    metrics::Metrics,
    series::Countable,
    unseen::Unseen,
    whose::{ContainerRef, Found, Owner},
};
use shmtrace_core::{
    capacity::Capacity,
    diagnose::{Cause, Diagnosis, FailureKind, Role, Roles},
    event::{Body, Event, names},
    model::{Annotation, ContainerInfo, World},
    pipeline::Observer,
};

pub struct FleetObserver {
    pub fleet: Rc<RefCell<Fleet>>,
    pub metrics: Metrics,
    /// The records of what the kernel counts, for the figures to add what never came.
    pub unseen: Rc<RefCell<Unseen>>,
    /// Whose the record in the pipeline now is, as the daemon placed it.
    pub placed: Rc<RefCell<Option<Found>>>,
}

impl Observer for FleetObserver {
    fn event(&mut self, event: &Event, note: &Annotation, role: &Role, _: &str, world: &World) {
        self.metrics.events.inc();
        if let Some(key) = tally_key(event) {
            self.unseen.borrow_mut().saw(key);
        }
        let placed = self.placed.borrow();
        let mut fleet = self.fleet.borrow_mut();
        if let Some(found) = placed.as_ref() {
            for tally in tallies(event, note, role) {
                fleet.count(found, event.ts_ns, tally);
            }
        }
        // Counted where the remover ran: another container, the host's clean-up.
        if let (Some(removal), Body::Call(call)) = (&note.name_removed, &event.body)
            && call.syscall.opens_a_path()
        {
            fleet.count_for(
                removal.remover,
                removal.remover_mntns,
                removal.ts_ns,
                Countable::NameRemoved,
            );
        }
        if let Body::Exit(_) = event.body {
            fleet.process_exited(event.pid);
            // A sandbox's /dev/shm goes with its namespace, which no runtime says ended.
            if let Some(found) = placed.as_ref()
                && !world.any_alive_in(event.mntns)
            {
                fleet.last_exit_in(event.mntns, found);
            }
        }
    }

    fn seeded(&mut self, _: u32, _: u64, _: &World) {}

    fn capacity(&mut self, sample: &Capacity) {
        // Measured at a failure: the fullest it is likely to be seen.
        self.fleet.borrow_mut().measured(sample);
    }

    fn container(&mut self, _: &ContainerInfo) {}

    fn diagnosis(&mut self, diagnosis: &Diagnosis) {
        // Deaths are counted from the exits the probes judged (`tallies`), which stay exact
        // when records are lost; a diagnosis brings the advice, and how full its /dev/shm was
        // at the failure (at least what the traced objects held): the measurement at the
        // failure came before the container had series, or read nothing, the processes having
        // freed it all, as a survey may.
        let tallies = [
            diagnosis
                .recommendation
                .as_ref()
                .map(|r| Countable::Recommended(r.min_bytes)),
            full_at(diagnosis).map(Countable::FullAt),
        ];
        let mut fleet = self.fleet.borrow_mut();
        // Its process, as it was placed; else the container the pipeline named its place
        // after (told in the order of the records, so the one it ran in).
        let found = fleet.of_process(diagnosis.pid).or_else(|| {
            let container = diagnosis.container.as_ref()?;
            Some(Found::Owner(Owner::Container(ContainerRef::of_info(
                container,
            ))))
        });
        let Some(found) = found else {
            log::debug!("the advice for pid {} is nobody's", diagnosis.pid);
            return;
        };
        for tally in tallies.into_iter().flatten() {
            fleet.count(&found, diagnosis.ts_ns, tally);
        }
    }

    fn finish(self: Box<Self>, _: &World, _: &Roles, _: u64, _: u64) -> Result<Option<String>> {
        Ok(None)
    }
}

/// How full the /dev/shm of a diagnosis's failure was: as measured then (the diagnosis
/// counts what the traced objects held at least), or, unmeasured, what the traced objects held
/// when a call found it full (its size then unknown: 0).
fn full_at(diagnosis: &Diagnosis) -> Option<Capacity> {
    if diagnosis.cause != Cause::ShmFull {
        return None;
    }
    let failure = diagnosis.failures.first()?;
    let capacity = diagnosis.capacity.or_else(|| {
        matches!(failure.kind, FailureKind::Call { .. }).then_some(Capacity {
            dev: failure.dev?,
            size: 0,
            used: failure.held,
            ts_ns: failure.ts_ns,
            files: None,
        })
    })?;
    (capacity.used > 0).then_some(capacity)
}

/// What one event counts.
fn tallies(event: &Event, note: &Annotation, role: &Role) -> Vec<Countable> {
    match &event.body {
        Body::Exit(exit) if exit.shm_death => vec![
            Countable::Touch,
            Countable::Death {
                role: role_name(role),
                count: 1,
            },
        ],
        Body::Call(call) if call.failed() => vec![
            Countable::Touch,
            Countable::Failure {
                syscall: call.syscall.name().to_owned(),
                errno: call
                    .errno()
                    .map(names::errno_name)
                    .unwrap_or_else(|| "MSG_CTRUNC".to_owned()),
                count: 1,
            },
        ],
        // Using /dev/shm: an object made, sized, mapped or removed. Opening or closing the
        // directory itself is not (the runtime does it as it sets a container up; `ls` does).
        Body::Call(call)
            if !note.irrelevant
                && !is_directory(call)
                && note.object_path.as_deref().is_some_and(is_object) =>
        {
            vec![Countable::Touch]
        }
        Body::Signal(signal) if counted_sigbus(signal) => {
            vec![Countable::Touch, Countable::Sigbus { count: 1 }]
        }
        _ => Vec::new(),
    }
}

/// A SIGBUS the kernel raised for an access the file could not back, in a process that had
/// mapped /dev/shm: what `shmtrace_sigbus_total` counts, and the kernel with it, so that one
/// whose record was lost is counted as well. Judged by the probes, not by the analysis,
/// which may not know the mapping when its record was lost too.
fn counted_sigbus(signal: &shmtrace_core::event::Signal) -> bool {
    const BUS_ADRERR: i32 = 2;
    signal.signo == libc::SIGBUS && signal.code == BUS_ADRERR && signal.target_maps_shm
}

/// What the kernel counted this record as (`shmtrace_ebpf::tally`): a failed call by its
/// errno (0 for descriptors dropped), a SIGBUS as [`counted_sigbus`] says, a death as the
/// exit's `shm_death` says.
fn tally_key(event: &Event) -> Option<TallyKey> {
    let (what, errno) = match &event.body {
        Body::Call(call) if call.failed() => (call.syscall as u16, (-call.ret).max(0) as u16),
        Body::Signal(signal) if counted_sigbus(signal) => (TallyKey::SIGBUS, 0),
        Body::Exit(exit) if exit.shm_death => (TallyKey::DEATH, 0),
        _ => return None,
    };
    Some(TallyKey {
        mntns: event.mntns,
        what,
        errno,
    })
}

/// The call acted on a directory (the close of `ls`'s descriptor of /dev/shm shows no path).
fn is_directory(call: &shmtrace_core::event::Call) -> bool {
    call.file
        .is_some_and(|file| file.mode & libc::S_IFMT == libc::S_IFDIR)
}

/// A path of an object in /dev/shm, not the directory (System V segments have their own names).
fn is_object(path: &str) -> bool {
    !matches!(path.trim_end_matches('/'), "/dev/shm" | "")
}

fn role_name(role: &Role) -> String {
    serde_json::to_value(role.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "other".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shmtrace_core::event::{Call, FileRef, InodeId, Syscall};

    /// `close(3)` of a descriptor of `mode`, as the model annotates a file it never saw
    /// opened.
    fn close(mode: u32) -> (Event, Annotation) {
        let call = Call {
            syscall: Syscall::Close,
            fd: Some(3),
            ret: 0,
            args: [3, 0, 0, 0, 0, 0],
            file: Some(FileRef {
                inode: InodeId { dev: 27, ino: 1 },
                mode,
                size: 80,
                allocated: 0,
            }),
            path: None,
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        };
        let event = Event {
            ts_ns: 1,
            cpu: 0,
            pid: 2,
            tid: 2,
            comm: "ls".into(),
            mntns: 3,
            cgroup_id: 1,
            container_match: false,
            body: Body::Call(call),
        };
        let note = Annotation {
            object_path: Some("<inode 1 on 0:27>".into()),
            ..Annotation::default()
        };
        (event, note)
    }

    #[test]
    fn closing_the_dev_shm_directory_is_no_use_of_it_and_closing_a_file_is() {
        let (event, note) = close(libc::S_IFDIR | 0o1777);
        assert_eq!(tallies(&event, &note, &Role::OTHER), Vec::new());
        let (event, note) = close(libc::S_IFREG | 0o600);
        assert_eq!(tallies(&event, &note, &Role::OTHER), vec![Countable::Touch]);
    }

    #[test]
    fn an_exit_counts_as_a_death_as_the_probes_judged_it_and_by_the_role_it_had() {
        let (mut event, note) = close(libc::S_IFREG | 0o600);
        let worker = Role {
            kind: shmtrace_core::diagnose::RoleKind::DataloaderWorker,
            worker_index: Some(0),
            trainer: Some(1),
        };
        let status = shmtrace_core::event::ExitStatus::Signal {
            signo: libc::SIGBUS,
            core_dumped: false,
        };
        event.body = Body::Exit(status.into());
        assert_eq!(tallies(&event, &note, &worker), Vec::new());
        assert_eq!(tally_key(&event), None);
        event.body = Body::Exit(shmtrace_core::event::Exit {
            status,
            shm_death: true,
        });
        assert_eq!(
            tallies(&event, &note, &worker),
            vec![
                Countable::Touch,
                Countable::Death {
                    role: "dataloader_worker".into(),
                    count: 1
                }
            ]
        );
        assert_eq!(
            tally_key(&event),
            Some(TallyKey {
                mntns: 3,
                what: TallyKey::DEATH,
                errno: 0
            })
        );
    }
}
