//! The closing table: per place and role, how many processes, the most they held in /dev/shm
//! at once (an object several of them hold counts once), in pages and in the objects' sizes,
//! their failures and deaths.
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
    /// The most the role's processes held in /dev/shm at once, counting each object by its
    /// size (what it takes once written), written or not.
    pub peak_bytes: u64,
    /// The most pages they held at once (an object mapped since its pages were last counted
    /// counts by its size: pages written through a mapping show in no system call).
    pub peak_held: u64,
    /// The size of the /dev/shm file systems their objects were on, as last measured (the
    /// sum when several); `None` when none was measured.
    pub shm_size: Option<u64>,
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
        for (group, (peak, held)) in &self.group_peak {
            let stats = table.entry(group.clone()).or_default();
            stats.peak_bytes = *peak;
            stats.peak_held = *held;
            let sizes: Vec<u64> = self
                .group_devs
                .get(group)
                .into_iter()
                .flatten()
                .filter_map(|dev| self.capacity.get(dev).map(|c| c.size))
                .collect();
            stats.shm_size = (!sizes.is_empty()).then(|| sizes.iter().sum());
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
            *peak = max_of(*peak, footprint(counts, world));
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
            Some(peak) => *peak = max_of(*peak, now),
            None => {
                self.group_peak.insert(group.clone(), now);
            }
        }
        if let Some(inode) = inodes.iter().next() {
            // One per group in practice: a role's processes share their /dev/shm.
            let devs = self.group_devs.entry(group.clone()).or_default();
            if devs.len() < 8 {
                devs.insert(inode.dev);
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

/// What a group's objects take now: `(their sizes, their pages)`.
fn footprint(counts: &FastMap<InodeId, u32>, world: &World) -> (u64, u64) {
    counts
        .keys()
        .filter_map(|inode| world.object(inode))
        .fold((0, 0), |(sizes, pages), o| {
            (sizes + o.footprint().0, pages + o.held())
        })
}

fn max_of(a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
    (a.0.max(b.0), a.1.max(b.1))
}
