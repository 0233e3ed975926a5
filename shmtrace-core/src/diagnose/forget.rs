//! Forgetting the processes the model forgot (`World::forget`, a daemon's long run): their
//! roles, the diagnoses a later one could have followed, their counts for the closing table.
use std::collections::HashSet;

use super::{Diagnoser, Diagnosis, RoleKind};
use crate::model::World;

/// Most (place, role) rows kept for the closing table once nobody in them holds anything.
const MAX_TABLE_ROWS: usize = 1024;

/// What the diagnoser holds per process, and what it dropped to stay bounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Remembered {
    /// Diagnoses made, kept for those that may follow them (a trainer dying after a worker).
    pub diagnoses: usize,
    /// Processes with failures not yet diagnosed.
    pub pending: usize,
    /// Processes with a role.
    pub roles: usize,
    /// Rows of the closing table.
    pub table_rows: usize,
    /// Rows of the closing table dropped, since the start.
    pub evicted_table_rows: u64,
}

impl Diagnoser {
    /// Whether `pid` has failures not yet diagnosed.
    pub fn has_pending(&self, pid: u32) -> bool {
        self.pending.contains_key(&pid)
    }

    /// The diagnosis of `pid`'s failures so far, now: for a process about to be forgotten
    /// alive (a cap dropped it), so that its failures are not lost with it.
    pub fn diagnose_now(&mut self, pid: u32, world: &World) -> Option<Diagnosis> {
        let failures = self.pending.remove(&pid)?;
        let mntns = world.process(pid).map_or(0, |p| p.mntns);
        let ts = failures.last().map_or(0, |f| f.ts_ns);
        Some(self.diagnose(pid, mntns, ts, None, failures, world))
    }

    /// Whether a diagnosis could still ask about `pid`: it has failures not yet diagnosed, or
    /// one made, which a later death may follow (a trainer's, after its worker's).
    pub fn remembers(&self, pid: u32) -> bool {
        self.pending.contains_key(&pid) || self.diagnosed.contains_key(&pid)
    }

    /// Counts `pids`, about to be forgotten by `world`, in their group of the closing table,
    /// so that it still tells how many processes each place and role had. Call before
    /// [`World::forget`], while the model still knows them.
    pub fn tally_forgotten(&mut self, pids: &[u32], world: &World) {
        if pids.is_empty() {
            return;
        }
        self.roles(world);
        for pid in pids {
            let Some(process) = world.process(*pid) else {
                continue;
            };
            let group = self.group(*pid, process.mntns);
            let (failures, died) = self.outcomes.get(pid).copied().unwrap_or_default();
            let stats = self.forgotten.entry(group).or_default();
            stats.processes += 1;
            stats.failures += failures;
            stats.deaths += u64::from(died);
        }
    }

    /// Forgets `pids`, which the model forgets too.
    pub fn forget(&mut self, pids: &[u32]) {
        for pid in pids {
            self.pending.remove(pid);
            if let Some((parent, ns)) = self.diagnosed.remove(pid).and_then(|d| d.filed_under)
                && let Some(children) = self.failed_children.get_mut(&parent)
            {
                children.remove(&(ns, *pid));
                if children.is_empty() {
                    self.failed_children.remove(&parent);
                }
            }
            self.failed_children.remove(pid);
            self.outcomes.remove(pid);
            self.loaders.remove(pid);
            self.looks.remove(pid);
            self.raylets.remove(pid);
            if let Some((inodes, group)) = self.held.remove(pid)
                && let Some(counts) = self.group_now.get_mut(&group)
            {
                for inode in inodes {
                    if let Some(n) = counts.get_mut(&inode) {
                        *n -= 1;
                        if *n == 0 {
                            counts.remove(&inode);
                        }
                    }
                }
            }
            self.roles.forget(*pid);
        }
        if pids.is_empty() {
            return;
        }
        self.group_now.retain(|_, counts| !counts.is_empty());
        // A place per container: over weeks, rows of containers long gone would pile up.
        if self.group_peak.len() > MAX_TABLE_ROWS || self.forgotten.len() > MAX_TABLE_ROWS {
            let now = &self.group_now;
            let mut dropped: HashSet<(String, RoleKind)> = HashSet::new();
            let mut keep = |group: &(String, RoleKind)| {
                let held = now.contains_key(group);
                if !held {
                    dropped.insert(group.clone());
                }
                held
            };
            self.group_peak.retain(|group, _| keep(group));
            self.forgotten.retain(|group, _| keep(group));
            let peaks = &self.group_peak;
            self.group_devs.retain(|group, _| peaks.contains_key(group));
            self.evicted_groups += dropped.len() as u64;
        }
    }

    pub fn remembered(&self) -> Remembered {
        Remembered {
            diagnoses: self.diagnosed.len(),
            pending: self.pending.len(),
            roles: self.roles.remembered(),
            table_rows: self.group_peak.len(),
            evicted_table_rows: self.evicted_groups,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        diagnose::{RoleKind, Roles},
        event::{Body, Event, ExitStatus},
        model::{Retention, World},
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

    /// A trainer (pid 10) starts DataLoader worker `pid` at `ts`.
    fn worker(world: &mut World, pid: u32, ts: u64) {
        world.apply(&event(ts, 10, "python3", Body::Fork { child_pid: pid }));
        let rename = Body::Rename {
            pid,
            tid: pid,
            comm: "pt_data_worker".to_owned(),
        };
        world.apply(&event(ts + 1, pid, "pt_data_worker", rename));
    }

    #[test]
    fn workers_keep_their_numbers_when_earlier_ones_are_forgotten() {
        let mut world = World::new().with_retention(Retention {
            linger_ns: 10,
            quiet_linger_ns: 10,
            max_processes: 100,
            max_objects: 100,
        });
        let mut roles = Roles::default();
        for (i, pid) in [11, 12, 13].into_iter().enumerate() {
            worker(&mut world, pid, 100 * i as u64);
        }
        let exit = Body::Exit(ExitStatus::Code(0).into());
        world.apply(&event(1000, 11, "pt_data_worker", exit.clone()));
        world.apply(&event(1001, 12, "pt_data_worker", exit));
        roles.update(&world);
        // Worker 13, alive and silent, is kept as a caller would keep it.
        let mut due = world.due_to_forget(2000, |pid| pid == 13);
        due.sort();
        assert_eq!(due, vec![11, 12]);
        world.forget(&due);
        for pid in &due {
            roles.forget(*pid);
        }
        worker(&mut world, 14, 3000);
        roles.update(&world);
        let index = |pid| roles.of(pid).worker_index;
        assert_eq!((index(13), index(14)), (Some(2), Some(3)));
        assert_eq!(roles.of(11).kind, RoleKind::Other);
        assert_eq!(roles.of(10).kind, RoleKind::Trainer);
        assert_eq!(roles.remembered(), 3);
    }
}
