//! Other BPF users on the machine. Another tracer attached to the same syscalls (say a
//! `shmtrace --all` left running) would run its probes on the "untraced" workload too and skew
//! every ratio, so the benchmark looks for processes holding BPF programs that it did not start
//! and names them next to the results.
use std::{collections::BTreeMap, fs};

/// Processes outside the benchmark's own tree that hold BPF programs: pid -> command line.
pub fn foreign_bpf_holders() -> BTreeMap<u32, String> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me && holds_bpf_program(*pid) && !descends_from(*pid, me))
        .map(|pid| (pid, command_line(pid)))
        .collect()
}

fn holds_bpf_program(pid: u32) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:bpf-prog"))
}

fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    // Bounded, in case the chain changes under us.
    for _ in 0..64 {
        match parent(pid) {
            Some(p) if p == ancestor => return true,
            Some(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
    false
}

fn parent(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses: state, then the parent's pid.
    stat.rsplit_once(") ")?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn command_line(pid: u32) -> String {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let text: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if text.is_empty() {
        format!("pid {pid}")
    } else {
        text.join(" ")
    }
}
