//! What holds the space of one /dev/shm, as the machine showed it at a failure: every file on
//! it that holds pages, with the processes that have it open or mapped, whoever they are
//! (traced or not, in this container or in another that shares its /dev/shm). The caller
//! reads /proc; the model only keeps the answer.

/// The files on one /dev/shm file system that held memory at `ts_ns`, most memory first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShmHolders {
    /// Kernel `dev_t` of the file system, as in kernel records.
    pub dev: u32,
    pub ts_ns: u64,
    pub files: Vec<HeldFile>,
}

/// One file (named, or unlinked and still held) and who holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldFile {
    pub ino: u64,
    /// As /proc or the directory showed it, escaped.
    pub path: String,
    /// Still named in /dev/shm.
    pub linked: bool,
    /// Memory it holds: its pages (`st_blocks * 512`), not its size.
    pub bytes: u64,
    pub size: u64,
    /// Processes with a descriptor on it or a mapping of it; none for a file nobody holds.
    pub holders: Vec<Holder>,
}

/// A process holding a [`HeldFile`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Escaped.
    pub comm: String,
    /// Its mount namespace: which container it is in.
    pub mntns: u32,
    pub open: bool,
    pub mapped: bool,
}

impl ShmHolders {
    /// Pages held by all its files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}
