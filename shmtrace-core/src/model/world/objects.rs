//! The lives of /dev/shm objects: sizes and what they add to a file system's use, the
//! descriptors and mappings that hold them, and their end (freed, or gone with their file
//! system).
use super::{FastSet, RECENTLY_FREED, World};
use crate::{
    event::InodeId,
    model::{Annotation, ObjectState, ShmObject},
};

impl World {
    pub(super) fn update_size(&mut self, inode: InodeId, size: i64, allocated: u64) {
        let Some(object) = self.objects.get_mut(&inode) else {
            return;
        };
        let before = object.footprint();
        object.size = size;
        object.allocated = allocated;
        // The kernel's count is the truth while nothing can write past it unseen.
        object.uncounted_writes = object.mappings > 0;
        let after = object.footprint();
        self.usage
            .entry(inode.dev)
            .or_default()
            .change(before, after);
        self.totals.live_bytes = (self.totals.live_bytes + after.1).saturating_sub(before.1);
        self.totals.peak_live_bytes = self.totals.peak_live_bytes.max(self.totals.live_bytes);
    }

    pub(super) fn adjust_mappings(&mut self, changes: Vec<(InodeId, i32)>, note: &mut Annotation) {
        for (inode, delta) in changes {
            if let Some(object) = self.objects.get_mut(&inode) {
                object.mappings = object.mappings.saturating_add_signed(delta);
            }
            self.free_if_released(inode, note);
        }
    }

    /// Drops descriptors and mappings of `fds` and `maps` inodes.
    pub(super) fn release(&mut self, fds: Vec<InodeId>, maps: Vec<InodeId>, note: &mut Annotation) {
        for inode in &fds {
            if let Some(object) = self.objects.get_mut(inode) {
                object.fds = object.fds.saturating_sub(1);
            }
        }
        for inode in &maps {
            if let Some(object) = self.objects.get_mut(inode) {
                object.mappings = object.mappings.saturating_sub(1);
            }
        }
        for inode in fds.into_iter().chain(maps) {
            self.free_if_released(inode, note);
        }
    }

    /// Whether a file just opened under `inode` cannot be the object the model knows by that
    /// number. A file system cannot hand out the number of a file that still exists, so when
    /// it does, the known one is gone without a trace: its /dev/shm was unmounted (a container
    /// restarted; its new tmpfs numbers inodes from 1 on the same device number) or its
    /// removal was among lost events. Proof is a create that had to be new (`O_EXCL`), or a
    /// create in another mount namespace of a file nobody traced holds.
    pub(super) fn is_stale(&self, inode: InodeId, flags: u64, mntns: u32) -> bool {
        let Some(known) = self.objects.get(&inode) else {
            return false;
        };
        let creates = flags & libc::O_CREAT as u64 != 0;
        let exclusive = flags & libc::O_EXCL as u64 != 0;
        creates && (exclusive || (known.mntns != mntns && known.fds == 0 && known.mappings == 0))
    }

    /// Ends the lives of the objects named in mount namespace `mntns` on file system `dev`:
    /// that namespace's private /dev/shm, unmounted when its last process ended (a container
    /// that stopped or restarted). Returns how many.
    pub fn retire_file_system(&mut self, dev: u32, mntns: u32) -> usize {
        self.forget_shm_dev(mntns);
        let gone: Vec<InodeId> = self
            .objects
            .values()
            .filter(|o| o.inode.dev == dev && o.mntns == mntns)
            .map(|o| o.inode)
            .collect();
        let mut note = Annotation::default();
        for inode in &gone {
            self.retire(*inode, &mut note);
        }
        gone.len()
    }

    /// Ends the lives of the objects named in mount namespace `mntns` on any file system but
    /// `shared_dev` (the host's /dev/shm, whose files outlive containers), first seen before
    /// `before_ns`: a gone container's or sandbox's own /dev/shm, whose namespace number
    /// another may have taken since (its objects come after it started), and whose device
    /// number the next tmpfs made takes. An object a live process elsewhere still holds is
    /// kept: a descriptor or a mapping keeps its file system alive, and its number taken.
    /// Returns how many.
    pub fn retire_namespace(
        &mut self,
        mntns: u32,
        shared_dev: Option<u32>,
        before_ns: u64,
    ) -> usize {
        let mut gone: Vec<(InodeId, bool)> = self
            .objects
            .values()
            .filter(|o| o.mntns == mntns && Some(o.inode.dev) != shared_dev)
            .filter(|o| o.first_seen_ns < before_ns)
            .map(|o| (o.inode, o.fds > 0 || o.mappings > 0))
            .collect();
        if gone.iter().any(|(_, held)| *held) {
            // Rare (a descriptor passed out of the namespace): only then are processes looked
            // through.
            let held: FastSet<InodeId> = self
                .processes
                .values()
                .filter(|p| p.alive() && p.mntns != mntns)
                .flat_map(|p| {
                    let fds = p.fds.values().map(|fd| fd.inode);
                    fds.chain(p.mappings.iter().map(|m| m.inode))
                })
                .collect();
            gone.retain(|(inode, _)| !held.contains(inode));
        }
        let gone: Vec<InodeId> = gone.into_iter().map(|(inode, _)| inode).collect();
        let mut note = Annotation::default();
        for inode in &gone {
            self.retire(*inode, &mut note);
        }
        gone.len()
    }

    /// Ends the life of an object whose file system went away with it (see `is_stale`).
    pub(super) fn retire(&mut self, inode: InodeId, note: &mut Annotation) {
        let Some(object) = self.remove_object(inode) else {
            return;
        };
        // Counted as freed only what was counted as created: not the objects found already
        // there, nor /dev/shm itself held open.
        if object.creator.is_some() {
            self.totals.objects_freed += 1;
        }
        note.freed.push(object.display_name());
        // Every bump has its entry in the change log (pid 0: no process to look at again),
        // or `changes_since` would skip the changes after it.
        self.changed(0);
    }

    /// Takes an object out of the model: what it held no longer counts in its file system's
    /// use, and its name no longer leads to it.
    pub(super) fn remove_object(&mut self, inode: InodeId) -> Option<ShmObject> {
        let object = self.objects.remove(&inode)?;
        self.totals.live_bytes = self.totals.live_bytes.saturating_sub(object.allocated);
        let usage = self.usage.entry(inode.dev).or_default();
        usage.change(object.footprint(), (0, 0));
        usage.objects = usage.objects.saturating_sub(1);
        if let Some(path) = &object.path {
            let key = (object.mntns, path.to_string());
            if self.names.get(&key) == Some(&inode) {
                self.names.remove(&key);
            }
        }
        Some(object)
    }

    /// An unlinked object with no descriptor or mapping left has given its memory back.
    pub(super) fn free_if_released(&mut self, inode: InodeId, note: &mut Annotation) {
        let Some(object) = self.objects.get(&inode) else {
            return;
        };
        if object.state() != ObjectState::Freed {
            return;
        }
        let object = self.objects.remove(&inode).expect("present");
        self.totals.live_bytes = self.totals.live_bytes.saturating_sub(object.allocated);
        // An object brought back by a passed descriptor was counted when first freed.
        if !self.recently_freed.contains_key(&inode) {
            self.totals.objects_freed += 1;
        }
        let usage = self.usage.entry(inode.dev).or_default();
        usage.change(object.footprint(), (0, 0));
        usage.objects = usage.objects.saturating_sub(1);
        note.freed.push(object.display_name());
        if let Some(path) = object.path {
            if self.recently_freed.len() >= RECENTLY_FREED {
                self.recently_freed.clear();
            }
            self.recently_freed.insert(inode, path);
        }
    }
}
