//! Can this machine run the probes? Checked before loading, so that each missing piece gets its
//! own message instead of a verifier error.
use std::{fs, path::Path};

use super::BpfError;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Root, or CAP_BPF + CAP_PERFMON (Linux 5.8 split them out of CAP_SYS_ADMIN).
pub fn check_privileges() -> Result<(), BpfError> {
    let caps = effective_capabilities().unwrap_or(0);
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(cap, _)| !has(*cap))
        .map(|(_, name)| name)
        .collect();
    Err(BpfError::NotPrivileged {
        missing: format!("neither CAP_SYS_ADMIN nor {}", missing.join(" nor ")),
    })
}

/// `CapEff` from /proc/self/status.
fn effective_capabilities() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

pub fn check_ring_buffer() -> Result<(), BpfError> {
    match aya::sys::is_map_supported(aya::maps::MapType::RingBuf) {
        Ok(true) => Ok(()),
        _ => Err(BpfError::NoRingBuffer),
    }
}

/// Where tracefs is, mounting it if the kernel has it but nobody mounted it.
pub fn tracefs() -> Result<&'static Path, BpfError> {
    for candidate in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        let path = Path::new(candidate);
        if path.join("events").is_dir() {
            return Ok(path);
        }
    }
    let path = Path::new("/sys/kernel/tracing");
    nix::mount::mount(
        Some("nodev"),
        path,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|errno| BpfError::NoTracefs {
        reason: errno.desc().to_owned(),
    })?;
    if path.join("events").is_dir() {
        Ok(path)
    } else {
        Err(BpfError::NoTracefs {
            reason: "it has no events directory".to_owned(),
        })
    }
}
