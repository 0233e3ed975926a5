//! One module per hooked call. Each entry point is a thin `#[tracepoint]` or `#[raw_tracepoint]`
//! named exactly after the kernel tracepoint it attaches to; the loader relies on that.
mod fd_calls;
mod memfd;
mod oom;
mod open;
mod process;
mod recvmsg;
mod signal;
mod statfs;
mod syscall;
mod sysv;
mod unlink;
