//! Opening output files as root without being tricked into writing somewhere else.
//!
//! shmtrace runs as root and is often pointed at shared directories (`-o /tmp/trace.shmtrace`).
//! Anyone who can write there can plant a symbolic link or a hard link named like the output,
//! or a FIFO, so that root overwrites `/etc/shadow` or blocks forever. Every file shmtrace
//! writes (`-o`, `record -o` and its rotated files, flight-recorder dumps, `report --html`,
//! `--perfetto`, `--redact -o`) is opened here, by these rules:
//!
//! - the last component must not be a symbolic link (checked with `lstat`, and the open uses
//!   `O_NOFOLLOW`, so a link planted between the two is refused too);
//! - an existing file must be a regular file with a single name (a hard link is refused: it
//!   would change the file under its other name) and, in a shared directory (world-writable,
//!   or group-writable and sticky, like `/tmp`), owned by the user shmtrace runs as;
//! - after opening, `fstat` must show the same file `lstat` saw, so a swap in between is
//!   caught;
//! - a file that is one of the command's inputs (same device and inode, so a hard link of the
//!   input is caught too) is refused;
//! - numbered files (rotation, dumps) are created with `O_EXCL`: they must be new;
//! - a recording takes an exclusive `flock` before truncating, so two recorders cannot write
//!   one file;
//! - files written only at the end (`--html`, `--perfetto`) go to a new temporary file in the
//!   same directory, renamed over the name when complete, so a failure leaves no half file.
//!
//! `-o -`, `/dev/stdout`, `/dev/stderr` and `/dev/fd/N` write to the descriptor the shell
//! opened, without truncating it; `/dev/null` discards.
use std::{
    fs::{File, Metadata},
    io,
    os::{
        fd::AsRawFd,
        unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

/// A file's identity: its device and inode. Two paths with the same identity are one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    pub fn of(metadata: &Metadata) -> FileId {
        FileId {
            dev: metadata.dev(),
            ino: metadata.ino(),
        }
    }

    /// The file `path` names, following links (an input is read through them).
    pub fn of_path(path: &Path) -> io::Result<FileId> {
        Ok(FileId::of(&std::fs::metadata(path)?))
    }
}

/// How an output file is opened.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// The file must not exist yet (numbered files of a rotation, flight-recorder dumps).
    pub create_new: bool,
    /// Take an exclusive lock, failing at once if another process holds it (a recording).
    pub lock: bool,
    /// The command's inputs: writing any of them would destroy what is being read.
    pub inputs: Vec<FileId>,
}

impl OpenOptions {
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    pub fn create_new(mut self) -> OpenOptions {
        self.create_new = true;
        self
    }

    pub fn locked(mut self) -> OpenOptions {
        self.lock = true;
        self
    }

    pub fn not_over(mut self, inputs: &[FileId]) -> OpenOptions {
        self.inputs.extend_from_slice(inputs);
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "{path} is a symbolic link; shmtrace does not write through links (as root, a link \
         planted in a shared directory could make it overwrite any file): remove it or choose \
         another path"
    )]
    Symlink { path: PathBuf },
    #[error("{path} is {kind}, not a regular file; choose the path of a file to write")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "{path} has {links} hard links; writing it would change the file under its other \
         names too: remove it or choose another path"
    )]
    HardLinked { path: PathBuf, links: u64 },
    #[error(
        "{path} belongs to another user (uid {owner}) in a shared directory; shmtrace does not \
         overwrite other users' files there: remove it or choose another path"
    )]
    Foreign { path: PathBuf, owner: u32 },
    #[error(
        "{path} is the file being read (the same file, perhaps under another name); writing \
         it would destroy the input: choose another output path"
    )]
    IsInput { path: PathBuf },
    #[error("{path} exists already; remove it or choose another path")]
    Exists { path: PathBuf },
    #[error(
        "{path} is being written by another process (another `shmtrace record -o` holds its \
         lock); choose another path, or stop the other recording first"
    )]
    Locked { path: PathBuf },
    #[error(
        "{path} was replaced while it was being opened (by another process in its directory); \
         nothing was written: try again, or choose a directory only you can write"
    )]
    Raced { path: PathBuf },
    /// The reason is in the message, not a source of its own: shown once.
    #[error("cannot {what} {path}: {error}{}", hint(what, error))]
    Io {
        what: &'static str,
        path: PathBuf,
        error: io::Error,
    },
}

/// The one device shmtrace writes to by name: output thrown away (`-o /dev/null`, as when only
/// the summary or the exit status matters). Only root can replace it, so it needs no checks.
const DISCARD: &str = "/dev/null";

/// The standard stream a path names (`-`, `/dev/stdout`, `/dev/fd/1`, ...), if any.
fn stdio_fd(path: &Path) -> Option<i32> {
    let text = path.to_str()?;
    match text {
        "-" | "/dev/stdout" | "/proc/self/fd/1" => Some(1),
        "/dev/stderr" | "/proc/self/fd/2" => Some(2),
        _ => text
            .strip_prefix("/dev/fd/")
            .or_else(|| text.strip_prefix("/proc/self/fd/"))
            .and_then(|n| n.parse().ok()),
    }
}

/// Whether `path` names a descriptor the shell opened rather than a file to create.
pub fn is_stdio(path: &Path) -> bool {
    stdio_fd(path).is_some()
}

/// Opens `path` for writing by the rules above; an existing file is truncated (after the lock
/// is taken, so a second recorder does not empty the first one's file).
pub fn create(path: &Path, options: &OpenOptions) -> Result<File, OpenError> {
    if let Some(fd) = stdio_fd(path) {
        return dup_stdio(path, fd);
    }
    if path == Path::new(DISCARD) {
        return File::options()
            .write(true)
            .open(DISCARD)
            .map_err(|source| OpenError::Io {
                what: "open",
                path: path.to_path_buf(),
                error: source,
            });
    }
    let io = |what, source| OpenError::Io {
        what,
        path: path.to_path_buf(),
        error: source,
    };
    let before = match std::fs::symlink_metadata(path) {
        Ok(metadata) => {
            if options.create_new {
                return Err(OpenError::Exists {
                    path: path.to_path_buf(),
                });
            }
            check_existing(path, &metadata, options)?;
            Some(metadata)
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(io("look at", error)),
    };
    let mut open = File::options();
    open.write(true)
        .mode(0o644)
        // O_NONBLOCK: a FIFO swapped in after the check must not block the open.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    if before.is_some() {
        open.create(false);
    } else {
        open.create_new(true);
    }
    let existed = before.is_some();
    let file = open
        .open(path)
        .map_err(|error| match error.raw_os_error() {
            Some(libc::ELOOP) => OpenError::Symlink {
                path: path.to_path_buf(),
            },
            Some(libc::EEXIST) if options.create_new => OpenError::Exists {
                path: path.to_path_buf(),
            },
            // It appeared, or went, between the look and the open.
            Some(libc::EEXIST) => OpenError::Raced {
                path: path.to_path_buf(),
            },
            Some(libc::ENOENT) if existed => OpenError::Raced {
                path: path.to_path_buf(),
            },
            Some(libc::ENXIO) => OpenError::NotRegular {
                path: path.to_path_buf(),
                kind: "a FIFO",
            },
            _ => io("create", error),
        })?;
    let opened = file.metadata().map_err(|e| io("look at", e))?;
    match &before {
        Some(before) if FileId::of(before) != FileId::of(&opened) => {
            return Err(OpenError::Raced {
                path: path.to_path_buf(),
            });
        }
        _ => check_existing(path, &opened, options)?,
    }
    clear_nonblocking(&file).map_err(|e| io("open", e))?;
    if options.lock {
        lock(&file, path)?;
    }
    if before.is_some() {
        file.set_len(0).map_err(|e| io("truncate", e))?;
    }
    Ok(file)
}

/// A file written whole and then put in place: writes go to a new temporary file next to
/// `path`, and [`Replacement::commit`] renames it over `path`. Dropped uncommitted, the
/// temporary file is removed and `path` is untouched.
pub struct Replacement {
    file: Option<File>,
    temp: PathBuf,
    path: PathBuf,
    options: OpenOptions,
    committed: bool,
}

impl Replacement {
    /// Checks `path` now (so a bad path fails before a long replay) and creates the temporary
    /// file.
    pub fn new(path: &Path, options: &OpenOptions) -> Result<Replacement, OpenError> {
        if stdio_fd(path).is_some() {
            return Ok(Replacement {
                file: Some(create(path, options)?),
                temp: PathBuf::new(),
                path: path.to_path_buf(),
                options: options.clone(),
                committed: false,
            });
        }
        check_target(path, options)?;
        let name = path.file_name().ok_or_else(|| OpenError::NotRegular {
            path: path.to_path_buf(),
            kind: "a directory",
        })?;
        let mut random = [0u8; 8];
        getrandom(&mut random).map_err(|source| OpenError::Io {
            what: "pick a temporary name next to",
            path: path.to_path_buf(),
            error: source,
        })?;
        let temp = path.with_file_name(format!(
            ".{}.{:016x}.tmp",
            name.to_string_lossy(),
            u64::from_ne_bytes(random)
        ));
        // Its failure is said of the file asked for: the temporary name means nothing to
        // whoever typed the path.
        let file =
            create(&temp, &OpenOptions::new().create_new()).map_err(|error| match error {
                OpenError::Io { what, error, .. } => OpenError::Io {
                    what,
                    path: path.to_path_buf(),
                    error,
                },
                other => other,
            })?;
        Ok(Replacement {
            file: Some(file),
            temp,
            path: path.to_path_buf(),
            options: options.clone(),
            committed: false,
        })
    }

    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("present until committed")
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Syncs the temporary file and renames it over the target (a rename replaces a link
    /// planted meanwhile rather than following it), checking the target once more first.
    pub fn commit(mut self) -> Result<(), OpenError> {
        let file = self.file.take().expect("committed once");
        if self.temp.as_os_str().is_empty() {
            self.committed = true;
            return Ok(());
        }
        let io = |what, source| OpenError::Io {
            what,
            path: self.path.clone(),
            error: source,
        };
        file.sync_all().map_err(|e| io("write", e))?;
        drop(file);
        check_target(&self.path, &self.options)?;
        std::fs::rename(&self.temp, &self.path).map_err(|e| io("put in place", e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Replacement {
    fn drop(&mut self) {
        if !self.committed && !self.temp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// The checks on an existing target of a [`Replacement`] (none when it does not exist).
fn check_target(path: &Path, options: &OpenOptions) -> Result<(), OpenError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) if options.create_new => Err(OpenError::Exists {
            path: path.to_path_buf(),
        }),
        Ok(metadata) => check_existing(path, &metadata, options),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(OpenError::Io {
            what: "look at",
            path: path.to_path_buf(),
            error: source,
        }),
    }
}

/// The rules for a file that exists: see the module documentation.
fn check_existing(
    path: &Path,
    metadata: &Metadata,
    options: &OpenOptions,
) -> Result<(), OpenError> {
    let path_buf = || path.to_path_buf();
    let file_type = metadata.file_type();
    if file_type.is_symlink() {
        return Err(OpenError::Symlink { path: path_buf() });
    }
    if !file_type.is_file() {
        return Err(OpenError::NotRegular {
            path: path_buf(),
            kind: kind_of(metadata),
        });
    }
    if options.inputs.contains(&FileId::of(metadata)) {
        return Err(OpenError::IsInput { path: path_buf() });
    }
    if metadata.nlink() > 1 {
        return Err(OpenError::HardLinked {
            path: path_buf(),
            links: metadata.nlink(),
        });
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if metadata.uid() != me && in_shared_directory(path) {
        return Err(OpenError::Foreign {
            path: path_buf(),
            owner: metadata.uid(),
        });
    }
    Ok(())
}

/// Whether others may create files in `path`'s directory: world-writable, or group-writable
/// and sticky (the kernel's `protected_regular` draws the same line). When it cannot be
/// looked at, it counts as shared.
fn in_shared_directory(path: &Path) -> bool {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(metadata) => {
            let mode = metadata.permissions().mode();
            let sticky = mode & 0o1000 != 0;
            mode & 0o002 != 0 || (sticky && mode & 0o020 != 0)
        }
        Err(_) => true,
    }
}

fn kind_of(metadata: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let file_type = metadata.file_type();
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "a device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

fn dup_stdio(path: &Path, fd: i32) -> Result<File, OpenError> {
    // SAFETY: `fd` is only borrowed for the duplication; the result is a new descriptor.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    borrowed
        .try_clone_to_owned()
        .map(File::from)
        .map_err(|source| OpenError::Io {
            what: "write to",
            path: path.to_path_buf(),
            error: source,
        })
}

fn clear_nonblocking(file: &File) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor this function borrows.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An exclusive `flock`, held until the file is closed.
fn lock(file: &File, path: &Path) -> Result<(), OpenError> {
    // SAFETY: flock on a descriptor this function borrows.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Err(OpenError::Locked {
            path: path.to_path_buf(),
        })
    } else {
        Err(OpenError::Io {
            what: "lock",
            path: path.to_path_buf(),
            error,
        })
    }
}

fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: the kernel fills at most `buf.len()` bytes of `buf`.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n == buf.len() as isize {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
#[path = "safe_open_tests.rs"]
mod tests;

/// What to check after a failure that says too little on its own.
fn hint(what: &str, error: &io::Error) -> &'static str {
    match (what, error.kind()) {
        ("create", io::ErrorKind::NotFound) => " (its directory does not exist)",
        ("create", io::ErrorKind::PermissionDenied) => " (its directory is not writable)",
        _ => "",
    }
}
