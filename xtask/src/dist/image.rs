//! The node agent's container image (`deploy/image/Dockerfile`), one per architecture: the
//! release binary and the glibc it loads, nothing else (no shell, no package manager). The
//! libraries come from Debian 11's packages of that architecture: glibc 2.31, the oldest the
//! binaries claim to run on, so the image holds the claim too.
//!
//! `cargo xtask dist` writes each root file system as a tar file into the image's build
//! context, `target/dist/image/`, beside a copy of the Dockerfile, which `ADD`s the one of its
//! architecture. With no registry at hand, `docker import` makes the same image from the tar
//! file (how docs/install.md says to make and push both).
use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{
    root, run,
    vm::{self, Arch},
};

/// The Debian release the image's libraries come from.
const SUITE: &str = "bullseye";

/// Its packages that hold what the binary loads.
const PACKAGES: [&str; 2] = ["libc6", "libgcc-s1"];

/// Where the binary sits in the image, as the Dockerfile's `ENTRYPOINT` names it.
pub const BINARY_IN_IMAGE: &str = "/usr/local/bin/shmtrace";

/// The image's build context: the Dockerfile and a root file system per architecture.
pub fn context_dir(dist: &Path) -> PathBuf {
    dist.join("image")
}

/// The root file system of `arch`'s image, as the Dockerfile names it.
pub fn root_tar(dist: &Path, arch: Arch) -> PathBuf {
    context_dir(dist).join(format!("rootfs-{}.tar", arch.oci()))
}

/// Writes `arch`'s root file system, holding `binary`, and the Dockerfile beside it.
pub fn write(dist: &Path, arch: Arch, binary: &Path) -> Result<PathBuf> {
    let sysroot = vm::unpacked(&vm::cache_dir(), SUITE, arch, &PACKAGES)
        .with_context(|| format!("fetching Debian {SUITE}'s glibc for {}", arch.debian()))?;
    let context = context_dir(dist);
    let staging = context.join(format!("rootfs-{}", arch.oci()));
    let _ = fs::remove_dir_all(&staging);
    let place = |target: &Path, from: &Path, mode: u32| -> Result<()> {
        let at = staging.join(target.strip_prefix("/")?);
        fs::create_dir_all(at.parent().context("a file in a directory")?)?;
        fs::copy(from, &at).with_context(|| format!("copying {}", from.display()))?;
        fs::set_permissions(&at, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    place(Path::new(BINARY_IN_IMAGE), binary, 0o755)?;
    for (target, host) in vm::libraries_of(&sysroot, arch, binary)? {
        place(&target, &host, 0o755)?;
    }
    // Mount points the runtime fills, and a scratch directory; the rest is read-only.
    for dir in ["proc", "sys", "dev", "run", "tmp", "var/lib/shmtrace"] {
        fs::create_dir_all(staging.join(dir))?;
    }
    fs::set_permissions(staging.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    let tar = root_tar(dist, arch);
    run(Command::new("tar")
        .args([
            "--create",
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "--sort=name",
        ])
        .arg("--file")
        .arg(&tar)
        .arg("--directory")
        .arg(&staging)
        .arg("."))
    .context("packing the image's root file system (tar)")?;
    fs::remove_dir_all(&staging)?;
    fs::copy(
        root().join("deploy/image/Dockerfile"),
        context.join("Dockerfile"),
    )?;
    Ok(tar)
}

/// Builds `arch`'s image from the Dockerfile, tagged `tag`, as a user with Docker would.
pub fn build(dist: &Path, arch: Arch, tag: &str) -> Result<()> {
    let context = context_dir(dist);
    let output = Command::new("docker")
        .args(["build", "--quiet", "--platform"])
        .arg(format!("linux/{}", arch.oci()))
        .args(["--build-arg", &format!("TARGETARCH={}", arch.oci())])
        .args(["--tag", tag])
        .arg(&context)
        .output()
        .context("running docker build")?;
    if !output.status.success() {
        bail!(
            "docker build of {} failed: {}",
            context.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let inspect = Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Os}}/{{.Architecture}}",
            tag,
        ])
        .output()?;
    let platform = String::from_utf8_lossy(&inspect.stdout).trim().to_owned();
    if platform != format!("linux/{}", arch.oci()) {
        bail!(
            "docker built {tag} for {platform:?}, not linux/{}",
            arch.oci()
        );
    }
    println!("image {tag}: {platform}");
    Ok(())
}
