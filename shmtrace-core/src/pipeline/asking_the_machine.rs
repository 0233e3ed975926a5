//! When the pipeline asks the machine: a process's /proc snapshot at its first /dev/shm call,
//! its first failure, its young age or its exec; what holds a full /dev/shm; how big and full a
//! /dev/shm is. Each answer goes to the tap as a record before the record that asked, so that
//! a replay ([`Recorded`](super::Recorded)) meets the same answers without a machine.
use anyhow::Result;

use super::{Environment, Pipeline, trigger::capacity_record};
use crate::{
    diagnose::space_check,
    event::{Body, Event, Exec},
    record::UserRecord,
};

impl Pipeline {
    /// Reads a process's title and container pid from /proc again, at its first /dev/shm
    /// call and at its first failure: PostgreSQL's `postgres: parallel worker for PID 34` is
    /// written over its command line after fork, where no event shows it, and a process that
    /// fails may be gone by the time its failure is read. Recorded like any snapshot, so a
    /// replay shows the same.
    pub(super) fn reread_title(&mut self, event: &Event, env: &mut dyn Environment) -> Result<()> {
        let (subject, failed) = match &event.body {
            Body::Call(call) => (
                event.pid,
                call.failed() && self.world.expected_error(event, call).is_none(),
            ),
            Body::Signal(signal) if signal.addr != 0 => (signal.target_pid, true),
            _ => return Ok(()),
        };
        let first_call = self.read_at_call.insert(subject);
        let first_failure = failed && self.read_at_failure.insert(subject);
        if !first_call && !first_failure {
            return Ok(());
        }
        match env.snapshot(subject) {
            Some(snapshot) => self.seed(&snapshot, event.ts_ns),
            None => Ok(()),
        }
    }

    /// Reads a new child's container pid while it is young, when its parent is in a
    /// container's pid namespace: a PostgreSQL parallel worker lives a few milliseconds, and
    /// may be gone by the time its failure is read. After the fork is applied, so the child is
    /// known and only refreshed.
    pub(super) fn read_young_child(
        &mut self,
        parent: u32,
        child: u32,
        env: &mut dyn Environment,
    ) -> Result<()> {
        let contained = self
            .world
            .process(parent)
            .is_some_and(|p| p.nspid.is_some());
        if !contained || !self.world.knows(child) {
            return Ok(());
        }
        match env.snapshot(child) {
            Some(snapshot) => self.seed(
                &snapshot,
                self.world.process(child).map_or(0, |p| p.first_seen_ns),
            ),
            None => Ok(()),
        }
    }

    /// Reads the whole command line of a program whose decisions the diagnosis reads there
    /// (Ray's raylet: its store's size and directory), when its exec record holds only the
    /// start of it. After the exec is applied, so that it becomes the process's title; recorded
    /// like any snapshot.
    pub(super) fn read_whole_command_line(
        &mut self,
        event: &Event,
        exec: &Exec,
        env: &mut dyn Environment,
    ) -> Result<()> {
        if !exec.argv_truncated || !space_check::needs_whole_command_line(&exec.filename) {
            return Ok(());
        }
        match env.snapshot(event.pid) {
            Some(snapshot) => self.seed(&snapshot, event.ts_ns),
            None => Ok(()),
        }
    }

    /// At a /dev/shm that is full (ENOSPC, or SIGBUS in a mapping of it), asks the machine
    /// what holds its space, traced or not, so that the diagnosis can name the others who
    /// share it. At most once a second per file system: a full /dev/shm fails many calls.
    pub(super) fn read_holders_if_full(
        &mut self,
        event: &Event,
        env: &mut dyn Environment,
    ) -> Result<()> {
        const EVERY_NS: u64 = 1_000_000_000;
        if !env.can_measure() {
            return Ok(());
        }
        let (subject, dev) = match &event.body {
            Body::Call(call) if call.errno() == Some(libc::ENOSPC) => match call.file {
                Some(file) => (event.pid, file.inode.dev),
                None => return Ok(()),
            },
            Body::Signal(signal) if signal.signo == libc::SIGBUS && signal.addr != 0 => {
                let Some(mapping) = self
                    .world
                    .process(signal.target_pid)
                    .and_then(|p| p.mapping_at(signal.addr))
                else {
                    return Ok(());
                };
                (signal.target_pid, mapping.inode.dev)
            }
            _ => return Ok(()),
        };
        // A container's private /dev/shm is nobody else's: reading every process's descriptors
        // and mappings for others would only delay the records after this one, and a process
        // failing next (a PostgreSQL parallel worker) may exit within milliseconds, taking its
        // title with it before its records are read.
        if self
            .diagnoser
            .container(event.mntns)
            .is_some_and(|container| container.ipc == "private")
        {
            return Ok(());
        }
        if self
            .holders_read
            .get(&dev)
            .is_some_and(|last| event.ts_ns.saturating_sub(*last) < EVERY_NS)
        {
            return Ok(());
        }
        self.holders_read.insert(dev, event.ts_ns);
        let pids = self.subject_then_its_namespace(subject, event.mntns);
        let Some(holders) = env.holders(&pids, dev, event.ts_ns) else {
            return Ok(());
        };
        self.tap_user(event.ts_ns, &UserRecord::Holders((&holders).into()))?;
        self.diagnoser.holders(holders);
        Ok(())
    }

    /// Measures /dev/shm when a namespace is first seen, when a call first touches an object
    /// on a file system not measured yet, and before a failure is diagnosed, so that the
    /// diagnosis can say how big it was and how full.
    ///
    /// The second covers a /dev/shm mounted after its namespace was first seen (`unshare -m`
    /// then `mount`, as sandboxes do): measured at the failure only, it would be missing
    /// whenever the failing processes, and all others of their namespace, are gone by the time
    /// their events are read.
    pub(super) fn measure_if_needed(
        &mut self,
        event: &Event,
        env: &mut dyn Environment,
    ) -> Result<()> {
        if !env.can_measure() {
            return Ok(());
        }
        let failure = self.world.is_failure(event);
        let new_file_system = match &event.body {
            // Tried once per file system, whatever the outcome: a file system that is not
            // this namespace's /dev/shm (a descriptor passed from elsewhere) costs one try.
            Body::Call(call) => call
                .file
                .is_some_and(|file| self.measured_devs.insert(file.inode.dev)),
            _ => false,
        };
        // A process that measured its namespace and then execs may have mounted a /dev/shm of
        // its own in between (`unshare -m sh -c 'mount -t tmpfs ... /dev/shm; exec prog'`):
        // measure again while the new program runs, as it may be gone soon after.
        let exec_after_setup = matches!(event.body, Body::Exec(_))
            && self.measured.get(&event.mntns) == Some(&event.pid);
        if !failure
            && !new_file_system
            && !exec_after_setup
            && self.measured.contains_key(&event.mntns)
        {
            return Ok(());
        }
        let subject = match &event.body {
            Body::Signal(signal) => signal.target_pid,
            _ => event.pid,
        };
        // The subject may be gone (it just died): any live process of its namespace will do.
        let pids = self.subject_then_its_namespace(subject, event.mntns);
        let Some(sample) = env.measure(&pids, event.ts_ns) else {
            return Ok(());
        };
        self.measured.insert(event.mntns, subject);
        self.measured_devs.insert(sample.dev);
        self.learn_capacity(sample);
        self.tap_user(event.ts_ns, &capacity_record(&sample, Some(subject)))
    }

    /// The processes to ask /proc about, in order: `subject`, then the other live processes of
    /// mount namespace `mntns` by pid (from the index, not a scan: every death by a signal
    /// asks; in pid order, so that the same one is tried first each time).
    fn subject_then_its_namespace(&self, subject: u32, mntns: u32) -> Vec<u32> {
        let mut others: Vec<u32> = self
            .world
            .alive_in(mntns)
            .filter(|pid| *pid != subject)
            .collect();
        others.sort_unstable();
        let mut pids = vec![subject];
        pids.extend(others);
        pids
    }
}
