//! What the model says of one event: the object it acts on, where a fault address points,
//! what it freed.
use std::sync::Arc;

use crate::event::{Event, InodeId};

/// What the model adds to an event for display and diagnosis.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotation {
    /// Name of the /dev/shm object the event acts on.
    pub object_path: Option<Arc<str>>,
    /// For a fault signal: the mapping and file the address belongs to.
    pub fault: Option<FaultSite>,
    /// Objects whose memory this event released (their last descriptor and mapping went away
    /// after they were unlinked).
    pub freed: Vec<String>,
    /// The event touched nothing shmtrace follows (an `munmap` of other memory, say).
    pub irrelevant: bool,
    /// For the death of a process by a signal another process sent it on purpose (a parent
    /// ending its children at shutdown): the sender's pid, or 0 for a termination request
    /// (SIGTERM, SIGINT, SIGHUP) whose sender the probes do not see. Such a death is not a
    /// failure.
    pub killed_by: Option<u32>,
    /// For an unsuccessful exit: the process had nothing to do with shared memory (see
    /// [`crate::model::Process::involved`]), so its status is its own business.
    pub uninvolved_exit: bool,
}

impl Annotation {
    /// Whether the event shows the program hurt: a failure ([`Event::is_failure`]) other than
    /// a death another process asked for or the exit status of a process that never touched
    /// shared memory.
    pub fn is_failure(&self, event: &Event) -> bool {
        event.is_failure() && self.killed_by.is_none() && !self.uninvolved_exit
    }
}

/// Where a fault address points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultSite {
    pub path: String,
    pub inode: InodeId,
    /// Offset of the address inside the file.
    pub file_offset: u64,
    pub mapping_start: u64,
    pub mapping_len: u64,
    /// `i_size` of the file when last seen.
    pub file_size: i64,
}
