//! The seccomp filters, in classic BPF, that decide in the kernel which calls stop the traced
//! program (`SECCOMP_RET_TRACE`) and which run untouched (`SECCOMP_RET_ALLOW`), the way
//! `strace --seccomp-bpf` does. A filter sees a call's number and arguments, not what they
//! point to, so:
//!
//! - [`base`], installed before the command runs: every call that names a path (`open`,
//!   `openat`, `openat2`, `unlink`, `unlinkat`, `statfs`, `memfd_create`: only the path says
//!   whether it is /dev/shm's), System V shared memory, `recvmsg` (descriptors arrive in it),
//!   `prctl(PR_SET_NAME)`, `ptrace`, and the calls that change a descriptor limit. Nothing
//!   that acts on a descriptor stops here.
//! - [`descriptor`], added to a process once one of its descriptors is found to be a /dev/shm
//!   object (`inject` runs `seccomp(2)` in it): `write`, `ftruncate`, `fallocate`, `close`,
//!   `fstatfs`, the `dup`s and `fcntl` on that descriptor number, and `mmap` of it. So a
//!   `write` stops the program only when its descriptor is, or was, a /dev/shm object, and
//!   every other `write` (a log, a pipe, a socket) runs at full speed.
//! - [`munmap`], added to a process once it maps a /dev/shm object: its `munmap`s, which keep
//!   its mappings current so that a SIGBUS address can be traced to its file.
//!
//! Filters stack and cannot be removed: a number whose descriptor is closed and reused for a
//! pipe still stops the program at that pipe's writes, and the tracer lets them go on (one
//! stop each, counted). Calls of another architecture (ia32, x32) are not traced.
use libc::{c_long, sock_filter};

use super::arch;

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
/// Only x86-64's filter compares (it tells x32 calls apart by number); the tests'
/// interpreter knows the instruction on every architecture.
#[cfg(any(target_arch = "x86_64", test))]
const JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// The low 32 bits of argument `i` (little-endian): a descriptor is an `int`, and the upper
/// half of its register is not the call's business.
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}

const TRACE: u32 = libc::SECCOMP_RET_TRACE;
const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

/// `PR_SET_NAME`: a thread names itself (PyTorch's `pt_data_worker`).
const PR_SET_NAME: u32 = 15;

/// A classic BPF program being put together.
#[derive(Default)]
pub struct Program(Vec<sock_filter>);

impl Program {
    fn push(&mut self, code: u16, jt: u8, jf: u8, k: u32) {
        self.0.push(sock_filter { code, jt, jf, k });
    }

    fn load(&mut self, offset: u32) {
        self.push(LD_W_ABS, 0, 0, offset);
    }

    fn ret(&mut self, value: u32) {
        self.push(RET_K, 0, 0, value);
    }

    /// Allows calls of another architecture, then loads the call's number. x86-64's x32
    /// calls share the native audit architecture and are told apart by their numbers.
    fn native_calls_only(&mut self) {
        self.load(ARCH);
        self.push(JEQ_K, 1, 0, arch::AUDIT_ARCH);
        self.ret(ALLOW);
        self.load(NR);
        #[cfg(target_arch = "x86_64")]
        {
            self.push(JGE_K, 0, 1, arch::X32_SYSCALL_BIT);
            self.ret(ALLOW);
        }
    }

    /// Traces call `nr` (the call's number is loaded, and still is after).
    fn trace(&mut self, nr: c_long) {
        self.push(JEQ_K, 0, 1, nr as u32);
        self.ret(TRACE);
    }

    /// Traces call `nr` when the low half of argument `arg` is `value`; the call's number is
    /// loaded again after.
    fn trace_if(&mut self, nr: c_long, arg: u32, value: u32) {
        self.push(JEQ_K, 0, 4, nr as u32);
        self.load(arg_low(arg));
        self.push(JEQ_K, 0, 1, value);
        self.ret(TRACE);
        self.load(NR);
    }

    pub fn instructions(&self) -> &[sock_filter] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// The filter a traced command starts with.
pub fn base() -> Program {
    let mut p = Program::default();
    p.native_calls_only();
    for nr in [
        Some(libc::SYS_openat),
        Some(libc::SYS_openat2),
        arch::SYS_OPEN,
        Some(libc::SYS_unlinkat),
        arch::SYS_UNLINK,
        Some(libc::SYS_statfs),
        Some(libc::SYS_memfd_create),
        Some(libc::SYS_shmget),
        Some(libc::SYS_shmat),
        Some(libc::SYS_shmdt),
        Some(libc::SYS_shmctl),
        Some(libc::SYS_recvmsg),
        Some(libc::SYS_ptrace),
        Some(libc::SYS_prlimit64),
        arch::SYS_SETRLIMIT,
    ]
    .into_iter()
    .flatten()
    {
        p.trace(nr);
    }
    p.trace_if(libc::SYS_prctl, 0, PR_SET_NAME);
    p.ret(ALLOW);
    p
}

/// The calls on a descriptor (its first argument) that concern a /dev/shm object.
pub fn descriptor_calls() -> impl Iterator<Item = c_long> {
    [
        Some(libc::SYS_write),
        Some(libc::SYS_ftruncate),
        Some(libc::SYS_fallocate),
        Some(libc::SYS_close),
        Some(libc::SYS_fstatfs),
        Some(libc::SYS_dup),
        arch::SYS_DUP2,
        Some(libc::SYS_dup3),
        Some(libc::SYS_fcntl),
    ]
    .into_iter()
    .flatten()
}

/// The filter that traces calls on descriptor `fd`, and mappings of it.
pub fn descriptor(fd: i32) -> Program {
    let fd = fd as u32;
    let mut p = Program::default();
    p.native_calls_only();
    p.trace_if(libc::SYS_mmap, 4, fd);
    // Every other call here takes the descriptor first: one look at it sends the rest away.
    p.load(arg_low(0));
    p.push(JEQ_K, 1, 0, fd);
    p.ret(ALLOW);
    p.load(NR);
    for nr in descriptor_calls() {
        p.trace(nr);
    }
    p.ret(ALLOW);
    p
}

/// The filter that traces every `munmap`.
pub fn munmap() -> Program {
    let mut p = Program::default();
    p.native_calls_only();
    p.trace(libc::SYS_munmap);
    p.ret(ALLOW);
    p
}

/// What each filter of a chain costs beyond its instructions, against the kernel's limit of
/// 32768 (`MAX_INSNS_PER_PATH`).
pub const FILTER_OVERHEAD: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions these filters use, over a
    /// `seccomp_data` of the native architecture.
    fn run(program: &Program, arch: u32, nr: c_long, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend((nr as u32).to_le_bytes());
        data.extend(arch.to_le_bytes());
        data.extend(0u64.to_le_bytes());
        for arg in args {
            data.extend(arg.to_le_bytes());
        }
        let insns = program.instructions();
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let insn = insns[pc];
            pc += 1;
            match insn.code {
                LD_W_ABS => {
                    let at = insn.k as usize;
                    a = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                }
                JEQ_K | JGE_K => {
                    let taken = if insn.code == JEQ_K {
                        a == insn.k
                    } else {
                        a >= insn.k
                    };
                    pc += usize::from(if taken { insn.jt } else { insn.jf });
                }
                RET_K => return insn.k,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    const NATIVE: u32 = arch::AUDIT_ARCH;

    #[test]
    fn the_base_filter_stops_paths_and_passes_descriptors() {
        let base = base();
        let traced = |nr, args| run(&base, NATIVE, nr, args) == TRACE;
        assert!(traced(libc::SYS_openat, [0; 6]));
        assert!(traced(libc::SYS_openat2, [0; 6]));
        assert!(traced(libc::SYS_unlinkat, [0; 6]));
        assert!(traced(libc::SYS_recvmsg, [0; 6]));
        assert!(traced(libc::SYS_shmget, [0; 6]));
        assert!(traced(libc::SYS_prctl, [15, 0, 0, 0, 0, 0]));
        assert!(!traced(libc::SYS_prctl, [16, 0, 0, 0, 0, 0]));
        // A descriptor's calls and every other call run untouched.
        for nr in [
            libc::SYS_write,
            libc::SYS_close,
            libc::SYS_mmap,
            libc::SYS_read,
            libc::SYS_getpid,
        ] {
            assert!(!traced(nr, [3, 0, 0, 0, 3, 0]), "call {nr}");
        }
        // Another architecture's openat is let through.
        assert_eq!(run(&base, 0x4000_0003, libc::SYS_openat, [0; 6]), ALLOW);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            run(&base, NATIVE, libc::SYS_openat | X32, [0; 6]),
            ALLOW,
            "x32"
        );
    }

    #[cfg(target_arch = "x86_64")]
    const X32: c_long = arch::X32_SYSCALL_BIT as c_long;

    #[test]
    fn a_descriptor_filter_stops_only_that_descriptor() {
        let filter = descriptor(11);
        let traced = |nr, args| run(&filter, NATIVE, nr, args) == TRACE;
        for nr in descriptor_calls() {
            assert!(traced(nr, [11, 0, 0, 0, 0, 0]), "call {nr} on 11");
            assert!(!traced(nr, [12, 0, 0, 0, 0, 0]), "call {nr} on 12");
        }
        // The upper half of the register is not looked at.
        assert!(traced(
            libc::SYS_write,
            [0xffff_ffff_0000_000b, 0, 0, 0, 0, 0]
        ));
        assert!(traced(libc::SYS_mmap, [0, 4096, 3, 1, 11, 0]));
        assert!(!traced(libc::SYS_mmap, [11, 4096, 3, 1, 12, 0]));
        assert!(!traced(libc::SYS_read, [11, 0, 0, 0, 0, 0]));
        assert!(!traced(libc::SYS_openat, [11, 0, 0, 0, 0, 0]));
        assert!(
            descriptor(11).len() < 40,
            "{} instructions",
            descriptor(11).len()
        );
    }

    #[test]
    fn the_munmap_filter_stops_munmap_only() {
        let filter = munmap();
        assert_eq!(run(&filter, NATIVE, libc::SYS_munmap, [0; 6]), TRACE);
        assert_eq!(run(&filter, NATIVE, libc::SYS_mmap, [0; 6]), ALLOW);
    }
}
