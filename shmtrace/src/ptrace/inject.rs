//! Running one system call in a traced thread stopped at a call's exit: how a seccomp filter
//! is added to a process that is already running (`filter::descriptor`, `filter::munmap`).
//!
//! At the exit stop the instruction pointer is just past the instruction that made the call.
//! The registers are set to make it again, as `seccomp(SECCOMP_SET_MODE_FILTER,
//! SECCOMP_FILTER_FLAG_TSYNC, prog)` (every thread of the process gets the filter), the
//! program is written into the thread's stack well below its stack pointer, and the thread is
//! let run to that call's exit. Then the registers are put back as they were, the first call's
//! result with them, and its own memory below the stack pointer too. A signal that arrives
//! meanwhile is delivered as it would be (its handler runs on the stack above the program, and
//! returns to the call), and waited through.
use std::io;

use libc::c_long;

use super::{
    arch::{CALL_INSTRUCTION, RED_ZONE, Registers},
    filter::Program,
    memory::Mem,
    wait::{self, Stop},
};

/// Bytes below the stack pointer the program is written at: far below the frames of a
/// signal handler that may run before the call, and within the stack of any thread.
const SCRATCH_DEPTH: u64 = 32 << 10;

/// What became of the thread.
#[derive(Debug)]
pub enum Injected {
    /// The call ran and returned this (`-errno` on failure); the thread is stopped at the
    /// first call's exit again, as it was.
    Returned(i64),
    /// It could not be run here (the instruction before the stop is not a system call, the
    /// stack could not be written); the thread is as it was.
    NotHere(io::Error),
    /// The thread ended meanwhile, with this wait status.
    Ended(i32),
}

/// Adds `program` to the filters of the process of `tid`, stopped at a call's exit.
pub fn add_filter(tid: i32, program: &Program, mem: &mut Mem) -> Injected {
    let saved = match Registers::read(tid) {
        Ok(regs) => regs,
        Err(error) => return Injected::NotHere(error),
    };
    let mut before = [0u8; CALL_INSTRUCTION.len()];
    match mem.read(saved.ip() - before.len() as u64, &mut before) {
        Ok(n) if n == before.len() && before == CALL_INSTRUCTION => {}
        Ok(_) => {
            return Injected::NotHere(io::Error::other(
                "the stop is not just past a system call instruction",
            ));
        }
        Err(error) => return Injected::NotHere(error),
    }
    // struct sock_fprog { unsigned short len; struct sock_filter *filter; }, then the filter.
    let instructions = program.instructions();
    let size = 16 + 8 * instructions.len() as u64;
    let base = (saved.sp() - RED_ZONE - SCRATCH_DEPTH - size) & !15;
    let mut bytes = Vec::with_capacity(size as usize);
    bytes.extend((instructions.len() as u64).to_le_bytes());
    bytes.extend((base + 16).to_le_bytes());
    for insn in instructions {
        bytes.extend(insn.code.to_le_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend(insn.k.to_le_bytes());
    }
    let mut kept = vec![0u8; bytes.len()];
    if let Err(error) = mem.read(base, &mut kept).and_then(|n| {
        (n == kept.len())
            .then_some(())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
    }) {
        return Injected::NotHere(error);
    }
    if let Err(error) = mem.write(base, &bytes) {
        return Injected::NotHere(error);
    }
    let args = [
        libc::SECCOMP_SET_MODE_FILTER as u64,
        libc::SECCOMP_FILTER_FLAG_TSYNC,
        base,
        0,
        0,
        0,
    ];
    let outcome = run(tid, &saved, libc::SYS_seccomp, args);
    // Put back what the stack held, whatever happened (a thread that ended has no stack).
    if !matches!(outcome, Injected::Ended(_)) {
        let _ = mem.write(base, &kept);
    }
    outcome
}

/// Runs call `nr` in `tid` from its exit stop (`saved` its registers there), and puts them
/// back.
fn run(tid: i32, saved: &Registers, nr: c_long, args: [u64; 6]) -> Injected {
    if let Err(error) = saved.rerun_as(nr, args).write(tid) {
        return Injected::NotHere(error);
    }
    // To the call's entry, delivering any signal on the way, then to its exit.
    let mut signal = 0;
    let mut entered = false;
    let result = loop {
        if let Err(error) = wait::resume(tid, libc::PTRACE_SYSCALL, signal) {
            // The thread was killed: its end is waited for below.
            if error.raw_os_error() != Some(libc::ESRCH) {
                let _ = saved.write(tid);
                return Injected::NotHere(error);
            }
        }
        signal = 0;
        match wait::wait_for(tid) {
            Ok(Stop::Ended(status)) => return Injected::Ended(status),
            Ok(Stop::Syscall) if !entered => entered = true,
            Ok(Stop::Syscall) => match Registers::read(tid) {
                Ok(regs) => break regs.result(),
                Err(error) => return Injected::NotHere(error),
            },
            Ok(Stop::Signal(sig)) => signal = sig,
            // A group stop (job control) holds the thread until it is continued.
            Ok(Stop::JobControl) => {
                let _ = wait::listen(tid);
                match wait::wait_for(tid) {
                    Ok(Stop::Ended(status)) => return Injected::Ended(status),
                    Ok(_) => {}
                    Err(error) => return Injected::NotHere(error),
                }
            }
            Ok(_) => {}
            Err(error) => return Injected::NotHere(error),
        }
    };
    match saved.write(tid) {
        Ok(()) => Injected::Returned(result),
        Err(error) => Injected::NotHere(error),
    }
}
