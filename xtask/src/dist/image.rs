//! The node agent's container image, one per architecture: the release binary and the glibc
//! it loads, nothing else (no shell, no package manager). The libraries come from Debian 11's
//! packages of that architecture: glibc 2.31, the oldest the binaries claim to run on, so the
//! image holds the claim too.
//!
//! For each architecture `cargo xtask dist` writes:
//! - `image/rootfs-ARCH.tar`, the root file system, beside a copy of
//!   `deploy/image/Dockerfile`, which `ADD`s it: the build context for `docker buildx build
//!   --platform linux/amd64,linux/arm64`, and for Docker's classic builder on the host's own
//!   architecture;
//! - `shmtrace-VERSION-image-ARCH.tar`, the same image as an archive that `docker load` takes
//!   (Docker's `docker save` layout: one layer, the root file system, and a config with the
//!   Dockerfile's `ENTRYPOINT` and `CMD`), for hosts with neither a registry nor buildx, where
//!   the classic builder cannot build for another architecture.
use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{
    debian::{self, Arch},
    root, run,
};

/// The Debian release the image's libraries come from.
const SUITE: &str = "bullseye";

/// Its packages that hold what the binary loads.
const PACKAGES: [&str; 2] = ["libc6", "libgcc-s1"];

/// Where the binary sits in the image, as the Dockerfile's `ENTRYPOINT` names it.
pub const BINARY_IN_IMAGE: &str = "/usr/local/bin/shmtrace";

/// The image's build context: the Dockerfile and a root file system per architecture.
fn context_dir(dist: &Path) -> PathBuf {
    dist.join("image")
}

/// The root file system of `arch`'s image, as the Dockerfile names it.
pub fn root_tar(dist: &Path, arch: Arch) -> PathBuf {
    context_dir(dist).join(format!("rootfs-{}.tar", arch.oci()))
}

/// The image archive of `arch`, for `docker load`.
pub fn archive(dist: &Path, version: &str, arch: Arch) -> PathBuf {
    dist.join(format!("shmtrace-{version}-image-{}.tar", arch.oci()))
}

/// The tag the archive of `arch` loads as.
pub fn tag(version: &str, arch: Arch) -> String {
    format!("shmtrace:{version}-{}", arch.oci())
}

/// Writes `arch`'s root file system, holding `binary`, with the Dockerfile beside it, and the
/// image archive made of them. Returns the archive.
pub fn write(dist: &Path, version: &str, arch: Arch, binary: &Path) -> Result<PathBuf> {
    let sysroot = debian::unpacked(&debian::cache_dir(), SUITE, arch, &PACKAGES)
        .with_context(|| format!("fetching Debian {SUITE}'s glibc for {}", arch.debian()))?;
    let context = context_dir(dist);
    let staging = context.join(format!("rootfs-{}", arch.oci()));
    let _ = fs::remove_dir_all(&staging);
    let place = |target: &Path, from: &Path| -> Result<()> {
        let at = staging.join(target.strip_prefix("/")?);
        fs::create_dir_all(at.parent().context("a file in a directory")?)?;
        fs::copy(from, &at).with_context(|| format!("copying {}", from.display()))?;
        fs::set_permissions(&at, fs::Permissions::from_mode(0o755))?;
        Ok(())
    };
    place(Path::new(BINARY_IN_IMAGE), binary)?;
    for (target, host) in debian::libraries_of(&sysroot, arch, binary)? {
        place(&target, &host)?;
    }
    // Mount points the runtime fills, and a scratch directory; the rest is read-only.
    for dir in ["proc", "sys", "dev", "run", "tmp", "var/lib/shmtrace"] {
        fs::create_dir_all(staging.join(dir))?;
    }
    fs::set_permissions(staging.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    let rootfs = root_tar(dist, arch);
    tar(&staging, &rootfs).context("packing the image's root file system")?;
    fs::remove_dir_all(&staging)?;
    fs::copy(
        root().join("deploy/image/Dockerfile"),
        context.join("Dockerfile"),
    )?;
    let archive = archive(dist, version, arch);
    write_archive(&rootfs, arch, &tag(version, arch), &archive)?;
    Ok(archive)
}

/// `docker save`'s layout around one layer: `manifest.json`, the config by its digest, and
/// the layer by its own.
fn write_archive(layer: &Path, arch: Arch, tag: &str, out: &Path) -> Result<()> {
    let layer_digest = hex_sha256(&fs::read(layer)?);
    let (entrypoint, cmd) = dockerfile_settings()?;
    let config = serde_json::to_vec(&json!({
        "architecture": arch.oci(),
        "os": "linux",
        "config": { "Entrypoint": entrypoint, "Cmd": cmd },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
        "history": [{ "created_by": "cargo xtask dist" }],
    }))?;
    let config_name = format!("{}.json", hex_sha256(&config));
    let layer_name = format!("{layer_digest}/layer.tar");
    let manifest = serde_json::to_vec(&json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": [layer_name],
    }]))?;
    let staging = out.with_extension("staging");
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(staging.join(&layer_digest))?;
    fs::copy(layer, staging.join(&layer_name))?;
    fs::write(staging.join(&config_name), config)?;
    fs::write(staging.join("manifest.json"), manifest)?;
    tar(&staging, out).context("packing the image archive")?;
    fs::remove_dir_all(&staging)?;
    Ok(())
}

/// The Dockerfile's `ENTRYPOINT` and `CMD`, each a JSON list as the Dockerfile writes it: the
/// one place they are set.
fn dockerfile_settings() -> Result<(serde_json::Value, serde_json::Value)> {
    let dockerfile = fs::read_to_string(root().join("deploy/image/Dockerfile"))?;
    let setting = |keyword: &str| -> Result<serde_json::Value> {
        let line = dockerfile
            .lines()
            .find_map(|line| line.strip_prefix(keyword)?.strip_prefix(' '))
            .with_context(|| format!("deploy/image/Dockerfile has no {keyword} line"))?;
        serde_json::from_str(line)
            .with_context(|| format!("deploy/image/Dockerfile's {keyword} is not a JSON list"))
    };
    Ok((setting("ENTRYPOINT")?, setting("CMD")?))
}

/// `dir`'s contents as a tar file, owned by root, in a stable order.
fn tar(dir: &Path, out: &Path) -> Result<()> {
    run(Command::new("tar")
        .args([
            "--create",
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            "--sort=name",
        ])
        .arg("--file")
        .arg(out)
        .arg("--directory")
        .arg(dir)
        .arg("."))
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Loads `arch`'s archive into Docker and checks what it made: the platform, the entrypoint
/// and the command. For the host's architecture, also builds the Dockerfile with the classic
/// builder, as a user with Docker would, and checks it makes the same layer.
pub fn load(dist: &Path, version: &str, arch: Arch) -> Result<()> {
    let tag = tag(version, arch);
    let _ = Command::new("docker")
        .args(["image", "rm", "--force", &tag])
        .output();
    let loaded = Command::new("docker")
        .args(["load", "--quiet", "--input"])
        .arg(archive(dist, version, arch))
        .output()
        .context("running docker load")?;
    if !loaded.status.success() {
        bail!(
            "docker load of the {} image failed: {}",
            arch.oci(),
            String::from_utf8_lossy(&loaded.stderr).trim()
        );
    }
    let made = inspect(&tag)?;
    let (entrypoint, cmd) = dockerfile_settings()?;
    let wanted = format!("linux/{} {entrypoint} {cmd}", arch.oci());
    if !made.starts_with(&format!("{wanted} ")) {
        bail!("docker loaded {tag} as {made:?}, not {wanted:?}");
    }
    println!("image {tag}: {made}");
    if arch.cross_target().is_none() {
        let built = format!("{tag}-dockerfile");
        run(Command::new("docker")
            .args(["build", "--quiet", "--no-cache"])
            .args(["--build-arg", &format!("TARGETARCH={}", arch.oci())])
            .args(["--tag", &built])
            .arg(context_dir(dist)))
        .context("building deploy/image/Dockerfile")?;
        // The same settings and the same files: layer digests differ, as Docker packs the
        // layer of an ADD itself.
        let settings = |line: &str| line.rsplit_once(' ').map(|(s, _)| s.to_owned());
        let (from_dockerfile, files) = (inspect(&built)?, files_of(&built));
        let _ = Command::new("docker")
            .args(["image", "rm", &built])
            .output();
        if settings(&from_dockerfile) != settings(&made) || files? != files_of(&tag)? {
            bail!("deploy/image/Dockerfile made another image than the archive's {tag}");
        }
        println!("deploy/image/Dockerfile makes the same image");
    }
    Ok(())
}

/// The files of a container of image `tag`: each one's type, mode, size and path, as `tar`
/// lists `docker export`.
fn files_of(tag: &str) -> Result<Vec<String>> {
    let created = Command::new("docker").args(["create", tag]).output()?;
    if !created.status.success() {
        bail!("docker create {tag} failed");
    }
    let container = String::from_utf8_lossy(&created.stdout).trim().to_owned();
    let export = Command::new("sh")
        .arg("-c")
        .arg(format!("docker export {container} | tar --list --verbose"))
        .output();
    let _ = Command::new("docker").args(["rm", &container]).output();
    let listing = export?;
    let mut files: Vec<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // mode, owner, size, date, time, path...
            Some(format!(
                "{} {} {}",
                fields.first()?,
                fields.get(2)?,
                fields.get(5..)?.join(" ")
            ))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// An image's platform, entrypoint, command and layers, as one line.
fn inspect(tag: &str) -> Result<String> {
    let output = Command::new("docker")
        .args(["image", "inspect", "--format"])
        .arg("{{.Os}}/{{.Architecture}} {{json .Config.Entrypoint}} {{json .Config.Cmd}} {{json .RootFS.Layers}}")
        .arg(tag)
        .output()?;
    if !output.status.success() {
        bail!("docker has no image {tag}");
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
