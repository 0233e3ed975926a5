//! The pipeline's view, turned into counts: what the pipeline learns (events as the model
//! annotated them, measurements, diagnoses) goes to the fleet, which knows whose it is.
use std::{cell::RefCell, rc::Rc, time::Instant};

use anyhow::Result;

use super::{
    fleet::{Fleet, Tally},
    metrics::Metrics,
};
use crate::{
    capacity::Capacity,
    diagnose::{Cause, Diagnosis, Role, Roles},
    event::{Body, Event, names},
    model::{Annotation, ContainerInfo, World},
    pipeline::Observer,
};

pub struct FleetObserver {
    pub fleet: Rc<RefCell<Fleet>>,
    pub metrics: Metrics,
}

impl Observer for FleetObserver {
    fn event(&mut self, event: &Event, note: &Annotation, _: &Role, _: &str, _: &World) {
        self.metrics.events.inc();
        let mut fleet = self.fleet.borrow_mut();
        let now = Instant::now();
        fleet.saw_process(event.pid, event.mntns);
        for tally in tallies(event, note) {
            fleet.tally_in(event.mntns, tally, event.ts_ns, now);
        }
        if let Body::Exit(_) = event.body {
            fleet.process_exited(event.pid);
        }
    }

    fn seeded(&mut self, _: u32, _: u64, _: &World) {}

    fn capacity(&mut self, sample: &Capacity) {
        // Measured at a failure: the fullest it is likely to be seen.
        self.fleet.borrow_mut().measured(sample);
    }

    fn container(&mut self, _: &ContainerInfo) {}

    fn diagnosis(&mut self, diagnosis: &Diagnosis) {
        let mut tallies = Vec::new();
        if diagnosis.ending.is_some() && diagnosis.cause == Cause::ShmFull {
            tallies.push(Tally::Death {
                role: role_name(diagnosis),
            });
        }
        if let Some(recommendation) = &diagnosis.recommendation {
            tallies.push(Tally::Recommended(recommendation.min_bytes));
        }
        let mut fleet = self.fleet.borrow_mut();
        for tally in tallies {
            let unplaced = match &diagnosis.container {
                Some(container) => fleet.tally_for_id(&container.id, tally),
                None => Err(tally),
            };
            if let Err(tally) = unplaced {
                match fleet.mntns_of(diagnosis.pid) {
                    Some(mntns) => fleet.tally_in(mntns, tally, diagnosis.ts_ns, Instant::now()),
                    None => log::debug!("diagnosis of pid {} not placed", diagnosis.pid),
                }
            }
        }
    }

    fn finish(self: Box<Self>, _: &World, _: &Roles, _: u64, _: u64) -> Result<Option<String>> {
        Ok(None)
    }
}

/// What one event counts.
fn tallies(event: &Event, note: &Annotation) -> Vec<Tally> {
    match &event.body {
        Body::Call(call) if call.failed() => vec![
            Tally::Touch,
            Tally::Failure {
                syscall: call.syscall.name().to_owned(),
                errno: call
                    .errno()
                    .map(names::errno_name)
                    .unwrap_or_else(|| "MSG_CTRUNC".to_owned()),
            },
        ],
        // Using /dev/shm: an object made, sized, mapped or removed. Opening the directory
        // itself is not (the runtime does it as it sets a container up).
        Body::Call(_) if !note.irrelevant && note.object_path.as_deref().is_some_and(is_object) => {
            vec![Tally::Touch]
        }
        Body::Signal(signal) if signal.signo == libc::SIGBUS && note.fault.is_some() => {
            vec![Tally::Touch, Tally::Sigbus]
        }
        _ => Vec::new(),
    }
}

/// A path of an object in /dev/shm, not the directory (System V segments have their own names).
fn is_object(path: &str) -> bool {
    !matches!(path.trim_end_matches('/'), "/dev/shm" | "")
}

fn role_name(diagnosis: &Diagnosis) -> String {
    serde_json::to_value(diagnosis.role.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "other".to_owned())
}
