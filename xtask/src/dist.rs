//! `cargo xtask dist`: release artifacts, in `target/dist/`, that install the way users install
//! tools: a binary per architecture that runs on glibc 2.31 or newer (Debian 11, Ubuntu 20.04,
//! RHEL 9 and everything since), and a wheel per architecture, `manylinux_2_31`, holding only
//! that binary, which `pip install` (or `pipx`, `uv tool install`) puts on PATH.
//!
//! Each architecture takes one release build: maturin (`deploy/python/pyproject.toml`, its
//! `bin` bindings) builds the crate with zig as the linker against glibc 2.31's symbol
//! versions (`--zig`; zig carries every glibc's stubs, so no old sysroot is needed, and it
//! cross-links arm64 alike), packs the wheel and checks it as auditwheel would; the binary is
//! then copied out beside it. maturin and zig come from PyPI, into a venv under `target/`.
//!
//! `--check` proves the claims: no symbol newer than GLIBC_2.31 in either binary; the x86-64
//! wheel pip-installed into a fresh venv runs `shmtrace demo`; and the x86-64 binary runs
//! `shmtrace demo` inside a Debian 11 root file system (glibc 2.31) made with debootstrap.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{root, run};

/// The oldest glibc the binaries run on: Debian 11's.
const GLIBC_FLOOR: (u32, u32) = (2, 31);

/// What is built, by Rust target and the wheel's platform tag's architecture.
const TARGETS: [(&str, &str); 2] = [
    ("x86_64-unknown-linux-gnu", "x86_64"),
    ("aarch64-unknown-linux-gnu", "aarch64"),
];

#[derive(clap::Args)]
pub struct DistArgs {
    /// Only these architectures (comma-separated: x86_64, aarch64; default: both).
    #[arg(long, value_delimiter = ',')]
    arch: Vec<String>,
    /// Then check the glibc claim and install the x86-64 wheel and binary as users would (root:
    /// the demo loads the probes; debootstrap needs the network the first time).
    #[arg(long)]
    check: bool,
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

pub fn run_dist(args: &DistArgs) -> Result<()> {
    let out = target_dir().join("dist");
    fs::create_dir_all(&out)?;
    let tools = tools()?;
    let version = workspace_version()?;
    let mut built = Vec::new();
    for (triple, arch) in TARGETS {
        if !args.arch.is_empty() && !args.arch.iter().any(|a| a == arch) {
            continue;
        }
        // A wheel of an older build must not pass for this one.
        for stale in wheels(&out, arch)? {
            fs::remove_file(stale)?;
        }
        run(tools
            .command("maturin")
            .current_dir(root().join("deploy/python"))
            .args(["build", "--release", "--zig", "--target", triple])
            .args(["--compatibility", "manylinux_2_31", "--out"])
            .arg(&out))
        .with_context(|| format!("building the {arch} wheel"))?;
        let wheel = wheels(&out, arch)?
            .pop()
            .with_context(|| format!("maturin left no {arch} wheel in {}", out.display()))?;
        let binary = out.join(format!("shmtrace-{version}-{triple}"));
        fs::copy(target_dir().join(triple).join("release/shmtrace"), &binary)?;
        let newest = newest_glibc(&binary)?;
        println!(
            "{}: needs GLIBC_{}.{} at most\n{}",
            binary.display(),
            newest.0,
            newest.1,
            wheel.display()
        );
        built.push((arch, binary, wheel, newest));
    }
    if args.check {
        for (arch, binary, _, newest) in &built {
            if *newest > GLIBC_FLOOR {
                bail!(
                    "{arch}: {} needs GLIBC_{}.{}, newer than {}.{}",
                    binary.display(),
                    newest.0,
                    newest.1,
                    GLIBC_FLOOR.0,
                    GLIBC_FLOOR.1
                );
            }
        }
        let Some((_, binary, wheel, _)) = built.iter().find(|(arch, ..)| *arch == "x86_64") else {
            bail!("--check installs the x86-64 artifacts: build them too");
        };
        check_wheel(wheel, &out.join("check"))?;
        check_bullseye(binary, &out.join("check"))?;
    }
    Ok(())
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

/// The demo's output explains both of its failures.
fn judge_demo(output: &std::process::Output, how: &str) -> Result<()> {
    let text = String::from_utf8_lossy(&output.stdout);
    let explained = text.contains("ENOSPC (No space left on device)")
        && text.contains("+++ killed by SIGBUS +++")
        && text.contains("shmtrace diagnosis");
    if !output.status.success() || !explained {
        bail!(
            "`shmtrace demo` {how} exited with {} without explaining both failures:\n{text}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    println!("`shmtrace demo` {how}: both failures explained");
    Ok(())
}

/// `pip install` of the wheel into a fresh venv, then `shmtrace` from that venv's PATH.
fn check_wheel(wheel: &Path, scratch: &Path) -> Result<()> {
    let venv = scratch.join("venv");
    let _ = fs::remove_dir_all(&venv);
    fs::create_dir_all(scratch)?;
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--no-index"])
        .arg(wheel))?;
    let bin = venv.join("bin");
    let path = format!(
        "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        bin.display()
    );
    let output = Command::new("shmtrace")
        .args(["demo", "--color", "never"])
        .env("PATH", &path)
        .output()
        .context("running shmtrace from the venv's PATH")?;
    judge_demo(&output, &format!("from a venv with {}", wheel.display()))
}

/// The binary in a Debian 11 root file system, whose glibc is 2.31: made once with
/// debootstrap, then entered with chroot and the kernel's file systems mounted inside.
fn check_bullseye(binary: &Path, scratch: &Path) -> Result<()> {
    let rootfs = scratch.join("bullseye");
    // Written once debootstrap has finished: a broken run leaves a tree that looks whole.
    let made = scratch.join("bullseye.made");
    if !made.exists() {
        let _ = fs::remove_dir_all(&rootfs);
        run(Command::new("debootstrap")
            .args(["--variant=minbase", "bullseye"])
            .arg(&rootfs)
            .arg(crate::vm::debian_mirror()?))
        .context("making a Debian 11 root file system (apt-get install debootstrap)")?;
        fs::write(&made, "")?;
    }
    let glibc = Command::new("chroot")
        .arg(&rootfs)
        .args(["ldd", "--version"])
        .output()?;
    let glibc = String::from_utf8_lossy(&glibc.stdout);
    println!(
        "Debian 11 root file system: {}",
        glibc.lines().next().unwrap_or("?")
    );
    fs::copy(binary, rootfs.join("usr/local/bin/shmtrace"))?;
    let mounts = Mounts::new(&rootfs)?;
    let output = Command::new("chroot")
        .arg(&rootfs)
        .args(["/usr/local/bin/shmtrace", "demo", "--color", "never"])
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .output()?;
    drop(mounts);
    judge_demo(&output, "in Debian 11 (chroot)")
}

/// The root file system as a mount point, with the kernel's file systems the probes need
/// mounted inside, all unmounted, innermost first, when dropped.
struct Mounts {
    mounted: Vec<PathBuf>,
}

impl Mounts {
    fn new(rootfs: &Path) -> Result<Mounts> {
        let mut mounts = Mounts {
            mounted: Vec::new(),
        };
        // The root file system on itself first: the demo makes every mount private from `/`,
        // which the kernel refuses (EINVAL) unless `/` is a mount point, as it is not in a bare
        // chroot.
        run(Command::new("mount").arg("--bind").arg(rootfs).arg(rootfs))?;
        mounts.mounted.push(rootfs.to_owned());
        for (what, kind) in [
            ("/proc", None),
            ("/sys", None),
            ("/sys/kernel/tracing", None),
            ("/sys/fs/bpf", None),
            ("/dev", None),
            ("/dev/shm", Some("tmpfs")),
        ] {
            let at = rootfs.join(what.trim_start_matches('/'));
            fs::create_dir_all(&at)?;
            let mut command = Command::new("mount");
            match kind {
                Some(kind) => command.args(["-t", kind, kind]),
                None => command.args(["--bind", what]),
            };
            run(command.arg(&at))?;
            mounts.mounted.push(at);
        }
        Ok(mounts)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for at in self.mounted.iter().rev() {
            // shmtrace's detachers (docs/probes.md, Detaching) live on inside the chroot for
            // a second or two after it exits, keeping the root busy: wait for them, then let
            // the kernel finish the unmount itself.
            let unmounted = (0..10).any(|attempt| {
                if attempt > 0 {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
                Command::new("umount")
                    .arg(at)
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            });
            if !unmounted {
                let _ = Command::new("umount").arg("--lazy").arg(at).status();
            }
        }
    }
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
