//! What the model says of one event: the object it acts on, where a fault address points,
//! what it freed.
use std::sync::Arc;

use crate::event::{Call, Event, InodeId};

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
    /// For an open that found no such name: the name was there in this trace, and another
    /// process than its maker removed it while others still held it (a clean-up script, a
    /// sibling's clean-up). Such an ENOENT is a failure, not an existence check.
    pub name_removed: Option<Removal>,
}

/// A /dev/shm name removed by a process other than its maker while others still held it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removal {
    pub path: Arc<str>,
    pub ts_ns: u64,
    pub remover: u32,
    pub remover_comm: String,
    /// The remover's mount namespace (its container).
    pub remover_mntns: u32,
    /// Its command line, as its exec showed it.
    pub remover_argv: Vec<String>,
    /// Who still had it open or mapped: pid and name.
    pub holders: Vec<(u32, String)>,
    pub maker: Option<u32>,
}

impl Annotation {
    /// Whether the event shows the program hurt: a failure ([`Event::is_failure`]) other than
    /// a death another process asked for or the exit status of a process that never touched
    /// shared memory.
    pub fn is_failure(&self, event: &Event) -> bool {
        (event.is_failure() || self.name_removed.is_some())
            && self.killed_by.is_none()
            && !self.uninvolved_exit
    }

    /// Why a failed call is part of the program's normal work ([`Call::expected_error`]),
    /// unless what the model knows says otherwise: an open of a name someone else removed.
    /// The same answer as `World::expected_error` gave before the call was applied.
    pub fn expected_error(&self, call: &Call) -> Option<&'static str> {
        if self.name_removed.is_some() {
            return None;
        }
        call.expected_error()
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
