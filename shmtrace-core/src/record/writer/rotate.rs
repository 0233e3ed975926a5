//! Rotating a recording (`record --max-size --keep`): when a file is full, closing it with its
//! end mark and starting the next numbered file with its own header and the state carried
//! over, and deleting the oldest files beyond `keep`.
use std::path::PathBuf;

use super::{CarryOver, TraceWriter, WriteError, open_options, open_with_header};
use crate::record::{
    format::{self, FrameKind},
    rotation,
};

/// `record --max-size --keep`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// A file is closed before a block would take it past this size (a single block larger
    /// than this gets a file of its own).
    pub max_size: u64,
    /// Keep only the newest `keep` files, deleting older ones; `None` keeps all.
    pub keep: Option<u32>,
}

/// The smallest `max_size` accepted: room for a header and a few blocks.
pub const MIN_ROTATION_SIZE: u64 = 64 << 10;

/// Room kept at the end of a rotated file for its end mark (a frame of about 30 bytes, or a
/// zstd block of it).
const END_MARK_ROOM: u64 = 128;

impl TraceWriter {
    pub(super) fn needs_rotation(&self, block_len: u64) -> bool {
        match self.options.rotation {
            Some(rotation) => {
                self.file_len > self.header_len
                    && self.file_len + block_len + END_MARK_ROOM > rotation.max_size
            }
            None => false,
        }
    }

    /// Closes the current file and starts the next, with its own header and the carried-over
    /// records, then deletes files beyond `keep`.
    pub(super) fn rotate(&mut self, carry: CarryOver<'_>) -> Result<PathBuf, WriteError> {
        self.close_file()?;
        self.header.sequence += 1;
        let path = rotation::numbered(&self.base, self.header.sequence);
        let (file, header_len) =
            open_with_header(&path, &self.header, &open_options(&self.options, true))?;
        self.file = file;
        self.path = path.clone();
        self.file_len = header_len;
        self.header_len = header_len;
        self.stats.files += 1;
        self.stats.bytes += header_len;

        let carried = carry();
        if !carried.is_empty() {
            let mut frames = Vec::new();
            for (ts, record) in &carried {
                format::encode_frame(&mut frames, FrameKind::User, *ts, &record.to_cbor());
            }
            let block = self.block(&frames);
            if let Err(source) = self.append(&block) {
                self.note_loss(
                    carried.len() as u64,
                    frames.len() as u64,
                    &source.to_string(),
                );
                return Err(WriteError::Write {
                    path: self.path.clone(),
                    dropped: carried.len() as u64,
                    error: source,
                });
            }
            self.stats.records += carried.len() as u64;
        }
        self.prune()?;
        Ok(path)
    }

    fn prune(&mut self) -> Result<(), WriteError> {
        let Some(keep) = self.options.rotation.and_then(|r| r.keep) else {
            return Ok(());
        };
        let Some(oldest_kept) = self.header.sequence.checked_sub(keep - 1) else {
            return Ok(());
        };
        let files = rotation::numbered_files(&self.base).map_err(|source| WriteError::Prune {
            path: self.base.clone(),
            error: source,
        })?;
        for (sequence, path) in files {
            if sequence < oldest_kept {
                std::fs::remove_file(&path).map_err(|source| WriteError::Prune {
                    path,
                    error: source,
                })?;
                self.stats.files_removed += 1;
            }
        }
        Ok(())
    }
}
