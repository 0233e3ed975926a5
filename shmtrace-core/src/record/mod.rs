//! Trace files: `shmtrace record` writes them, `report` and `show` read them back.
//!
//! A trace file is a self-describing header (tool, format version, kernel, cgroup layout, what
//! was traced, when) and then framed records, each with its length and CRC: raw kernel
//! ring-buffer records, stored byte for byte so that a replay goes through `event::decode` like
//! a live trace, and userspace records (/proc snapshots, container metadata, capacity samples,
//! lost-event counters, notes). The layout is documented in `docs/trace-format.md`.
//!
//! `format` lays out the bytes; `header` and `user` say what they mean; `writer` writes
//! (crash-safe, compressed or not, rotating); `reader` reads and says where a bad file goes
//! bad, and `cbor_error` how undecodable CBOR in it is named; `flight` is the in-memory window of `record --on-failure`; `redact` makes a copy safe
//! to share, with `pseudonym`; `carry` gives a rotated file the state it starts from.

mod carry;
mod cbor_error;
mod flight;
mod format;
mod header;
mod pseudonym;
mod reader;
mod redact;
mod rotation;
mod set;
mod user;
mod write_error;
mod writer;

#[cfg(test)]
pub(crate) mod tests;

pub use carry::world_snapshots;
pub use flight::{FlightOptions, FlightRecorder, Triggered};
pub use header::{ContainerDescription, ShmCapacity, TargetDescription, TraceHeader};
pub use set::TraceSet;
// The whole file format, for the CLI's tests, the fuzz targets (fuzz/) and other readers.
pub use header::FlightInfo;
pub use reader::{ReadError, Reason, TraceReader};
#[cfg(test)]
pub use redact::RedactError;
pub use redact::redact_file;
pub use user::{
    CapacitySample, Entry, HeldFileRecord, HolderRecord, HoldersSample, LostCounters,
    ProcessSnapshot, Record, SnapshotFdRecord, SnapshotMappingRecord, Trigger, TriggerReason,
    UserRecord, WriterLoss,
};
pub use writer::no_carry;
pub use writer::{Rotation, TraceWriter, WriteError, WriterOptions};
