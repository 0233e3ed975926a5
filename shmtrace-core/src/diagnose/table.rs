//! The closing table: per place and role, how many processes, the most bytes they held in
//! /dev/shm at once (an object several of them hold counts once), their failures and deaths.
use std::collections::BTreeMap;

use super::{Diagnoser, RoleKind};
use crate::{
    event::InodeId,
    model::{FastMap, FastSet, World},
};

/// Per place and role, for the closing table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoleStats {
    pub processes: u64,
    /// Most bytes the role's processes held in /dev/shm at once.
    pub peak_bytes: u64,
    pub failures: u64,
    pub deaths: u64,
}

impl Diagnoser {
    /// Per place and role (as known at the end): processes, most bytes held at once,
    /// failures, deaths.
    pub fn table(&mut self, world: &World) -> Vec<(String, RoleKind, RoleStats)> {
        self.roles(world);
        let mut table: BTreeMap<(String, RoleKind), RoleStats> = BTreeMap::new();
        for process in world.processes() {
            let group = self.group(process.pid, process.mntns);
            let stats = table.entry(group).or_default();
            stats.processes += 1;
            let (failures, died) = self.outcomes.get(&process.pid).copied().unwrap_or_default();
            stats.failures += failures;
            stats.deaths += u64::from(died);
        }
        for (group, gone) in &self.forgotten {
            let stats = table.entry(group.clone()).or_default();
            stats.processes += gone.processes;
            stats.failures += gone.failures;
            stats.deaths += gone.deaths;
        }
        for (group, peak) in &self.group_peak {
            table.entry(group.clone()).or_default().peak_bytes = *peak;
        }
        table
            .into_iter()
            .map(|((place, role), stats)| (place, role, stats))
            .collect()
    }

    /// Recomputes what `pid` holds (each object once, however many descriptors or mappings).
    pub(super) fn update_held(&mut self, pid: u32, mntns: u32, world: &World) {
        let Some(process) = world.process(pid) else {
            return;
        };
        let mut inodes = std::mem::take(&mut self.held_scratch);
        inodes.clear();
        inodes.extend(process.fds.values().map(|fd| fd.inode));
        inodes.extend(process.mappings.iter().map(|m| m.inode));
        // Most calls (a resize, a mapping or a close of an object still mapped) change
        // neither what the process holds nor its group: then only the sizes can have
        // changed, and the group's peak is all there is to update.
        if let Some((before, group)) = self.held.get(&pid)
            && *before == inodes
            && group.1 == self.roles.of(pid).kind
            && group.0 == self.place_name(mntns)
            && let Some(counts) = self.group_now.get(group)
            && let Some(peak) = self.group_peak.get_mut(group)
        {
            *peak = (*peak).max(footprint(counts, world));
            self.held_scratch = inodes;
            return;
        }
        let group = self.group(pid, mntns);
        self.held_to(pid, inodes, group, world);
    }

    pub(super) fn held_to(
        &mut self,
        pid: u32,
        mut inodes: FastSet<InodeId>,
        group: (String, RoleKind),
        world: &World,
    ) {
        if let Some((mut before, old_group)) = self.held.remove(&pid) {
            if let Some(counts) = self.group_now.get_mut(&old_group) {
                for inode in before.drain() {
                    if let Some(n) = counts.get_mut(&inode) {
                        *n -= 1;
                        if *n == 0 {
                            counts.remove(&inode);
                        }
                    }
                }
            }
            // Its table is the next call's scratch: a process's holdings change at every
            // open and last close, and a new table each time was most of this function.
            before.clear();
            self.held_scratch = before;
        }
        // The group is looked up before it is copied: it is nearly always there already.
        let counts = match self.group_now.get_mut(&group) {
            Some(counts) => counts,
            None => self.group_now.entry(group.clone()).or_default(),
        };
        for inode in &inodes {
            *counts.entry(*inode).or_default() += 1;
        }
        let now = footprint(counts, world);
        match self.group_peak.get_mut(&group) {
            Some(peak) => *peak = (*peak).max(now),
            None => {
                self.group_peak.insert(group.clone(), now);
            }
        }
        if !inodes.is_empty() {
            self.held.insert(pid, (inodes, group));
        } else if self.held_scratch.capacity() == 0 {
            inodes.clear();
            self.held_scratch = inodes;
        }
    }
}

/// Bytes a group's objects hold now.
fn footprint(counts: &FastMap<InodeId, u32>, world: &World) -> u64 {
    counts
        .keys()
        .filter_map(|inode| world.object(inode))
        .map(|o| o.footprint().0)
        .sum()
}
