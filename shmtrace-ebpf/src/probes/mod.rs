//! One module per kind of call. Each entry point is a thin `#[tracepoint]` or
//! `#[raw_tracepoint]` named exactly after the kernel tracepoint it attaches to; the loader
//! relies on that.
//!
//! What the syscall programs share lives beside them, one job a file: `tracepoint` (the
//! tracepoints' records, a call's arguments at its exit), `stash` (a call seen at its entry,
//! waiting for its exit), `shm_check` (whether a path or a descriptor is on /dev/shm),
//! `report` (a finished call's record) and `recvmsg_exit` (what a `recvmsg` left in its
//! message, which `stash`'s exit reads).
mod fd_calls;
mod memfd;
mod mounts;
mod oom;
mod open;
mod process;
mod recvmsg;
mod recvmsg_exit;
mod report;
mod shm_check;
mod signal;
mod stash;
mod statfs;
mod sysv;
mod tracepoint;
mod unlink;
