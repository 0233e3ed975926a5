//! Why a record did not reach userspace, or reached it incomplete: the index of the kernel's
//! `LOST` counters. Nothing the probes drop goes uncounted.
use crate::event::EventKind;

/// One reason for a loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Loss {
    /// The ring buffer was full: a record of this kind was dropped.
    RingFull(EventKind),
    /// A path argument could not be read from the process's memory: the call was not
    /// recognised as a /dev/shm call and no record was written.
    PathRead,
    /// A kernel struct field (task, file, inode, ...) could not be read: the record was dropped,
    /// or lacks a detail (its container, the file's size).
    KernelRead,
    /// Another argument in the process's memory (`struct open_how`, `msg_flags`, the command
    /// line at exec) could not be read: the record was dropped or lacks that detail.
    UserRead,
    /// The table of calls awaiting their return was full: the call was not recorded.
    Pending,
    /// The table of failures counted in the kernel (`TALLIES`) was full: a failure or SIGBUS
    /// whose record is also lost is missing from the daemon's figures.
    Tally,
}

impl Loss {
    /// Size of the `LOST` counter array.
    pub const COUNT: u32 = 21;

    /// Every reason that is not a full ring buffer.
    pub const READS: [Loss; 5] = [
        Loss::PathRead,
        Loss::KernelRead,
        Loss::UserRead,
        Loss::Pending,
        Loss::Tally,
    ];

    /// The counter's index: a record kind's number for a full ring, 16 and up otherwise.
    #[inline(always)]
    pub const fn index(self) -> u32 {
        match self {
            Loss::RingFull(kind) => kind as u32,
            Loss::PathRead => 16,
            Loss::KernelRead => 17,
            Loss::UserRead => 18,
            Loss::Pending => 19,
            Loss::Tally => 20,
        }
    }

    pub fn from_index(index: u32) -> Option<Loss> {
        Some(match index {
            16 => Loss::PathRead,
            17 => Loss::KernelRead,
            18 => Loss::UserRead,
            19 => Loss::Pending,
            20 => Loss::Tally,
            other => Loss::RingFull(EventKind::try_from(u16::try_from(other).ok()?).ok()?),
        })
    }

    /// Every reason, in counter order.
    pub fn all() -> impl Iterator<Item = Loss> {
        (0..Loss::COUNT).filter_map(Loss::from_index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_round_trip_and_stay_in_range() {
        let all: [Loss; 13] = [
            Loss::RingFull(EventKind::Syscall),
            Loss::RingFull(EventKind::Path),
            Loss::RingFull(EventKind::Signal),
            Loss::RingFull(EventKind::Fork),
            Loss::RingFull(EventKind::Exec),
            Loss::RingFull(EventKind::Exit),
            Loss::RingFull(EventKind::Rename),
            Loss::RingFull(EventKind::Oom),
            Loss::PathRead,
            Loss::KernelRead,
            Loss::UserRead,
            Loss::Pending,
            Loss::Tally,
        ];
        for loss in all {
            assert!(loss.index() < Loss::COUNT);
            assert_eq!(Loss::from_index(loss.index()), Some(loss));
        }
        assert_eq!(Loss::all().count(), all.len());
        assert_eq!(Loss::from_index(0), None);
        assert_eq!(Loss::from_index(Loss::COUNT), None);
    }
}
