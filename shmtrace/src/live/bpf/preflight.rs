//! Can this machine run the probes? Checked before loading, so that each missing piece gets its
//! own message instead of a verifier error.
use std::{fs, path::Path};

use super::BpfError;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Root, or CAP_BPF + CAP_PERFMON (Linux 5.8 split them out of CAP_SYS_ADMIN).
pub fn check_privileges() -> Result<(), BpfError> {
    let status = fs::read_to_string("/proc/self/status").map_err(|error| {
        BpfError::CapabilitiesUnreadable {
            reason: error.to_string(),
        }
    })?;
    let caps = effective_capabilities(&status)?;
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

/// `CapEff` of a /proc/PID/status text. An unreadable set is an error, not "no capabilities":
/// the message would send a root user after the wrong problem.
pub(crate) fn effective_capabilities(status: &str) -> Result<u64, BpfError> {
    let unreadable = |reason: &str| BpfError::CapabilitiesUnreadable {
        reason: reason.to_owned(),
    };
    let hex = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .ok_or_else(|| unreadable("it has no CapEff line"))?;
    u64::from_str_radix(hex.trim(), 16).map_err(|_| unreadable("its CapEff line is not hex"))
}

/// The oldest kernel the probes load on: they use BPF atomic OR and AND (5.12) and
/// `bpf_task_pt_regs` (5.15). An older kernel's verifier refuses them with a dump that names
/// neither, so the kernel's release is checked first.
pub const MINIMUM_KERNEL: (u32, u32) = (5, 15);

pub fn check_kernel_version() -> Result<(), BpfError> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|text| text.trim().to_owned())
        .unwrap_or_default();
    // A release that does not parse (a vendor's odd scheme) is let through: the loader's own
    // errors then speak.
    match kernel_version(&release) {
        Some(version) if version < MINIMUM_KERNEL => Err(BpfError::KernelTooOld { release }),
        _ => Ok(()),
    }
}

/// `(major, minor)` of a kernel release such as `6.1.0-50-cloud-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

pub fn check_ring_buffer() -> Result<(), BpfError> {
    match aya::sys::is_map_supported(aya::maps::MapType::RingBuf) {
        Ok(true) => Ok(()),
        _ => Err(BpfError::NoRingBuffer),
    }
}

/// Where tracefs is. It is not mounted here if missing: a check must not change the machine;
/// the error says what to run.
pub fn tracefs() -> Result<&'static Path, BpfError> {
    tracefs_among(&["/sys/kernel/tracing", "/sys/kernel/debug/tracing"])
}

fn tracefs_among(candidates: &[&'static str]) -> Result<&'static Path, BpfError> {
    let mut not_found = None;
    for candidate in candidates {
        let path = Path::new(*candidate);
        match fs::metadata(path.join("events")) {
            Ok(metadata) if metadata.is_dir() => match fs::read_dir(path.join("events")) {
                Ok(_) => return Ok(path),
                Err(error) => return Err(unreadable(path, &error)),
            },
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(unreadable(path, &error));
            }
            Err(error) => {
                not_found.get_or_insert(error.to_string());
            }
        }
    }
    Err(BpfError::NoTracefs {
        reason: not_found.unwrap_or_else(|| "not a directory".to_owned()),
    })
}

fn unreadable(path: &Path, error: &std::io::Error) -> BpfError {
    BpfError::TracefsUnreadable {
        path: path.to_path_buf(),
        reason: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_capability_set_is_an_error_not_no_privileges() {
        let status = "Name:\tshmtrace\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_capabilities(status).unwrap(), 0x1ff_ffff_ffff);
        for broken in ["Name:\tshmtrace\n", "CapEff:\tzz\n"] {
            let error = effective_capabilities(broken).unwrap_err();
            assert!(
                matches!(error, BpfError::CapabilitiesUnreadable { .. }),
                "{error}"
            );
        }
    }

    #[test]
    fn kernel_releases_parse_to_major_and_minor() {
        assert_eq!(kernel_version("6.1.0-50-cloud-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.10.0-32-cloud-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("6.12.117+deb13-cloud-amd64"), Some((6, 12)));
        assert_eq!(kernel_version("5.15.0-1050-aws"), Some((5, 15)));
        assert_eq!(kernel_version("weird"), None);
        assert!(kernel_version("5.10.0").unwrap() < MINIMUM_KERNEL);
        assert!(kernel_version("5.15.0").unwrap() >= MINIMUM_KERNEL);
    }

    #[test]
    fn a_missing_tracefs_is_reported_and_not_mounted() {
        let dir = std::env::temp_dir().join(format!("harden-no-tracefs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path: &'static str = Box::leak(dir.to_string_lossy().into_owned().into_boxed_str());
        let error = tracefs_among(&[path]).unwrap_err();
        assert!(matches!(error, BpfError::NoTracefs { .. }), "{error}");
        assert!(error.to_string().contains("mount -t tracefs"), "{error}");
        // Nothing was mounted there.
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(path), "a check mounted something");
        fs::remove_dir(&dir).unwrap();
    }
}
