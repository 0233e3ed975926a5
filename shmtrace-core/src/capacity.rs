//! How big one /dev/shm file system is and how full, at one moment: the one type for a
//! capacity. Diagnosis, reports and the daemon read it; the live side measures it (statfs of a
//! container's /dev/shm); a trace file keeps it as `record::ShmCapacity`, converted only where
//! records are written and read.
use serde::{Deserialize, Serialize};

/// Size and use of one /dev/shm file system, measured with statfs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// `dev_t` of the file system (kernel encoding, `major << 20 | minor`, as the probes
    /// report it).
    pub dev: u32,
    /// Bytes it can hold (0: an unbounded tmpfs, `size=0`).
    pub size: u64,
    pub used: u64,
    /// When it was measured (`CLOCK_BOOTTIME` ns).
    pub ts_ns: u64,
    /// How many files it can hold and how many more it could take then (`f_files`,
    /// `f_ffree`: a tmpfs's `nr_inodes`), when measured; older trace files lack it.
    #[serde(default)]
    pub files: Option<FileCount>,
}

/// A file system's file count: a tmpfs holds at most `nr_inodes` files, whatever their size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCount {
    /// Files it can hold (`f_files`).
    pub limit: u64,
    /// Files it could still take (`f_ffree`).
    pub free: u64,
}

impl FileCount {
    pub fn used(&self) -> u64 {
        self.limit.saturating_sub(self.free)
    }
}

impl Capacity {
    /// Bytes still free.
    pub fn available(&self) -> u64 {
        self.size.saturating_sub(self.used)
    }

    /// Whether it has a size limit at all (an unbounded tmpfs reports 0 blocks).
    pub fn is_bounded(&self) -> bool {
        self.size > 0
    }
}
