//! Why writing a trace file failed; each message says what to do. The I/O error is part of
//! the message, not a source of its own, so that it is said once.
use std::{io, path::PathBuf};

use crate::safe_open::OpenError;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(
        "cannot create the trace file {path}: {error}; check that its directory exists and is \
         writable"
    )]
    Create { path: PathBuf, error: io::Error },
    #[error(
        "{path} exists, from an earlier recording; remove the old files or choose another -o, \
         so that the two recordings do not mix"
    )]
    Exists { path: PathBuf },
    #[error(
        "writing the trace file {path} failed: {error}; {dropped} records were not written \
         (the file stays readable up to the last good flush; free space or pick another \
         disk)"
    )]
    Write {
        path: PathBuf,
        dropped: u64,
        error: io::Error,
    },
    #[error(
        "a record of {len} bytes is larger than the {max} bytes a trace file holds; it was \
         dropped and counted"
    )]
    TooLarge { len: usize, max: usize },
    #[error("removing the old trace file {path} (--keep) failed: {error}")]
    Prune { path: PathBuf, error: io::Error },
    #[error("--max-size must be at least {min} bytes, not {given}")]
    RotationTooSmall { given: u64, min: u64 },
    #[error("--keep must be at least 1")]
    KeepZero,
    #[error(transparent)]
    Unsafe(OpenError),
}

impl WriteError {
    /// Whether the file could not be made because its name is taken (by a file, a link, or
    /// anything else): a caller free to choose the name may take the next one.
    pub fn name_taken(&self) -> bool {
        match self {
            WriteError::Exists { .. } => true,
            WriteError::Unsafe(open) => matches!(
                open,
                OpenError::Exists { .. }
                    | OpenError::Symlink { .. }
                    | OpenError::NotRegular { .. }
                    | OpenError::HardLinked { .. }
                    | OpenError::Foreign { .. }
                    | OpenError::Raced { .. }
            ),
            WriteError::Create { error, .. } => error.kind() == io::ErrorKind::AlreadyExists,
            _ => false,
        }
    }

    pub(super) fn open(path: &std::path::Path, error: OpenError) -> WriteError {
        match error {
            OpenError::Io { error, .. } => WriteError::Create {
                path: path.to_path_buf(),
                error,
            },
            other => WriteError::Unsafe(other),
        }
    }
}
