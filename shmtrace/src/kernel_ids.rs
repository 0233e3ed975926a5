//! How the kernel names what the probes report, read or computed the same way by the live
//! side and the container runtimes: device numbers in the kernel's encoding, and a process's
//! mount namespace. A leaf: it imports nothing from the crate.
use std::fs;

/// The kernel's `dev_t` encoding (`MKDEV`): what the probes report.
pub fn kernel_dev(major: u64, minor: u64) -> u32 {
    ((major << 20) | (minor & 0xfffff)) as u32
}

/// Kernel `dev_t` of a `st_dev` from stat(2) (glibc's encoding).
pub fn kernel_dev_from_stat(st_dev: u64) -> u32 {
    kernel_dev(libc::major(st_dev) as u64, libc::minor(st_dev) as u64)
}

/// Mount namespace inode number of `pid`.
pub fn mount_namespace(pid: u32) -> Option<u32> {
    let link = fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()?;
    let text = link.to_str()?;
    text.strip_prefix("mnt:[")?.strip_suffix(']')?.parse().ok()
}
