//! What every syscall tracepoint program shares: the layout of the tracepoints' records, the
//! arguments of a call read at its exit, and the caller's ids.
use aya_ebpf::{EbpfContext, helpers::bpf_get_current_pid_tgid, programs::TracePointContext};
use shmtrace_common::KernelOffsets;

use crate::kernel::{self, Current};

/// Every syscall tracepoint record starts with the same fields:
/// ```text
/// field:unsigned short common_type;         offset:0; size:2; signed:0;
/// field:unsigned char common_flags;         offset:2; size:1; signed:0;
/// field:unsigned char common_preempt_count; offset:3; size:1; signed:0;
/// field:int common_pid;                     offset:4; size:4; signed:1;
/// field:int __syscall_nr;                   offset:8; size:4; signed:1;
/// ```
/// The arguments (`sys_enter_*`) or the return value (`sys_exit_*`) follow from offset 16, each
/// in 8 bytes whatever its C type. This reads the 8-byte word `slot` of them.
///
/// A plain load: the verifier lets a tracepoint program read its record directly, at a constant
/// offset. `read_at` would copy it through `bpf_probe_read`, a helper call that every process
/// on the host would pay on every traced call, before the scope check could turn it away.
#[inline(always)]
pub fn record_word(ctx: &TracePointContext, slot: usize) -> u64 {
    // SAFETY: every syscall tracepoint record holds the words its format lists; callers read
    // only those.
    unsafe { *(ctx.as_ptr() as *const u64).add(2 + slot) }
}

/// Defines the arguments of a `sys_enter_*` record, one 8-byte slot each, named as in the
/// tracepoint's format. `read` loads them (see [`record_word`]); `raw()` gives them in order,
/// as records carry them.
macro_rules! enter_args {
    ($(#[$doc:meta])* $name:ident { $($field:ident),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name {
            $(pub $field: u64,)+
        }

        impl $name {
            #[inline(always)]
            #[allow(unused_assignments, reason = "the slot after the last is not read")]
            pub fn read(ctx: &aya_ebpf::programs::TracePointContext) -> $name {
                let mut slot = 0;
                $(
                    let $field = $crate::probes::tracepoint::record_word(ctx, slot);
                    slot += 1;
                )+
                $name { $($field,)+ }
            }

            #[inline(always)]
            #[allow(unused_assignments, dead_code, reason = "not every call stashes them raw")]
            pub fn raw(&self) -> [u64; 6] {
                let mut out = [0u64; 6];
                let mut i = 0;
                $(
                    out[i] = self.$field;
                    i += 1;
                )+
                // The unused slots are zeroed word by word, and the whole read back opaquely:
                // zeros the compiler can see become a call to the byte-at-a-time `memset` BPF
                // programs get.
                while i < 6 {
                    // SAFETY: `i` is in bounds.
                    unsafe { core::ptr::write_volatile(&mut out[i], 0) };
                    i += 1;
                }
                // SAFETY: a read of a local.
                unsafe { core::ptr::read_volatile(&out) }
            }
        }
    };
}
pub(crate) use enter_args;

/// What the current call returned, in a `sys_exit_*` program. Its records are all alike:
/// ```text
/// field:long ret; offset:16; size:8; signed:1;
/// ```
#[inline(always)]
pub fn exit_ret(ctx: &TracePointContext) -> i64 {
    record_word(ctx, 0) as i64
}

/// The current call's first `count` arguments, read at its exit; the other slots are zero, as
/// in a `sys_enter_*` record of a call with fewer arguments.
#[inline(always)]
pub fn args_at_exit(task: Current, count: usize, off: &KernelOffsets) -> [u64; 6] {
    let mut args = kernel::syscall_args(task, off);
    let mut i = count;
    while i < 6 {
        // SAFETY: `i` is in bounds.
        unsafe { core::ptr::write_volatile(&mut args[i], 0) };
        i += 1;
    }
    // Written and read back opaquely: zeros the compiler can see become a call to BPF's
    // byte-at-a-time `memset`.
    // SAFETY: a read of a local.
    unsafe { core::ptr::read_volatile(&args) }
}

/// `AT_FDCWD`.
pub const AT_FDCWD: i32 = -100;

/// The current thread's ids: (tgid, tid).
#[inline(always)]
pub fn ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}
