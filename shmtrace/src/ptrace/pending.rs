//! A call whose exit a traced thread is let run to: what `calls` decided at its entry.
use shmtrace_common::{FileRef, Syscall};

/// A call awaiting its exit.
pub struct Pending {
    pub what: What,
    pub flags: u16,
    pub args: [u64; 6],
    pub fd: i32,
    pub file: Option<FileRef>,
    pub path: Vec<u8>,
}

/// What to do at the exit.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// Report it.
    Report(Syscall),
    /// An open elsewhere: report it only if it failed for want of descriptors.
    FdLimitOnly(Syscall),
    /// A `recvmsg` that may carry descriptors: those on /dev/shm are watched, and it is
    /// reported if it dropped some.
    Receive,
    /// A `dup` of a /dev/shm descriptor: the copy is watched too.
    Duplicate,
}
