//! What the diagnoser notes as events pass (a DataLoader's batch size, the sizes asked of
//! /dev/shm) and what it records of the machine at the moment of a failure: how full /dev/shm
//! was, who else held it, how much the request still needed.
use std::collections::HashSet;

use super::{
    Diagnoser, RoleKind,
    failure::{Cause, Failure, FailureKind, at_least_refused},
    leftovers::leftovers_on,
    role,
    usage_floor::at_least_held,
};
use crate::{
    event::{Event, Syscall},
    model::{Annotation, World},
};

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LoaderStats {
    pub(super) batch_bytes: u64,
    pub(super) max_in_flight: u32,
}

impl Diagnoser {
    /// DataLoader facts: batch size (the largest torch_ object its workers sized), and how
    /// many batches one worker keeps in flight.
    pub(super) fn learn_loader(
        &mut self,
        pid: u32,
        call: &crate::event::Call,
        note: &Annotation,
        world: &World,
    ) {
        let role = self.roles.of(pid);
        let (RoleKind::DataloaderWorker, Some(trainer)) = (role.kind, role.trainer) else {
            return;
        };
        if !note.object_path.as_deref().is_some_and(role::is_torch) {
            return;
        }
        let size = match call.syscall {
            Syscall::Ftruncate => call.args[1],
            Syscall::Fallocate => call.args[3],
            Syscall::Mmap => call.args[1],
            _ => 0,
        };
        let in_flight = world
            .process(pid)
            .map(|p| {
                let mut inodes: HashSet<_> = p.fds.values().map(|fd| fd.inode).collect();
                inodes.extend(p.mappings.iter().map(|m| m.inode));
                inodes
                    .iter()
                    .filter(|inode| {
                        world
                            .object(inode)
                            .and_then(|o| o.path.as_deref())
                            .is_some_and(role::is_torch)
                    })
                    .count() as u32
            })
            .unwrap_or(0);
        let stats = self.loaders.entry(trainer).or_default();
        stats.batch_bytes = stats.batch_bytes.max(size);
        stats.max_in_flight = stats.max_in_flight.max(in_flight);
    }

    /// Sizes asked of /dev/shm objects, for the growth of requests.
    pub(super) fn learn_requests(&mut self, call: &crate::event::Call) {
        let Some(file) = call.file else { return };
        let request = match call.syscall {
            Syscall::Ftruncate => call.args[1],
            Syscall::Fallocate => call.args[2].saturating_add(call.args[3]),
            _ => return,
        };
        self.pressure.asked(file.inode.dev, request);
    }

    pub(super) fn failure_now(
        &self,
        event: &Event,
        pid: u32,
        cause: Cause,
        kind: FailureKind,
        dev: Option<u32>,
        world: &World,
    ) -> Failure {
        let workers_allocating = dev
            .map(|dev| {
                world
                    .processes()
                    .filter(|p| p.alive())
                    .filter(|p| self.roles.of(p.pid).kind == RoleKind::DataloaderWorker)
                    .filter(|p| {
                        p.fds.values().any(|fd| fd.inode.dev == dev)
                            || p.mappings.iter().any(|m| m.inode.dev == dev)
                    })
                    .count() as u32
            })
            .unwrap_or(0);
        let comm = world
            .process(pid)
            .map(|p| p.comm.clone())
            .unwrap_or_else(|| event.comm.clone());
        let unmet = match &kind {
            // A write appends: all of it is new.
            FailureKind::Call {
                syscall: "write",
                request,
                ..
            } => *request,
            FailureKind::Call { request, path, .. } => {
                let counted = path
                    .as_ref()
                    .and_then(|p| {
                        world
                            .live_objects()
                            .find(|o| o.path.as_deref() == Some(p.as_str()))
                    })
                    // Pages it holds: an ftruncate before a failed fallocate holds nothing.
                    .map(|o| o.allocated)
                    .unwrap_or(0);
                request.saturating_sub(counted)
            }
            _ => 0,
        };
        let capacity = dev
            .and_then(|d| self.capacity.get(&d).copied())
            .map(|c| at_least_held(c, dev.and_then(|d| world.usage(d))))
            .map(|c| at_least_refused(c, cause, &kind));
        let leftovers = match (cause, dev) {
            // A file whose maker failed for want of room too is the same shortage (a sibling
            // of the same job that died just before), not one left from an earlier run.
            (Cause::ShmFull, Some(dev)) => leftovers_on(dev, world)
                .into_iter()
                .filter(|l| self.outcomes.get(&l.creator_pid).is_none_or(|o| o.0 == 0))
                .collect(),
            _ => Vec::new(),
        };
        Failure {
            ts_ns: event.ts_ns,
            pid,
            tid: event.tid,
            comm,
            cause,
            kind,
            dev,
            usage: dev.and_then(|d| world.usage(d).cloned()),
            capacity,
            workers_allocating,
            unmet,
            held: dev.map(|dev| held_on(dev, world)).unwrap_or(0),
            peers: dev.map(|dev| peers_of(pid, dev, world)).unwrap_or(0),
            leftovers,
            others: match (cause, dev) {
                (Cause::ShmFull, Some(dev)) => self.others_on(dev, world),
                _ => Vec::new(),
            },
            removal: None,
        }
    }
}

/// Pages the live objects on /dev/shm `dev` hold ([`crate::model::ShmObject::held`]): an
/// object mapped since its pages were counted counts by its size, as pages written through a
/// mapping show in no system call; others by their pages, as a file only ftruncated holds
/// nothing.
fn held_on(dev: u32, world: &World) -> u64 {
    world
        .live_objects()
        .filter(|o| o.inode.dev == dev)
        .map(|o| o.held())
        .sum()
}

/// Live processes other than `pid` that hold (by descriptor or mapping) an object on /dev/shm
/// `dev` that `pid` holds too, other than those its parent holds and those made before the
/// trace began.
fn peers_of(pid: u32, dev: u32, world: &World) -> u32 {
    let holds = |p: &crate::model::Process| -> HashSet<crate::event::InodeId> {
        p.fds
            .values()
            .map(|fd| fd.inode)
            .chain(p.mappings.iter().map(|m| m.inode))
            .filter(|inode| inode.dev == dev)
            .collect()
    };
    let Some(process) = world.process(pid) else {
        return 0;
    };
    // What it inherited with everyone else from its parent (PostgreSQL's postmaster maps its
    // control segment into every backend) says nothing about who works with it.
    let inherited = process
        .parent
        .and_then(|parent| world.process(parent))
        .map(holds)
        .unwrap_or_default();
    // Nor does an object found already there when the trace began: attached to a running
    // PostgreSQL, every backend is seen mapping the control segment, and who made it, and
    // who inherited it from whom, is not known.
    let seen_made = |inode: &&crate::event::InodeId| {
        world
            .object(inode)
            .is_some_and(|object| object.creator.is_some())
    };
    let own: HashSet<_> = holds(process)
        .difference(&inherited)
        .filter(seen_made)
        .copied()
        .collect();
    if own.is_empty() {
        return 0;
    }
    world
        .processes()
        .filter(|p| p.pid != pid && p.alive())
        .filter(|p| !holds(p).is_disjoint(&own))
        .count() as u32
}
