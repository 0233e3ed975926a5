//! apt with a private state: Debian packages of any suite and architecture, downloaded and
//! unpacked, never installed.
//!
//! Each suite and architecture gets an apt state of its own (sources, lists, package cache)
//! under the cache, with the machine's own Debian archive as its source, so the machine's own
//! sources stay as they are, a suite's metapackage
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
        let mirror = debian_mirror()?;
        fs::write(
            &sources,
            format!(
                "deb [arch={} signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                 {mirror} {suite} main\n",
                arch.debian()
            ),
        )?;
        // An empty dpkg status of its own: nothing counts as installed, so the candidate is
        // the suite's own version even where the host has a newer one (its libc6, say).
        let status = dir.join("status");
        fs::write(&status, "")?;
        let path = |p: &Path| p.display().to_string();
        let mut options = vec![
            format!("Dir::Etc::sourcelist={}", path(&sources)),
            format!("Dir::State::status={}", path(&status)),
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
        Ok(Apt { dir, arch, options })
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
        let suffixes = [
            format!("_{}.deb", self.arch.debian()),
            "_all.deb".to_owned(),
        ];
        let mut debs: Vec<PathBuf> = fs::read_dir(dir)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| {
                path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
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

/// The Debian archive this machine's own apt sources use: other suites of the same archive
/// serve the matrix's kernels.
pub fn debian_mirror() -> Result<String> {
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
