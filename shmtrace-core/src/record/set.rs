//! A recording that may have been rotated into several files, read in order as one stream,
//! with what is missing from the set, or there twice, said rather than hidden.
use std::{
    collections::VecDeque,
    fs::File,
    io::{self, BufReader},
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use super::{
    format::PREAMBLE_LEN,
    header::TraceHeader,
    reader::{ReadError, Reason, TraceReader},
    rotation,
    user::{Entry, Record},
};
use crate::safe_open::FileId;

/// Reads a recording that may have been rotated into several files, in order, as one stream.
pub struct TraceSet {
    files: VecDeque<PathBuf>,
    current: TraceReader<BufReader<File>>,
    first_header: TraceHeader,
    /// The identities of the files to read, so that no output overwrites one of them.
    ids: Vec<FileId>,
    /// What is missing from a rotated set, or there twice: said, not hidden.
    gaps: Vec<String>,
    finished: bool,
    skipped: u64,
    /// The file being read, and the latest record time read from it.
    current_path: PathBuf,
    latest_ts: u64,
    /// Set when a file was left: the file and its latest time, which the next file's first
    /// record must not come before.
    left: Option<(PathBuf, u64)>,
}

impl TraceSet {
    /// Opens `path`, or, when it does not exist, the numbered files of a rotated recording
    /// named `path` (`trace.000000.shmtrace`, ...). `-`, `/dev/stdin`, a pipe or a FIFO are
    /// read as one file.
    pub fn open(path: &Path) -> Result<TraceSet, ReadError> {
        let fail = |reason| ReadError {
            path: Some(path.to_path_buf()),
            offset: 0,
            in_block: None,
            reason,
        };
        if path == Path::new("-") {
            let stdin = std::io::stdin()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| fail(Reason::Io(e)))?;
            let current = TraceReader::from_file(File::from(stdin), path)?;
            return Ok(TraceSet::starting(
                current,
                path,
                VecDeque::new(),
                Vec::new(),
            ));
        }
        let all = match std::fs::metadata(path) {
            Ok(metadata) if metadata.is_dir() => return Err(fail(Reason::Directory)),
            Ok(_) => vec![path.to_path_buf()],
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                rotation::discover(path).map_err(|e| fail(Reason::Open(e)))?
            }
            Err(error) => return Err(fail(Reason::Open(error))),
        };
        if all.is_empty() {
            return Err(fail(Reason::Missing));
        }
        let ids = all
            .iter()
            .filter_map(|file| FileId::of_path(file).ok())
            .collect();
        let mut files: VecDeque<PathBuf> = all.into_iter().collect();
        let first = files.pop_front().expect("not empty");
        let current = TraceReader::open(&first)?;
        let mut set = TraceSet::starting(current, &first, files, ids);
        if !set.files.is_empty() && set.first_header.sequence > 0 {
            set.gaps.push(format!(
                "the rotated set starts at file {} ({}): the files before it were removed \
                 (by --keep) or are missing",
                set.first_header.sequence,
                first.display()
            ));
        }
        Ok(set)
    }

    fn starting(
        current: TraceReader<BufReader<File>>,
        path: &Path,
        files: VecDeque<PathBuf>,
        ids: Vec<FileId>,
    ) -> TraceSet {
        TraceSet {
            current_path: path.to_path_buf(),
            latest_ts: 0,
            left: None,
            files,
            first_header: current.header().clone(),
            current,
            ids,
            gaps: Vec::new(),
            finished: false,
            skipped: 0,
        }
    }

    /// The header of the first file (later files repeat it, with their own sequence number).
    pub fn header(&self) -> &TraceHeader {
        &self.first_header
    }

    pub fn skipped(&self) -> u64 {
        self.skipped + self.current.skipped()
    }

    /// The files being read, by identity: outputs must not be written over them.
    pub fn file_ids(&self) -> &[FileId] {
        &self.ids
    }

    /// Files missing from the middle of a rotated set, and files there twice (skipped), as
    /// sentences; complete once the set is read.
    pub fn gaps(&self) -> &[String] {
        &self.gaps
    }

    /// Moves to the next file, checking it belongs to the same recording and comes next: a
    /// missing file is noted, a second copy of one already read is noted and skipped.
    fn advance(&mut self) -> Result<bool, ReadError> {
        loop {
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
                    reason: Reason::OtherRecording {
                        // Read from the files: escaped, as all text from a file is.
                        found: crate::event::escape::text(&header.recording_id),
                        expected: crate::event::escape::text(&first.recording_id),
                    },
                });
            }
            let previous = self.current.header().sequence;
            let sequence = header.sequence;
            if sequence <= previous {
                self.gaps.push(format!(
                    "{} repeats file {sequence} of the recording, which was read already; it \
                     was skipped",
                    path.display()
                ));
                self.skipped += next.skipped();
                continue;
            }
            if sequence > previous + 1 {
                let missing = sequence - previous - 1;
                let (n, are) = match missing {
                    1 => ("1 file is".to_owned(), "it"),
                    n => (format!("{n} files are"), "they"),
                };
                self.gaps.push(format!(
                    "{n} missing between file {previous} and file {sequence} ({}): the records \
                     {are} held are not in this report",
                    path.display()
                ));
            }
            self.skipped += self.current.skipped();
            self.current = next;
            let left = std::mem::replace(&mut self.current_path, path);
            self.left = Some((left, std::mem::take(&mut self.latest_ts)));
            return Ok(true);
        }
    }
}

impl TraceSet {
    /// Whether the last file read so far ended with the writer's end mark: after the last
    /// record, `false` means the recording was cut short.
    pub fn closed(&self) -> bool {
        self.current.closed()
    }
}

/// How far a file's first record may come before the previous file's latest: records of
/// different CPUs reach the ring buffer a little out of order.
const OUT_OF_ORDER_SLACK_NS: u64 = 50_000_000;

impl TraceSet {
    /// A file of a rotated set whose first kernel record is older than the previous file's latest
    /// goes back in time: files renumbered, or from another recording under the same id. The
    /// report still reads them in order, and says so.
    ///
    /// Only kernel records count: a rotated file opens with the processes carried over, stamped
    /// when the writer flushed, which is after the kernel records of that flush that follow them
    /// (one flush can fill several files, and then every file's carry-over has the same stamp).
    fn check_order(&mut self, entry: &Entry) {
        if !matches!(entry.record, Record::Kernel(_)) {
            return;
        }
        let ts_ns = entry.ts_ns;
        if let Some((left, latest)) = self.left.take()
            && ts_ns.saturating_add(OUT_OF_ORDER_SLACK_NS) < latest
        {
            self.gaps.push(format!(
                "{} starts {:.3} s before the end of {}, the file before it: the rotated \
                 files go back in time (renumbered, or not of one recording?); times, orders and \
                 durations in this report may be wrong",
                crate::event::escape::text(&self.current_path.to_string_lossy()),
                (latest - ts_ns) as f64 / 1e9,
                crate::event::escape::text(&left.to_string_lossy()),
            ));
        }
        self.latest_ts = self.latest_ts.max(ts_ns);
    }
}

impl Iterator for TraceSet {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.finished {
            match self.current.next() {
                Some(Ok(entry)) => {
                    self.check_order(&entry);
                    return Some(Ok(entry));
                }
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
