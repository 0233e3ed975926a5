//! The kernel matrix: Debian's own kernel packages, fetched with apt into a cache.
//!
//! Each suite gets an apt state of its own (sources, lists, package cache) under the cache, so
//! the machine's own sources stay as they are and a suite's metapackage
//! (`linux-image-cloud-amd64`) has exactly one candidate: the newest build of that line.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

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
    /// Debian suite whose archive has the package.
    pub suite: &'static str,
    /// The metapackage's flavour: `linux-image-<flavour>`.
    pub flavour: &'static str,
    /// Who runs this line, for the report and the README's table.
    pub who: &'static str,
    pub expect: Expect,
    /// What `vm-test --ci` (in `.ci/run`, on every submission) runs on it.
    pub ci: Ci,
}

/// How much of the guest suite `.ci/run` runs on a kernel, to stay within CI's time.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ci {
    /// The whole guest suite.
    Full,
    /// The guest suite without `kernel_diagnosis`: its Python workloads take the longest
    /// under emulation (10 tests, about 20 minutes on a loaded machine), so `.ci/run` runs
    /// them on the oldest supported line only.
    WithoutPython,
    /// The demo and a `dd` filling /dev/shm: another build of a line tested in full.
    Smoke,
}

/// Oldest first. The 6.1 and 6.12 lines are those of Debian 12 and 13, and of Amazon Linux
/// 2023; 5.10 (Debian 11) is below the minimum.
pub const MATRIX: &[Kernel] = &[
    Kernel {
        name: "5.10",
        suite: "bullseye",
        flavour: "cloud-amd64",
        who: "Debian 11: below the minimum, refused",
        expect: Expect::Refused,
        ci: Ci::Full,
    },
    Kernel {
        name: "6.1",
        suite: "bookworm",
        flavour: "cloud-amd64",
        who: "Debian 12; Amazon Linux 2023's first line, COS LTS",
        expect: Expect::Works,
        ci: Ci::Full,
    },
    Kernel {
        name: "6.1-rt",
        suite: "bookworm",
        flavour: "rt-amd64",
        who: "Debian 12, PREEMPT_RT build",
        expect: Expect::Works,
        ci: Ci::Smoke,
    },
    Kernel {
        name: "6.12-bpo",
        suite: "bookworm-backports",
        flavour: "cloud-amd64",
        who: "Debian 12 backports",
        expect: Expect::Works,
        ci: Ci::Smoke,
    },
    Kernel {
        name: "6.12",
        suite: "trixie",
        flavour: "cloud-amd64",
        who: "Debian 13; Amazon Linux 2023's newer line",
        expect: Expect::Works,
        ci: Ci::WithoutPython,
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

/// Where kernels and apt states are kept between runs: `SHMTRACE_VM_CACHE`, or
/// `/var/cache/shmtrace-vm` (the tests run as root).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("SHMTRACE_VM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/shmtrace-vm"))
}

/// A kernel image ready to boot, and the package it came from.
pub struct Fetched {
    pub package: String,
    pub vmlinuz: PathBuf,
}

/// The newest build of the kernel's line, downloaded and unpacked unless it already is.
pub fn fetch(kernel: &Kernel, cache: &Path) -> Result<Fetched> {
    let apt = Apt::new(cache, kernel.suite)?;
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
        apt.download(&package, &debs)?;
        let deb = newest_deb(&debs, &package)?;
        extract_vmlinuz(&deb, &unpacked)?;
    }
    Ok(Fetched { package, vmlinuz })
}

/// apt, with every path that holds state pointed under the cache.
struct Apt {
    dir: PathBuf,
    options: Vec<String>,
}

impl Apt {
    fn new(cache: &Path, suite: &str) -> Result<Apt> {
        let dir = cache.join("apt").join(suite);
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        let sources = dir.join("sources.list");
        let mirror = debian_mirror()?;
        fs::write(
            &sources,
            format!(
                "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                 {mirror} {suite} main\n"
            ),
        )?;
        let path = |p: &Path| p.display().to_string();
        let options = vec![
            format!("Dir::Etc::sourcelist={}", path(&sources)),
            "Dir::Etc::sourceparts=/nonexistent".to_owned(),
            format!("Dir::State::Lists={}", path(&dir.join("lists"))),
            format!("Dir::Cache={}", path(&dir.join("cache"))),
            // Only the package lists: no translations, no AppStream metadata.
            "Acquire::Languages=none".to_owned(),
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_owned(),
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_owned(),
        ];
        Ok(Apt { dir, options })
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        for option in &self.options {
            command.arg("-o").arg(option);
        }
        command
    }

    fn update(&self) -> Result<()> {
        let output = self.command("apt-get").args(["-qq", "update"]).output()?;
        if !output.status.success() {
            bail!(
                "apt-get update for {} failed: {}",
                self.dir.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }

    /// The versioned package a metapackage depends on: `linux-image-6.1.0-50-cloud-amd64`.
    fn dependency_of(&self, meta: &str) -> Result<String> {
        let output = self.command("apt-cache").args(["depends", meta]).output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines()
            .filter_map(|line| line.trim().strip_prefix("Depends: "))
            .find(|dep| dep.starts_with("linux-image-"))
            .map(str::to_owned)
            .with_context(|| format!("{meta} in {} depends on no kernel", self.dir.display()))
    }

    fn download(&self, package: &str, into: &Path) -> Result<()> {
        let status = self
            .command("apt-get")
            .args(["-qq", "download", package])
            .current_dir(into)
            .status()?;
        if !status.success() {
            bail!("apt-get download {package} failed: {status}");
        }
        Ok(())
    }
}

/// The Debian archive this machine's own apt sources use: other suites of the same archive
/// serve the matrix's kernels.
fn debian_mirror() -> Result<String> {
    let mut texts = Vec::new();
    texts.extend(fs::read_to_string("/etc/apt/sources.list").ok());
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        texts.extend(entries.filter_map(|e| fs::read_to_string(e.ok()?.path()).ok()));
    }
    texts.iter().find_map(|text| mirror_in(text)).context(
        "no Debian archive in /etc/apt/sources.list or sources.list.d/ to fetch kernels from",
    )
}

/// The first URI of a Debian archive (a path ending in `/debian`) in an apt sources text, in
/// either format: one-line (`deb URI SUITE ...`) or deb822 (`URIs: URI`).
fn mirror_in(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if let Some(uris) = line.strip_prefix("URIs:") {
                return uris.split_whitespace().next();
            }
            let rest = line.strip_prefix("deb ")?.trim_start();
            // Options in brackets come first when present.
            let rest = match rest.strip_prefix('[') {
                Some(options) => options.split_once(']')?.1,
                None => rest,
            };
            rest.split_whitespace().next()
        })
        .find(|uri| uri.trim_end_matches('/').ends_with("/debian"))
        .map(|uri| uri.trim_end_matches('/').to_owned())
}

fn newest_deb(dir: &Path, package: &str) -> Result<PathBuf> {
    let prefix = format!("{package}_");
    let mut debs: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
        .collect();
    debs.sort();
    debs.pop().with_context(|| {
        format!(
            "apt-get download left no {package}_*.deb in {}",
            dir.display()
        )
    })
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

    #[test]
    fn the_archive_is_found_in_either_sources_format() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n\
                      Types: deb\nURIs: http://mirror.example/debian-security\n";
        assert_eq!(
            mirror_in(deb822).as_deref(),
            Some("http://mirror.example/debian")
        );
        let one_line = "deb http://other.example/apt cloud main\n\
                        deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main\n";
        assert_eq!(
            mirror_in(one_line).as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            mirror_in("deb https://nodes.example/node_20.x nodistro main\n"),
            None
        );
    }
}
