//! What differs between the architectures the ptrace source runs on: the audit architecture
//! a seccomp filter checks, the calls that exist, and how a stopped thread's registers are
//! read and set to run one more system call in it (`inject`).
use std::io;

use libc::c_long;

/// `AUDIT_ARCH_X86_64` and `AUDIT_ARCH_AARCH64` (`linux/audit.h`): what `seccomp_data.arch`
/// holds for a native call. A filter passes every other (an ia32 or x32 call) untraced.
#[cfg(target_arch = "x86_64")]
pub const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
pub const AUDIT_ARCH: u32 = 0xc000_00b7;

/// x86-64 numbers x32 calls from here; they share the native audit architecture.
#[cfg(target_arch = "x86_64")]
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Calls only some architectures have (arm64 has no `open` and no `unlink`).
#[cfg(target_arch = "x86_64")]
pub const SYS_OPEN: Option<c_long> = Some(libc::SYS_open);
#[cfg(target_arch = "aarch64")]
pub const SYS_OPEN: Option<c_long> = None;
#[cfg(target_arch = "x86_64")]
pub const SYS_UNLINK: Option<c_long> = Some(libc::SYS_unlink);
#[cfg(target_arch = "aarch64")]
pub const SYS_UNLINK: Option<c_long> = None;
#[cfg(target_arch = "x86_64")]
pub const SYS_SETRLIMIT: Option<c_long> = Some(libc::SYS_setrlimit);
#[cfg(target_arch = "aarch64")]
pub const SYS_SETRLIMIT: Option<c_long> = None;
#[cfg(target_arch = "x86_64")]
pub const SYS_DUP2: Option<c_long> = Some(libc::SYS_dup2);
#[cfg(target_arch = "aarch64")]
pub const SYS_DUP2: Option<c_long> = None;

/// A stopped thread's registers.
#[derive(Clone, Copy)]
pub struct Registers(libc::user_regs_struct);

impl Registers {
    /// Reads them (`PTRACE_GETREGSET`, `NT_PRSTATUS`, which both architectures have).
    pub fn read(tid: i32) -> io::Result<Registers> {
        // SAFETY: user_regs_struct is plain data; zeroes are a valid value.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: (&raw mut regs).cast(),
            iov_len: size_of::<libc::user_regs_struct>(),
        };
        // SAFETY: the kernel writes at most iov_len bytes into `regs`.
        let done = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGSET,
                tid,
                libc::NT_PRSTATUS as usize,
                &raw mut iov,
            )
        };
        if done < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Registers(regs))
    }

    pub fn write(&self, tid: i32) -> io::Result<()> {
        let mut regs = self.0;
        let mut iov = libc::iovec {
            iov_base: (&raw mut regs).cast(),
            iov_len: size_of::<libc::user_regs_struct>(),
        };
        // SAFETY: the kernel reads iov_len bytes from `regs`.
        let done = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGSET,
                tid,
                libc::NT_PRSTATUS as usize,
                &raw mut iov,
            )
        };
        if done < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Where a stopped thread resumes.
    #[cfg(target_arch = "x86_64")]
    pub fn ip(&self) -> u64 {
        self.0.rip
    }
    #[cfg(target_arch = "aarch64")]
    pub fn ip(&self) -> u64 {
        self.0.pc
    }

    #[cfg(target_arch = "x86_64")]
    pub fn sp(&self) -> u64 {
        self.0.rsp
    }
    #[cfg(target_arch = "aarch64")]
    pub fn sp(&self) -> u64 {
        self.0.sp
    }

    /// The value a call returned, at its exit stop.
    #[cfg(target_arch = "x86_64")]
    pub fn result(&self) -> i64 {
        self.0.rax as i64
    }
    #[cfg(target_arch = "aarch64")]
    pub fn result(&self) -> i64 {
        self.0.regs[0] as i64
    }

    /// Sets them up, at a call's exit stop, to run the call instruction again as call `nr`
    /// with `args`: the instruction pointer steps back over the instruction that made the
    /// call (see [`CALL_INSTRUCTION`]).
    #[cfg(target_arch = "x86_64")]
    pub fn rerun_as(&self, nr: c_long, args: [u64; 6]) -> Registers {
        let mut regs = self.0;
        regs.rax = nr as u64;
        regs.orig_rax = nr as u64;
        regs.rdi = args[0];
        regs.rsi = args[1];
        regs.rdx = args[2];
        regs.r10 = args[3];
        regs.r8 = args[4];
        regs.r9 = args[5];
        regs.rip -= CALL_INSTRUCTION.len() as u64;
        Registers(regs)
    }
    #[cfg(target_arch = "aarch64")]
    pub fn rerun_as(&self, nr: c_long, args: [u64; 6]) -> Registers {
        let mut regs = self.0;
        regs.regs[8] = nr as u64;
        regs.regs[..6].copy_from_slice(&args);
        regs.pc -= CALL_INSTRUCTION.len() as u64;
        Registers(regs)
    }
}

/// The bytes of the instruction that makes a system call: `syscall` (x86-64), `svc #0`
/// (arm64). A call is run again only where the instruction before the stop is this one.
#[cfg(target_arch = "x86_64")]
pub const CALL_INSTRUCTION: [u8; 2] = [0x0f, 0x05];
#[cfg(target_arch = "aarch64")]
pub const CALL_INSTRUCTION: [u8; 4] = 0xd400_0001u32.to_le_bytes();

/// Bytes below the stack pointer a signal handler or a leaf function may use (x86-64's red
/// zone; arm64 has none, but keeps the stack 16-byte aligned): left alone when the stack is
/// borrowed.
#[cfg(target_arch = "x86_64")]
pub const RED_ZONE: u64 = 128;
#[cfg(target_arch = "aarch64")]
pub const RED_ZONE: u64 = 0;
