//! What a trace file says about itself: which tool wrote it, on which kernel, what was traced,
//! and when. Stored as CBOR after the preamble.
//!
//! Every field has a default, and unknown fields are ignored, so a header from a slightly newer
//! or older shmtrace of the same format version still decodes. Container metadata is still
//! growing (the container module is young): `ContainerDescription::extra` carries fields this
//! version has no name for, and they survive a read and re-write.
use std::{collections::BTreeMap, path::Path};

use crate::{capacity::Capacity, clock::boot_ns};
use serde::{Deserialize, Serialize};

/// The decoded header of a trace file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceHeader {
    /// Kept in the preamble's flags word, not in the CBOR.
    #[serde(skip)]
    pub redacted: bool,
    /// Kept in the preamble's flags word, not in the CBOR.
    #[serde(skip)]
    pub compressed: bool,
    /// `CARGO_PKG_VERSION` of the shmtrace that wrote the file.
    pub tool_version: String,
    /// `uname -r`.
    pub kernel_release: String,
    pub hostname: Option<String>,
    pub cgroup_layout: CgroupLayout,
    pub target: TargetDescription,
    /// When recording started: wall clock (nanoseconds since the Unix epoch) and `CLOCK_BOOTTIME`.
    pub start_unix_ns: i64,
    pub start_boot_ns: u64,
    /// Wall clock minus boot time, nanoseconds: record timestamps are boot time, and this turns
    /// them into dates (`clock::Clock::with_offset`).
    pub unix_minus_boot_ns: i64,
    /// Random, shared by every file of one recording (rotated files, flight-recorder dumps).
    pub recording_id: String,
    /// 0 for the first file of a recording, then one more for each rotated file or dump.
    pub sequence: u32,
    /// Set on files written by the flight recorder (`record --on-failure`).
    pub flight: Option<FlightInfo>,
    /// The recorder's own mount namespace: processes in it ran on the host, not in a
    /// container.
    pub host_mntns: Option<u32>,
    /// `shmtrace_common::LAYOUT_HASH` of the writer: kernel records are stored as the probes
    /// wrote them, so a file whose records are laid out differently is refused. Absent in files
    /// written before it was added, whose layout is today's.
    pub record_layout: Option<u64>,
    /// Where the records came from: `ebpf` (the probes) or `ptrace` (the unprivileged
    /// source, which writes the same records). Absent in files written before it was added,
    /// which are the probes'.
    pub source: Option<String>,
}

/// How the host arranges cgroups, which decides whether a cgroup id identifies a container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupLayout {
    /// Only cgroup v1 hierarchies.
    V1,
    /// v1 controllers plus a cgroup2 hierarchy at `/sys/fs/cgroup/unified` (systemd "hybrid").
    Hybrid,
    /// The unified hierarchy only: cgroup ids identify containers.
    V2,
    #[default]
    Unknown,
}

impl CgroupLayout {
    /// Reads the layout of this host from the file system types under /sys/fs/cgroup.
    pub fn detect() -> CgroupLayout {
        Self::detect_at(Path::new("/sys/fs/cgroup"))
    }

    fn detect_at(root: &Path) -> CgroupLayout {
        use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, statfs};
        match statfs(root) {
            Ok(fs) if fs.filesystem_type() == CGROUP2_SUPER_MAGIC => CgroupLayout::V2,
            Ok(_) => match statfs(&root.join("unified")) {
                Ok(fs) if fs.filesystem_type() == CGROUP2_SUPER_MAGIC => CgroupLayout::Hybrid,
                _ => CgroupLayout::V1,
            },
            Err(_) => CgroupLayout::Unknown,
        }
    }
}

/// What was traced, as the user asked for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TargetDescription {
    /// The command shmtrace ran (`-- CMD ...`), escaped.
    pub command: Option<Vec<String>>,
    /// `--pid` roots.
    pub pids: Vec<u32>,
    /// `--all`.
    pub host_wide: bool,
    /// `--failed`: successful data-path calls were dropped in the kernel.
    pub failed_only: bool,
    /// Containers traced, or seen, when recording started.
    pub containers: Vec<ContainerDescription>,
}

/// A container, as its runtime describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerDescription {
    /// The runtime's id (Docker: 64 hex digits).
    pub id: String,
    pub name: Option<String>,
    /// `docker`, `containerd`, `podman`, `cri-o`, ...
    pub runtime: Option<String>,
    pub image: Option<String>,
    pub hostname: Option<String>,
    /// Pid of its first process, in the host's pid namespace.
    pub pid: Option<u32>,
    /// Mount namespace inode: identifies the container on cgroup v1 hosts too.
    pub mntns: Option<u32>,
    pub cgroup_id: Option<u64>,
    pub cgroup_path: Option<String>,
    /// Its /dev/shm when it was described.
    pub shm: Option<ShmCapacity>,
    pub labels: BTreeMap<String, String>,
    /// Fields a newer container module adds; kept as they are.
    #[serde(flatten)]
    pub extra: BTreeMap<String, ciborium::Value>,
}

/// Size and use of one /dev/shm file system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShmCapacity {
    /// Kernel `dev_t` (`major << 20 | minor`), as in kernel records.
    pub dev: u32,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub available_bytes: u64,
    /// Its file count (`nr_inodes`) and the files it could still take, when measured: absent
    /// from files written before they were kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files_free: Option<u64>,
}

/// The one capacity type into the file's form, and back: the only place they meet.
impl From<&Capacity> for ShmCapacity {
    fn from(capacity: &Capacity) -> ShmCapacity {
        ShmCapacity {
            dev: capacity.dev,
            size_bytes: capacity.size,
            used_bytes: capacity.used,
            available_bytes: capacity.available(),
            files: capacity.files.map(|f| f.limit),
            files_free: capacity.files.map(|f| f.free),
        }
    }
}

impl ShmCapacity {
    /// As measured at `ts_ns` (the file keeps the time in the record's frame, not here).
    pub fn at(&self, ts_ns: u64) -> Capacity {
        Capacity {
            dev: self.dev,
            size: self.size_bytes,
            used: self.used_bytes,
            ts_ns,
            files: self
                .files
                .zip(self.files_free)
                .map(|(limit, free)| crate::capacity::FileCount { limit, free }),
        }
    }
}

/// Why and around when a flight-recorder file was written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlightInfo {
    /// The first trigger of this file (later ones are `Trigger` records inside it).
    pub reason: String,
    pub trigger_ts_ns: u64,
    /// The window asked for, and where the kept records really start (later when the memory
    /// bound was reached first).
    pub window_ns: u64,
    pub window_start_ns: u64,
    pub tail_ns: u64,
    /// Records pushed out of the window by the memory bound before this dump.
    pub evicted_for_memory: u64,
}

impl TraceHeader {
    /// A header for a recording starting now on this machine; the caller fills in `target`.
    pub fn for_this_host(target: TargetDescription) -> std::io::Result<TraceHeader> {
        let boot = boot_ns()?;
        let unix = jiff::Timestamp::now().as_nanosecond();
        let uname = nix::sys::utsname::uname().ok();
        Ok(TraceHeader {
            redacted: false,
            compressed: false,
            tool_version: env!("CARGO_PKG_VERSION").to_owned(),
            kernel_release: uname
                .as_ref()
                .map(|u| u.release().to_string_lossy().into_owned())
                .unwrap_or_default(),
            hostname: uname.map(|u| u.nodename().to_string_lossy().into_owned()),
            cgroup_layout: CgroupLayout::detect(),
            target,
            start_unix_ns: i64::try_from(unix).unwrap_or(i64::MAX),
            start_boot_ns: boot,
            unix_minus_boot_ns: i64::try_from(unix - boot as i128).unwrap_or(i64::MAX),
            recording_id: random_id(),
            sequence: 0,
            flight: None,
            host_mntns: None,
            record_layout: Some(shmtrace_common::LAYOUT_HASH),
            source: None,
        })
    }

    /// Turns the file's boot-time timestamps into wall-clock time, in the local time zone.
    pub fn clock(&self) -> crate::clock::Clock {
        crate::clock::Clock::with_offset(
            i128::from(self.unix_minus_boot_ns),
            jiff::tz::TimeZone::system(),
        )
    }

    pub(super) fn flags(&self) -> u16 {
        let mut bits = 0;
        if self.redacted {
            bits |= super::format::flags::REDACTED;
        }
        if self.compressed {
            bits |= super::format::flags::COMPRESSED;
        }
        bits
    }

    pub(super) fn to_cbor(&self) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(self, &mut out).expect("writing CBOR to memory cannot fail");
        out
    }
}

/// 128 random bits, as hex.
pub(super) fn random_id() -> String {
    let mut bytes = [0u8; 16];
    if super::pseudonym::fill_random(&mut bytes).is_err() {
        // Only uniqueness matters here: the time and pid will do.
        let boot = boot_ns().unwrap_or_default();
        let seed = (boot as u128) << 32 | u128::from(std::process::id());
        bytes = seed.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The container fields with no slot of their own travel in `extra`, under these keys.
const EXTRA_POD: &str = "pod";
const EXTRA_NAMESPACE: &str = "namespace";
pub(super) const EXTRA_IPC: &str = "ipc";
pub(super) const EXTRA_STARTED_BY: &str = "started_by";

impl From<&crate::model::ContainerInfo> for ContainerDescription {
    fn from(info: &crate::model::ContainerInfo) -> ContainerDescription {
        let mut extra = BTreeMap::new();
        let text = |s: &str| ciborium::Value::Text(s.to_owned());
        if let Some(pod) = &info.pod {
            extra.insert(EXTRA_POD.to_owned(), text(pod));
        }
        if let Some(namespace) = &info.namespace {
            extra.insert(EXTRA_NAMESPACE.to_owned(), text(namespace));
        }
        extra.insert(EXTRA_IPC.to_owned(), text(&info.ipc));
        if let Ok(started_by) = ciborium::Value::serialized(&info.started_by) {
            extra.insert(EXTRA_STARTED_BY.to_owned(), started_by);
        }
        ContainerDescription {
            id: info.id.clone(),
            name: Some(info.name.clone()),
            runtime: Some(info.runtime.clone()),
            image: info.image.clone(),
            mntns: info.mntns,
            shm: info.shm_size.map(|size| ShmCapacity {
                dev: info.shm_dev.unwrap_or(0),
                size_bytes: size,
                used_bytes: info.shm_used.unwrap_or(0),
                available_bytes: size.saturating_sub(info.shm_used.unwrap_or(0)),
                ..ShmCapacity::default()
            }),
            extra,
            ..ContainerDescription::default()
        }
    }
}

impl ContainerDescription {
    /// Back to the form events and diagnoses use.
    pub fn to_info(&self) -> crate::model::ContainerInfo {
        let text = |key: &str| match self.extra.get(key) {
            Some(ciborium::Value::Text(value)) => Some(value.clone()),
            _ => None,
        };
        crate::model::ContainerInfo {
            runtime: self.runtime.clone().unwrap_or_else(|| "unknown".to_owned()),
            id: self.id.clone(),
            name: self.name.clone().unwrap_or_default(),
            image: self.image.clone(),
            pod: text(EXTRA_POD),
            namespace: text(EXTRA_NAMESPACE),
            shm_size: self.shm.map(|s| s.size_bytes),
            shm_used: self.shm.map(|s| s.used_bytes),
            ipc: text(EXTRA_IPC).unwrap_or_default(),
            started_by: self
                .extra
                .get(EXTRA_STARTED_BY)
                .and_then(|v| v.deserialized().ok())
                .unwrap_or_default(),
            mntns: self.mntns,
            shm_dev: self.shm.map(|s| s.dev).filter(|dev| *dev != 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_through_cbor_with_unknown_container_fields() {
        let mut header = TraceHeader::for_this_host(TargetDescription {
            command: Some(vec!["python3".into(), "train.py".into()]),
            ..Default::default()
        })
        .unwrap();
        let mut container = ContainerDescription {
            id: "ab".repeat(32),
            runtime: Some("docker".into()),
            shm: Some(ShmCapacity {
                dev: 26,
                size_bytes: 64 << 20,
                ..Default::default()
            }),
            ..Default::default()
        };
        container
            .extra
            .insert("restart_count".into(), ciborium::Value::Integer(3.into()));
        header.target.containers.push(container);
        let back: TraceHeader = ciborium::from_reader(&header.to_cbor()[..]).unwrap();
        assert_eq!(back, header);
        assert!(!header.kernel_release.is_empty());
        assert_eq!(header.recording_id.len(), 32);
        // Boot time plus the offset is the wall clock the header was made at.
        let start = header
            .clock()
            .wall(header.start_boot_ns)
            .unwrap()
            .as_nanosecond();
        assert_eq!(start, i128::from(header.start_unix_ns));
    }

    #[test]
    fn detects_this_hosts_cgroup_layout() {
        // This machine is hybrid: v1 controllers and a cgroup2 hierarchy at .../unified.
        assert_ne!(CgroupLayout::detect(), CgroupLayout::Unknown);
    }
}
