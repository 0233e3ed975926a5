//! A traced process: its name, lineage, open /dev/shm descriptors and mappings.
use std::collections::{BTreeMap, BTreeSet};

use crate::event::{ExitStatus, InodeId};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub parent: Option<u32>,
    /// Name of the thread-group leader (what `ps` shows), escaped.
    pub comm: String,
    pub exe: Option<String>,
    pub argv: Vec<String>,
    pub mntns: u32,
    pub fds: BTreeMap<i32, OpenFd>,
    /// Descriptors of directories on a /dev/shm (`find`, `du`, `rm -r` walk a tree by them),
    /// with their paths, at most [`MAX_NAMES`]: a path opened relative to one is named whole.
    pub dir_fds: BTreeMap<i32, std::sync::Arc<str>>,
    /// /dev/shm mappings, sorted by start address, never overlapping.
    pub mappings: Vec<Mapping>,
    pub first_seen_ns: u64,
    /// Its latest event: a process that has been silent longest is the first a capped model
    /// forgets (its exit may have been lost).
    pub last_seen_ns: u64,
    pub exit: Option<ExitStatus>,
    pub exit_ns: Option<u64>,
    /// Names of the process's other threads (`pt_data_pin`, say), at most [`MAX_NAMES`].
    pub thread_names: BTreeSet<String>,
    /// Paths of the first [`MAX_NAMES`] /dev/shm objects this process opened (created or not):
    /// what they are named tells what the process is (`torch_`, `nccl-`, `psm_`).
    pub opened: Vec<String>,
    /// The last signal another process sent it on purpose: (sender pid, signal number).
    /// SIGKILL counts whoever sent it (a runtime tearing a container down sends it from the
    /// kernel), unless the OOM killer chose the process.
    pub sent_signal: Option<(u32, i32)>,
    /// When it last executed a new program: its DataLoader workers from before belong to the
    /// program it was then.
    pub exec_ns: Option<u64>,
    /// Its pid in its own pid namespace (a container's), when /proc told it (`NSpid`).
    pub nspid: Option<u32>,
    /// Its process title (/proc/PID/cmdline, which programs such as PostgreSQL rewrite:
    /// `postgres: parallel worker for PID 34`) when last read, if it differs from `argv`.
    pub title: Option<String>,
    /// It made a traced call (on /dev/shm, System V or memfd shared memory, or one that ran
    /// out of descriptors), or a process it started failed. An unsuccessful exit without
    /// either says nothing about shared memory: a library probe of a compiler failing, `test`
    /// returning 1.
    pub involved: bool,
}

/// Bound on the names kept per process, so a process creating millions of objects costs no
/// more than one creating a few.
pub const MAX_NAMES: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFd {
    pub inode: InodeId,
    pub cloexec: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub len: u64,
    pub inode: InodeId,
    /// File offset of `start`.
    pub offset: u64,
}

impl Mapping {
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }

    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.start && addr < self.end()
    }
}

impl Process {
    pub fn new(pid: u32, comm: String, mntns: u32, ts_ns: u64) -> Process {
        Process {
            pid,
            parent: None,
            comm,
            exe: None,
            argv: Vec::new(),
            mntns,
            fds: BTreeMap::new(),
            dir_fds: BTreeMap::new(),
            mappings: Vec::new(),
            first_seen_ns: ts_ns,
            last_seen_ns: ts_ns,
            exit: None,
            exit_ns: None,
            thread_names: BTreeSet::new(),
            opened: Vec::new(),
            sent_signal: None,
            exec_ns: None,
            nspid: None,
            title: None,
            involved: false,
        }
    }

    pub fn alive(&self) -> bool {
        self.exit.is_none()
    }

    pub fn mapping_at(&self, addr: u64) -> Option<&Mapping> {
        self.mappings.iter().find(|m| m.contains(addr))
    }

    /// Removes `[start, start + len)` from the mappings, splitting any that straddle it.
    /// Returns, per inode touched, how its number of mappings changed: -1 for a mapping cut
    /// away entirely, +1 for one split in two.
    pub fn unmap(&mut self, start: u64, len: u64) -> Vec<(InodeId, i32)> {
        let end = start.saturating_add(len);
        let mut released = Vec::new();
        let mut kept = Vec::with_capacity(self.mappings.len() + 1);
        for m in self.mappings.drain(..) {
            if m.end() <= start || m.start >= end {
                kept.push(m);
                continue;
            }
            let mut pieces = 0;
            if m.start < start {
                kept.push(Mapping {
                    len: start - m.start,
                    ..m
                });
                pieces += 1;
            }
            if m.end() > end {
                kept.push(Mapping {
                    start: end,
                    len: m.end() - end,
                    offset: m.offset + (end - m.start),
                    ..m
                });
                pieces += 1;
            }
            match pieces {
                0 => released.push((m.inode, -1)),
                2 => released.push((m.inode, 1)),
                _ => {}
            }
        }
        kept.sort_by_key(|m| m.start);
        self.mappings = kept;
        released
    }

    pub fn map(&mut self, mapping: Mapping) {
        let pos = self.mappings.partition_point(|m| m.start < mapping.start);
        self.mappings.insert(pos, mapping);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode() -> InodeId {
        InodeId { dev: 26, ino: 9 }
    }

    #[test]
    fn unmapping_the_middle_splits_a_mapping() {
        let mut p = Process::new(1, "p".into(), 0, 0);
        p.map(Mapping {
            start: 0x1000,
            len: 0x4000,
            inode: inode(),
            offset: 0,
        });
        assert_eq!(p.unmap(0x2000, 0x1000), vec![(inode(), 1)]);
        assert_eq!(p.mappings.len(), 2);
        assert_eq!(p.mappings[1].start, 0x3000);
        assert_eq!(p.mappings[1].offset, 0x2000);
        assert!(p.mapping_at(0x2800).is_none());
        assert!(p.mapping_at(0x3800).is_some());
    }

    #[test]
    fn unmapping_everything_releases_the_mapping() {
        let mut p = Process::new(1, "p".into(), 0, 0);
        p.map(Mapping {
            start: 0x1000,
            len: 0x1000,
            inode: inode(),
            offset: 0,
        });
        assert_eq!(p.unmap(0, 0x10000), vec![(inode(), -1)]);
        assert!(p.mappings.is_empty());
    }
}
