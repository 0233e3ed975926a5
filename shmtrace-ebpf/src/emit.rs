//! Writing records into the ring buffer, and counting what could not be written.
//!
//! Small records are built whole on the stack and copied in with one write ([`send`]); the two
//! big ones (a path, a command line) are filled in place in reserved memory ([`reserve`], then
//! [`submit`]). Every loss is counted in `LOST` by its reason ([`count`]).
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_smp_processor_id,
        bpf_ktime_get_boot_ns,
    },
    maps::ring_buf::RingBufEntry,
};
use shmtrace_common::{EventKind, FileRef, Header, KernelOffsets, Loss};

use crate::{
    kernel,
    maps::{EVENTS, config},
};

// `bpf_ringbuf_submit` and `bpf_ringbuf_query` flags (UAPI).
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

/// Counts one loss; it lives beside `LOST`, where `kernel`'s failed reads count too.
pub use crate::maps::count;

/// The header that starts every record, for the current task.
#[inline(always)]
pub fn header(kind: EventKind, flags: u16, off: &KernelOffsets) -> Header {
    let pid_tgid = bpf_get_current_pid_tgid();
    Header {
        kind: kind as u16,
        flags,
        // SAFETY: this helper has no preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        // SAFETY: this helper has no preconditions.
        ts_ns: unsafe { bpf_ktime_get_boot_ns() },
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        mntns: kernel::current_mntns(off).unwrap_or(0),
        _pad: 0,
        // SAFETY: this helper has no preconditions.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        comm: kernel::current_comm(off),
    }
}

/// A record's file when it has none. Read from a static the compiler cannot see into: zeros it
/// can see are written with a call to BPF's byte-at-a-time `memset`, on every record.
#[inline(always)]
pub fn no_file() -> FileRef {
    static NO_FILE: FileRef = FileRef {
        dev: 0,
        mode: 0,
        ino: 0,
        size: 0,
        blocks: 0,
    };
    // SAFETY: a read of a static.
    unsafe { core::ptr::read_volatile(&NO_FILE) }
}

/// Copies a whole record into the ring buffer, or counts it lost.
#[inline(always)]
pub fn send<T: Copy + 'static>(kind: EventKind, record: &T, urgent: bool) {
    if let Some(mut entry) = reserve::<T>(kind) {
        entry.write(*record);
        submit(entry, urgent);
    }
}

/// Reserves room for a `T` to fill in place, or counts a lost `kind` record.
#[inline(always)]
pub fn reserve<T: 'static>(kind: EventKind) -> Option<RingBufEntry<T>> {
    let entry = EVENTS.reserve::<T>(0);
    if entry.is_none() {
        count(Loss::RingFull(kind));
    }
    entry
}

/// Hands a record to userspace. Waking the reader costs several microseconds in the traced
/// call, so ordinary records do not (the reader also drains the ring on a timer); failures,
/// signals and deaths wake it at once, and so does every record while the ring is more than
/// `wakeup_bytes` full. That last cost (about a microsecond a record here) is deliberate: it
/// slows a traced process that makes records faster than the reader takes them, and so keeps
/// the trace whole. Waking the reader once per filling instead lost a quarter of the records
/// of a 4 KiB churn whose reader had half a CPU, where this lost none (docs/BENCHMARKS.md).
#[inline(always)]
pub fn submit<T>(entry: RingBufEntry<T>, urgent: bool) {
    let flags = if urgent || EVENTS.query(BPF_RB_AVAIL_DATA) > config().wakeup_bytes as u64 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    entry.submit(flags);
}
