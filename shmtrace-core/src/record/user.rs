//! Records that come from shmtrace itself rather than from the kernel, and the `Record` type
//! that holds either kind.
//!
//! These are the file format's own types, deliberately separate from the model's: the model may
//! change shape between versions, a file written today must still read tomorrow. Each is
//! CBOR-encoded with its field names, so fields can be added without a format version bump.
use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use shmtrace_common::Loss;

use super::header::{ContainerDescription, ShmCapacity};
use crate::event::escape::stored;
use crate::{
    event::{InodeId, LostCounts},
    model::{HeldFile, Holder, ProcSnapshot, ShmHolders, SnapshotFd, SnapshotMapping},
};

/// One record of a trace.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// A kernel ring-buffer record, exactly as the ring buffer gave it: replay it through
    /// `event::decode`.
    Kernel(Bytes),
    User(UserRecord),
}

/// A record read back, with where it was.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Byte offset of its frame in the file (for records inside a compressed block: the
    /// block's offset).
    pub offset: u64,
    /// `CLOCK_BOOTTIME` nanoseconds.
    pub ts_ns: u64,
    pub record: Record,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum UserRecord {
    /// A process as /proc showed it when shmtrace met it (or, at the start of a rotated file,
    /// as the model knew it).
    Snapshot(ProcessSnapshot),
    /// New or changed metadata for a container.
    Container(Box<ContainerDescription>),
    /// The container of mount namespace `mntns` stopped: from here on the number names it no
    /// more (another container may get it), so a reader forgets the mapping, as the live side
    /// did.
    ContainerEnd {
        mntns: u32,
    },
    /// A /dev/shm file system's use, measured when something failed.
    Capacity(CapacitySample),
    /// What held the space of a /dev/shm when something failed on it: its files, with the
    /// processes that had them open or mapped, traced or not.
    Holders(HoldersSample),
    /// Cumulative counts of kernel records lost to a full ring buffer.
    Lost(LostCounters),
    /// Records shmtrace had but could not write (an I/O error, or the flight recorder's memory
    /// bound), so a reader knows the trace has a hole.
    WriterLoss(WriterLoss),
    /// The flight recorder was triggered.
    Trigger(Trigger),
    Note {
        text: String,
    },
    /// The writer closed the file: the last record of every complete file. A file without it
    /// was cut short (the recorder was killed, or the machine stopped). Readers take it in
    /// themselves (`TraceReader::closed`) rather than hand it on.
    End,
    /// A record type this version does not know (written by a newer shmtrace).
    #[serde(other)]
    Unknown,
}

/// `model::ProcSnapshot`, as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessSnapshot {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub exe: Option<String>,
    pub argv: Vec<String>,
    pub mntns: u32,
    /// Its pid in its container's pid namespace; absent in traces of older versions.
    pub nspid: Option<u32>,
    pub fds: Vec<SnapshotFdRecord>,
    pub mappings: Vec<SnapshotMappingRecord>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SnapshotFdRecord {
    pub fd: i32,
    pub dev: u32,
    pub ino: u64,
    pub path: String,
    pub deleted: bool,
    pub cloexec: bool,
    pub size: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SnapshotMappingRecord {
    pub start: u64,
    pub len: u64,
    pub offset: u64,
    pub dev: u32,
    pub ino: u64,
    pub path: String,
    pub deleted: bool,
}

impl From<&ProcSnapshot> for ProcessSnapshot {
    fn from(s: &ProcSnapshot) -> ProcessSnapshot {
        ProcessSnapshot {
            pid: s.pid,
            ppid: s.ppid,
            comm: s.comm.clone(),
            exe: s.exe.clone(),
            argv: s.argv.clone(),
            mntns: s.mntns,
            nspid: s.nspid,
            fds: s
                .fds
                .iter()
                .map(|f| SnapshotFdRecord {
                    fd: f.fd,
                    dev: f.inode.dev,
                    ino: f.inode.ino,
                    path: f.path.clone(),
                    deleted: f.deleted,
                    cloexec: f.cloexec,
                    size: f.size,
                })
                .collect(),
            mappings: s
                .mappings
                .iter()
                .map(|m| SnapshotMappingRecord {
                    start: m.start,
                    len: m.len,
                    offset: m.offset,
                    dev: m.inode.dev,
                    ino: m.inode.ino,
                    path: m.path.clone(),
                    deleted: m.deleted,
                })
                .collect(),
        }
    }
}

impl ProcessSnapshot {
    /// The model's form, for `World::seed`.
    pub fn to_model(&self) -> ProcSnapshot {
        ProcSnapshot {
            pid: self.pid,
            ppid: self.ppid,
            // Escaped when recorded; checked again, since the file may come from anyone.
            comm: stored(&self.comm),
            exe: self.exe.as_deref().map(stored),
            argv: self.argv.iter().map(|arg| stored(arg)).collect(),
            mntns: self.mntns,
            nspid: self.nspid,
            fds: self
                .fds
                .iter()
                .map(|f| SnapshotFd {
                    fd: f.fd,
                    inode: InodeId {
                        dev: f.dev,
                        ino: f.ino,
                    },
                    path: stored(&f.path),
                    deleted: f.deleted,
                    cloexec: f.cloexec,
                    size: f.size,
                })
                .collect(),
            mappings: self
                .mappings
                .iter()
                .map(|m| SnapshotMapping {
                    start: m.start,
                    len: m.len,
                    offset: m.offset,
                    inode: InodeId {
                        dev: m.dev,
                        ino: m.ino,
                    },
                    path: stored(&m.path),
                    deleted: m.deleted,
                })
                .collect(),
        }
    }
}

/// `model::ShmHolders`, as stored (its time is the record's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HoldersSample {
    pub dev: u32,
    pub files: Vec<HeldFileRecord>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HeldFileRecord {
    pub ino: u64,
    pub path: String,
    pub linked: bool,
    pub bytes: u64,
    pub size: u64,
    pub holders: Vec<HolderRecord>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HolderRecord {
    pub pid: u32,
    pub comm: String,
    pub mntns: u32,
    pub open: bool,
    pub mapped: bool,
}

impl From<&ShmHolders> for HoldersSample {
    fn from(h: &ShmHolders) -> HoldersSample {
        HoldersSample {
            dev: h.dev,
            files: h
                .files
                .iter()
                .map(|f| HeldFileRecord {
                    ino: f.ino,
                    path: f.path.clone(),
                    linked: f.linked,
                    bytes: f.bytes,
                    size: f.size,
                    holders: f
                        .holders
                        .iter()
                        .map(|p| HolderRecord {
                            pid: p.pid,
                            comm: p.comm.clone(),
                            mntns: p.mntns,
                            open: p.open,
                            mapped: p.mapped,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

impl HoldersSample {
    /// The model's form; text checked again, since the file may come from anyone.
    pub fn to_model(&self, ts_ns: u64) -> ShmHolders {
        ShmHolders {
            dev: self.dev,
            ts_ns,
            files: self
                .files
                .iter()
                .map(|f| HeldFile {
                    ino: f.ino,
                    path: stored(&f.path),
                    linked: f.linked,
                    bytes: f.bytes,
                    size: f.size,
                    holders: f
                        .holders
                        .iter()
                        .map(|p| Holder {
                            pid: p.pid,
                            comm: stored(&p.comm),
                            mntns: p.mntns,
                            open: p.open,
                            mapped: p.mapped,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CapacitySample {
    /// The process whose failure prompted the sample.
    pub pid: Option<u32>,
    /// The container whose /dev/shm this is, by id.
    pub container: Option<String>,
    pub capacity: ShmCapacity,
}

/// What the probes lost, by `Loss::index` (a record kind's number when the ring buffer was
/// full, 16 and up for failed reads), cumulative since recording started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LostCounters {
    pub by_kind: BTreeMap<u16, u64>,
}

impl From<&LostCounts> for LostCounters {
    fn from(counts: &LostCounts) -> LostCounters {
        LostCounters {
            by_kind: counts
                .by_kind()
                .map(|(k, n)| (k.index() as u16, n))
                .collect(),
        }
    }
}

impl LostCounters {
    /// The session's form; kinds this version does not know are counted under `unknown`.
    pub fn to_counts(&self) -> (LostCounts, u64) {
        let mut counts = LostCounts::default();
        let mut unknown = 0;
        for (kind, n) in &self.by_kind {
            match Loss::from_index(u32::from(*kind)) {
                Some(kind) => counts.add(kind, *n),
                None => unknown = u64::saturating_add(unknown, *n),
            }
        }
        (counts, unknown)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WriterLoss {
    pub records: u64,
    pub bytes: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Trigger {
    pub reason: TriggerReason,
    /// The process that failed or died.
    pub pid: Option<u32>,
    /// Free text for people, e.g. `fallocate(fd 11, 96 MiB) = -ENOSPC`.
    pub detail: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerReason {
    /// A /dev/shm call failed with ENOSPC.
    Enospc,
    /// A SIGBUS from touching a mapping of a full /dev/shm.
    Sigbus,
    /// A traced worker died of a signal or a failing status.
    WorkerDeath,
    /// The user asked (e.g. SIGUSR1).
    Manual,
    #[default]
    #[serde(other)]
    Other,
}

impl TriggerReason {
    /// As the trace file's header keeps it (docs/trace-format.md).
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerReason::Enospc => "ENOSPC",
            TriggerReason::Sigbus => "SIGBUS",
            TriggerReason::WorkerDeath => "worker death",
            TriggerReason::Manual => "manual",
            TriggerReason::Other => "other",
        }
    }

    /// As JSON names it (docs/json.md): a word, `worker_death`.
    pub fn key(self) -> &'static str {
        match self {
            TriggerReason::WorkerDeath => "worker_death",
            other => other.as_str(),
        }
    }
}

impl UserRecord {
    pub(super) fn to_cbor(&self) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(self, &mut out).expect("writing CBOR to memory cannot fail");
        out
    }

    pub(super) fn from_cbor(bytes: &[u8]) -> Result<UserRecord, String> {
        ciborium::from_reader(bytes).map_err(|e| super::cbor_error::problem(&e, "the record"))
    }
}

#[cfg(test)]
mod tests {
    use shmtrace_common::EventKind;

    use super::*;

    #[test]
    fn snapshots_convert_both_ways() {
        let model = ProcSnapshot {
            pid: 7,
            ppid: Some(1),
            comm: "python3".into(),
            exe: Some("/usr/bin/python3.11".into()),
            argv: vec!["python3".into(), "train.py".into()],
            mntns: 4026531841,
            nspid: Some(12),
            fds: vec![SnapshotFd {
                fd: 11,
                inode: InodeId { dev: 26, ino: 99 },
                path: "/dev/shm/torch_7_1".into(),
                deleted: true,
                cloexec: true,
                size: 4096,
            }],
            mappings: vec![SnapshotMapping {
                start: 0x7f00_0000_0000,
                len: 4096,
                offset: 0,
                inode: InodeId { dev: 26, ino: 99 },
                path: "/dev/shm/torch_7_1".into(),
                deleted: true,
            }],
        };
        let stored = UserRecord::Snapshot(ProcessSnapshot::from(&model));
        let back = UserRecord::from_cbor(&stored.to_cbor()).unwrap();
        let UserRecord::Snapshot(snapshot) = back else {
            panic!("not a snapshot")
        };
        assert_eq!(snapshot.to_model(), model);
    }

    #[test]
    fn unknown_record_types_decode_as_unknown() {
        #[derive(Serialize)]
        struct Future {
            r#type: &'static str,
            field: u32,
        }
        let mut bytes = Vec::new();
        ciborium::into_writer(
            &Future {
                r#type: "gpu_memory",
                field: 1,
            },
            &mut bytes,
        )
        .unwrap();
        assert_eq!(UserRecord::from_cbor(&bytes), Ok(UserRecord::Unknown));
    }

    #[test]
    fn lost_counters_keep_unknown_kinds_apart() {
        let mut counts = LostCounts::default();
        counts.add(Loss::RingFull(EventKind::Syscall), 5);
        counts.add(Loss::PathRead, 7);
        let mut stored = LostCounters::from(&counts);
        stored.by_kind.insert(200, 2);
        let (back, unknown) = stored.to_counts();
        assert_eq!(back, counts);
        assert_eq!(unknown, 2);
    }
}
