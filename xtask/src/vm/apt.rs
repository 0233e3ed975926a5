//! apt with a private state: Debian packages of any suite and architecture, downloaded and
//! unpacked, never installed.
//!
//! Each suite and architecture gets an apt state of its own (sources, lists, package cache)
//! under the cache, so the machine's own sources stay as they are, a suite's metapackage
//! (`linux-image-cloud-amd64`) has exactly one candidate, the newest build of that line, and
//! an arm64 package is never a candidate for the host.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::arch::Arch;

/// apt, with every path that holds state pointed under the cache.
pub struct Apt {
    pub dir: PathBuf,
    arch: Arch,
    options: Vec<String>,
}

impl Apt {
    pub fn new(cache: &Path, suite: &str, arch: Arch) -> Result<Apt> {
        // amd64's states keep the names they had before there were other architectures.
        let dir = match arch {
            Arch::X86_64 => cache.join("apt").join(suite),
            _ => cache.join("apt").join(format!("{suite}-{}", arch.debian())),
        };
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        let sources = dir.join("sources.list");
        fs::write(
            &sources,
            format!(
                "deb [arch={} signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                 ARCHIVE {suite} main\n",
                arch.debian()
            ),
        )?;
        let path = |p: &Path| p.display().to_string();
        let mut options = vec![
            format!("Dir::Etc::sourcelist={}", path(&sources)),
            "Dir::Etc::sourceparts=/nonexistent".to_owned(),
            format!("Dir::State::Lists={}", path(&dir.join("lists"))),
            format!("Dir::Cache={}", path(&dir.join("cache"))),
            // Only the package lists: no translations, no AppStream metadata.
            "Acquire::Languages=none".to_owned(),
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_owned(),
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_owned(),
        ];
        if arch != Arch::X86_64 {
            // The lists and candidates of that architecture alone, as if apt ran there.
            options.push(format!("APT::Architectures::={}", arch.debian()));
            options.push(format!("APT::Architecture={}", arch.debian()));
        }
        Ok(Apt {
            dir,
            arch,
            options,
        })
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        for option in &self.options {
            command.arg("-o").arg(option);
        }
        command
    }

    pub fn update(&self) -> Result<()> {
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
    pub fn dependency_of(&self, meta: &str) -> Result<String> {
        let output = self.command("apt-cache").args(["depends", meta]).output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines()
            .filter_map(|line| line.trim().strip_prefix("Depends: "))
            .find(|dep| dep.starts_with("linux-image-"))
            .map(str::to_owned)
            .with_context(|| format!("{meta} in {} depends on no kernel", self.dir.display()))
    }

    /// Downloads `package` into `into` and returns its `.deb`.
    pub fn download(&self, package: &str, into: &Path) -> Result<PathBuf> {
        let status = self
            .command("apt-get")
            .args(["-qq", "download", package])
            .current_dir(into)
            .status()?;
        if !status.success() {
            bail!("apt-get download {package} failed: {status}");
        }
        self.newest_deb(into, package)
    }

    /// The newest `.deb` of `package` for this architecture (or for all) in `dir`.
    fn newest_deb(&self, dir: &Path, package: &str) -> Result<PathBuf> {
        let prefix = format!("{package}_");
        let suffixes = [format!("_{}.deb", self.arch.debian()), "_all.deb".to_owned()];
        let mut debs: Vec<PathBuf> = fs::read_dir(dir)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| {
                        n.starts_with(&prefix) && suffixes.iter().any(|s| n.ends_with(s.as_str()))
                    })
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
}
