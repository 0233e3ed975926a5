//! The ptrace floor (`cargo xtask ptrace-floor -- CMD`): the stops shmtrace's ptrace source
//! makes in the churn, with nothing done at them but reading the call.
//!
//! A tracer that stops a program at its calls pays, at each stop, two switches between the
//! program and the tracer, and on a machine whose idle CPUs halt, the wake of whichever CPU
//! went idle. This floor makes the same stops as the ptrace source in the churn, 11 an object:
//! a seccomp filter stops the command at each of the churn's calls (`bench/churn.rs`, `CALLS`),
//! and the calls whose result the source awaits (the opens, `fallocate`, `write`, `mmap`,
//! `unlink`) are followed to their exit. At each stop it reads the call
//! (`PTRACE_GET_SYSCALL_INFO`, as any tracer must) and lets the command go on. It shares no
//! code with shmtrace and sleeps in `waitpid` between stops, as `strace` does.
use std::{ffi::CString, io};

use anyhow::{Context, Result, bail};

/// The calls the filter stops at, and whether the floor awaits each one's exit.
fn stops() -> Vec<(libc::c_long, bool)> {
    let mut stops = vec![
        (libc::SYS_openat, true),
        (libc::SYS_ftruncate, false),
        (libc::SYS_fallocate, true),
        (libc::SYS_write, true),
        (libc::SYS_mmap, true),
        (libc::SYS_munmap, false),
        (libc::SYS_close, false),
        (libc::SYS_unlinkat, true),
    ];
    #[cfg(target_arch = "x86_64")]
    stops.extend([(libc::SYS_open, true), (libc::SYS_unlink, true)]);
    stops
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_TRACE: u32 = 0x7ff0_0000;
/// The filter's data for a call whose exit is awaited (`PTRACE_GETEVENTMSG` reads it).
const AWAIT_EXIT: u32 = 1;
/// `PTRACE_GET_SYSCALL_INFO` and the size of `struct ptrace_syscall_info`.
const PTRACE_GET_SYSCALL_INFO: libc::c_uint = 0x420e;
const SYSCALL_INFO_SIZE: usize = 88;

/// The filter: for this architecture's calls, `SECCOMP_RET_TRACE` at those of [`stops`] (with
/// [`AWAIT_EXIT`] where awaited), `SECCOMP_RET_ALLOW` elsewhere.
fn filter() -> Vec<libc::sock_filter> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump_if_equal = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load_word = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ret = libc::BPF_RET | libc::BPF_K;
    let stops = stops();
    let mut program = vec![
        // `struct seccomp_data`: nr at 0, arch at 4.
        stmt(load_word, 4),
        jump_if_equal(AUDIT_ARCH, 1, 0),
        stmt(ret, SECCOMP_RET_ALLOW),
        stmt(load_word, 0),
    ];
    for (nr, await_exit) in stops {
        program.push(jump_if_equal(nr as u32, 0, 1));
        let data = if await_exit { AWAIT_EXIT } else { 0 };
        program.push(stmt(ret, SECCOMP_RET_TRACE | data));
    }
    program.push(stmt(ret, SECCOMP_RET_ALLOW));
    program
}

fn check(result: libc::c_long, what: &str) -> io::Result<libc::c_long> {
    if result < 0 {
        let error = io::Error::last_os_error();
        return Err(io::Error::new(error.kind(), format!("{what}: {error}")));
    }
    Ok(result)
}

/// Runs `command` under the floor; exits with its status.
pub fn run(command: &[String]) -> Result<()> {
    let args: Vec<CString> = command
        .iter()
        .map(|arg| CString::new(arg.as_str()))
        .collect::<Result<_, _>>()
        .context("a NUL in the command")?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|arg| arg.as_ptr()).collect();
    argv.push(std::ptr::null());
    let program = filter();
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: the child calls only async-signal-safe functions before exec or _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        bail!("fork: {}", io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: plain system calls on this process, with data prepared before the fork.
        unsafe {
            libc::ptrace(libc::PTRACE_TRACEME, 0, 0usize, 0usize);
            libc::raise(libc::SIGSTOP);
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &raw const fprog,
            );
            libc::execvp(argv[0], argv.as_ptr());
            libc::_exit(127);
        }
    }
    let status = trace(child)?;
    if libc::WIFEXITED(status) {
        std::process::exit(libc::WEXITSTATUS(status));
    }
    bail!("the command ended with wait status {status:#x}")
}

/// Answers every stop of `child` and its descendants until `child` ends; returns its status.
fn trace(child: libc::pid_t) -> Result<i32> {
    let mut status = 0;
    // SAFETY: waitpid writes the status into a local.
    let first = unsafe { libc::waitpid(child, &mut status, libc::__WALL) };
    check(
        first as libc::c_long,
        "waiting for the command's first stop",
    )?;
    let options = libc::PTRACE_O_TRACESECCOMP
        | libc::PTRACE_O_TRACESYSGOOD
        | libc::PTRACE_O_EXITKILL
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEVFORK
        | libc::PTRACE_O_TRACECLONE
        // An exec stops as an event, not with a SIGTRAP the command would be sent.
        | libc::PTRACE_O_TRACEEXEC;
    // SAFETY: ptrace requests on our stopped child; no memory is passed.
    unsafe {
        check(
            libc::ptrace(libc::PTRACE_SETOPTIONS, child, 0usize, options as usize),
            "PTRACE_SETOPTIONS",
        )?;
        check(
            libc::ptrace(libc::PTRACE_CONT, child, 0usize, 0usize),
            "PTRACE_CONT",
        )?;
    }
    let mut info = [0u8; SYSCALL_INFO_SIZE];
    loop {
        // SAFETY: as above.
        let tid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
        if tid < 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            bail!("waitpid: {error}");
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            if tid == child {
                return Ok(status);
            }
            continue;
        }
        let mut request = libc::PTRACE_CONT;
        let mut signal = 0;
        let stop = libc::WSTOPSIG(status);
        if status >> 16 == libc::PTRACE_EVENT_SECCOMP {
            let mut data: libc::c_ulong = 0;
            // SAFETY: the kernel writes the call's info and one unsigned long into locals.
            unsafe {
                libc::ptrace(PTRACE_GET_SYSCALL_INFO, tid, info.len(), info.as_mut_ptr());
                libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0usize, &raw mut data);
            }
            if data as u32 == AWAIT_EXIT {
                request = libc::PTRACE_SYSCALL;
            }
        } else if status >> 16 == 0 && stop == libc::SIGTRAP | 0x80 {
            // A call's exit: its result.
            // SAFETY: as above.
            unsafe { libc::ptrace(PTRACE_GET_SYSCALL_INFO, tid, info.len(), info.as_mut_ptr()) };
        } else if status >> 16 == 0 && stop != libc::SIGSTOP {
            // A signal on its way: delivered. (A new process's first SIGSTOP is not.)
            signal = stop;
        }
        // SAFETY: a ptrace request on a traced, stopped thread; ESRCH if it was killed.
        unsafe { libc::ptrace(request, tid, 0usize, signal as usize) };
    }
}
