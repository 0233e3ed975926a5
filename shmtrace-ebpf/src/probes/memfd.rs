//! `memfd_create`: anonymous shared memory, reported for traced processes.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::Syscall;

use super::{
    stash,
    tracepoint::{enter_args, ids},
};
use crate::scope;

enter_args! {
    /// `syscalls/sys_enter_memfd_create`:
    /// ```text
    /// field:const char * uname;   offset:16; size:8; signed:0;
    /// field:unsigned int flags;   offset:24; size:8; signed:0;
    /// ```
    MemfdCreateArgs { uname, flags }
}

#[tracepoint]
pub fn sys_enter_memfd_create(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = ids();
    if let Some(flags) = scope::in_scope(tgid) {
        let args = MemfdCreateArgs::read(&ctx);
        stash::stash(tid, Syscall::MemfdCreate, flags, -1, args.raw());
    }
    0
}
