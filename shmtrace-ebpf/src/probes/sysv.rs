//! System V shared memory, reported for traced processes.
use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use shmtrace_common::Syscall;

use super::{
    stash,
    tracepoint::{enter_args, ids},
};
use crate::scope;

enter_args! {
    /// `syscalls/sys_enter_shmget`:
    /// ```text
    /// field:key_t key;    offset:16; size:8; signed:0;
    /// field:size_t size;  offset:24; size:8; signed:0;
    /// field:int shmflg;   offset:32; size:8; signed:0;
    /// ```
    ShmgetArgs { key, size, shmflg }
}

enter_args! {
    /// `syscalls/sys_enter_shmat`:
    /// ```text
    /// field:int shmid;        offset:16; size:8; signed:0;
    /// field:char * shmaddr;   offset:24; size:8; signed:0;
    /// field:int shmflg;       offset:32; size:8; signed:0;
    /// ```
    ShmatArgs { shmid, shmaddr, shmflg }
}

enter_args! {
    /// `syscalls/sys_enter_shmdt`:
    /// ```text
    /// field:char * shmaddr;   offset:16; size:8; signed:0;
    /// ```
    ShmdtArgs { shmaddr }
}

enter_args! {
    /// `syscalls/sys_enter_shmctl`:
    /// ```text
    /// field:int shmid;                offset:16; size:8; signed:0;
    /// field:int cmd;                  offset:24; size:8; signed:0;
    /// field:struct shmid_ds * buf;    offset:32; size:8; signed:0;
    /// ```
    ShmctlArgs { shmid, cmd, buf }
}

#[inline(always)]
fn enter(call: Syscall, args: impl FnOnce() -> [u64; 6]) {
    let (tgid, tid) = ids();
    if let Some(flags) = scope::in_scope(tgid) {
        stash::stash(tid, call, flags, -1, args());
    }
}

#[tracepoint]
pub fn sys_enter_shmget(ctx: TracePointContext) -> u32 {
    enter(Syscall::Shmget, || ShmgetArgs::read(&ctx).raw());
    0
}

#[tracepoint]
pub fn sys_enter_shmat(ctx: TracePointContext) -> u32 {
    enter(Syscall::Shmat, || ShmatArgs::read(&ctx).raw());
    0
}

#[tracepoint]
pub fn sys_enter_shmdt(ctx: TracePointContext) -> u32 {
    enter(Syscall::Shmdt, || ShmdtArgs::read(&ctx).raw());
    0
}

#[tracepoint]
pub fn sys_enter_shmctl(ctx: TracePointContext) -> u32 {
    enter(Syscall::Shmctl, || ShmctlArgs::read(&ctx).raw());
    0
}
