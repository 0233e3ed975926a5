//! A /dev/shm object: one inode, from creation to the moment its memory is given back.
use std::sync::Arc;

use crate::event::InodeId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmObject {
    pub inode: InodeId,
    /// The path it was opened by, or found under in /proc (escaped).
    pub path: Option<Arc<str>>,
    /// Mount namespace its name lives in.
    pub mntns: u32,
    /// `i_size` last seen.
    pub size: i64,
    /// Memory it held when last seen (`i_blocks * 512`).
    pub allocated: u64,
    /// Pages may have been added since `allocated` was counted: it was mapped since (pages
    /// written through a mapping show in no system call), or found in /proc uncounted.
    pub uncounted_writes: bool,
    /// Largest size requested for it, including requests that failed.
    pub peak_request: u64,
    /// Its name still exists in /dev/shm.
    pub linked: bool,
    /// Open descriptors, over all traced processes.
    pub fds: u32,
    /// Live mappings, over all traced processes.
    pub mappings: u32,
    /// The process that created it (`O_CREAT` that made a new file).
    pub creator: Option<u32>,
    pub first_seen_ns: u64,
    pub freed_ns: Option<u64>,
}

/// Where an object is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectState {
    /// Named in /dev/shm.
    Linked,
    /// Unlinked, but a descriptor or mapping keeps its memory: invisible to `ls /dev/shm`.
    UnlinkedHeld,
    /// Unlinked and released.
    Freed,
}

impl ShmObject {
    pub fn new(inode: InodeId, mntns: u32, ts_ns: u64) -> ShmObject {
        ShmObject {
            inode,
            path: None,
            mntns,
            size: 0,
            allocated: 0,
            uncounted_writes: false,
            peak_request: 0,
            linked: true,
            fds: 0,
            mappings: 0,
            creator: None,
            first_seen_ns: ts_ns,
            freed_ns: None,
        }
    }

    pub fn state(&self) -> ObjectState {
        if self.linked {
            ObjectState::Linked
        } else if self.fds > 0 || self.mappings > 0 {
            ObjectState::UnlinkedHeld
        } else {
            ObjectState::Freed
        }
    }

    /// `(demand, allocated)`: what the object takes once fully written (its size, or more if
    /// more was allocated), and what it holds now.
    pub fn footprint(&self) -> (u64, u64) {
        (self.allocated.max(self.size.max(0) as u64), self.allocated)
    }

    /// Memory it holds now, by pages rather than nominal size (a file sized by `ftruncate`
    /// and never written holds nothing): its pages as last counted, or its size when pages may
    /// have been written where no count saw them.
    pub fn held(&self) -> u64 {
        if self.uncounted_writes {
            self.footprint().0
        } else {
            self.allocated
        }
    }

    /// The name to show: the path, or the inode when no name was ever seen.
    pub fn display_name(&self) -> String {
        self.shared_name().to_string()
    }

    /// [`ShmObject::display_name`], shared with the object: an event's annotation names its
    /// object, and a copy of the name for every event was a tenth of the model's time.
    pub fn shared_name(&self) -> Arc<str> {
        match &self.path {
            Some(path) => Arc::clone(path),
            None => format!("<inode {} on {}>", self.inode.ino, self.inode.dev_string()).into(),
        }
    }
}
