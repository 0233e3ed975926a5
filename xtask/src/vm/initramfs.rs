//! The guest's root file system: an initramfs (cpio "newc", uncompressed, so that a guest
//! under TCG spends no time inflating it) holding busybox, the programs the tests run with the
//! shared libraries they load, and an `/init` script. A guest of the host's architecture gets
//! the host's libraries, as `ldd` names them; another gets those of a directory of unpacked
//! Debian packages (`vm/userland.rs`, `debian/unpack.rs`), found by the names in the programs'
//! ELF headers.
//!
//! The Debian cloud kernels have virtio and 9p as modules, if at all; an initramfs needs
//! neither, and the kernel unpacks it before running `/init`.
use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::debian::Arch;

enum Entry {
    Dir,
    File { bytes: Vec<u8>, mode: u32 },
    Symlink(String),
}

/// Where the programs' shared libraries come from.
pub enum Libraries {
    /// The host's, which `ldd` names.
    Host,
    /// Those of a foreign architecture unpacked in this directory: `ldd` cannot run its
    /// programs, so `readelf` reads what they need.
    Sysroot(PathBuf, Arch),
}

/// Files by their path in the guest.
pub struct Initramfs {
    entries: BTreeMap<PathBuf, Entry>,
    libraries: Libraries,
    /// The binutils `objcopy` that understands the guest's programs.
    objcopy: &'static str,
}

impl Initramfs {
    pub fn new(libraries: Libraries, objcopy: &'static str) -> Initramfs {
        Initramfs {
            entries: BTreeMap::new(),
            libraries,
            objcopy,
        }
    }

    pub fn dir(&mut self, guest: impl AsRef<Path>) {
        let guest = guest.as_ref();
        for ancestor in guest.ancestors() {
            if ancestor.as_os_str().is_empty() || ancestor == Path::new("/") {
                break;
            }
            self.entries
                .entry(ancestor.to_owned())
                .or_insert(Entry::Dir);
        }
    }

    fn insert(&mut self, guest: &Path, entry: Entry) {
        if let Some(parent) = guest.parent() {
            self.dir(parent);
        }
        self.entries.insert(guest.to_owned(), entry);
    }

    pub fn text(&mut self, guest: impl AsRef<Path>, text: &str, mode: u32) {
        let bytes = text.as_bytes().to_vec();
        self.insert(guest.as_ref(), Entry::File { bytes, mode });
    }

    pub fn symlink(&mut self, guest: impl AsRef<Path>, target: &str) {
        self.insert(guest.as_ref(), Entry::Symlink(target.to_owned()));
    }

    /// A host file at `guest`, with its mode.
    pub fn file(&mut self, host: &Path, guest: impl AsRef<Path>) -> Result<()> {
        let bytes = fs::read(host).with_context(|| format!("reading {}", host.display()))?;
        let mode = fs::metadata(host)?.permissions().mode() & 0o7777;
        self.insert(guest.as_ref(), Entry::File { bytes, mode });
        Ok(())
    }

    /// A host program at the same path in the guest, with the libraries it loads.
    pub fn program(&mut self, host: &Path) -> Result<()> {
        self.file(host, host)?;
        self.libraries_of(host)
    }

    /// Every file and symbolic link under host directory `dir`, at the same paths, but for
    /// the directories named in `skip` (by name, at any depth). Shared objects bring the
    /// libraries they load.
    pub fn tree(&mut self, dir: &Path, skip: &[&str]) -> Result<()> {
        for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let kind = fs::symlink_metadata(&path)?.file_type();
            if kind.is_symlink() {
                let target = fs::read_link(&path)?;
                self.symlink(&path, &target.to_string_lossy());
            } else if kind.is_dir() {
                if !skip.contains(&name) {
                    self.tree(&path, skip)?;
                }
            } else if kind.is_file() {
                self.file(&path, &path)?;
                if name.ends_with(".so") {
                    self.libraries_of(&path)?;
                }
            }
        }
        Ok(())
    }

    /// Every file, directory and symbolic link of a tar file, under `guest` (a root file
    /// system to enter with chroot).
    pub fn unpacked_tar(&mut self, tar: &Path, guest: &Path) -> Result<()> {
        let scratch = std::env::temp_dir().join(format!(
            "shmtrace-vm-untar-{}-{}",
            std::process::id(),
            self.entries.len()
        ));
        let _ = fs::remove_dir_all(&scratch);
        fs::create_dir_all(&scratch)?;
        let unpacked = Command::new("tar")
            .arg("--extract")
            .arg("--file")
            .arg(tar)
            .arg("--directory")
            .arg(&scratch)
            .status()
            .context("running tar")?;
        if !unpacked.success() {
            bail!("unpacking {} failed: {unpacked}", tar.display());
        }
        let result = self.copy_tree(&scratch, guest);
        let _ = fs::remove_dir_all(&scratch);
        result
    }

    fn copy_tree(&mut self, host: &Path, guest: &Path) -> Result<()> {
        self.dir(guest);
        for entry in fs::read_dir(host)? {
            let path = entry?.path();
            let at = guest.join(path.file_name().context("an entry with a name")?);
            let kind = fs::symlink_metadata(&path)?.file_type();
            if kind.is_symlink() {
                self.symlink(&at, &fs::read_link(&path)?.to_string_lossy());
            } else if kind.is_dir() {
                self.copy_tree(&path, &at)?;
            } else {
                self.file(&path, &at)?;
            }
        }
        Ok(())
    }

    /// A program this workspace built, without its debug information (a debug test binary is
    /// ten times larger with it), at the same path in the guest.
    pub fn built_program(&mut self, host: &Path) -> Result<()> {
        let scratch = std::env::temp_dir().join(format!(
            "shmtrace-vm-strip-{}-{}",
            std::process::id(),
            self.entries.len()
        ));
        let status = Command::new(self.objcopy)
            .arg("--strip-debug")
            .arg(host)
            .arg(&scratch)
            .status()
            .with_context(|| format!("running {} (binutils)", self.objcopy))?;
        if !status.success() {
            bail!("objcopy --strip-debug {} failed: {status}", host.display());
        }
        let result = self.file(&scratch, host);
        let _ = fs::remove_file(&scratch);
        result?;
        self.libraries_of(host)
    }

    /// A program of the sysroot, at `guest`, with the libraries it loads.
    pub fn sysroot_program(&mut self, in_root: &Path, guest: impl AsRef<Path>) -> Result<()> {
        let Libraries::Sysroot(root, _) = &self.libraries else {
            bail!("no sysroot to take {} from", in_root.display());
        };
        let host = crate::debian::resolve(root, in_root)?;
        self.file(&host, guest)?;
        self.libraries_of(&host)
    }

    /// Every shared library `program` loads, at its own path (the loader's too).
    fn libraries_of(&mut self, program: &Path) -> Result<()> {
        match &self.libraries {
            Libraries::Host => self.host_libraries_of(program),
            Libraries::Sysroot(root, arch) => {
                let (root, arch) = (root.clone(), *arch);
                self.sysroot_libraries_of(&root, arch, program)
            }
        }
    }

    /// What `program` needs, from its ELF headers, found in `root`'s library directories and
    /// put at the same paths in the guest, where the loader looks without a cache.
    fn sysroot_libraries_of(&mut self, root: &Path, arch: Arch, program: &Path) -> Result<()> {
        for (guest, host) in crate::debian::libraries_of(root, arch, program)? {
            if !self.entries.contains_key(&guest) {
                self.file(&host, &guest)?;
            }
        }
        Ok(())
    }

    /// Every shared library `ldd` names for `program`, at its own path (the loader's too).
    fn host_libraries_of(&mut self, program: &Path) -> Result<()> {
        let output = Command::new("ldd").arg(program).output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        if text.contains("not a dynamic executable") || !output.status.success() {
            return Ok(());
        }
        for line in text.lines() {
            let path = match line.split_once("=>") {
                Some((_, after)) => after.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            let Some(path) = path.filter(|p| p.starts_with('/')) else {
                continue;
            };
            let path = Path::new(path);
            if !self.entries.contains_key(path) {
                // The real file, not the symlink apt made: the guest needs the bytes.
                let real = fs::canonicalize(path)?;
                self.file(&real, path)?;
            }
        }
        Ok(())
    }

    /// Writes the archive (cpio "newc"): a header per entry, then its name and its bytes, each
    /// padded to four bytes, and the `TRAILER!!!` entry.
    pub fn write(&self, out: &Path) -> Result<()> {
        let mut archive = std::io::BufWriter::new(
            fs::File::create(out).with_context(|| format!("creating {}", out.display()))?,
        );
        let mut inode = 1u32;
        for (path, entry) in &self.entries {
            let name = path.strip_prefix("/").unwrap_or(path);
            let (mode, data): (u32, &[u8]) = match entry {
                Entry::Dir => (0o040755, &[]),
                Entry::File { bytes, mode } => (0o100000 | mode, bytes),
                Entry::Symlink(target) => (0o120777, target.as_bytes()),
            };
            write_entry(
                &mut archive,
                inode,
                mode,
                name.to_string_lossy().as_bytes(),
                data,
            )?;
            inode += 1;
        }
        write_entry(&mut archive, inode, 0, b"TRAILER!!!", &[])?;
        archive.flush()?;
        Ok(())
    }
}

fn write_entry(
    out: &mut impl Write,
    inode: u32,
    mode: u32,
    name: &[u8],
    data: &[u8],
) -> Result<()> {
    let name_size = name.len() as u32 + 1;
    let fields = [
        inode,
        mode,
        0, // uid
        0, // gid
        1, // nlink
        0, // mtime
        u32::try_from(data.len()).context("a file of 4 GiB or more")?,
        0, // devmajor
        0, // devminor
        0, // rdevmajor
        0, // rdevminor
        name_size,
        0, // check
    ];
    let mut header = String::from("070701");
    for field in fields {
        header.push_str(&format!("{field:08x}"));
    }
    out.write_all(header.as_bytes())?;
    out.write_all(name)?;
    out.write_all(&[0])?;
    out.write_all(&padding(110 + name_size as usize))?;
    out.write_all(data)?;
    out.write_all(&padding(data.len()))?;
    Ok(())
}

fn padding(len: usize) -> Vec<u8> {
    vec![0; (4 - len % 4) % 4]
}
