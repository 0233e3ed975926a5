//! A process as /proc shows it, for the model to start from (the caller reads /proc; the
//! model never does).
use crate::event::InodeId;

/// A process as /proc showed it when shmtrace first met it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcSnapshot {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub exe: Option<String>,
    pub argv: Vec<String>,
    pub mntns: u32,
    /// Its pid in its own pid namespace (`NSpid` in /proc/PID/status), when that differs.
    pub nspid: Option<u32>,
    pub fds: Vec<SnapshotFd>,
    pub mappings: Vec<SnapshotMapping>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFd {
    pub fd: i32,
    pub inode: InodeId,
    /// Path as /proc shows it, without the ` (deleted)` suffix.
    pub path: String,
    pub deleted: bool,
    pub cloexec: bool,
    pub size: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotMapping {
    pub start: u64,
    pub len: u64,
    pub offset: u64,
    pub inode: InodeId,
    pub path: String,
    pub deleted: bool,
}
