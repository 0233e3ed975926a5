//! Names removed while others held them, and the mount namespaces that share one /dev/shm (a
//! pod's containers, `--ipc=container:`, `--ipc=host` and the host itself). Names are kept per
//! namespace (the same name in two private /dev/shm is two files), so a name removed from one
//! namespace is looked for in the others on the same file system: a clean-up in a sidecar
//! removes the file its neighbour holds, and the neighbour's next open of the name fails.
use super::World;
use crate::{
    event::{Body, Call, Event, InodeId, Syscall},
    model::{Annotation, Removal},
};

/// Bound on the namespaces whose /dev/shm is known.
const SHM_DEVS: usize = 4096;

impl World {
    /// Mount namespace `mntns` has its /dev/shm on file system `dev`: its opens of /dev/shm
    /// names showed it, or its container did (the pipeline says, from the runtime's
    /// description, so that a remover that never opened anything is placed too).
    pub fn learn_shm_dev(&mut self, mntns: u32, dev: u32) {
        if mntns == 0 {
            return;
        }
        match self.shm_dev_of.get(&mntns) {
            Some(known) if *known == dev => return,
            Some(known) => {
                let known = *known;
                self.unshare(mntns, known);
            }
            None if self.shm_dev_of.len() >= SHM_DEVS => {
                // Bounded by clearing: a namespace's next open of a name teaches it again.
                self.shm_dev_of.clear();
                self.namespaces_on.clear();
            }
            None => {}
        }
        self.shm_dev_of.insert(mntns, dev);
        self.namespaces_on.entry(dev).or_default().push(mntns);
    }

    /// Mount namespace `mntns` is gone (its container ended): its /dev/shm is no longer known.
    pub fn forget_shm_dev(&mut self, mntns: u32) {
        if let Some(dev) = self.shm_dev_of.remove(&mntns) {
            self.unshare(mntns, dev);
        }
        // The number may go to another container, whose /dev/shm numbers its inodes anew.
        self.forget_directories(mntns);
    }

    fn unshare(&mut self, mntns: u32, dev: u32) {
        if let Some(namespaces) = self.namespaces_on.get_mut(&dev) {
            namespaces.retain(|m| *m != mntns);
            if namespaces.is_empty() {
                self.namespaces_on.remove(&dev);
            }
        }
    }

    /// The /dev/shm file system of `mntns`, when known.
    pub(super) fn shm_dev(&self, mntns: u32) -> Option<u32> {
        self.shm_dev_of.get(&mntns).copied()
    }

    /// `inode`, named `path`, was unlinked from `mntns`: the other namespaces on its file
    /// system that know it by that name lose the name too.
    pub(super) fn unlink_shared_name(&mut self, mntns: u32, path: &str, inode: InodeId) {
        let Some(namespaces) = self.namespaces_on.get(&inode.dev) else {
            return;
        };
        if namespaces.len() < 2 {
            return;
        }
        let mut key = (0, path.to_owned());
        for other in namespaces.clone() {
            key.0 = other;
            if other != mntns && self.names.get(&key) == Some(&inode) {
                self.names.remove(&key);
            }
        }
    }

    /// A successful unlink of `path` from `event`'s namespace, which knows no such name: it
    /// may be another namespace's, on the same /dev/shm. When the remover's /dev/shm is known
    /// to be theirs, the name is gone there, and a removal under its holders is noted; when
    /// its /dev/shm is not known (a container shmtrace has not yet been told of), the removal
    /// is only noted, and counts when an open of the name there then fails
    /// ([`World::confirm_removal`]).
    pub(super) fn unlink_elsewhere(&mut self, event: &Event, path: &str, note: &mut Annotation) {
        let own = self.shm_dev(event.mntns);
        let namespaces: Vec<u32> = match own {
            Some(dev) => self.namespaces_on.get(&dev).cloned().unwrap_or_default(),
            None => self.shm_dev_of.keys().copied().collect(),
        };
        // One key, its namespace changed: a host-wide trace may know thousands of namespaces.
        let mut key = (0, path.to_owned());
        for other in namespaces {
            key.0 = other;
            if other == event.mntns {
                continue;
            }
            let Some(inode) = self.names.get(&key).copied() else {
                continue;
            };
            self.note_removal(event, inode);
            if own.is_some() {
                self.names.remove(&key);
                self.unlink_object(inode, note);
            }
        }
    }

    /// An open from `mntns` of `removal`'s name found no such name: the removal is confirmed,
    /// and a name the namespace still had for it is gone.
    pub(super) fn confirm_removal(
        &mut self,
        mntns: u32,
        (dev, removal): &(u32, Removal),
        note: &mut Annotation,
    ) {
        let key = (mntns, removal.path.to_string());
        if let Some(inode) = self.names.get(&key).copied()
            && inode.dev == *dev
        {
            self.names.remove(&key);
            self.unlink_object(inode, note);
        }
    }

    /// `inode` lost its name: freed if nothing holds it either.
    pub(super) fn unlink_object(&mut self, inode: InodeId, note: &mut Annotation) {
        if let Some(object) = self.objects.get_mut(&inode) {
            object.linked = false;
        }
        self.free_if_released(inode, note);
    }

    /// An unlink of `inode`'s name: kept when someone other than its maker removed it while
    /// others still held it, so that an open of the name that then fails is told.
    pub(super) fn note_removal(&mut self, event: &Event, inode: InodeId) {
        let Some(object) = self.objects.get(&inode) else {
            return;
        };
        if object.fds + object.mappings == 0 || object.creator == Some(event.pid) {
            return;
        }
        let holders: Vec<(u32, String)> = self
            .processes
            .values()
            .filter(|p| p.pid != event.pid && p.alive())
            .filter(|p| {
                p.fds.values().any(|fd| fd.inode == inode)
                    || p.mappings.iter().any(|m| m.inode == inode)
            })
            .map(|p| (p.pid, p.comm.clone()))
            .collect();
        if holders.is_empty() {
            return;
        }
        let Some(path) = object.path.clone() else {
            return;
        };
        let remover = self.processes.get(&event.pid);
        let removal = Removal {
            path,
            ts_ns: event.ts_ns,
            remover: event.pid,
            remover_comm: event.comm.clone(),
            remover_mntns: event.mntns,
            remover_argv: remover.map(|p| p.argv.clone()).unwrap_or_default(),
            holders,
            maker: object.creator,
        };
        if self.removals.len() >= super::REMOVALS {
            self.removals.pop_front();
        }
        self.removals.push_back((inode.dev, removal));
    }

    /// The removal that a failed call of `event` meets: an open that found no such name,
    /// after someone other than its maker removed it while others held it; an unlink by one
    /// of those holders (its clean-up fails for that). The one judge of whether such an
    /// ENOENT is a failure ([`World::expected_error`], [`Annotation::name_removed`]).
    pub(super) fn removal_met(&self, event: &Event, call: &Call) -> Option<(u32, Removal)> {
        if call.errno() != Some(libc::ENOENT) {
            return None;
        }
        let path = call.display_path()?;
        match call.syscall {
            open if open.opens_a_path() => self.removal_of(&path, event.mntns),
            Syscall::Unlink | Syscall::Unlinkat => self
                .removal_of(&path, event.mntns)
                .filter(|(_, r)| r.holders.iter().any(|(pid, _)| *pid == event.pid)),
            _ => None,
        }
    }

    /// Why a failed call is part of the program's normal work, if it is, as the model sees it:
    /// [`Call::expected_error`], unless it meets a name someone else removed
    /// ([`World::removal_met`]). Asked before the call is applied (the pipeline reads /proc
    /// and measures /dev/shm at a failure), it answers as the call's annotation will
    /// ([`Annotation::expected_error`]).
    pub fn expected_error(&self, event: &Event, call: &Call) -> Option<&'static str> {
        match self.removal_met(event, call) {
            Some(_) => None,
            None => call.expected_error(),
        }
    }

    /// Whether an event shows the program hurt, as the model sees it before applying it:
    /// [`Event::is_failure`] with the model's answer for calls ([`World::expected_error`]);
    /// the event's annotation says the same after ([`Annotation::is_failure`]) and more
    /// (deaths asked for).
    pub fn is_failure(&self, event: &Event) -> bool {
        match &event.body {
            Body::Call(call) => call.failed() && self.expected_error(event, call).is_none(),
            _ => event.is_failure(),
        }
    }

    /// The removal of `path` that an open from `mntns` finding no such name follows: one in
    /// its own namespace, or on the same /dev/shm from another (a container sharing it, the
    /// host's clean-up).
    pub(super) fn removal_of(&self, path: &str, mntns: u32) -> Option<(u32, Removal)> {
        let mut candidates = self.removals.iter().rev().filter(|(_, r)| &*r.path == path);
        // What it opened there showed its /dev/shm; failing that, an object it was found
        // holding when tracing started.
        let own_dev = || {
            self.shm_dev(mntns).or_else(|| {
                self.objects
                    .values()
                    .find(|o| {
                        o.mntns == mntns
                            && o.path
                                .as_deref()
                                .is_some_and(|p| p.starts_with("/dev/shm/"))
                    })
                    .map(|o| o.inode.dev)
            })
        };
        candidates
            .clone()
            .find(|(_, r)| r.remover_mntns == mntns)
            .or_else(|| {
                let dev = own_dev()?;
                candidates.find(|(d, _)| *d == dev)
            })
            .cloned()
    }
}
