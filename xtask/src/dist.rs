//! `cargo xtask dist`: release artifacts, in `target/dist/`, that install the way users install
//! tools: a binary per architecture that runs on glibc 2.31 or newer (Debian 11, Ubuntu 20.04,
//! RHEL 9 and everything since); a wheel per architecture, `manylinux_2_31`, holding only
//! that binary, which `pip install` (or `pipx`, `uv tool install`) puts on PATH; and the node
//! agent's container image per architecture (`dist/image.rs`).
//!
//! Each architecture takes one release build: maturin (`deploy/python/pyproject.toml`, its
//! `bin` bindings) builds the crate with zig as the linker against glibc 2.31's symbol
//! versions (`--zig`; zig carries every glibc's stubs, so no old sysroot is needed, and it
//! cross-links arm64 alike), packs the wheel and checks it as auditwheel would; the binary is
//! then copied out beside it. maturin and zig come from PyPI, into a venv under `target/`.
//!
//! `--check` proves the claims (`dist/check.rs`): no symbol newer than GLIBC_2.31 in either
//! binary, and the x86-64 artifacts installed and run as users would.
mod check;
mod image;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{debian::Arch, root, run};

/// The oldest glibc the binaries run on: Debian 11's.
const GLIBC_FLOOR: (u32, u32) = (2, 31);

/// What is built.
const ARCHES: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

#[derive(clap::Args)]
pub struct DistArgs {
    /// Only these architectures (comma-separated: x86_64, aarch64; default: both).
    #[arg(long, value_delimiter = ',')]
    arch: Vec<String>,
    /// Then check the glibc claim, install the x86-64 wheel and binary as users would, and
    /// build the images and run the x86-64 one beside a failing container (root: the demo
    /// loads the probes; debootstrap needs the network the first time; Docker).
    #[arg(long)]
    check: bool,
}

/// One architecture's artifacts.
struct Built {
    arch: Arch,
    binary: PathBuf,
    wheel: PathBuf,
    /// The newest `GLIBC_` symbol version the binary requires.
    newest_glibc: (u32, u32),
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Where `cargo xtask dist` writes: the binaries and wheels, and the image's build context.
pub fn dist_dir() -> PathBuf {
    target_dir().join("dist")
}

/// Where the release builds go: a cargo target directory of their own, so that they can run
/// beside other builds and tests of the workspace (`.ci/run` builds them while the tests run)
/// without waiting on the main target directory's lock.
fn build_dir() -> PathBuf {
    target_dir().join("dist-build")
}

pub fn run_dist(args: &DistArgs) -> Result<()> {
    let out = dist_dir();
    fs::create_dir_all(&out)?;
    let tools = tools()?;
    let version = workspace_version()?;
    let mut built = Vec::new();
    for arch in ARCHES {
        if !args.arch.is_empty() && !args.arch.iter().any(|a| a == arch.gnu()) {
            continue;
        }
        let one = build(&tools, &out, arch)?;
        let image = image::write(&out, &version, arch, &one.binary)?;
        println!(
            "{}: needs GLIBC_{}.{} at most\n{}\n{}",
            one.binary.display(),
            one.newest_glibc.0,
            one.newest_glibc.1,
            one.wheel.display(),
            image.display()
        );
        built.push(one);
    }
    if args.check {
        for one in &built {
            if one.newest_glibc > GLIBC_FLOOR {
                bail!(
                    "{}: {} needs GLIBC_{}.{}, newer than {}.{}",
                    one.arch.gnu(),
                    one.binary.display(),
                    one.newest_glibc.0,
                    one.newest_glibc.1,
                    GLIBC_FLOOR.0,
                    GLIBC_FLOOR.1
                );
            }
            image::load(&out, &version, one.arch)?;
        }
        let Some(x86) = built.iter().find(|one| one.arch == Arch::X86_64) else {
            bail!("--check installs the x86-64 artifacts: build them too");
        };
        check::wheel(&x86.wheel, &out.join("check"))?;
        for one in built.iter().filter(|one| one.arch != Arch::X86_64) {
            let platform = format!("manylinux_2_31_{}", one.arch.gnu());
            let pip = tools.venv.join("bin/pip");
            check::foreign_wheel(&pip, &one.wheel, &one.binary, &platform, &out.join("check"))?;
        }
        check::bullseye(&x86.binary, &out.join("check"))?;
        check::image_runs(&image::tag(&version, Arch::X86_64))?;
    }
    Ok(())
}

/// The release binary of `arch` that `cargo xtask dist` writes.
pub fn binary(arch: Arch) -> Result<PathBuf> {
    Ok(dist_dir().join(format!(
        "shmtrace-{}-{}",
        workspace_version()?,
        arch.rust_target()
    )))
}

/// The root file system of `arch`'s image that `cargo xtask dist` writes, which must be there.
pub fn image_root(arch: Arch) -> Result<PathBuf> {
    let tar = image::root_tar(&dist_dir(), arch);
    if !tar.exists() {
        bail!("{} is missing: run `cargo xtask dist` first", tar.display());
    }
    Ok(tar)
}

pub use image::BINARY_IN_IMAGE;

/// One architecture's release build, through maturin: the wheel, and the binary copied out.
fn build(tools: &Tools, out: &Path, arch: Arch) -> Result<Built> {
    let triple = arch.rust_target();
    let name = arch.gnu();
    // A wheel of an older build must not pass for this one.
    for stale in wheels(out, name)? {
        fs::remove_file(stale)?;
    }
    run(tools
        .command("maturin")
        .current_dir(root().join("deploy/python"))
        .args([
            "build",
            "--release",
            "--zig",
            "--target",
            triple,
            "--target-dir",
        ])
        .arg(build_dir())
        .args(["--compatibility", "manylinux_2_31", "--out"])
        .arg(out))
    .with_context(|| format!("building the {name} wheel"))?;
    let wheel = wheels(out, name)?
        .pop()
        .with_context(|| format!("maturin left no {name} wheel in {}", out.display()))?;
    let binary = binary(arch)?;
    fs::copy(build_dir().join(triple).join("release/shmtrace"), &binary)?;
    let newest_glibc = newest_glibc(&binary)?;
    Ok(Built {
        arch,
        binary,
        wheel,
        newest_glibc,
    })
}

/// maturin and zig from PyPI, in a venv of their own under `target/`, made unless it is there.
struct Tools {
    venv: PathBuf,
}

impl Tools {
    /// `program` of the venv, with the venv first on PATH: maturin finds zig as its
    /// `python3 -m ziglang`.
    fn command(&self, program: &str) -> Command {
        let bin = self.venv.join("bin");
        let mut path = std::ffi::OsString::from(&bin);
        if let Some(rest) = std::env::var_os("PATH") {
            path.push(":");
            path.push(rest);
        }
        let mut command = Command::new(bin.join(program));
        command.env("PATH", path).env("VIRTUAL_ENV", &self.venv);
        command
    }
}

fn tools() -> Result<Tools> {
    let venv = target_dir().join("dist-tools/venv");
    let tools = Tools { venv: venv.clone() };
    if venv.join("bin/maturin").exists() && venv.join("bin/python-zig").exists() {
        return Ok(tools);
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))
        .context("making a venv for maturin (apt-get install python3-venv)")?;
    run(tools
        .command("pip")
        .args(["install", "--quiet", "maturin>=1.5,<2", "ziglang"]))
    .context("installing maturin and ziglang from PyPI")?;
    Ok(tools)
}

/// The workspace's `version = "..."`.
fn workspace_version() -> Result<String> {
    let manifest = fs::read_to_string(root().join("Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|line| {
            let value = line
                .trim()
                .strip_prefix("version")?
                .trim()
                .strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_owned())
        })
        .context("no version in the workspace's Cargo.toml")
}

/// The `shmtrace-*.whl` files for `arch` in `dir`, oldest name first.
fn wheels(dir: &Path, arch: &str) -> Result<Vec<PathBuf>> {
    let suffix = format!("_{arch}.whl");
    let mut found: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("shmtrace-") && n.ends_with(&suffix))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// The newest `GLIBC_x.y` symbol version `binary` requires, from its version needs (`readelf`
/// reads them for any architecture, as `objdump -T` shows them per symbol).
fn newest_glibc(binary: &Path) -> Result<(u32, u32)> {
    let output = Command::new("readelf")
        .args(["--version-info", "--wide"])
        .arg(binary)
        .output()
        .context("running readelf (binutils)")?;
    if !output.status.success() {
        bail!("readelf {} failed", binary.display());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    glibc_versions(&text)
        .into_iter()
        .max()
        .with_context(|| format!("{} requires no GLIBC_ version", binary.display()))
}

/// Every `GLIBC_x.y` a `readelf --version-info` text names.
fn glibc_versions(text: &str) -> Vec<(u32, u32)> {
    text.split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter_map(|version| {
            let mut parts = version.split('.');
            let major = parts.next()?.parse().ok()?;
            let minor = parts.next().unwrap_or("0").parse().ok()?;
            Some((major, minor))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_versions_are_read_from_readelf() {
        let text = "Version needs section '.gnu.version_r' contains 2 entries:\n\
                    000000: Version: 1  File: libc.so.6  Cnt: 3\n\
                    0x0010:   Name: GLIBC_2.28  Flags: none  Version: 5\n\
                    0x0020:   Name: GLIBC_2.3.4  Flags: none  Version: 4\n\
                    0x0030:   Name: GLIBC_2.31  Flags: none  Version: 3\n\
                    0x0040: Version: 1  File: ld-linux-aarch64.so.1  Cnt: 1\n\
                    0x0050:   Name: GLIBC_2.17  Flags: none  Version: 2\n";
        let versions = glibc_versions(text);
        assert_eq!(versions.iter().max(), Some(&(2, 31)));
        assert!(versions.contains(&(2, 3)));
    }
}
