//! Userspace's side of the `FOLLOWED` bitmap, which the probes read before `TARGETS` (see
//! `shmtrace-ebpf/src/scope.rs`): a process's bit must be set before it goes into `TARGETS`,
//! or the probes would never look it up there.
use aya::maps::{Array, MapData};
use shmtrace_common::targets::{FOLLOWED_WORDS, followed_bit};

use super::mapped::MappedWords;

/// The bitmap, mapped read-write.
pub struct FollowedBitmap {
    words: MappedWords,
}

impl FollowedBitmap {
    pub fn map(map: Array<MapData, u64>) -> std::io::Result<FollowedBitmap> {
        Ok(FollowedBitmap {
            words: MappedWords::map(map, FOLLOWED_WORDS)?,
        })
    }

    /// Sets `pid`'s bit. An id beyond the bitmap (none the kernel gives) has none: the probes
    /// look such a process up in `TARGETS` directly.
    pub fn set(&self, pid: u32) {
        let (index, bit) = followed_bit(pid);
        self.words.set(index, bit);
    }
}
