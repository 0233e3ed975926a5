//! Waiting for traced threads and resuming them: what a wait status says (the kinds of
//! ptrace stop), in one place.
use std::{
    io,
    time::{Duration, Instant},
};

/// What a thread reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// It ended; the raw wait status (exit code or signal).
    Ended(i32),
    /// A system call's entry or exit (`PTRACE_SYSCALL`, with `PTRACE_O_TRACESYSGOOD`).
    Syscall,
    /// A seccomp filter returned `SECCOMP_RET_TRACE`: a call's entry.
    Seccomp,
    /// `PTRACE_EVENT_FORK`, `_VFORK`, `_CLONE` or `_EXEC`.
    Event(i32),
    /// It entered a group stop (job control: SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU).
    JobControl,
    /// A stop of ptrace's own: a new thread's first, an interrupt, a listener woken.
    Interrupt,
    /// A signal is about to be delivered to it.
    Signal(i32),
}

const SYSCALL_TRAP: i32 = libc::SIGTRAP | 0x80;

pub fn classify(status: i32) -> Stop {
    if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
        return Stop::Ended(status);
    }
    let signal = libc::WSTOPSIG(status);
    match status >> 16 {
        0 if signal == SYSCALL_TRAP => Stop::Syscall,
        0 => Stop::Signal(signal),
        libc::PTRACE_EVENT_SECCOMP => Stop::Seccomp,
        libc::PTRACE_EVENT_STOP => match signal {
            libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU => Stop::JobControl,
            _ => Stop::Interrupt,
        },
        event => Stop::Event(event),
    }
}

/// How long [`wait_any`] asks for a report without sleeping before it sleeps for one.
///
/// A program that stops at its calls often stops again within microseconds of being let go.
/// A tracer that slept meanwhile must be woken, and its CPU with it: on a virtual machine
/// whose idle CPUs halt (this project's, where the guest does not poll before halting), that
/// wake was most of what a stop cost: a stop alone cost about 62 µs, against 9.5 µs with the
/// program and its tracer on one CPU (docs/unprivileged.md, "What a stop costs"). Asking
/// again for this long first, yielding the CPU to anything else that would run on it between
/// asks, catches the next stop awake; a program that computes for longer costs this much CPU
/// once per stop.
const ASK_BEFORE_SLEEPING: Duration = Duration::from_micros(200);

/// The next report of any traced thread (or child): its id and raw status.
pub fn wait_any() -> io::Result<(i32, i32)> {
    let asking_since = Instant::now();
    loop {
        if let Some(report) = wait_pid_now(-1)? {
            return Ok(report);
        }
        if asking_since.elapsed() >= ASK_BEFORE_SLEEPING {
            return waitpid(-1, 0);
        }
        // SAFETY: no preconditions; it cannot fail on Linux.
        unsafe { libc::sched_yield() };
    }
}

/// A report already waiting, if any: `waitpid` with `WNOHANG`.
fn wait_pid_now(pid: i32) -> io::Result<Option<(i32, i32)>> {
    let (tid, status) = waitpid(pid, libc::WNOHANG)?;
    Ok((tid != 0).then_some((tid, status)))
}

/// The next report of thread `tid`.
pub fn wait_for(tid: i32) -> io::Result<Stop> {
    waitpid(tid, 0).map(|(_, status)| classify(status))
}

/// `waitpid(pid, __WALL | flags)`, asked again when a signal interrupts it.
fn waitpid(pid: i32, flags: i32) -> io::Result<(i32, i32)> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status into a local.
        let tid = unsafe { libc::waitpid(pid, &mut status, libc::__WALL | flags) };
        if tid >= 0 {
            return Ok((tid, status));
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINTR) {
            return Err(error);
        }
    }
}

/// Resumes `tid` with `request` (`PTRACE_CONT`, `PTRACE_SYSCALL`), delivering `signal`.
pub fn resume(tid: i32, request: libc::c_uint, signal: i32) -> io::Result<()> {
    // SAFETY: a ptrace request on a thread we trace; no memory is passed.
    let done = unsafe { libc::ptrace(request, tid, 0usize, signal as usize) };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Leaves `tid` in its group stop until it is continued (SIGCONT), reported then.
pub fn listen(tid: i32) -> io::Result<()> {
    resume(tid, libc::PTRACE_LISTEN, 0)
}

/// `PTRACE_GETEVENTMSG`: the new thread of a fork event, the former id of an exec.
pub fn event_message(tid: i32) -> io::Result<u64> {
    let mut message: libc::c_ulong = 0;
    // SAFETY: the kernel writes one unsigned long.
    let done = unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0usize, &raw mut message) };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(message as u64)
}

/// `PTRACE_GETSIGINFO` at a signal-delivery stop.
pub fn signal_info(tid: i32) -> io::Result<libc::siginfo_t> {
    // SAFETY: siginfo_t is plain data; the kernel fills it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let done = unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, tid, 0usize, &raw mut info) };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// What a syscall stop shows (`PTRACE_GET_SYSCALL_INFO`, Linux 5.3).
#[derive(Clone, Copy, Debug)]
pub enum CallInfo {
    /// At entry, or at a seccomp stop: the call and its arguments.
    Entry { nr: i64, args: [u64; 6] },
    /// At exit: its return value (`-errno` on failure).
    Exit { ret: i64, is_error: bool },
    /// Not at a call.
    None,
}

/// `struct ptrace_syscall_info`.
#[repr(C)]
#[derive(Default)]
struct RawInfo {
    op: u8,
    _pad: u8,
    _flags: u16,
    _arch: u32,
    _ip: u64,
    _sp: u64,
    data: [u64; 8],
}

const OP_ENTRY: u8 = 1;
const OP_EXIT: u8 = 2;
const OP_SECCOMP: u8 = 3;

pub fn call_info(tid: i32) -> io::Result<CallInfo> {
    let mut raw = RawInfo::default();
    // SAFETY: the kernel writes at most the size given into `raw`.
    let done = unsafe {
        libc::ptrace(
            libc::PTRACE_GET_SYSCALL_INFO,
            tid,
            size_of::<RawInfo>(),
            &raw mut raw,
        )
    };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    let args = [
        raw.data[1],
        raw.data[2],
        raw.data[3],
        raw.data[4],
        raw.data[5],
        raw.data[6],
    ];
    Ok(match raw.op {
        OP_ENTRY | OP_SECCOMP => CallInfo::Entry {
            nr: raw.data[0] as i64,
            args,
        },
        OP_EXIT => CallInfo::Exit {
            ret: raw.data[0] as i64,
            is_error: raw.data[1] as u8 != 0,
        },
        _ => CallInfo::None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_wait_statuses() {
        assert_eq!(classify(3 << 8), Stop::Ended(3 << 8));
        assert_eq!(classify(libc::SIGBUS), Stop::Ended(libc::SIGBUS));
        let stopped = |signal: i32, event: i32| (event << 16) | (signal << 8) | 0x7f;
        assert_eq!(classify(stopped(SYSCALL_TRAP, 0)), Stop::Syscall);
        assert_eq!(
            classify(stopped(libc::SIGBUS, 0)),
            Stop::Signal(libc::SIGBUS)
        );
        assert_eq!(
            classify(stopped(libc::SIGTRAP, libc::PTRACE_EVENT_SECCOMP)),
            Stop::Seccomp
        );
        assert_eq!(
            classify(stopped(libc::SIGTSTP, libc::PTRACE_EVENT_STOP)),
            Stop::JobControl
        );
        assert_eq!(
            classify(stopped(libc::SIGTRAP, libc::PTRACE_EVENT_STOP)),
            Stop::Interrupt
        );
        assert_eq!(
            classify(stopped(libc::SIGTRAP, libc::PTRACE_EVENT_FORK)),
            Stop::Event(libc::PTRACE_EVENT_FORK)
        );
    }
}
