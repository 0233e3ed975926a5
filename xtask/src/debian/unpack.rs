//! Debian packages of any release and architecture unpacked into a directory (a sysroot),
//! never installed, and what a program there loads, found from its ELF headers as the loader
//! would find it with no cache ([`libraries_of`]). The kernel matrix's arm64 guests take
//! their tools from such a sysroot (`vm/userland.rs`), the release image its glibc
//! (`dist/image.rs`).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::{apt::Apt, arch::Arch};

/// `packages` of Debian `suite` for `arch`, unpacked into one directory under the cache, now
/// unless they already are (the same list, from the same suite).
pub fn unpacked(cache: &Path, suite: &str, arch: Arch, packages: &[&str]) -> Result<PathBuf> {
    let root = cache
        .join("userland")
        .join(format!("{suite}-{}", arch.debian()));
    let stamp = root.join(".packages");
    let wanted = packages.join("\n");
    if fs::read_to_string(&stamp).is_ok_and(|text| text == wanted) {
        return Ok(root);
    }
    let apt = Apt::new(cache, suite, arch)?;
    apt.update()?;
    let debs = cache.join("debs");
    fs::create_dir_all(&debs)?;
    // Through a scratch directory, so that a broken unpack never passes for a whole one.
    let mut scratch = root.as_os_str().to_owned();
    scratch.push(".unpacking");
    let scratch = PathBuf::from(scratch);
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch)?;
    for package in packages {
        let deb = apt
            .download(package, &debs)
            .with_context(|| format!("fetching {package} of {suite} for {}", arch.debian()))?;
        crate::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&scratch))?;
    }
    fs::write(scratch.join(".packages"), &wanted)?;
    let _ = fs::remove_dir_all(&root);
    fs::rename(&scratch, &root)?;
    Ok(root)
}

/// Every shared library `program` loads, the loader included, and what those load in turn,
/// found in `root` (a sysroot of `arch`) where Debian's loader looks with no cache: each as
/// (its path on the target, the file in `root`). A static program loads nothing.
pub fn libraries_of(root: &Path, arch: Arch, program: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut found: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut pending = vec![program.to_owned()];
    while let Some(elf) = pending.pop() {
        let (interpreter, needed) = elf_dependencies(&elf)?;
        if let Some(interpreter) = interpreter {
            let target = PathBuf::from(interpreter);
            if !found.iter().any(|(t, _)| *t == target) {
                let host = resolve(root, &target)?;
                found.push((target, host));
            }
        }
        for soname in needed {
            let located = arch.library_dirs().iter().find_map(|dir| {
                let target = Path::new(dir).join(&soname);
                resolve(root, &target).ok().map(|host| (target, host))
            });
            let Some((target, host)) = located else {
                bail!(
                    "{} needs {soname}, which no package unpacked in {} has",
                    elf.display(),
                    root.display()
                );
            };
            if !found.iter().any(|(t, _)| *t == target) {
                pending.push(host.clone());
                found.push((target, host));
            }
        }
    }
    Ok(found)
}

/// An ELF file's program interpreter and the sonames it needs, as `readelf` (which reads any
/// architecture's) shows them.
fn elf_dependencies(elf: &Path) -> Result<(Option<String>, Vec<String>)> {
    let output = Command::new("readelf")
        .args(["--wide", "--program-headers", "--dynamic"])
        .arg(elf)
        .output()
        .context("running readelf (binutils)")?;
    if !output.status.success() {
        bail!(
            "readelf {} failed: {}",
            elf.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let interpreter = text.lines().find_map(|line| {
        let rest = line.split("Requesting program interpreter: ").nth(1)?;
        Some(rest.trim_end_matches(']').to_owned())
    });
    let needed = text
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| {
            let start = line.find('[')? + 1;
            let end = line.rfind(']')?;
            Some(line[start..end].to_owned())
        })
        .collect();
    Ok((interpreter, needed))
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
        let root = std::env::temp_dir().join(format!("shmtrace-unpack-{}", std::process::id()));
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
