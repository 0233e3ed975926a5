//! Reading trace files back, without trusting them.
//!
//! Every length is checked against the format's limits before anything is allocated, every
//! frame's CRC is checked before its payload is looked at, and nothing panics. The reader yields
//! each good record, then, if the file is bad somewhere, one final error naming the byte
//! offset and the reason: a truncated file (a recorder killed mid-write) still gives
//! everything before the tear.
use std::{
    fmt,
    fs::File,
    io::{self, BufReader, Read},
    path::{Path, PathBuf},
};

use bytes::{Buf, Bytes, BytesMut};
use shmtrace_common::LAYOUT_HASH;

use super::{
    format::{
        self, FORMAT_VERSION, FRAME_HEAD_LEN, FrameHead, FrameKind, MAGIC, MAX_HEADER, MAX_PAYLOAD,
        PREAMBLE_LEN, SKIPPABLE,
    },
    header::TraceHeader,
    user::{Entry, Record, UserRecord},
};

/// Where a trace file goes bad, and why.
#[derive(Debug)]
pub struct ReadError {
    pub path: Option<PathBuf>,
    /// Byte offset in the file: of the frame (or header field) that is bad.
    pub offset: u64,
    /// For a bad record inside a compressed block: its offset in the decompressed block.
    pub in_block: Option<u64>,
    pub reason: Reason,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.reason.at_opening() {
            let path = self.path.as_deref().unwrap_or(std::path::Path::new("-"));
            return write!(f, "cannot open {}: {}", path.display(), self.reason);
        }
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        write!(f, "at byte offset {}", self.offset)?;
        if let Some(inner) = self.in_block {
            write!(
                f,
                " (byte {inner} of the compressed block there, once decompressed)"
            )?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.reason {
            Reason::Io(error) => Some(error),
            _ => None,
        }
    }
}

impl ReadError {
    /// The file simply ends early, as after a crash of the recorder: what came before is good.
    pub fn is_truncation(&self) -> bool {
        matches!(
            self.reason,
            Reason::Truncated { .. } | Reason::HeaderTruncated { .. }
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Reason {
    #[error("the file is empty: the recorder stopped before it wrote anything")]
    Empty,
    #[error(
        "this is not a shmtrace trace file (it starts with {found}, a trace starts with \
         89 53 48 4d 54 52 43 0a); check the file name"
    )]
    Foreign { found: String },
    #[error(
        "the file uses trace format version {version}{by}, and this shmtrace ({ours}) reads \
         versions up to {FORMAT_VERSION}; upgrade shmtrace to read it",
        by = written_by.as_ref().map(|v| format!(" (written by shmtrace {v})")).unwrap_or_default(),
        ours = env!("CARGO_PKG_VERSION")
    )]
    NewerVersion {
        version: u16,
        written_by: Option<String>,
    },
    #[error(
        "the file's kernel records are laid out differently (layout {found:016x}, written by \
         shmtrace {written_by}) from what this shmtrace ({ours}, layout {LAYOUT_HASH:016x}) \
         reads; read it with the shmtrace that recorded it",
        ours = env!("CARGO_PKG_VERSION")
    )]
    OtherLayout { found: u64, written_by: String },
    #[error("format version 0 does not exist: the file is corrupt")]
    ZeroVersion,
    #[error(
        "the file ends inside the {what} ({have} of {need} bytes): the recorder was probably \
         stopped or killed while writing; everything before this offset was read"
    )]
    Truncated {
        what: &'static str,
        have: u64,
        need: u64,
    },
    #[error(
        "the file ends inside its header (after {have} bytes, of the {need} it needs): it is cut \
         short (a recorder stopped as it started it, an incomplete copy) or not a shmtrace \
         trace; nothing in it can be read: copy it again whole, or record again"
    )]
    HeaderTruncated { have: u64, need: u64 },
    #[error(
        "the header is corrupt (its checksum is {found:08x}, its contents give {expected:08x}); \
         the file was damaged after it was written"
    )]
    HeaderChecksum { found: u32, expected: u32 },
    #[error(
        "the header claims {len} bytes, more than the {MAX_HEADER} any shmtrace writes: the file is corrupt"
    )]
    HeaderTooLong { len: u32 },
    #[error(
        "the header could not be decoded: {0}; the file is corrupt or was not written by \
         shmtrace, and nothing in it can be read: record again, or ask for the original file"
    )]
    BadHeader(String),
    #[error(
        "it belongs to another recording ({found}, not {expected}, which the files before it \
         are of); move it out of the way"
    )]
    OtherRecording { found: String, expected: String },
    #[error(
        "the record is corrupt (its checksum is {found:08x}, its contents give {expected:08x}); \
         the file was damaged after it was written; everything before this offset was read"
    )]
    Checksum { found: u32, expected: u32 },
    #[error(
        "a record claims {len} bytes, more than the {MAX_PAYLOAD} any shmtrace writes: the file \
         is corrupt here; everything before this offset was read"
    )]
    Oversized { len: u32 },
    #[error(
        "unknown record kind {kind}: the file was written by a newer shmtrace; upgrade shmtrace \
         to read past this point"
    )]
    UnknownKind { kind: u8 },
    #[error(
        "a compressed block holds another compressed block, which shmtrace never writes: the file is corrupt"
    )]
    NestedBlock,
    #[error("a compressed block could not be decompressed ({0}): the file is corrupt")]
    Decompress(String),
    #[error(
        "a userspace record could not be decoded: {0}; the file is corrupt here; everything \
         before this offset was read"
    )]
    BadUserRecord(String),
    #[error(
        "this is not a trace file (a directory); give the trace file, or the -o name it was \
         recorded with"
    )]
    Directory,
    #[error("reading failed: {0}")]
    Io(#[source] io::Error),
    /// The file could not be opened (read as `cannot open PATH: ...`).
    #[error("{0}")]
    Open(io::Error),
    #[error(
        "no such file, and no rotated files named after it (NAME.000000.shmtrace, ...); check \
         the name"
    )]
    Missing,
}

impl Reason {
    /// Nothing was read: the file could not even be opened.
    fn at_opening(&self) -> bool {
        matches!(self, Reason::Open(_) | Reason::Missing | Reason::Directory)
    }
}

/// How much is read from the file at a time. Records are cut out of what was read as [`Bytes`]
/// sharing its allocation: no allocation and no copy for each record (a replay reads hundreds
/// of thousands a second, issue 12). A record kept for long keeps its whole chunk alive: a
/// caller that keeps a few records out of many copies them (`Bytes::copy_from_slice`).
const READ_AHEAD: usize = 256 << 10;

/// Reads one trace file.
pub struct TraceReader<R> {
    src: R,
    /// Read from `src` and not yet parsed.
    ahead: BytesMut,
    path: Option<PathBuf>,
    header: TraceHeader,
    /// File offset of the next top-level frame.
    offset: u64,
    block: Option<Block>,
    finished: bool,
    skipped: u64,
    /// The last record read was the writer's end mark.
    closed: bool,
}

/// A decompressed block being read.
struct Block {
    data: Bytes,
    pos: usize,
    file_offset: u64,
}

impl TraceReader<BufReader<File>> {
    pub fn open(path: &Path) -> Result<Self, ReadError> {
        let file = File::open(path).map_err(|error| ReadError {
            path: Some(path.to_path_buf()),
            offset: 0,
            in_block: None,
            reason: Reason::Open(error),
        })?;
        TraceReader::from_file(file, path)
    }

    /// Reads an open file (or pipe), naming it `path` in errors.
    pub(super) fn from_file(file: File, path: &Path) -> Result<Self, ReadError> {
        let mut reader = TraceReader::new(BufReader::with_capacity(1 << 16, file))
            .map_err(|e| e.at_path(path))?;
        reader.path = Some(path.to_path_buf());
        Ok(reader)
    }
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the preamble and header.
    pub fn new(mut src: R) -> Result<Self, ReadError> {
        let header = read_header(&mut src)?;
        let offset = header.1;
        Ok(TraceReader {
            src,
            ahead: BytesMut::new(),
            path: None,
            header: header.0,
            offset,
            block: None,
            finished: false,
            skipped: 0,
            closed: false,
        })
    }

    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// Records skipped because this version does not know their type (written by a newer
    /// shmtrace, and marked as safe to skip).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Whether the last record read was the writer's end mark: once the file is read, `false`
    /// means it was cut short (the recorder was killed), even where it ends on a clean frame
    /// boundary.
    pub fn closed(&self) -> bool {
        self.closed
    }

    fn error(&self, offset: u64, in_block: Option<u64>, reason: Reason) -> ReadError {
        ReadError {
            path: self.path.clone(),
            offset,
            in_block,
            reason,
        }
    }

    /// Reads ahead until `ahead` holds `need` bytes or the input ends; returns how many it
    /// holds. Grows by [`READ_AHEAD`] at a time: a hostile length gets no more memory than
    /// the file proves it has.
    fn fill(&mut self, need: usize) -> io::Result<usize> {
        while self.ahead.len() < need {
            let have = self.ahead.len();
            // Takes back the space of records already dropped, when none is still held.
            self.ahead.reserve(READ_AHEAD);
            self.ahead.resize(have + READ_AHEAD, 0);
            let got = loop {
                match self.src.read(&mut self.ahead[have..]) {
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    other => break other,
                }
            };
            self.ahead.truncate(have + *got.as_ref().unwrap_or(&0));
            if got? == 0 {
                break;
            }
        }
        Ok(self.ahead.len())
    }

    fn next_entry(&mut self) -> Result<Option<Entry>, ReadError> {
        loop {
            if let Some(entry) = self.next_in_block()? {
                return Ok(Some(entry));
            }
            let frame_offset = self.offset;
            let got = self
                .fill(FRAME_HEAD_LEN)
                .map_err(|e| self.error(frame_offset, None, Reason::Io(e)))?;
            if got == 0 {
                return Ok(None);
            }
            if got < FRAME_HEAD_LEN {
                return Err(self.error(
                    frame_offset,
                    None,
                    Reason::Truncated {
                        what: "head of a record",
                        have: got as u64,
                        need: FRAME_HEAD_LEN as u64,
                    },
                ));
            }
            let head: [u8; FRAME_HEAD_LEN] = self.ahead[..FRAME_HEAD_LEN]
                .try_into()
                .expect("FRAME_HEAD_LEN bytes");
            let frame = FrameHead::parse(&head);
            if frame.len > MAX_PAYLOAD {
                return Err(self.error(frame_offset, None, Reason::Oversized { len: frame.len }));
            }
            let end = FRAME_HEAD_LEN + frame.len as usize;
            let got = self
                .fill(end)
                .map_err(|e| self.error(frame_offset, None, Reason::Io(e)))?;
            if got < end {
                return Err(self.error(
                    frame_offset,
                    None,
                    Reason::Truncated {
                        what: "record",
                        have: got as u64,
                        need: end as u64,
                    },
                ));
            }
            self.ahead.advance(FRAME_HEAD_LEN);
            let payload = self.ahead.split_to(frame.len as usize).freeze();
            self.offset += end as u64;
            let expected = FrameHead::expected_crc(&head, &payload);
            if expected != frame.crc {
                return Err(self.error(
                    frame_offset,
                    None,
                    Reason::Checksum {
                        found: frame.crc,
                        expected,
                    },
                ));
            }
            match FrameKind::from_u8(frame.kind) {
                Some(FrameKind::ZstdBlock) => {
                    let data = decompress(&payload)
                        .map_err(|reason| self.error(frame_offset, None, reason))?;
                    self.block = Some(Block {
                        data: Bytes::from(data),
                        pos: 0,
                        file_offset: frame_offset,
                    });
                }
                Some(kind) => {
                    match record(kind, payload) {
                        Ok(Some(record)) => {
                            return Ok(Some(Entry {
                                offset: frame_offset,
                                ts_ns: frame.ts_ns,
                                record,
                            }));
                        }
                        Ok(None) => self.skipped += 1,
                        Err(reason) => return Err(self.error(frame_offset, None, reason)),
                    };
                }
                None if frame.kind & SKIPPABLE != 0 => self.skipped += 1,
                None => {
                    return Err(self.error(
                        frame_offset,
                        None,
                        Reason::UnknownKind { kind: frame.kind },
                    ));
                }
            }
        }
    }

    /// The next record of the current compressed block, if any is left.
    fn next_in_block(&mut self) -> Result<Option<Entry>, ReadError> {
        loop {
            let Some(block) = self.block.as_mut() else {
                return Ok(None);
            };
            let (file_offset, pos) = (block.file_offset, block.pos);
            let rest = &block.data[pos..];
            if rest.is_empty() {
                self.block = None;
                return Ok(None);
            }
            let fail = |reason| ReadError {
                path: self.path.clone(),
                offset: file_offset,
                in_block: Some(pos as u64),
                reason,
            };
            let Some(head) = rest.first_chunk::<FRAME_HEAD_LEN>() else {
                return Err(fail(Reason::Truncated {
                    what: "head of a record in a compressed block",
                    have: rest.len() as u64,
                    need: FRAME_HEAD_LEN as u64,
                }));
            };
            let frame = FrameHead::parse(head);
            let end = FRAME_HEAD_LEN + frame.len as usize;
            let Some(payload) = rest.get(FRAME_HEAD_LEN..end) else {
                return Err(fail(Reason::Truncated {
                    what: "record in a compressed block",
                    have: rest.len() as u64,
                    need: end as u64,
                }));
            };
            let expected = FrameHead::expected_crc(head, payload);
            if expected != frame.crc {
                return Err(fail(Reason::Checksum {
                    found: frame.crc,
                    expected,
                }));
            }
            let payload = block.data.slice(pos + FRAME_HEAD_LEN..pos + end);
            block.pos += end;
            match FrameKind::from_u8(frame.kind) {
                Some(FrameKind::ZstdBlock) => return Err(fail(Reason::NestedBlock)),
                Some(kind) => match record(kind, payload) {
                    Ok(Some(record)) => {
                        return Ok(Some(Entry {
                            offset: file_offset,
                            ts_ns: frame.ts_ns,
                            record,
                        }));
                    }
                    Ok(None) => self.skipped += 1,
                    Err(reason) => return Err(fail(reason)),
                },
                None if frame.kind & SKIPPABLE != 0 => self.skipped += 1,
                None => return Err(fail(Reason::UnknownKind { kind: frame.kind })),
            }
        }
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.finished {
            match self.next_entry() {
                // A loop, not recursion: a hostile file may hold any number of end marks.
                Ok(Some(entry)) if entry.record == Record::User(UserRecord::End) => {
                    self.closed = true;
                }
                Ok(Some(entry)) => {
                    self.closed = false;
                    return Some(Ok(entry));
                }
                Ok(None) => self.finished = true,
                Err(error) => {
                    self.finished = true;
                    return Some(Err(error));
                }
            }
        }
        None
    }
}

impl ReadError {
    fn at_path(mut self, path: &Path) -> ReadError {
        self.path = Some(path.to_path_buf());
        self
    }
}

/// A kernel or userspace record from a checked payload; `None` for a userspace record of a
/// type this version does not know.
fn record(kind: FrameKind, payload: Bytes) -> Result<Option<Record>, Reason> {
    match kind {
        FrameKind::Kernel => Ok(Some(Record::Kernel(payload))),
        FrameKind::User => match UserRecord::from_cbor(&payload) {
            Ok(UserRecord::Unknown) => Ok(None),
            Ok(user) => Ok(Some(Record::User(user))),
            Err(error) => Err(Reason::BadUserRecord(error)),
        },
        FrameKind::ZstdBlock => Err(Reason::NestedBlock),
    }
}

fn decompress(payload: &[u8]) -> Result<Vec<u8>, Reason> {
    let Some((len, compressed)) = payload.split_first_chunk::<4>() else {
        return Err(Reason::Decompress(
            "the block is shorter than its length field".into(),
        ));
    };
    let len = u32::from_le_bytes(*len);
    if len > MAX_PAYLOAD {
        return Err(Reason::Oversized { len });
    }
    let data = zstd::bulk::decompress(compressed, len as usize)
        .map_err(|e| Reason::Decompress(e.to_string()))?;
    if data.len() != len as usize {
        return Err(Reason::Decompress(format!(
            "{} bytes came out, the block says {len}",
            data.len()
        )));
    }
    Ok(data)
}

/// Reads and checks the preamble and header; returns the header and the offset of the body.
fn read_header(src: &mut impl Read) -> Result<(TraceHeader, u64), ReadError> {
    let at = |offset: u64, reason| ReadError {
        path: None,
        offset,
        in_block: None,
        reason,
    };
    let mut preamble = [0u8; PREAMBLE_LEN];
    let got = read_full(src, &mut preamble).map_err(|e| at(0, Reason::Io(e)))?;
    if got == 0 {
        return Err(at(0, Reason::Empty));
    }
    let magic_seen = got.min(MAGIC.len());
    if preamble[..magic_seen] != MAGIC[..magic_seen] {
        let found = preamble[..magic_seen]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ");
        return Err(at(0, Reason::Foreign { found }));
    }
    if got < PREAMBLE_LEN {
        return Err(at(
            got as u64,
            Reason::HeaderTruncated {
                have: got as u64,
                need: PREAMBLE_LEN as u64,
            },
        ));
    }
    let version = u16::from_le_bytes([preamble[8], preamble[9]]);
    let flags = u16::from_le_bytes([preamble[10], preamble[11]]);
    let header_len = u32::from_le_bytes(preamble[12..16].try_into().expect("4 bytes"));
    let header_crc = u32::from_le_bytes(preamble[16..20].try_into().expect("4 bytes"));
    if version == 0 {
        return Err(at(8, Reason::ZeroVersion));
    }
    if version > FORMAT_VERSION {
        return Err(at(
            8,
            Reason::NewerVersion {
                version,
                written_by: newer_tool_version(src, header_len),
            },
        ));
    }
    if header_len > MAX_HEADER {
        return Err(at(12, Reason::HeaderTooLong { len: header_len }));
    }
    let mut cbor = Vec::new();
    let got = src
        .take(u64::from(header_len))
        .read_to_end(&mut cbor)
        .map_err(|e| at(PREAMBLE_LEN as u64, Reason::Io(e)))?;
    if got < header_len as usize {
        return Err(at(
            (PREAMBLE_LEN + got) as u64,
            Reason::HeaderTruncated {
                have: (PREAMBLE_LEN + got) as u64,
                need: (PREAMBLE_LEN + header_len as usize) as u64,
            },
        ));
    }
    let expected = format::preamble_crc(&preamble[..16], &cbor);
    if expected != header_crc {
        return Err(at(
            0,
            Reason::HeaderChecksum {
                found: header_crc,
                expected,
            },
        ));
    }
    let mut header: TraceHeader = ciborium::from_reader(&cbor[..]).map_err(|e| {
        at(
            PREAMBLE_LEN as u64,
            Reason::BadHeader(super::cbor_error::problem(&e, "the header")),
        )
    })?;
    if let Some(found) = header.record_layout.filter(|found| *found != LAYOUT_HASH) {
        let written_by = crate::event::escape::text(&header.tool_version);
        return Err(at(
            PREAMBLE_LEN as u64,
            Reason::OtherLayout { found, written_by },
        ));
    }
    header.redacted = flags & format::flags::REDACTED != 0;
    header.compressed = flags & format::flags::COMPRESSED != 0;
    Ok((header, (PREAMBLE_LEN + cbor.len()) as u64))
}

/// The tool version of a file in a newer format, if its header still reads the same way: it
/// makes the upgrade message precise. Best effort.
fn newer_tool_version(src: &mut impl Read, header_len: u32) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Just {
        tool_version: String,
    }
    if header_len > MAX_HEADER {
        return None;
    }
    let mut cbor = Vec::new();
    src.take(u64::from(header_len))
        .read_to_end(&mut cbor)
        .ok()?;
    let just: Just = ciborium::from_reader(&cbor[..]).ok()?;
    Some(crate::event::escape::text(&just.tool_version))
}

/// Reads until `buf` is full or the input ends; returns how much was read.
fn read_full(src: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match src.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}
