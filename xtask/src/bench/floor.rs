//! The floors: empty BPF programs on the hooks shmtrace uses (`cargo xtask floor -- CMD`), and
//! the same with one record per call (`cargo xtask floor --records -- CMD`).
//!
//! Enabling a syscall tracepoint costs every call something before any program does work; what
//! an empty program costs there is the least any tracer on those hooks can cost. The programs
//! are two instructions (`r0 = 0; exit`), loaded with the raw `bpf(2)` system call so that the
//! floor shares no code with shmtrace: plain tracepoint programs on the `syscalls/sys_*`
//! tracepoints shmtrace uses (both ends of the calls it traces at both, the one end of those
//! it traces at one, and the exits of `mount` and `fsconfig`) and `oom/mark_victim`, raw
//! tracepoint programs on the five scheduler and signal tracepoints.
//! Everything is detached when the process exits.
//!
//! The record floor is the least a tracer that reports every call can cost: where shmtrace
//! reports a call (its exit, or the entry of `close`), its program reserves a record the size of
//! shmtrace's call record in a ring buffer and submits it, unwritten, without waking the reader,
//! for every process (no scope check). Its ring is drained by a thread
//! ([`floor_ring`](super::floor_ring)).
use std::{
    ffi::CString,
    fs,
    os::fd::{FromRawFd, OwnedFd, RawFd},
    process::Command,
};

use anyhow::{Context, Result, bail};
use shmtrace_common::{Syscall, SyscallEvent};

use super::{bpf_syscall::bpf, floor_ring::DrainedRing};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `_IOW('$', 8, __u32)` and `_IO('$', 0)`.
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
/// `mov r0, 0` and `exit`, one 8-byte instruction each (opcode in the low byte).
const EMPTY_PROGRAM: [u64; 2] = [0xb7, 0x95];
/// Helper numbers (UAPI `enum bpf_func_id`), and `bpf_ringbuf_submit`'s flag.
const BPF_FUNC_RINGBUF_RESERVE: i32 = 131;
const BPF_FUNC_RINGBUF_SUBMIT: i32 = 132;
const BPF_RB_NO_WAKEUP: i32 = 1;
/// `src_reg` of a 64-bit immediate load that names a map by descriptor.
const BPF_PSEUDO_MAP_FD: u8 = 1;

/// The BTF tracepoints shmtrace attaches to, here as raw tracepoints.
pub const RAW_TRACEPOINTS: [&str; 5] = [
    "sched_process_fork",
    "sched_process_exec",
    "sched_process_exit",
    "task_rename",
    "signal_generate",
];

/// The prefix of `union bpf_attr` that `BPF_PROG_LOAD` reads; the rest stays zero.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    rest: [u64; 12],
}

#[repr(C)]
#[derive(Default)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    rest: [u64; 4],
}

/// `struct perf_event_attr` as 136 bytes (`PERF_ATTR_SIZE_VER8`): type and size share the first
/// word; config and sample_period follow; everything else stays zero.
#[repr(C)]
struct PerfEventAttr {
    type_and_size: u64,
    config: u64,
    sample_period: u64,
    rest: [u64; 14],
}

/// One instruction: opcode, registers, offset and immediate, as the kernel reads them.
fn insn(code: u8, dst: u8, src: u8, offset: i16, imm: i32) -> u64 {
    code as u64
        | ((dst | src << 4) as u64) << 8
        | (offset as u16 as u64) << 16
        | (imm as u32 as u64) << 32
}

/// `reserve(ring, size of a call record, 0)`; if that worked, `submit(record, NO_WAKEUP)`;
/// return 0.
fn record_program(ring_fd: i32) -> Vec<u64> {
    let record = std::mem::size_of::<SyscallEvent>() as i32;
    vec![
        insn(0x18, 1, BPF_PSEUDO_MAP_FD, 0, ring_fd), // r1 = the ring (two instructions)
        0,
        insn(0xb7, 2, 0, 0, record), // r2 = size
        insn(0xb7, 3, 0, 0, 0),      // r3 = 0
        insn(0x85, 0, 0, 0, BPF_FUNC_RINGBUF_RESERVE),
        insn(0x15, 0, 0, 3, 0), // if r0 == 0, skip to the end
        insn(0xbf, 1, 0, 0, 0), // r1 = r0
        insn(0xb7, 2, 0, 0, BPF_RB_NO_WAKEUP),
        insn(0x85, 0, 0, 0, BPF_FUNC_RINGBUF_SUBMIT),
        insn(0xb7, 0, 0, 0, 0), // r0 = 0
        insn(0x95, 0, 0, 0, 0), // exit
    ]
}

fn load(prog_type: u32, program: &[u64]) -> Result<OwnedFd> {
    let license = c"GPL";
    let mut attr = ProgLoadAttr {
        prog_type,
        insn_cnt: program.len() as u32,
        insns: program.as_ptr() as u64,
        license: license.as_ptr() as u64,
        ..Default::default()
    };
    attr.prog_name[..5].copy_from_slice(b"floor");
    bpf(BPF_PROG_LOAD, &mut attr).context("loading a floor BPF program")
}

fn attach_tracepoint(program: &OwnedFd, category: &str, name: &str) -> Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let id_path = format!("/sys/kernel/tracing/events/{category}/{name}/id");
    let id: u64 = fs::read_to_string(&id_path)
        .with_context(|| format!("reading {id_path}"))?
        .trim()
        .parse()
        .with_context(|| format!("{id_path} is not a number"))?;
    let mut attr = PerfEventAttr {
        type_and_size: PERF_TYPE_TRACEPOINT as u64
            | ((std::mem::size_of::<PerfEventAttr>() as u64) << 32),
        config: id,
        sample_period: 1,
        rest: [0; 14],
    };
    // SAFETY: a valid attribute; pid -1 on cpu 0 is how BPF tracepoint programs are attached.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &mut attr as *mut PerfEventAttr,
            -1,
            0,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("perf_event_open on {category}/{name}"));
    }
    // SAFETY: a new descriptor that nothing else owns.
    let event = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: ioctls on a perf event descriptor we own, with the argument types they take.
    unsafe {
        if libc::ioctl(
            event.as_raw_fd(),
            PERF_EVENT_IOC_SET_BPF,
            program.as_raw_fd(),
        ) != 0
            || libc::ioctl(event.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) != 0
        {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("attaching to {category}/{name}"));
        }
    }
    Ok(event)
}

fn attach_raw(program: &OwnedFd, name: &str) -> Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let name_c = CString::new(name)?;
    let mut attr = RawTracepointAttr {
        name: name_c.as_ptr() as u64,
        prog_fd: program.as_raw_fd() as u32,
        ..Default::default()
    };
    bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr)
        .with_context(|| format!("attaching to raw tracepoint {name}"))
}

/// The floor's programs, attached; dropping it detaches them.
pub struct Attached {
    _links: Vec<OwnedFd>,
    /// Declared last, so dropped after the programs that write into it.
    _ring: Option<DrainedRing>,
}

/// Attaches an empty program to every hook, or with `records`, the record program to the end of
/// every call where shmtrace reports it.
pub fn attach_all(records: bool) -> Result<Attached> {
    let tracepoint = load(BPF_PROG_TYPE_TRACEPOINT, &EMPTY_PROGRAM)?;
    let raw = load(BPF_PROG_TYPE_RAW_TRACEPOINT, &EMPTY_PROGRAM)?;
    let ring = records.then(DrainedRing::create).transpose()?;
    // The end of each call where shmtrace writes its record: the exit, or the entry of a call
    // traced there only.
    let reporting = match &ring {
        Some(ring) => load(BPF_PROG_TYPE_TRACEPOINT, &record_program(ring.map_fd()))?,
        None => tracepoint.try_clone()?,
    };
    let mut held = Vec::new();
    for name in RAW_TRACEPOINTS {
        held.push(attach_raw(&raw, name)?);
    }
    held.push(attach_tracepoint(&tracepoint, "oom", "mark_victim")?);
    // What shmtrace's probes watch for file systems made (`MOUNT_CALLS` in its loader).
    for call in ["mount", "fsconfig"] {
        held.push(attach_tracepoint(
            &tracepoint,
            "syscalls",
            &format!("sys_exit_{call}"),
        )?);
    }
    for call in Syscall::ALL {
        for phase in ["enter", "exit"] {
            if phase == "enter" && call.traced_at_exit_only()
                || phase == "exit" && call.traced_at_entry_only()
            {
                continue;
            }
            let name = format!("sys_{phase}_{}", call.name());
            let program = if phase == "exit" || call.traced_at_entry_only() {
                &reporting
            } else {
                &tracepoint
            };
            held.push(attach_tracepoint(program, "syscalls", &name)?);
        }
    }
    held.extend([tracepoint, raw, reporting]);
    Ok(Attached {
        _links: held,
        _ring: ring,
    })
}

/// `cargo xtask floor [--records] -- CMD`: runs CMD with the floor's programs attached, and
/// exits as it did.
pub fn run(command: &[String], records: bool) -> Result<()> {
    let Some((program, args)) = command.split_first() else {
        bail!("usage: cargo xtask floor [--records] -- COMMAND [ARGS...]");
    };
    let held = attach_all(records)?;
    let status = Command::new(program)
        .args(args)
        .status()
        .with_context(|| format!("running {program}"))?;
    drop(held);
    match status.code() {
        Some(code) => std::process::exit(code),
        None => bail!("{program} was killed: {status}"),
    }
}
