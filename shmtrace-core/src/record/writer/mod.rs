//! Writing a trace file: crash-safe, optionally compressed, optionally rotating.
//!
//! Records are framed into memory as they arrive; nothing touches the file until a flush. A
//! flush writes whole blocks, each one `write(2)` of complete frames (compressed: one
//! independent zstd frame per block). So a `kill -9` at any moment leaves a file whose every
//! flushed block reads back, and at worst a torn last block that the reader reports as a
//! truncation at its offset.
//!
//! Flush policy: the session calls [`TraceWriter::flush_if_due`] after each batch it takes from
//! the ring buffer and when [`TraceWriter::flush_deadline`] passes. A flush is due once the
//! oldest unwritten record is `flush_interval` old (default 100 ms) or `block_bytes` are
//! waiting, so after a crash at most the last 100 ms are missing. `sync_on_flush` adds an
//! `fdatasync` for power loss; without it, files are synced when rotated and finished.
//!
//! Nothing is lost silently: a record that cannot be written is counted in [`WriteStats`], the
//! error is returned, and the next successful flush writes a `WriterLoss` record so that
//! readers see the hole.
use std::{
    fs::File,
    io::{self, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::safe_open::{self, FileId, OpenOptions};

pub use super::write_error::WriteError;

use super::{
    format::{self, FRAME_HEAD_LEN, FrameKind, MAX_PAYLOAD},
    header::TraceHeader,
    rotation,
    user::{UserRecord, WriterLoss},
};

mod rotate;
pub use rotate::{MIN_ROTATION_SIZE, Rotation};

/// The largest record a writer accepts: a block holding it and its frame head still fits in
/// [`MAX_PAYLOAD`].
pub const MAX_RECORD: usize = (MAX_PAYLOAD as usize) - (1 << 20);

/// Records to put at the start of each new rotated file so that it reads on its own: the
/// session returns snapshots of the processes it knows (`record::carry::world_snapshots`).
pub type CarryOver<'a> = &'a mut dyn FnMut() -> Vec<(u64, UserRecord)>;

/// For callers with nothing to carry over (and writers that never rotate).
pub fn no_carry() -> Vec<(u64, UserRecord)> {
    Vec::new()
}

#[derive(Clone, Debug)]
pub struct WriterOptions {
    /// zstd level (1-19; 3 is zstd's default), or `None` for no compression.
    pub compression: Option<i32>,
    /// Longest a record waits in memory before a flush is due.
    pub flush_interval: Duration,
    /// Bytes of framed records per block (and per compressed frame).
    pub block_bytes: usize,
    pub rotation: Option<Rotation>,
    /// `fdatasync` after every flush, for power loss as well as crashes.
    pub sync_on_flush: bool,
    /// Every file must be new (flight-recorder dumps); otherwise `-o` may name an old file of
    /// this user, which is replaced.
    pub create_new: bool,
    /// Files that must not be written: the inputs of a command that copies a trace.
    pub not_over: Vec<FileId>,
}

impl Default for WriterOptions {
    fn default() -> WriterOptions {
        WriterOptions {
            compression: None,
            flush_interval: Duration::from_millis(100),
            block_bytes: 1 << 20,
            rotation: None,
            sync_on_flush: false,
            create_new: false,
            not_over: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Records written by flushes that succeeded.
    pub records: u64,
    /// Bytes in the files, headers included.
    pub bytes: u64,
    /// Records that could not be written (I/O errors, records too large).
    pub records_dropped: u64,
    pub bytes_dropped: u64,
    /// Files created, and old ones deleted by `keep`.
    pub files: u32,
    pub files_removed: u32,
    /// The file written last (with rotation, the newest of the set), once finished.
    pub last_path: PathBuf,
    /// The first write that failed: where the file stopped, and why (a full disk).
    pub stopped: Option<Stopped>,
}

/// Where a recording stopped being written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub path: PathBuf,
    /// The file's length then: everything before it reads back.
    pub offset: u64,
    pub reason: String,
}

/// What a flush did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    pub records: u64,
    /// Files opened by rotation during this flush.
    pub rotated_to: Vec<PathBuf>,
}

/// Framed records waiting for a flush, cut into blocks of about `block_bytes`.
#[derive(Clone)]
struct Chunk {
    bytes: Vec<u8>,
    records: u64,
}

pub struct TraceWriter {
    options: WriterOptions,
    /// The `-o` path; rotated files are numbered after it.
    base: PathBuf,
    header: TraceHeader,
    file: File,
    path: PathBuf,
    file_len: u64,
    header_len: u64,
    chunks: Vec<Chunk>,
    oldest: Option<Instant>,
    last_ts: u64,
    pending_loss: Option<WriterLoss>,
    compressor: Option<zstd::bulk::Compressor<'static>>,
    stats: WriteStats,
}

impl TraceWriter {
    /// Creates the trace file at `path` (with rotation: `path`'s file number 0) and writes its
    /// header. `header.compressed` and `header.sequence` are set here.
    pub fn create(
        path: &Path,
        mut header: TraceHeader,
        mut options: WriterOptions,
    ) -> Result<TraceWriter, WriteError> {
        let first = match options.rotation {
            Some(rotation) => {
                if rotation.max_size < MIN_ROTATION_SIZE {
                    return Err(WriteError::RotationTooSmall {
                        given: rotation.max_size,
                        min: MIN_ROTATION_SIZE,
                    });
                }
                if rotation.keep == Some(0) {
                    return Err(WriteError::KeepZero);
                }
                // Blocks small enough that a file is filled close to its limit.
                options.block_bytes = options.block_bytes.min((rotation.max_size / 4) as usize);
                if let Some((_, old)) = rotation::numbered_files(path)
                    .map_err(|source| WriteError::Create {
                        path: path.to_path_buf(),
                        error: source,
                    })?
                    .into_iter()
                    .next()
                {
                    return Err(WriteError::Exists { path: old });
                }
                header.sequence = 0;
                rotation::numbered(path, 0)
            }
            None => path.to_path_buf(),
        };
        options.block_bytes = options.block_bytes.clamp(4096, MAX_RECORD);
        header.compressed = options.compression.is_some();
        let compressor =
            match options.compression {
                Some(level) => Some(zstd::bulk::Compressor::new(level).map_err(|source| {
                    WriteError::Create {
                        path: first.clone(),
                        error: source,
                    }
                })?),
                None => None,
            };
        let first_options =
            open_options(&options, options.create_new || options.rotation.is_some());
        let (file, header_len) = open_with_header(&first, &header, &first_options)?;
        Ok(TraceWriter {
            options,
            base: path.to_path_buf(),
            header,
            file,
            path: first,
            file_len: header_len,
            header_len,
            chunks: Vec::new(),
            oldest: None,
            last_ts: 0,
            pending_loss: None,
            compressor,
            stats: WriteStats {
                bytes: header_len,
                files: 1,
                ..WriteStats::default()
            },
        })
    }

    /// Removes the file this writer made, if its name still names it: for a file that could
    /// hold nothing but its header (a full disk).
    pub fn discard(self) {
        remove_if_same(&self.path, &self.file);
    }

    /// Whether anything beyond the header reached the file.
    pub fn wrote_records(&self) -> bool {
        self.file_len > self.header_len
    }

    /// The file being written now.
    pub fn path(&self) -> &Path {
        &self.path
    }

    #[cfg(test)]
    pub fn stats(&self) -> &WriteStats {
        &self.stats
    }

    /// Queues a raw kernel ring-buffer record; its timestamp is read from its header.
    pub fn write_kernel(&mut self, record: &[u8]) -> Result<(), WriteError> {
        self.write_frame(FrameKind::Kernel, format::kernel_ts(record), record)
    }

    /// Queues a userspace record.
    pub fn write_user(&mut self, ts_ns: u64, record: &UserRecord) -> Result<(), WriteError> {
        self.write_frame(FrameKind::User, ts_ns, &record.to_cbor())
    }

    /// Queues an already-encoded payload (the flight recorder keeps records encoded).
    pub(super) fn write_frame(
        &mut self,
        kind: FrameKind,
        ts_ns: u64,
        payload: &[u8],
    ) -> Result<(), WriteError> {
        if payload.len() > MAX_RECORD {
            self.note_loss(1, payload.len() as u64, "a record was too large to store");
            return Err(WriteError::TooLarge {
                len: payload.len(),
                max: MAX_RECORD,
            });
        }
        let frame_len = FRAME_HEAD_LEN + payload.len();
        let start_new = match self.chunks.last() {
            None => true,
            Some(last) => {
                !last.bytes.is_empty() && last.bytes.len() + frame_len > self.options.block_bytes
            }
        };
        if start_new {
            self.chunks.push(Chunk {
                bytes: Vec::with_capacity(self.options.block_bytes.min(1 << 16)),
                records: 0,
            });
        }
        let chunk = self.chunks.last_mut().expect("pushed above");
        format::encode_frame(&mut chunk.bytes, kind, ts_ns, payload);
        chunk.records += 1;
        self.oldest.get_or_insert_with(Instant::now);
        self.last_ts = self.last_ts.max(ts_ns);
        Ok(())
    }

    /// Bytes queued and not yet written.
    pub fn buffered_bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.bytes.len()).sum()
    }

    /// When the queued records must be flushed, if any are queued.
    pub fn flush_deadline(&self) -> Option<Instant> {
        self.oldest.map(|t| t + self.options.flush_interval)
    }

    pub fn flush_due(&self, now: Instant) -> bool {
        self.flush_deadline()
            .is_some_and(|deadline| now >= deadline)
            || self.buffered_bytes() >= self.options.block_bytes
    }

    /// Flushes if [`flush_due`](Self::flush_due).
    pub fn flush_if_due(
        &mut self,
        now: Instant,
        carry: CarryOver<'_>,
    ) -> Result<Flushed, WriteError> {
        if self.flush_due(now) {
            self.flush(carry)
        } else {
            Ok(Flushed::default())
        }
    }

    /// Writes every queued record, rotating first when a block would take the file past
    /// `max_size`. On an I/O error the queued records are dropped and counted, the file is cut
    /// back to its last complete block, and the error is returned; the writer stays usable.
    pub fn flush(&mut self, carry: CarryOver<'_>) -> Result<Flushed, WriteError> {
        let mut flushed = Flushed::default();
        if let Some(loss) = self.pending_loss.take() {
            let mut bytes = Vec::new();
            let payload = UserRecord::WriterLoss(loss).to_cbor();
            format::encode_frame(&mut bytes, FrameKind::User, self.last_ts, &payload);
            self.chunks.insert(0, Chunk { bytes, records: 1 });
        }
        let chunks = std::mem::take(&mut self.chunks);
        self.oldest = None;
        let mut pending = chunks.into_iter();
        while let Some(chunk) = pending.next() {
            let block = self.block(&chunk.bytes);
            if self.needs_rotation(block.len() as u64) {
                match self.rotate(carry) {
                    Ok(path) => flushed.rotated_to.push(path),
                    Err(error) => {
                        self.drop_chunks(std::iter::once(chunk).chain(pending), "rotating failed");
                        return Err(error);
                    }
                }
            }
            if let Err(source) = self.append(&block) {
                self.note_stop(&source);
                // Keep what fits (the last megabyte before a disk fills is often the failure).
                let ends = format::frame_ends(&chunk.bytes);
                let (kept, kept_bytes) = self.append_what_fits(&chunk.bytes, &ends);
                self.stats.records += kept;
                flushed.records += kept;
                let rest = Chunk {
                    bytes: chunk.bytes[kept_bytes..].to_vec(),
                    records: chunk.records - kept,
                };
                let dropped = rest.records + pending.clone().map(|c| c.records).sum::<u64>();
                self.drop_chunks(std::iter::once(rest).chain(pending), &source.to_string());
                return Err(WriteError::Write {
                    path: self.path.clone(),
                    dropped,
                    error: source,
                });
            }
            self.stats.records += chunk.records;
            flushed.records += chunk.records;
        }
        if self.options.sync_on_flush && flushed.records > 0 {
            self.sync()?;
        }
        Ok(flushed)
    }

    /// Flushes, syncs and closes. Returns what was written over the writer's life.
    pub fn finish(self, carry: CarryOver<'_>) -> Result<WriteStats, WriteError> {
        match self.finish_anyway(carry) {
            (stats, None) => Ok(stats),
            (_, Some(error)) => Err(error),
        }
    }

    /// Like [`finish`](Self::finish), but returns what was written even when the last flush
    /// or the end mark failed (a full disk), with the error.
    pub fn finish_anyway(mut self, carry: CarryOver<'_>) -> (WriteStats, Option<WriteError>) {
        let error = self.flush(carry).err();
        let error = match self.close_file() {
            Err(close) if error.is_none() => {
                if let WriteError::Write { error: source, .. } = &close {
                    self.note_stop(source);
                }
                Some(close)
            }
            _ => error,
        };
        self.stats.last_path = self.path;
        (self.stats, error)
    }

    /// Like [`finish`](Self::finish), but leaves the file without its end mark, so that it
    /// reads as cut short: for a copy of a recording that was itself cut short (`--redact`).
    pub fn finish_cut_short(mut self, carry: CarryOver<'_>) -> Result<WriteStats, WriteError> {
        self.flush(carry)?;
        self.sync()?;
        self.stats.last_path = self.path;
        Ok(self.stats)
    }

    /// Ends the current file with the end mark (`UserRecord::End`), which tells a reader that
    /// nothing is missing after it, and syncs it.
    fn close_file(&mut self) -> Result<(), WriteError> {
        let mut frame = Vec::new();
        format::encode_frame(
            &mut frame,
            FrameKind::User,
            self.last_ts,
            &UserRecord::End.to_cbor(),
        );
        let block = self.block(&frame);
        self.append(&block).map_err(|source| WriteError::Write {
            path: self.path.clone(),
            dropped: 0,
            error: source,
        })?;
        self.sync()
    }

    fn block(&mut self, frames: &[u8]) -> Vec<u8> {
        let Some(compressor) = self.compressor.as_mut() else {
            return frames.to_vec();
        };
        match compressor.compress(frames) {
            Ok(compressed) => {
                let mut payload = Vec::with_capacity(4 + compressed.len());
                payload.extend_from_slice(&(frames.len() as u32).to_le_bytes());
                payload.extend_from_slice(&compressed);
                let mut block = Vec::with_capacity(FRAME_HEAD_LEN + payload.len());
                format::encode_frame(&mut block, FrameKind::ZstdBlock, 0, &payload);
                block
            }
            // zstd fails only on allocation; the frames are still good written plainly.
            Err(_) => frames.to_vec(),
        }
    }

    /// One `write` of a whole block; on failure the file is cut back to where it was.
    fn append(&mut self, block: &[u8]) -> io::Result<()> {
        match self.file.write_all(block) {
            Ok(()) => {
                self.file_len += block.len() as u64;
                self.stats.bytes += block.len() as u64;
                Ok(())
            }
            Err(error) => {
                let _ = self.file.set_len(self.file_len);
                let _ = self.file.seek(SeekFrom::Start(self.file_len));
                Err(error)
            }
        }
    }

    fn sync(&mut self) -> Result<(), WriteError> {
        self.file.sync_data().map_err(|source| WriteError::Write {
            path: self.path.clone(),
            dropped: 0,
            error: source,
        })
    }

    /// Appends as many whole records of `frames` as fit, first ones first, halving what is
    /// tried after each failure. Returns the records and bytes of `frames` written.
    fn append_what_fits(&mut self, frames: &[u8], ends: &[usize]) -> (u64, usize) {
        match ends {
            [] => (0, 0),
            [_] => match self.block(frames) {
                block if self.append(&block).is_ok() => (1, frames.len()),
                _ => (0, 0),
            },
            _ => {
                let half = ends.len() / 2;
                let split = ends[half - 1];
                let (kept, bytes) = self.append_what_fits(&frames[..split], &ends[..half]);
                if kept < half as u64 {
                    return (kept, bytes);
                }
                let second: Vec<usize> = ends[half..].iter().map(|end| end - split).collect();
                let (more, more_bytes) = self.append_what_fits(&frames[split..], &second);
                (kept + more, bytes + more_bytes)
            }
        }
    }

    fn note_stop(&mut self, error: &io::Error) {
        if self.stats.stopped.is_none() {
            self.stats.stopped = Some(Stopped {
                path: self.path.clone(),
                offset: self.file_len,
                reason: error.to_string(),
            });
        }
    }

    fn drop_chunks(&mut self, chunks: impl Iterator<Item = Chunk>, reason: &str) {
        let (mut records, mut bytes) = (0, 0);
        for chunk in chunks {
            records += chunk.records;
            bytes += chunk.bytes.len() as u64;
        }
        self.note_loss(records, bytes, reason);
    }

    fn note_loss(&mut self, records: u64, bytes: u64, reason: &str) {
        self.stats.records_dropped += records;
        self.stats.bytes_dropped += bytes;
        let loss = self.pending_loss.get_or_insert_with(WriterLoss::default);
        loss.records += records;
        loss.bytes += bytes;
        if loss.reason.is_empty() {
            loss.reason = reason.to_owned();
        }
    }
}

/// How a file of the recording is opened: locked against a second recorder, never through a
/// link (see `safe_open`); numbered files after the first must be new.
fn open_options(options: &WriterOptions, create_new: bool) -> OpenOptions {
    let open = OpenOptions::new().locked().not_over(&options.not_over);
    if create_new { open.create_new() } else { open }
}

/// Unlinks `path` if it is still `file` (not a name swapped in meanwhile).
fn remove_if_same(path: &Path, file: &File) {
    let ours = file.metadata().map(|m| FileId::of(&m)).ok();
    let there = std::fs::symlink_metadata(path).map(|m| FileId::of(&m)).ok();
    if ours.is_some() && ours == there {
        let _ = std::fs::remove_file(path);
    }
}

/// Creates `path` and writes the preamble and header in one write.
fn open_with_header(
    path: &Path,
    header: &TraceHeader,
    options: &OpenOptions,
) -> Result<(File, u64), WriteError> {
    let create = |source| WriteError::Create {
        path: path.to_path_buf(),
        error: source,
    };
    let mut file = safe_open::create(path, options).map_err(|e| WriteError::open(path, e))?;
    let bytes = format::encode_preamble(header.flags(), &header.to_cbor());
    if let Err(error) = file.write_all(&bytes) {
        // A full disk: no file rather than an empty or headless one. Only a file this call
        // made is removed (a new one); an old file given as -o was emptied already.
        if options.create_new {
            remove_if_same(path, &file);
        }
        return Err(create(error));
    }
    Ok((file, bytes.len() as u64))
}
