//! Debian's archive and the architectures xtask builds for, as the release artifacts (`dist`)
//! and the kernel matrix (`vm`) both use them: a leaf, importing neither.
//!
//! - `arch`: what differs between one architecture and another (Debian's, the kernel's,
//!   Rust's and Docker's names for it, and how qemu boots it);
//! - `apt`: apt with a private state, for packages of any suite and architecture, and the
//!   machine's own Debian archive;
//! - `unpack`: packages unpacked into a sysroot, never installed, and the libraries a program
//!   there loads.
mod apt;
mod arch;
mod unpack;

use std::path::PathBuf;

pub use apt::{Apt, debian_mirror};
pub use arch::Arch;
pub use unpack::{libraries_of, resolve, unpacked};

/// Where kernels, apt states and unpacked packages are kept between runs: `SHMTRACE_VM_CACHE`,
/// or `/var/cache/shmtrace-vm` (the tests run as root).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("SHMTRACE_VM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/shmtrace-vm"))
}
