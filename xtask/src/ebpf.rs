//! Building the eBPF object, and knowing whether the committed one is current.
//!
//! Users build the CLI with stable Rust alone, because the object is committed (as Go's bpf2go
//! projects do). The object is not byte-reproducible across toolchains, so freshness is keyed
//! on a hash of what it is built from: the eBPF and common crates' sources and manifests, the
//! locked versions of their registry dependencies, and the build flags below.
use std::{
    collections::{BTreeSet, HashMap},
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::{root, run};

const OBJECT: &str = "shmtrace/bpf/shmtrace.bpf.o";
const INPUTS: &str = "shmtrace/bpf/shmtrace.bpf.o.inputs";
const TARGET: &str = "bpfel-unknown-none";
/// Flags as aya-build passes them; part of the hash, so changing them marks the object stale.
///
/// One object serves x86-64 and arm64 alike: `bpf_target_arch` picks only aya-ebpf's
/// per-architecture types (`pt_regs` for kprobes, `c_char`), which the probes do not use (see
/// [`ARCH_DEPENDENT`]); what differs, the registers a call's arguments were saved in and which
/// calls exist, comes from userspace at load (`shmtrace/src/live/bpf/arch.rs`). It is pinned to
/// x86_64 so that the object is the same whatever machine builds it.
const RUSTFLAGS: [&str; 3] = [
    "--cfg=bpf_target_arch=\"x86_64\"",
    "-Cdebuginfo=2",
    "-Clink-arg=--btf",
];
/// aya-ebpf items whose layout follows `bpf_target_arch`: using one would make the object
/// right for x86-64 only. `check-ebpf` refuses sources that name them.
const ARCH_DEPENDENT: [&str; 6] = [
    "PtRegs",
    "ProbeContext",
    "RetProbeContext",
    "bindings::pt_regs",
    "user_pt_regs",
    "c_char",
];
/// Crates whose sources go into the object.
const SOURCE_CRATES: [&str; 2] = ["shmtrace-ebpf", "shmtrace-common"];

/// `cargo +nightly <subcommand>` of the eBPF crate for its real target, with the object's
/// flags: what `build` builds is what `lint` checks.
fn nightly_cargo(subcommand: &str, target_dir: &Path) -> Command {
    let mut command = Command::new("rustup");
    command
        .current_dir(root())
        .args(["run", "nightly", "cargo", subcommand])
        .args(["--package", "shmtrace-ebpf", "--bins", "--release"])
        .args(["--target", TARGET, "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", RUSTFLAGS.join("\x1f"))
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTUP_TOOLCHAIN");
    command
}

/// Where the eBPF builds go: `bpf/` under the workspace's target directory.
fn bpf_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
        .join("bpf")
}

pub fn build(verify_only: bool) -> Result<()> {
    let root = root();
    let target_dir = bpf_target_dir();
    run(&mut nightly_cargo("build", &target_dir)).context(
        "building the eBPF object needs nightly with rust-src and bpf-linker (see .ci/run)",
    )?;
    let built = target_dir.join(TARGET).join("release/shmtrace-ebpf");
    if verify_only {
        println!("the eBPF sources build ({})", built.display());
        return Ok(());
    }
    let object = root.join(OBJECT);
    strip_or_copy(&built, &object)?;
    let digest = inputs_digest(&root)?;
    fs::write(root.join(INPUTS), digest.render())?;
    println!(
        "wrote {OBJECT} ({} bytes) and {INPUTS} (inputs sha256 {})",
        fs::metadata(&object)?.len(),
        digest.hash
    );
    Ok(())
}

/// Clippy on the eBPF crate as it is really built (the BPF target, `core` only), warnings as
/// errors: the workspace's `cargo clippy` cannot check it, as it builds only for that target.
pub fn lint() -> Result<()> {
    run(nightly_cargo("clippy", &bpf_target_dir()).args(["--", "-D", "warnings"]))
        .context("clippy found problems in shmtrace-ebpf (or nightly's clippy is missing)")?;
    println!("shmtrace-ebpf passes clippy for {TARGET}");
    Ok(())
}

pub fn check() -> Result<()> {
    let root = root();
    check_arch_neutral(&root)?;
    let recorded = fs::read_to_string(root.join(INPUTS))
        .with_context(|| format!("{INPUTS} is missing: run `cargo xtask build-ebpf`"))?;
    let recorded_hash = recorded
        .lines()
        .find_map(|line| line.strip_prefix("sha256 "))
        .with_context(|| format!("{INPUTS} has no `sha256` line"))?;
    let current = inputs_digest(&root)?;
    if recorded_hash != current.hash {
        bail!(
            "{OBJECT} is stale: its inputs changed since it was built (recorded {recorded_hash}, \
             now {}). Run `cargo xtask build-ebpf` and commit the result.",
            current.hash
        );
    }
    if !root.join(OBJECT).exists() {
        bail!("{OBJECT} is missing: run `cargo xtask build-ebpf`");
    }
    println!("{OBJECT} is up to date (inputs sha256 {})", current.hash);
    Ok(())
}

/// The one object is loaded on every architecture: fails when a probe source names an item of
/// aya-ebpf whose layout is x86-64's in it (see [`ARCH_DEPENDENT`]).
fn check_arch_neutral(root: &Path) -> Result<()> {
    let mut found = Vec::new();
    for file in crate_files(&root.join("shmtrace-ebpf"))? {
        let text = fs::read_to_string(&file)?;
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for item in ARCH_DEPENDENT.iter().filter(|item| code.contains(*item)) {
                found.push(format!(
                    "{}:{}: {item}",
                    file.strip_prefix(root)?.display(),
                    number + 1
                ));
            }
        }
    }
    if !found.is_empty() {
        bail!(
            "the eBPF object is shared by x86-64 and arm64, but these use aya-ebpf's \
             per-architecture layouts (read registers at offsets from userspace instead, as \
             kernel::syscall_args does):\n  {}",
            found.join("\n  ")
        );
    }
    println!(
        "the eBPF sources use nothing architecture-specific (one object for x86-64 and arm64)"
    );
    Ok(())
}

/// DWARF is only needed to generate BTF; the committed object keeps BTF and drops DWARF.
fn strip_or_copy(built: &Path, object: &Path) -> Result<()> {
    for strip in [
        "llvm-strip-22",
        "/usr/lib/llvm-22/bin/llvm-strip",
        "llvm-strip",
    ] {
        let status = Command::new(strip)
            .arg("--strip-debug")
            .arg("-o")
            .arg(object)
            .arg(built)
            .status();
        if matches!(status, Ok(s) if s.success()) {
            return Ok(());
        }
    }
    fs::copy(built, object).context("copying the eBPF object")?;
    Ok(())
}

struct Digest256 {
    hash: String,
    listing: Vec<String>,
}

impl Digest256 {
    fn render(&self) -> String {
        let mut text = format!(
            "# Inputs of shmtrace.bpf.o, checked by `cargo xtask check-ebpf`.\nsha256 {}\n",
            self.hash
        );
        for line in &self.listing {
            text.push_str(line);
            text.push('\n');
        }
        text
    }
}

/// Hash of every input, with a listing of what went in.
fn inputs_digest(root: &Path) -> Result<Digest256> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for krate in SOURCE_CRATES {
        for file in crate_files(&root.join(krate))? {
            let bytes = fs::read(&file)?;
            let name = file.strip_prefix(root)?.to_string_lossy().into_owned();
            entries.push((name, hex(&Sha256::digest(&bytes))));
        }
    }
    for package in locked_dependencies(root)? {
        entries.push((format!("lock {package}"), String::new()));
    }
    entries.push(("rustflags".to_owned(), RUSTFLAGS.join(" ")));
    entries.push(("profile".to_owned(), ebpf_profile(root)?));
    entries.sort();
    let mut hasher = Sha256::new();
    let mut listing = Vec::new();
    for (name, value) in &entries {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(value.as_bytes());
        hasher.update([0]);
        listing.push(if value.is_empty() {
            name.clone()
        } else {
            format!("{name} {value}")
        });
    }
    Ok(Digest256 {
        hash: hex(&hasher.finalize()),
        listing,
    })
}

/// Manifests and sources of a crate (not its build output).
fn crate_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name == "target" || name.starts_with('.') {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if name.ends_with(".rs") || name == "Cargo.toml" {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The workspace's `[profile.release.package.shmtrace-ebpf]` section, as written.
fn ebpf_profile(root: &Path) -> Result<String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml"))?;
    let mut section = String::new();
    let mut inside = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            inside = line.trim() == "[profile.release.package.shmtrace-ebpf]";
        }
        if inside {
            section.push_str(line.trim());
            section.push('\n');
        }
    }
    Ok(section)
}

/// `name version source` of every registry package the eBPF crate builds with, from
/// Cargo.lock. Workspace crates are hashed by content instead, and their (userspace-only,
/// optional) dependencies are not followed.
fn locked_dependencies(root: &Path) -> Result<BTreeSet<String>> {
    let metadata = crate::cargo_metadata(root, &["--locked"])?;
    let packages: HashMap<&str, &serde_json::Value> = metadata["packages"]
        .as_array()
        .context("metadata packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: HashMap<&str, Vec<&str>> = metadata["resolve"]["nodes"]
        .as_array()
        .context("metadata resolve")?
        .iter()
        .filter_map(|n| {
            let deps = n["deps"]
                .as_array()?
                .iter()
                .filter_map(|d| d["pkg"].as_str())
                .collect();
            Some((n["id"].as_str()?, deps))
        })
        .collect();
    let is_local = |id: &str| packages.get(id).is_none_or(|p| p["source"].is_null());
    let start = packages
        .iter()
        .find(|(_, p)| p["name"] == "shmtrace-ebpf")
        .map(|(id, _)| *id)
        .context("shmtrace-ebpf is not in the workspace")?;
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = nodes.get(start).cloned().unwrap_or_default();
    let mut out = BTreeSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) || is_local(id) {
            continue;
        }
        let p = packages[id];
        out.insert(format!(
            "{} {} {}",
            p["name"].as_str().unwrap_or("?"),
            p["version"].as_str().unwrap_or("?"),
            p["source"].as_str().unwrap_or("?")
        ));
        stack.extend(nodes.get(id).cloned().unwrap_or_default());
    }
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
