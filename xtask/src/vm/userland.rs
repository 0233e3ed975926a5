//! The guest's own tools when it is not of the host's architecture: Debian's busybox-static,
//! bash and util-linux, with the libraries they load, unpacked from their packages into a
//! directory (a sysroot), never installed.
//!
//! The host's x86-64 guests take these from the host itself (`initramfs::Initramfs::program`).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use super::{apt::Apt, arch::Arch};

/// Debian's release the tools come from: they only need to run on every kernel of the matrix.
const SUITE: &str = "bookworm";

/// The packages unpacked: the tools the guest runs and the libraries they name.
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

/// The unpacked packages for `arch`, unpacked now unless they already are (with this list).
pub fn sysroot(arch: Arch, cache: &Path) -> Result<PathBuf> {
    let root = cache
        .join("userland")
        .join(format!("{SUITE}-{}", arch.debian()));
    let stamp = root.join(".packages");
    let wanted = PACKAGES.join("\n");
    if fs::read_to_string(&stamp).is_ok_and(|text| text == wanted) {
        return Ok(root);
    }
    let apt = Apt::new(cache, SUITE, arch)?;
    apt.update()?;
    let debs = cache.join("debs");
    fs::create_dir_all(&debs)?;
    // Through a scratch directory, so that a broken unpack never passes for a whole one.
    let mut scratch = root.as_os_str().to_owned();
    scratch.push(".unpacking");
    let scratch = PathBuf::from(scratch);
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    for package in PACKAGES {
        let deb = apt
            .download(package, &debs)
            .with_context(|| format!("fetching {package} for {}", arch.debian()))?;
        crate::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&scratch))?;
    }
    fs::write(scratch.join(".packages"), &wanted)?;
    let _ = fs::remove_dir_all(&root);
    fs::rename(&scratch, &root)?;
    Ok(root)
}

/// `path` inside `root`, with every symbolic link on the way followed inside `root` too (an
/// absolute link target means `root`'s, not the host's).
pub fn resolve(root: &Path, path: &Path) -> Result<PathBuf> {
    let mut current = PathBuf::from("/");
    let mut pending: Vec<PathBuf> = path
        .components()
        .rev()
        .map(|c| PathBuf::from(c.as_os_str()))
        .collect();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        if part == Path::new("/") {
            current = PathBuf::from("/");
            continue;
        }
        if part == Path::new("..") {
            current.pop();
            continue;
        }
        let next = current.join(&part);
        let on_host = root.join(next.strip_prefix("/")?);
        match fs::read_link(&on_host) {
            Ok(target) => {
                hops += 1;
                if hops > 40 {
                    anyhow::bail!(
                        "too many links resolving {} in {}",
                        path.display(),
                        root.display()
                    );
                }
                pending.extend(
                    target
                        .components()
                        .rev()
                        .map(|c| PathBuf::from(c.as_os_str())),
                );
            }
            Err(_) => current = next,
        }
    }
    let on_host = root.join(current.strip_prefix("/")?);
    if !on_host.exists() {
        anyhow::bail!("{} is not in {}", path.display(), root.display());
    }
    Ok(on_host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_inside_the_root() {
        let root = std::env::temp_dir().join(format!("shmtrace-userland-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("usr/lib/aarch64-linux-gnu")).unwrap();
        fs::write(root.join("usr/lib/aarch64-linux-gnu/libc.so.6"), "c").unwrap();
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
        std::os::unix::fs::symlink(
            "/lib/aarch64-linux-gnu/libc.so.6",
            root.join("usr/lib/aarch64-linux-gnu/libc-abs.so"),
        )
        .unwrap();
        let want = root.join("usr/lib/aarch64-linux-gnu/libc.so.6");
        assert_eq!(
            resolve(&root, Path::new("/lib/aarch64-linux-gnu/libc.so.6")).unwrap(),
            want
        );
        assert_eq!(
            resolve(&root, Path::new("/usr/lib/aarch64-linux-gnu/libc-abs.so")).unwrap(),
            want
        );
        assert!(resolve(&root, Path::new("/bin/nothing")).is_err());
        fs::remove_dir_all(&root).unwrap();
    }
}
