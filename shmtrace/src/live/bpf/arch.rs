//! What differs between the architectures the probes run on, and nothing else.
//!
//! The eBPF object is one for every architecture: syscall tracepoint records lay their
//! arguments out the same way everywhere, raw tracepoints take their arguments as an array,
//! and the kernel structs are read at offsets resolved from BTF. What is left is here, handed
//! to the probes at load time or used to choose their hooks:
//! - which `struct pt_regs` fields a system call's arguments were saved in, for the calls
//!   traced at their exit only;
//! - which traced calls the architecture has at all: arm64 (like every architecture that came
//!   after the generic system call table) has no `unlink`, only `unlinkat`, so there is no
//!   `sys_enter_unlink` tracepoint to attach to.
use shmtrace_common::Syscall;

use super::{
    BpfError,
    btf::{KernelBtf, field_offset},
};

/// An architecture shmtrace's probes run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "a binary uses its own architecture; the tests check every one's hooks"
    )
)]
pub enum KernelArch {
    X86_64,
    Aarch64,
}

impl KernelArch {
    #[cfg(test)]
    pub const ALL: [KernelArch; 2] = [KernelArch::X86_64, KernelArch::Aarch64];

    /// The architecture this binary runs on, and so the running kernel's: the probes trace the
    /// system calls of the kernel's own architecture (a 32-bit compat call is not traced).
    #[cfg(target_arch = "x86_64")]
    pub const HOST: KernelArch = KernelArch::X86_64;
    #[cfg(target_arch = "aarch64")]
    pub const HOST: KernelArch = KernelArch::Aarch64;

    /// Whether the architecture has this system call (and its tracepoints).
    pub fn has(self, call: Syscall) -> bool {
        match self {
            KernelArch::X86_64 => true,
            // The generic system call table of newer architectures has only the *at calls.
            KernelArch::Aarch64 => !matches!(call, Syscall::Unlink | Syscall::Open),
        }
    }

    /// Where the six system call arguments sit in `struct pt_regs`, in argument order, as the
    /// kernel saved them at entry.
    pub fn syscall_arg_registers(self, btf: &KernelBtf<'_>) -> Result<[u32; 6], BpfError> {
        let mut at = [0u32; 6];
        match self {
            // The system call convention: rdi, rsi, rdx, r10, r8, r9.
            KernelArch::X86_64 => {
                for (slot, register) in at.iter_mut().zip(["di", "si", "dx", "r10", "r8", "r9"]) {
                    *slot = field_offset(btf, "pt_regs", register)?;
                }
            }
            // x0 to x5; but x0 is overwritten by the return value before `sys_exit_*` runs,
            // so the first argument is read from `orig_x0`, which keeps it.
            KernelArch::Aarch64 => {
                at[0] = field_offset(btf, "pt_regs", "orig_x0")?;
                let regs = field_offset(btf, "pt_regs", "regs")?;
                for (n, slot) in at.iter_mut().enumerate().skip(1) {
                    // `u64 regs[31]`: x<n> is the n-th 8-byte element.
                    *slot = regs + 8 * n as u32;
                }
            }
        }
        Ok(at)
    }
}
