//! Files grown by `write()` with no size asked first: the failing write asks for a block while
//! the program wanted megabytes. What each process needs is then known only from one that
//! finished: it is the size its file reached. With none finished, the need is unknown.
use super::Diagnoser;
use crate::{
    event::{Call, Event, InodeId, Syscall},
    model::World,
};

/// Files grown by write per /dev/shm, at most this many each: enough for any job whose
/// processes each grow one.
const GROWN: usize = 4096;

/// A write of less than a page fills a file once rather than growing it.
const PAGE: u64 = 4096;

/// A file grown by writes, by one process.
#[derive(Clone, Copy, Debug)]
pub(super) struct Grown {
    pub(super) pid: u32,
    size: u64,
}

/// What the writers on one /dev/shm show: how many grew a file, and the size of the largest
/// file of one that ended successfully (a whole need), if any did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WriteGrowth {
    pub(super) writers: u32,
    pub(super) finished_size: Option<u64>,
}

impl Diagnoser {
    /// Takes in a write to a /dev/shm file that was never given a size: it grows by writing.
    /// A failed one counts its writer too: one that failed before it wrote anything wanted
    /// what the others did.
    pub(super) fn learn_growth(&mut self, event: &Event, call: &Call, world: &World) {
        // Bulk writes: glibc's sem_open writes its 32 bytes once, PyTorch one byte.
        if call.syscall != Syscall::Write || call.args[2] < PAGE {
            return;
        }
        let Some(file) = call.file else { return };
        if world.object(&file.inode).is_none_or(|o| o.peak_request > 0) {
            return;
        }
        let grown = self.grown.entry(file.inode.dev).or_default();
        if grown.len() >= GROWN && !grown.contains_key(&file.inode) {
            return;
        }
        let size = u64::try_from(file.size).unwrap_or(0);
        let entry = grown.entry(file.inode).or_insert(Grown {
            pid: event.pid,
            size,
        });
        entry.size = entry.size.max(size);
    }

    /// The writers of /dev/shm `dev`, when files on it were grown by write.
    pub(super) fn write_growth(&self, dev: u32) -> Option<WriteGrowth> {
        let grown = self.grown.get(&dev)?;
        let mut writers: Vec<u32> = grown.values().map(|g| g.pid).collect();
        writers.sort_unstable();
        writers.dedup();
        let finished_size = grown
            .values()
            .filter(|g| self.ended_well.contains(&g.pid))
            .map(|g| g.size)
            .max();
        Some(WriteGrowth {
            writers: writers.len() as u32,
            finished_size,
        })
    }
}

/// When the burst of processes that `pid` belongs to began: it and its siblings (children of
/// its parent) whose lives overlap, one after another, back from it. Eight writers started
/// together by one shell are one job even when the first has finished before the last began,
/// on a loaded machine, as long as each began while another still ran; a step the shell ran
/// after the previous one ended is not of it. Asked rarely (a write-grown file failing beside
/// files of finished processes): it scans the processes.
pub(super) fn burst_began(pid: u32, world: &World) -> u64 {
    let Some(process) = world.process(pid) else {
        return 0;
    };
    let mut began = process.first_seen_ns;
    let Some(parent) = process.parent else {
        return began;
    };
    let mut siblings: Vec<(u64, u64)> = world
        .processes()
        .filter(|p| p.parent == Some(parent) && p.pid != pid && p.first_seen_ns <= began)
        .map(|p| (p.first_seen_ns, p.exit_ns.unwrap_or(u64::MAX)))
        .collect();
    siblings.sort_unstable_by(|a, b| b.cmp(a));
    for (started, ended) in siblings {
        if ended >= began {
            began = began.min(started);
        }
    }
    began
}

/// The files grown by write, per /dev/shm.
pub(super) type GrownFiles = crate::model::FastMap<u32, crate::model::FastMap<InodeId, Grown>>;
