//! Kernel programs of shmtrace: see which processes touch /dev/shm, how, and how it ends.
//!
//! Each hooked call has a thin entry point in `probes/`; shared machinery lives beside it:
//! `maps` (what the programs share with userspace), `kernel` (reading kernel structs through
//! offsets resolved at start-up), `scope` (which processes are traced), `emit` (ring buffer
//! records and loss counting), `tally` (failures counted in the kernel).
#![no_std]
#![no_main]
// The BPF target's `core` has atomic loads and stores but not `AtomicU64::fetch_or`: the
// intrinsics give LLVM's atomic OR, AND and add, which BPF has (`scope`'s `FOLLOWED` bitmap,
// `tally`'s counts).
#![feature(core_intrinsics)]
#![allow(
    internal_features,
    reason = "core::intrinsics::atomic_{or,and,xadd}, see above"
)]

mod emit;
mod kernel;
mod maps;
mod probes;
mod scope;
mod tally;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // The verifier rejects any reachable panic path, so this is never executed.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
