//! Symbolic names for numbers in system calls: errnos, flags, signals.
use std::fmt::Write as _;

/// `ENOSPC`, or `E123` for a number this platform does not name.
pub fn errno_name(errno: i32) -> String {
    let e = nix::errno::Errno::from_raw(errno);
    if e == nix::errno::Errno::UnknownErrno {
        format!("E{errno}")
    } else {
        format!("{e:?}")
    }
}

/// "No space left on device".
pub fn errno_description(errno: i32) -> &'static str {
    nix::errno::Errno::from_raw(errno).desc()
}

/// Renders `value` as `A|B|0x..` given named single-bit (or multi-bit) flags.
fn flag_list(value: u64, names: &[(u64, &str)], zero: &str) -> String {
    let mut out = String::with_capacity(64);
    push_flags(&mut out, value, names);
    if out.is_empty() { zero.to_owned() } else { out }
}

/// `first|A|B|0x..`, or `first` alone when `value` is 0.
fn flags_after(first: &str, value: u64, names: &[(u64, &str)]) -> String {
    let mut out = String::with_capacity(64);
    out.push_str(first);
    push_flags(&mut out, value, names);
    out
}

/// Appends the flags of `value` to `out`, each after a `|` unless `out` is empty: one string
/// grown in place, as every open and mapping of a replay names its flags.
fn push_flags(out: &mut String, mut value: u64, names: &[(u64, &str)]) {
    for (bits, name) in names {
        if *bits != 0 && value & bits == *bits {
            if !out.is_empty() {
                out.push('|');
            }
            out.push_str(name);
            value &= !bits;
        }
    }
    if value != 0 {
        if !out.is_empty() {
            out.push('|');
        }
        let _ = write!(out, "{value:#x}");
    }
}

/// `O_RDWR|O_CREAT|O_EXCL|O_CLOEXEC`.
/// The kernel's `O_LARGEFILE`. libc's is 0 on 64-bit targets, where glibc never passes it;
/// musl does (`open(2)` on x86-64, Alpine's programs), and the kernel shows it.
#[cfg(not(target_arch = "aarch64"))]
const KERNEL_O_LARGEFILE: u64 = 0o100000;
#[cfg(target_arch = "aarch64")]
const KERNEL_O_LARGEFILE: u64 = 0o400000;

pub fn open_flags(flags: u64) -> String {
    let access = match flags & libc::O_ACCMODE as u64 {
        0 => "O_RDONLY",
        1 => "O_WRONLY",
        2 => "O_RDWR",
        _ => "O_ACCMODE",
    };
    let rest = flags & !(libc::O_ACCMODE as u64);
    let names: &[(u64, &str)] = &[
        (libc::O_CREAT as u64, "O_CREAT"),
        (libc::O_EXCL as u64, "O_EXCL"),
        (libc::O_NOCTTY as u64, "O_NOCTTY"),
        (libc::O_TRUNC as u64, "O_TRUNC"),
        (libc::O_APPEND as u64, "O_APPEND"),
        (libc::O_NONBLOCK as u64, "O_NONBLOCK"),
        (libc::O_DSYNC as u64, "O_DSYNC"),
        (libc::O_DIRECT as u64, "O_DIRECT"),
        (KERNEL_O_LARGEFILE, "O_LARGEFILE"),
        (libc::O_TMPFILE as u64, "O_TMPFILE"),
        (libc::O_DIRECTORY as u64, "O_DIRECTORY"),
        (libc::O_NOFOLLOW as u64, "O_NOFOLLOW"),
        (libc::O_NOATIME as u64, "O_NOATIME"),
        (libc::O_CLOEXEC as u64, "O_CLOEXEC"),
        (libc::O_PATH as u64, "O_PATH"),
    ];
    flags_after(access, rest, names)
}

pub fn prot_flags(prot: u64) -> String {
    flag_list(
        prot,
        &[
            (libc::PROT_READ as u64, "PROT_READ"),
            (libc::PROT_WRITE as u64, "PROT_WRITE"),
            (libc::PROT_EXEC as u64, "PROT_EXEC"),
        ],
        "PROT_NONE",
    )
}

pub fn map_flags(flags: u64) -> String {
    let kind = match flags & 0x3 {
        1 => "MAP_SHARED",
        2 => "MAP_PRIVATE",
        3 => "MAP_SHARED_VALIDATE",
        _ => "0",
    };
    let rest = flags & !0x3;
    let names: &[(u64, &str)] = &[
        (libc::MAP_FIXED as u64, "MAP_FIXED"),
        (libc::MAP_ANONYMOUS as u64, "MAP_ANONYMOUS"),
        (libc::MAP_NORESERVE as u64, "MAP_NORESERVE"),
        (libc::MAP_POPULATE as u64, "MAP_POPULATE"),
        (libc::MAP_LOCKED as u64, "MAP_LOCKED"),
        (libc::MAP_HUGETLB as u64, "MAP_HUGETLB"),
        (libc::MAP_FIXED_NOREPLACE as u64, "MAP_FIXED_NOREPLACE"),
    ];
    flags_after(kind, rest, names)
}

pub fn fallocate_mode(mode: u64) -> String {
    flag_list(
        mode,
        &[
            (libc::FALLOC_FL_KEEP_SIZE as u64, "FALLOC_FL_KEEP_SIZE"),
            (libc::FALLOC_FL_PUNCH_HOLE as u64, "FALLOC_FL_PUNCH_HOLE"),
            (
                libc::FALLOC_FL_COLLAPSE_RANGE as u64,
                "FALLOC_FL_COLLAPSE_RANGE",
            ),
            (libc::FALLOC_FL_ZERO_RANGE as u64, "FALLOC_FL_ZERO_RANGE"),
            (
                libc::FALLOC_FL_INSERT_RANGE as u64,
                "FALLOC_FL_INSERT_RANGE",
            ),
            (
                libc::FALLOC_FL_UNSHARE_RANGE as u64,
                "FALLOC_FL_UNSHARE_RANGE",
            ),
        ],
        "0",
    )
}

/// `IPC_CREAT|IPC_EXCL|0600`.
pub fn shmget_flags(flags: u64) -> String {
    let mode = flags & 0o777;
    let rest = flags & !0o777;
    let names = flag_list(
        rest,
        &[
            (libc::IPC_CREAT as u64, "IPC_CREAT"),
            (libc::IPC_EXCL as u64, "IPC_EXCL"),
            (libc::SHM_HUGETLB as u64, "SHM_HUGETLB"),
            (libc::SHM_NORESERVE as u64, "SHM_NORESERVE"),
        ],
        "",
    );
    if names.is_empty() {
        format!("{mode:#o}")
    } else {
        format!("{names}|{mode:#o}")
    }
}

pub fn shmctl_command(cmd: u64) -> String {
    // IPC_64 (0x100) is or-ed in by glibc and means nothing to the reader.
    match cmd & !0x100 {
        0 => "IPC_RMID".to_owned(),
        1 => "IPC_SET".to_owned(),
        2 => "IPC_STAT".to_owned(),
        3 => "IPC_INFO".to_owned(),
        11 => "SHM_LOCK".to_owned(),
        12 => "SHM_UNLOCK".to_owned(),
        13 => "SHM_STAT".to_owned(),
        14 => "SHM_INFO".to_owned(),
        15 => "SHM_STAT_ANY".to_owned(),
        other => other.to_string(),
    }
}

/// `MSG_CTRUNC|MSG_CMSG_CLOEXEC`: `recvmsg` flags.
pub fn msg_flags(flags: u64) -> String {
    flag_list(
        flags,
        &[
            (libc::MSG_OOB as u64, "MSG_OOB"),
            (libc::MSG_PEEK as u64, "MSG_PEEK"),
            (libc::MSG_CTRUNC as u64, "MSG_CTRUNC"),
            (libc::MSG_TRUNC as u64, "MSG_TRUNC"),
            (libc::MSG_DONTWAIT as u64, "MSG_DONTWAIT"),
            (libc::MSG_EOR as u64, "MSG_EOR"),
            (libc::MSG_WAITALL as u64, "MSG_WAITALL"),
            (libc::MSG_CMSG_CLOEXEC as u64, "MSG_CMSG_CLOEXEC"),
        ],
        "0",
    )
}

/// `SIGBUS`, or `SIG35` for real-time and unknown signals.
pub fn signal_name(signo: i32) -> String {
    match nix::sys::signal::Signal::try_from(signo) {
        Ok(signal) => signal.as_str().to_owned(),
        Err(_) => format!("SIG{signo}"),
    }
}

/// `si_code` in the words of `siginfo.h`.
pub fn si_code_name(signo: i32, code: i32) -> String {
    let generic = match code {
        0 => Some("SI_USER"),
        0x80 => Some("SI_KERNEL"),
        -1 => Some("SI_QUEUE"),
        -2 => Some("SI_TIMER"),
        -3 => Some("SI_MESGQ"),
        -4 => Some("SI_ASYNCIO"),
        -6 => Some("SI_TKILL"),
        _ => None,
    };
    if let Some(name) = generic {
        return name.to_owned();
    }
    let specific = match (signo, code) {
        (libc::SIGBUS, 1) => "BUS_ADRALN",
        (libc::SIGBUS, 2) => "BUS_ADRERR",
        (libc::SIGBUS, 3) => "BUS_OBJERR",
        (libc::SIGBUS, 4) => "BUS_MCEERR_AR",
        (libc::SIGBUS, 5) => "BUS_MCEERR_AO",
        (libc::SIGSEGV, 1) => "SEGV_MAPERR",
        (libc::SIGSEGV, 2) => "SEGV_ACCERR",
        (libc::SIGSEGV, 3) => "SEGV_BNDERR",
        (libc::SIGSEGV, 4) => "SEGV_PKUERR",
        _ => return code.to_string(),
    };
    specific.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pytorch_open_flags() {
        let flags =
            (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                as u64;
        assert_eq!(
            open_flags(flags),
            "O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC"
        );
        assert_eq!(open_flags(0), "O_RDONLY");
        // musl's shm_open on x86-64, as strace shows it.
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            open_flags(0o2_504_102),
            "O_RDWR|O_CREAT|O_NONBLOCK|O_LARGEFILE|O_NOFOLLOW|O_CLOEXEC"
        );
    }

    #[test]
    fn names_errnos_signals_and_codes() {
        assert_eq!(errno_name(28), "ENOSPC");
        assert_eq!(errno_description(28), "No space left on device");
        assert_eq!(errno_name(4000), "E4000");
        assert_eq!(signal_name(7), "SIGBUS");
        assert_eq!(signal_name(40), "SIG40");
        assert_eq!(si_code_name(7, 2), "BUS_ADRERR");
        assert_eq!(si_code_name(7, -6), "SI_TKILL");
    }

    #[test]
    fn names_mapping_and_ipc_flags() {
        assert_eq!(prot_flags(3), "PROT_READ|PROT_WRITE");
        assert_eq!(map_flags(1), "MAP_SHARED");
        assert_eq!(map_flags(0x11), "MAP_SHARED|MAP_FIXED");
        assert_eq!(shmget_flags(0o1600), "IPC_CREAT|0o600");
        assert_eq!(shmctl_command(0x100), "IPC_RMID");
        assert_eq!(fallocate_mode(0), "0");
        assert_eq!(prot_flags(0), "PROT_NONE");
        assert_eq!(prot_flags(0x10), "0x10");
        assert_eq!(
            map_flags(0x11 | 1 << 40),
            "MAP_SHARED|MAP_FIXED|0x10000000000"
        );
        assert_eq!(map_flags(1 << 40), "0|0x10000000000");
        assert_eq!(
            fallocate_mode(3),
            "FALLOC_FL_KEEP_SIZE|FALLOC_FL_PUNCH_HOLE"
        );
    }
}
