//! The kernel matrix: Debian's own kernel packages, fetched with apt (`debian/apt.rs`) into a
//! cache.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::debian::{Apt, Arch};

/// What a kernel of the matrix is expected to do with shmtrace.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Expect {
    /// Load every probe and pass the tests.
    Works,
    /// Below the minimum: refuse in one sentence that names the kernel and the minimum.
    Refused,
}

pub struct Kernel {
    /// Short name, for `--kernel` and the report.
    pub name: &'static str,
    pub arch: Arch,
    /// Debian suite whose archive has the package.
    pub suite: &'static str,
    /// The metapackage's flavour: `linux-image-<flavour>`.
    pub flavour: &'static str,
    /// Who runs this line, for the report and the README's table.
    pub who: &'static str,
    pub expect: Expect,
    /// What `vm-test --ci` (in `.ci/run`, on every submission) runs on it.
    pub ci: Ci,
    /// What `vm-test --ci --full` (in `.ci/run --full`) runs on it.
    pub full: Ci,
}

/// How much of the guest suite `.ci/run` runs on a kernel, to stay within CI's time. What
/// differs from one kernel to another is what the probes meet (the verifier, the tracepoints,
/// the structs' layouts), so every submission runs every probe's tests on the main build of
/// each supported line; the rest of the guest suite is the same userspace on every kernel,
/// which the host's kernel runs in full (`cargo xtask test`), and `.ci/run --full` in guests.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ci {
    /// The whole guest suite.
    Full,
    /// The smoke test and the whole of `kernel_probes`: every probe's tests.
    ProbeSuite,
    /// The demo and a `dd` filling /dev/shm: another build of a line tested in full.
    Smoke,
    /// The smoke test and a test of each probe (`vm::PROBES`): an architecture whose
    /// emulation is too slow for the whole suite within CI's time (arm64 under TCG).
    Probes,
}

/// x86-64 then arm64, oldest first. The 6.1 and 6.12 lines are those of Debian 12 and 13, and
/// of Amazon Linux 2023; 5.10 (Debian 11) is below the minimum. The arm64 kernels are the
/// same lines built for arm64, as Graviton and Ampere nodes run them.
pub const MATRIX: &[Kernel] = &[
    Kernel {
        name: "5.10",
        arch: Arch::X86_64,
        suite: "bullseye",
        flavour: "cloud-amd64",
        who: "Debian 11: below the minimum, refused",
        expect: Expect::Refused,
        ci: Ci::Full,
        full: Ci::Full,
    },
    Kernel {
        name: "6.1",
        arch: Arch::X86_64,
        suite: "bookworm",
        flavour: "cloud-amd64",
        who: "Debian 12; Amazon Linux 2023's first line, COS LTS",
        expect: Expect::Works,
        ci: Ci::ProbeSuite,
        full: Ci::Full,
    },
    Kernel {
        name: "6.1-rt",
        arch: Arch::X86_64,
        suite: "bookworm",
        flavour: "rt-amd64",
        who: "Debian 12, PREEMPT_RT build",
        expect: Expect::Works,
        ci: Ci::Smoke,
        full: Ci::ProbeSuite,
    },
    Kernel {
        name: "6.12-bpo",
        arch: Arch::X86_64,
        suite: "bookworm-backports",
        flavour: "cloud-amd64",
        who: "Debian 12 backports",
        expect: Expect::Works,
        ci: Ci::Smoke,
        full: Ci::ProbeSuite,
    },
    Kernel {
        name: "6.12",
        arch: Arch::X86_64,
        suite: "trixie",
        flavour: "cloud-amd64",
        who: "Debian 13; Amazon Linux 2023's newer line",
        expect: Expect::Works,
        ci: Ci::ProbeSuite,
        full: Ci::Full,
    },
    Kernel {
        name: "6.1-arm64",
        arch: Arch::Aarch64,
        suite: "bookworm",
        flavour: "cloud-arm64",
        who: "Debian 12 on arm64 (Graviton, Ampere)",
        expect: Expect::Works,
        ci: Ci::Probes,
        full: Ci::Probes,
    },
    Kernel {
        name: "6.12-arm64",
        arch: Arch::Aarch64,
        suite: "trixie",
        flavour: "cloud-arm64",
        who: "Debian 13 on arm64; Amazon Linux 2023's newer line on Graviton",
        expect: Expect::Works,
        ci: Ci::Probes,
        full: Ci::Probes,
    },
];

/// The kernels named (all of them when none is), or an error naming the unknown one.
pub fn select(names: &[String]) -> Result<Vec<&'static Kernel>> {
    if names.is_empty() {
        return Ok(MATRIX.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            MATRIX.iter().find(|k| k.name == name).with_context(|| {
                let known: Vec<&str> = MATRIX.iter().map(|k| k.name).collect();
                format!(
                    "no kernel {name:?} in the matrix; known: {}",
                    known.join(", ")
                )
            })
        })
        .collect()
}

/// A kernel image ready to boot, and the package it came from.
pub struct Fetched {
    pub package: String,
    pub vmlinuz: PathBuf,
}

/// The newest build of the kernel's line, downloaded and unpacked unless it already is.
pub fn fetch(kernel: &Kernel, cache: &Path) -> Result<Fetched> {
    let apt = Apt::new(cache, kernel.suite, kernel.arch)?;
    let meta = format!("linux-image-{}", kernel.flavour);
    let package = match apt.update().and_then(|()| apt.dependency_of(&meta)) {
        Ok(package) => {
            fs::write(apt.dir.join(format!("{meta}.resolved")), &package)?;
            package
        }
        // Offline: the build resolved last time, if any.
        Err(error) => fs::read_to_string(apt.dir.join(format!("{meta}.resolved")))
            .map(|text| text.trim().to_owned())
            .map_err(|_| error)
            .context("no kernel of this line was fetched before either")?,
    };
    let unpacked = cache.join("kernels").join(&package);
    let vmlinuz = unpacked.join("vmlinuz");
    if !vmlinuz.exists() {
        let debs = cache.join("debs");
        fs::create_dir_all(&debs)?;
        let deb = apt.download(&package, &debs)?;
        extract_vmlinuz(&deb, &unpacked)?;
    }
    Ok(Fetched { package, vmlinuz })
}

/// Unpacks the package's `boot/vmlinuz-*` as `into/vmlinuz`, through a scratch directory so
/// that a broken unpack never leaves a `vmlinuz` behind.
fn extract_vmlinuz(deb: &Path, into: &Path) -> Result<()> {
    let mut scratch = into.as_os_str().to_owned();
    scratch.push(".unpacking");
    let scratch = PathBuf::from(scratch);
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    crate::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&scratch))?;
    let boot = scratch.join("boot");
    let image = fs::read_dir(&boot)
        .with_context(|| format!("{} has no boot/", deb.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .with_context(|| format!("{} has no boot/vmlinuz-*", deb.display()))?;
    fs::create_dir_all(into)?;
    fs::rename(&image, into.join("vmlinuz"))?;
    fs::remove_dir_all(&scratch)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What docs/kernels.md's table says a selection runs.
    fn words(ci: Ci) -> &'static str {
        match ci {
            Ci::Full => "the whole guest suite",
            Ci::ProbeSuite => {
                "every test of `kernel_probes` and `kernel_host_wide_deaths`, the demo and `dd`"
            }
            Ci::Smoke => "the demo and `dd`",
            Ci::Probes => "a test of each probe, the demo and `dd`",
        }
    }

    /// docs/kernels.md's table says, for each kernel of the matrix, what `.ci/run` runs on it
    /// on every submission and with `--full`.
    #[test]
    fn the_kernels_table_says_what_ci_runs() {
        let text = std::fs::read_to_string(crate::root().join("docs/kernels.md")).unwrap();
        for kernel in MATRIX {
            let package = format!("| {} `linux-image-{}` |", kernel.suite, kernel.flavour);
            let row = text
                .lines()
                .find(|line| line.contains(&package))
                .unwrap_or_else(|| panic!("docs/kernels.md has no row for {}", kernel.name));
            if kernel.expect == Expect::Refused {
                assert!(
                    row.contains("refused in one sentence on every submission"),
                    "{row}"
                );
                continue;
            }
            for (ci, when) in [
                (kernel.ci, "on every submission"),
                (kernel.full, "with `--full`"),
            ] {
                let said = format!("{} {when}", words(ci));
                assert!(
                    row.contains(&said),
                    "{}: {row:?} should say {said:?}",
                    kernel.name
                );
            }
        }
    }
}
