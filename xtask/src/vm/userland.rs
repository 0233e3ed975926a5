//! The guest's own tools when it is not of the host's architecture: Debian's busybox-static,
//! bash and util-linux, with the libraries they load, unpacked into a sysroot
//! ([`crate::debian::unpacked`]).
//!
//! The host's x86-64 guests take their tools from the host itself (`initramfs::Initramfs::program`).
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::debian::{Arch, unpacked};

/// Debian's release the guest's tools come from: they only need to run on every kernel of the
/// matrix.
const SUITE: &str = "bookworm";

/// The packages unpacked for a guest: the tools it runs and the libraries they name.
/// `initramfs` fails naming a library none of them has.
const PACKAGES: &[&str] = &[
    "busybox-static",
    "bash",
    "util-linux",
    "mount",
    "libc6",
    "libtinfo6",
    "libmount1",
    "libblkid1",
    "libselinux1",
    "libpcre2-8-0",
    "libcap-ng0",
    "libsmartcols1",
    "libuuid1",
    "libudev1",
    "libcrypt1",
    "libsystemd0",
    "libcap2",
    "libgcrypt20",
    "libgpg-error0",
    "liblz4-1",
    "liblzma5",
    "libzstd1",
    "zlib1g",
];

/// The guest's tools for `arch`, unpacked now unless they already are (with this list).
pub fn sysroot(arch: Arch, cache: &Path) -> Result<PathBuf> {
    unpacked(cache, SUITE, arch, PACKAGES)
}
