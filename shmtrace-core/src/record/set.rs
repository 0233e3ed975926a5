//! A recording rotated into several files, read back in order as one stream.
use std::{
    collections::VecDeque,
    fs::File,
    io::{self, BufReader},
    path::{Path, PathBuf},
};

use super::{
    format::PREAMBLE_LEN,
    header::TraceHeader,
    reader::{ReadError, Reason, TraceReader},
    rotation,
    user::Entry,
};

/// Reads a recording that may have been rotated into several files, in order, as one stream.
pub struct TraceSet {
    files: VecDeque<PathBuf>,
    current: TraceReader<BufReader<File>>,
    first_header: TraceHeader,
    finished: bool,
    skipped: u64,
}

impl TraceSet {
    /// Opens `path`, or, when it does not exist, the numbered files of a rotated recording
    /// named `path` (`trace.000000.shmtrace`, ...).
    pub fn open(path: &Path) -> Result<TraceSet, ReadError> {
        let not_found = |reason| ReadError {
            path: Some(path.to_path_buf()),
            offset: 0,
            in_block: None,
            reason,
        };
        let all = rotation::discover(path).map_err(|e| not_found(Reason::Io(e)))?;
        if all.is_empty() {
            return Err(not_found(Reason::Io(io::Error::new(
                io::ErrorKind::NotFound,
                "no such trace file, and no rotated files named after it",
            ))));
        }
        let mut files: VecDeque<PathBuf> = all.into_iter().collect();
        let first = files.pop_front().expect("not empty");
        let current = TraceReader::open(&first)?;
        Ok(TraceSet {
            files,
            first_header: current.header().clone(),
            current,
            finished: false,
            skipped: 0,
        })
    }

    /// The header of the first file (later files repeat it, with their own sequence number).
    pub fn header(&self) -> &TraceHeader {
        &self.first_header
    }

    pub fn skipped(&self) -> u64 {
        self.skipped + self.current.skipped()
    }

    /// Moves to the next file, checking it belongs to the same recording.
    fn advance(&mut self) -> Result<bool, ReadError> {
        let Some(path) = self.files.pop_front() else {
            return Ok(false);
        };
        let next = TraceReader::open(&path)?;
        let (first, header) = (&self.first_header, next.header());
        if header.recording_id != first.recording_id {
            return Err(ReadError {
                path: Some(path),
                offset: PREAMBLE_LEN as u64,
                in_block: None,
                reason: Reason::BadHeader(format!(
                    "it belongs to another recording ({}, not {}); move it out of the way",
                    header.recording_id, first.recording_id
                )),
            });
        }
        self.skipped += self.current.skipped();
        self.current = next;
        Ok(true)
    }
}

impl TraceSet {
    /// Whether the last file read so far ended with the writer's end mark: after the last
    /// record, `false` means the recording was cut short.
    pub fn closed(&self) -> bool {
        self.current.closed()
    }
}

impl Iterator for TraceSet {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.finished {
            match self.current.next() {
                Some(Ok(entry)) => return Some(Ok(entry)),
                Some(Err(error)) => {
                    self.finished = true;
                    return Some(Err(error));
                }
                None => match self.advance() {
                    Ok(true) => continue,
                    Ok(false) => self.finished = true,
                    Err(error) => {
                        self.finished = true;
                        return Some(Err(error));
                    }
                },
            }
        }
        None
    }
}
