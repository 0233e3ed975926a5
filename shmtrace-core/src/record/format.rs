//! The bytes of a trace file: the preamble, the frame that wraps every record, and the limits a
//! reader enforces. `docs/trace-format.md` is the human description of the same layout.
//!
//! All integers are little-endian. Every frame carries a CRC-32 (the IEEE polynomial of zlib,
//! gzip and PNG, so `zlib.crc32` in Python checks it) over its head and payload.

/// First bytes of every trace file. The high-bit first byte catches transfers that strip the 8th
/// bit and the newline catches newline conversion, as in PNG's signature.
pub const MAGIC: [u8; 8] = *b"\x89SHMTRC\n";

/// The format this code writes, and the newest it reads.
pub const FORMAT_VERSION: u16 = 1;

/// magic (8), format version (2), flags (2), header length (4), header CRC (4).
pub const PREAMBLE_LEN: usize = 20;

/// kind (1), reserved (3), payload length (4), timestamp (8), CRC (4).
pub const FRAME_HEAD_LEN: usize = 20;

/// No frame payload (a kernel record, a userspace record, or a compressed block, compressed or
/// not) is larger. Readers refuse longer lengths before allocating anything.
pub const MAX_PAYLOAD: u32 = 16 << 20;

/// The CBOR header is at most this long.
pub const MAX_HEADER: u32 = 4 << 20;

/// Bits of the preamble's flags word.
pub mod flags {
    /// Identifying strings were replaced by pseudonyms (`shmtrace report --redact`).
    pub const REDACTED: u16 = 1 << 0;
    /// The body is made of zstd-compressed blocks.
    pub const COMPRESSED: u16 = 1 << 1;
}

/// What a frame holds.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A kernel ring-buffer record, byte for byte.
    Kernel = 1,
    /// A userspace record, CBOR-encoded.
    User = 2,
    /// A zstd frame holding a run of `Kernel` and `User` frames; the payload starts with the
    /// decompressed length (u32).
    ZstdBlock = 3,
}

/// Frame kinds with this bit set may be skipped by readers that do not know them; any other
/// unknown kind stops the reader.
pub const SKIPPABLE: u8 = 0x80;

impl FrameKind {
    pub fn from_u8(value: u8) -> Option<FrameKind> {
        match value {
            1 => Some(FrameKind::Kernel),
            2 => Some(FrameKind::User),
            3 => Some(FrameKind::ZstdBlock),
            _ => None,
        }
    }
}

/// A frame's fixed-size head, as read; nothing is validated yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHead {
    pub kind: u8,
    pub len: u32,
    pub ts_ns: u64,
    pub crc: u32,
}

impl FrameHead {
    pub fn parse(bytes: &[u8; FRAME_HEAD_LEN]) -> FrameHead {
        FrameHead {
            kind: bytes[0],
            len: u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")),
            ts_ns: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
            crc: u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes")),
        }
    }

    /// The CRC this head and `payload` should carry.
    pub fn expected_crc(head: &[u8; FRAME_HEAD_LEN], payload: &[u8]) -> u32 {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&head[..16]);
        hasher.update(payload);
        hasher.finalize()
    }
}

/// Appends one frame to `out`. The caller keeps `payload` within [`MAX_PAYLOAD`].
pub fn encode_frame(out: &mut Vec<u8>, kind: FrameKind, ts_ns: u64, payload: &[u8]) {
    debug_assert!(payload.len() <= MAX_PAYLOAD as usize);
    let mut head = [0u8; FRAME_HEAD_LEN];
    head[0] = kind as u8;
    head[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    head[8..16].copy_from_slice(&ts_ns.to_le_bytes());
    let crc = FrameHead::expected_crc(&head, payload);
    head[16..20].copy_from_slice(&crc.to_le_bytes());
    out.reserve(FRAME_HEAD_LEN + payload.len());
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
}

/// The preamble that starts a file, followed by its CBOR header.
pub fn encode_preamble(flags: u16, header_cbor: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREAMBLE_LEN + header_cbor.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&(header_cbor.len() as u32).to_le_bytes());
    let crc = preamble_crc(&out[..16], header_cbor);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(header_cbor);
    out
}

/// CRC over the first 16 preamble bytes and the CBOR header.
pub fn preamble_crc(first16: &[u8], header_cbor: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(first16);
    hasher.update(header_cbor);
    hasher.finalize()
}

/// The kernel stamps every ring-buffer record with `CLOCK_BOOTTIME` at this offset
/// (`shmtrace_common::Header::ts_ns`); 0 when the record is too short to have one.
pub fn kernel_ts(record: &[u8]) -> u64 {
    record
        .get(8..16)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_layout_is_as_documented() {
        let mut out = Vec::new();
        encode_frame(&mut out, FrameKind::User, 0x0102030405060708, b"abc");
        assert_eq!(out.len(), FRAME_HEAD_LEN + 3);
        assert_eq!(out[0], 2);
        assert_eq!(&out[1..4], &[0, 0, 0]);
        assert_eq!(&out[4..8], &3u32.to_le_bytes());
        assert_eq!(&out[8..16], &0x0102030405060708u64.to_le_bytes());
        // The CRC is zlib's crc32 of everything but itself.
        let mut covered = out[..16].to_vec();
        covered.extend_from_slice(b"abc");
        assert_eq!(&out[16..20], &crc32fast::hash(&covered).to_le_bytes());
    }

    #[test]
    fn kernel_ts_reads_the_common_header() {
        let header = shmtrace_common::Header {
            ts_ns: 123_456,
            ..Default::default()
        };
        // SAFETY: a plain-old-data struct viewed as bytes, for the test only.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                &header as *const _ as *const u8,
                size_of::<shmtrace_common::Header>(),
            )
        };
        assert_eq!(kernel_ts(bytes), 123_456);
        assert_eq!(kernel_ts(&bytes[..10]), 0);
    }
}
