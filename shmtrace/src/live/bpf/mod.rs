//! Loading the eBPF programs into the kernel, and talking to them.
//!
//! `preflight` checks the machine can run them, `btf` reads the kernel's type information and
//! `offsets` resolves the kernel struct offsets they need, `arch` says what differs between
//! architectures, `hooks` lists what they attach to, `tracer` loads and attaches them and owns
//! their maps (`followed` and `supers` the two that userspace maps, through `mapped`),
//! `reader` streams their records, `detach` lets them go in the background, and `attaching`
//! keeps an earlier run's release out of a new run's way. Dropping the [`Tracer`] detaches and
//! unloads everything: nothing is pinned, so nothing outlives the process.
mod arch;
mod attaching;
mod btf;
mod detach;
mod followed;
mod hooks;
mod mapped;
mod offsets;
mod preflight;
mod reader;
mod supers;
mod tracer;

use std::path::PathBuf;

pub use preflight::check_privileges;
pub use reader::EventReader;
pub use tracer::{Tracer, TracerOptions};

/// The eBPF object built from `shmtrace-ebpf` by `cargo xtask build-ebpf`, committed so that
/// building the CLI needs only stable Rust.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("CARGO_MANIFEST_DIR"), "/bpf/shmtrace.bpf.o"));

/// Default location of the running kernel's BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why tracing could not start. Each message says what is wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error(
        "shmtrace needs root, or the CAP_BPF and CAP_PERFMON capabilities, to load eBPF programs \
         (this process has {missing}); run it with sudo"
    )]
    NotPrivileged { missing: String },
    #[error(
        "this kernel has no BTF type information ({path} is missing); shmtrace needs Linux 5.15 \
         or newer built with CONFIG_DEBUG_INFO_BTF=y"
    )]
    NoBtf { path: PathBuf },
    #[error(
        "this kernel is Linux {release}, and shmtrace needs Linux {}.{} or newer (its probes use \
         BPF atomics, from 5.12, and the bpf_task_pt_regs helper, from 5.15): run it on a node \
         with a newer kernel",
        preflight::MINIMUM_KERNEL.0,
        preflight::MINIMUM_KERNEL.1
    )]
    KernelTooOld { release: String },
    #[error("cannot read the kernel's BTF from {path}: {reason}")]
    BadBtf { path: PathBuf, reason: String },
    #[error(
        "this kernel's BTF has no {field}, which shmtrace reads; please report your kernel \
         version (uname -r) at the shmtrace issue tracker"
    )]
    MissingField { field: String },
    #[error(
        "this kernel does not support BPF ring buffers (BPF_MAP_TYPE_RINGBUF); shmtrace needs \
         Linux 5.15 or newer"
    )]
    NoRingBuffer,
    #[error(
        "tracefs is not mounted (no /sys/kernel/tracing/events: {reason}); shmtrace does not \
         mount file systems behind your back: mount it with \
         `mount -t tracefs nodev /sys/kernel/tracing`, then run shmtrace again"
    )]
    NoTracefs { reason: String },
    #[error(
        "tracefs is mounted at {path} but this process cannot read it ({reason}); with \
         CAP_BPF and CAP_PERFMON but not root, make it readable (mount -o remount,mode=755 \
         {path}, or a group given with gid=), or run shmtrace as root"
    )]
    TracefsUnreadable { path: PathBuf, reason: String },
    #[error(
        "cannot tell whether this process may load eBPF programs: reading its capabilities \
         from /proc/self/status failed ({reason}); is /proc mounted?"
    )]
    CapabilitiesUnreadable { reason: String },
    #[error(
        "this kernel lacks attach points shmtrace needs: {}. shmtrace uses syscall tracepoints \
         and raw tracepoints; a kernel built without CONFIG_FTRACE_SYSCALLS or with a different \
         tracepoint set cannot be traced",
        missing.join(", ")
    )]
    MissingHooks { missing: Vec<String> },
    #[error("--buffer-size must be a power of two and at least 4096 bytes, not {0}")]
    BadBufferSize(u32),
    #[error("loading the eBPF object failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    // The verifier's log comes with the source, which `{:#}` prints after this: naming it
    // here too would print the log twice.
    #[error(
        "the kernel refused program {program}, although it is new enough for shmtrace: please \
         report this with the output of `uname -r` and this message"
    )]
    Program {
        program: String,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
}

/// A map's error, named.
fn map_error(name: &'static str, source: aya::maps::MapError) -> BpfError {
    BpfError::Map {
        name,
        source: Box::new(source),
    }
}
