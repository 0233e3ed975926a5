//! The flight recorder behind `record --on-failure`: the last seconds of records, kept in
//! memory, written to a file only when something fails.
//!
//! The session drives it: [`FlightRecorder::push`] every record, [`FlightRecorder::trigger`] on
//! a failure it recognises (ENOSPC, SIGBUS, a worker's death), [`FlightRecorder::tick`] now and
//! then. A trigger writes a new file holding the window (the seconds before it), and recording
//! goes on into that file for `tail` more; a trigger during the tail extends it. After the tail
//! the file is closed and the recorder waits for the next trigger, which writes the next file.
//!
//! Memory is bounded twice: by time (`window`) and by bytes (`max_window_bytes`). When the byte
//! bound cuts the window short, the file's header says how many records were pushed out.
//!
//! So that a dump explains processes that started long before its window, the recorder also
//! keeps a little context per live process (its last /proc snapshot, exec, fork and rename
//! records) and per container, and writes it ahead of the window.
use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use bytes::Bytes;
use shmtrace_common::{EventKind, Header, RenameEvent};
use zerocopy::FromBytes;

use super::{
    format::{FRAME_HEAD_LEN, FrameKind},
    header::{FlightInfo, TraceHeader},
    rotation,
    user::{Record, Trigger, UserRecord},
    writer::{TraceWriter, WriteError, WriterOptions, no_carry},
};

#[derive(Clone, Debug)]
pub struct FlightOptions {
    /// How far back a dump reaches.
    pub window: Duration,
    /// How long recording goes on after the last trigger.
    pub tail: Duration,
    /// Memory for the window: encoded records plus bookkeeping.
    pub max_window_bytes: usize,
    /// Most context entries (processes and containers) kept.
    pub max_context: usize,
    /// For the dump files (rotation is not used).
    pub writer: WriterOptions,
}

impl Default for FlightOptions {
    fn default() -> FlightOptions {
        FlightOptions {
            window: Duration::from_secs(30),
            tail: Duration::from_secs(5),
            max_window_bytes: 64 << 20,
            max_context: 1 << 16,
            writer: WriterOptions::default(),
        }
    }
}

/// What a trigger did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Triggered {
    /// A new file was written with the window, and the tail goes into it.
    Started(PathBuf),
    /// A capture was already going on: its tail now ends later.
    Extended(PathBuf),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlightStats {
    pub pushed: u64,
    pub dumps: u32,
    /// Records pushed out of the window by the memory bound, over the whole run.
    pub evicted_for_memory: u64,
    /// Context entries not kept because `max_context` was reached.
    pub context_overflow: u64,
    /// Dump names found taken, and skipped for the next number.
    pub names_skipped: u64,
}

/// Most taken names skipped for one dump: beyond, something is making them on purpose, and
/// the trigger fails (counted by the caller) rather than spin.
const MAX_NAMES_SKIPPED: u32 = 64;

/// A record held in memory, already encoded as it will be written.
#[derive(Clone)]
struct Held {
    index: u64,
    ts_ns: u64,
    kind: FrameKind,
    payload: Bytes,
}

impl Held {
    /// What it costs to keep, as counted against `max_window_bytes`.
    fn cost(&self) -> usize {
        self.payload.len() + FRAME_HEAD_LEN + size_of::<Held>()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ContextKey {
    Snapshot(u32),
    Exec(u32),
    Fork(u32),
    Rename(u32),
    Container(String),
    Lost,
}

struct Capture {
    writer: TraceWriter,
    until_ns: u64,
}

pub struct FlightRecorder {
    options: FlightOptions,
    base: PathBuf,
    header: TraceHeader,
    next_sequence: u32,
    next_index: u64,
    window: VecDeque<Held>,
    window_bytes: usize,
    /// Evicted for memory since the last dump.
    evicted_since_dump: u64,
    context: HashMap<ContextKey, Held>,
    /// The container each mount namespace's context record names, to forget at its end.
    container_in: HashMap<u32, String>,
    capture: Option<Capture>,
    stats: FlightStats,
}

impl FlightRecorder {
    /// Dumps will be `path`'s numbered files (`trace.000000.shmtrace`, ...), each with
    /// `header` (its sequence number and flight information filled in).
    pub fn new(
        path: &Path,
        header: TraceHeader,
        mut options: FlightOptions,
    ) -> Result<FlightRecorder, WriteError> {
        let existing = rotation::numbered_files(path).map_err(|source| WriteError::Create {
            path: path.to_path_buf(),
            error: source,
        })?;
        if let Some((_, old)) = existing.into_iter().next() {
            return Err(WriteError::Exists { path: old });
        }
        options.writer.rotation = None;
        options.writer.create_new = true;
        Ok(FlightRecorder {
            options,
            base: path.to_path_buf(),
            header,
            next_sequence: 0,
            next_index: 0,
            window: VecDeque::new(),
            window_bytes: 0,
            evicted_since_dump: 0,
            context: HashMap::new(),
            container_in: HashMap::new(),
            capture: None,
            stats: FlightStats::default(),
        })
    }

    /// Takes one record. Returns the path of a dump whose tail ended with this record.
    pub fn push(&mut self, ts_ns: u64, record: Record) -> Result<Option<PathBuf>, WriteError> {
        let held = Held {
            index: self.next_index,
            ts_ns,
            kind: match record {
                Record::Kernel(_) => FrameKind::Kernel,
                Record::User(_) => FrameKind::User,
            },
            payload: match &record {
                // A copy, so that the window does not pin the reader's whole arena.
                Record::Kernel(bytes) => Bytes::copy_from_slice(bytes),
                Record::User(user) => Bytes::from(user.to_cbor()),
            },
        };
        self.next_index += 1;
        self.stats.pushed += 1;
        self.remember_context(&record, &held);

        let mut finished = None;
        if self.capture.as_ref().is_some_and(|c| ts_ns > c.until_ns) {
            finished = self.close_capture()?;
        }
        if let Some(capture) = self.capture.as_mut() {
            capture
                .writer
                .write_frame(held.kind, held.ts_ns, &held.payload)?;
            capture.writer.flush_if_due(Instant::now(), &mut no_carry)?;
        }

        self.window_bytes += held.cost();
        self.window.push_back(held);
        let window_ns = self.options.window.as_nanos() as u64;
        while let Some(front) = self.window.front() {
            let too_old = front.ts_ns.saturating_add(window_ns) < ts_ns;
            let too_big = self.window_bytes > self.options.max_window_bytes;
            if !too_old && !too_big {
                break;
            }
            if too_big && !too_old {
                self.evicted_since_dump += 1;
                self.stats.evicted_for_memory += 1;
            }
            self.window_bytes -= front.cost();
            self.window.pop_front();
        }
        Ok(finished)
    }

    /// Something failed at `ts_ns`: write the window to a new file and keep recording into it
    /// for the tail, or, during a tail, make the tail longer.
    pub fn trigger(&mut self, ts_ns: u64, trigger: Trigger) -> Result<Triggered, WriteError> {
        let tail_ns = self.options.tail.as_nanos() as u64;
        let marker = UserRecord::Trigger(trigger.clone());
        if let Some(capture) = self.capture.as_mut() {
            capture.until_ns = capture.until_ns.max(ts_ns.saturating_add(tail_ns));
            capture.writer.write_user(ts_ns, &marker)?;
            capture.writer.flush(&mut no_carry)?;
            return Ok(Triggered::Extended(capture.writer.path().to_path_buf()));
        }

        let window_start = self.window.front().map(|h| h.ts_ns).unwrap_or(ts_ns);
        let flight = FlightInfo {
            reason: trigger.reason.as_str().to_owned(),
            trigger_ts_ns: ts_ns,
            window_ns: self.options.window.as_nanos() as u64,
            window_start_ns: window_start,
            tail_ns,
            evicted_for_memory: self.evicted_since_dump,
        };
        let (path, mut writer) = self.create_dump(flight)?;

        // Context from before the window first, oldest first, then the window itself.
        let first_in_window = self.window.front().map_or(self.next_index, |h| h.index);
        let mut context: Vec<&Held> = self
            .context
            .values()
            .filter(|h| h.index < first_in_window)
            .collect();
        context.sort_by_key(|h| h.index);
        let written = context
            .into_iter()
            .chain(self.window.iter())
            .try_for_each(|held| writer.write_frame(held.kind, held.ts_ns, &held.payload))
            .and_then(|()| writer.write_user(ts_ns, &marker))
            .and_then(|_| writer.flush(&mut no_carry).map(drop));
        if let Err(error) = written {
            // A full disk: what fitted is kept (the writer keeps what it can); a file that
            // holds nothing but its header explains nothing and goes.
            if !writer.wrote_records() {
                writer.discard();
            }
            return Err(error);
        }

        self.evicted_since_dump = 0;
        self.stats.dumps += 1;
        self.capture = Some(Capture {
            writer,
            until_ns: ts_ns.saturating_add(tail_ns),
        });
        Ok(Triggered::Started(path))
    }

    /// Closes a capture whose tail has passed by `now_ns` (boot time) even if no record came,
    /// and flushes a capture's file when its flush interval has passed. Returns the path of a
    /// closed dump.
    pub fn tick(&mut self, now_ns: u64) -> Result<Option<PathBuf>, WriteError> {
        if self.capture.as_ref().is_some_and(|c| now_ns > c.until_ns) {
            return self.close_capture();
        }
        if let Some(capture) = self.capture.as_mut() {
            capture.writer.flush_if_due(Instant::now(), &mut no_carry)?;
        }
        Ok(None)
    }

    /// Ends recording; closes a capture still going on and returns its path.
    pub fn finish(mut self) -> Result<Option<PathBuf>, WriteError> {
        self.close_capture()
    }

    /// The dump being written, during a tail.
    #[cfg(test)]
    pub fn capturing(&self) -> Option<&Path> {
        self.capture.as_ref().map(|c| c.writer.path())
    }

    pub fn stats(&self) -> &FlightStats {
        &self.stats
    }

    /// Records and bytes now held in the window.
    #[cfg(test)]
    pub fn window_size(&self) -> (usize, usize) {
        (self.window.len(), self.window_bytes)
    }

    /// Creates the next dump file. A name already taken (planted there, or left by another
    /// run) is skipped, and the next number tried, so that the incident is not lost for it;
    /// files are created with `O_EXCL | O_NOFOLLOW`, so nothing is written through a link.
    fn create_dump(&mut self, flight: FlightInfo) -> Result<(PathBuf, TraceWriter), WriteError> {
        let mut skipped = 0;
        loop {
            let sequence = self.next_sequence;
            self.next_sequence += 1;
            let path = rotation::numbered(&self.base, sequence);
            let mut header = self.header.clone();
            header.sequence = sequence;
            header.flight = Some(flight.clone());
            match TraceWriter::create(&path, header, self.options.writer.clone()) {
                Ok(writer) => return Ok((path, writer)),
                Err(error) if error.name_taken() && skipped < MAX_NAMES_SKIPPED => {
                    skipped += 1;
                    self.stats.names_skipped += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn close_capture(&mut self) -> Result<Option<PathBuf>, WriteError> {
        let Some(capture) = self.capture.take() else {
            return Ok(None);
        };
        let path = capture.writer.path().to_path_buf();
        capture.writer.finish(&mut no_carry)?;
        Ok(Some(path))
    }

    /// Keeps what a dump needs to name the processes and containers in its window.
    fn remember_context(&mut self, record: &Record, held: &Held) {
        let (key, forget) = match record {
            Record::User(UserRecord::Snapshot(s)) => (Some(ContextKey::Snapshot(s.pid)), None),
            Record::User(UserRecord::Container(c)) => {
                if let Some(mntns) = c.mntns {
                    self.container_in.insert(mntns, c.id.clone());
                }
                (Some(ContextKey::Container(c.id.clone())), None)
            }
            // A dump after a container's end must not name its namespace number after it:
            // another container may have the number by then (issue 25).
            Record::User(UserRecord::ContainerEnd { mntns }) => {
                if let Some(id) = self.container_in.remove(mntns) {
                    self.context.remove(&ContextKey::Container(id));
                }
                (None, None)
            }
            Record::User(UserRecord::Lost(_)) => (Some(ContextKey::Lost), None),
            Record::User(_) => (None, None),
            Record::Kernel(bytes) => kernel_context(bytes),
        };
        if let Some(pid) = forget {
            for key in [
                ContextKey::Snapshot(pid),
                ContextKey::Exec(pid),
                ContextKey::Fork(pid),
                ContextKey::Rename(pid),
            ] {
                self.context.remove(&key);
            }
        }
        let Some(key) = key else { return };
        if self.context.len() >= self.options.max_context && !self.context.contains_key(&key) {
            self.stats.context_overflow += 1;
            return;
        }
        self.context.insert(key, held.clone());
    }
}

/// Which context a kernel record is, and which process it ends.
fn kernel_context(bytes: &[u8]) -> (Option<ContextKey>, Option<u32>) {
    let Ok((header, _)) = Header::read_from_prefix(bytes) else {
        return (None, None);
    };
    match EventKind::try_from(header.kind) {
        Ok(EventKind::Exec) => (Some(ContextKey::Exec(header.pid)), None),
        Ok(EventKind::Fork) => match shmtrace_common::ForkEvent::read_from_prefix(bytes) {
            Ok((fork, _)) => (Some(ContextKey::Fork(fork.child_pid)), None),
            Err(_) => (None, None),
        },
        Ok(EventKind::Rename) => match RenameEvent::read_from_prefix(bytes) {
            Ok((rename, _)) if rename.target_pid == rename.target_tid => {
                (Some(ContextKey::Rename(rename.target_pid)), None)
            }
            _ => (None, None),
        },
        Ok(EventKind::Exit) => (None, Some(header.pid)),
        _ => (None, None),
    }
}
