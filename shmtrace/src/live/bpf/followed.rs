//! Userspace's side of the `FOLLOWED` bitmap, which the probes read before `TARGETS` (see
//! `shmtrace-ebpf/src/scope.rs`): a process's bit must be set before it goes into `TARGETS`,
//! or the probes would never look it up there.
//!
//! The probes set and clear bits with atomic operations, so userspace does too, through a
//! shared mapping of the array: an update through `bpf(2)` would write the whole 64-bit word
//! back, and could undo a bit the probes set meanwhile.
use std::{
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::{Array, IterableMap, MapData};
use shmtrace_common::targets::{FOLLOWED_WORDS, followed_bit};

/// The bitmap, mapped read-write.
pub struct FollowedBitmap {
    words: NonNull<AtomicU64>,
    /// Kept open for as long as it is mapped.
    _map: Array<MapData, u64>,
}

// SAFETY: the mapping is shared memory accessed only through atomic operations.
unsafe impl Send for FollowedBitmap {}

const BYTES: usize = FOLLOWED_WORDS as usize * 8;

impl FollowedBitmap {
    pub fn map(map: Array<MapData, u64>) -> std::io::Result<FollowedBitmap> {
        let fd = map.map().fd().as_fd().as_raw_fd();
        // SAFETY: a new shared mapping of a BPF array created with BPF_F_MMAPABLE, of its
        // exact size; nothing else is mapped there.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let words = NonNull::new(address.cast())
            .ok_or_else(|| std::io::Error::other("mmap of FOLLOWED returned address 0"))?;
        Ok(FollowedBitmap { words, _map: map })
    }

    /// Sets `pid`'s bit. An id beyond the bitmap (none the kernel gives) has none: the probes
    /// look such a process up in `TARGETS` directly.
    pub fn set(&self, pid: u32) {
        let (index, bit) = followed_bit(pid);
        if index >= FOLLOWED_WORDS {
            return;
        }
        // SAFETY: `index` is within the mapping, whose words are 8-byte aligned and live as
        // long as `self`.
        let word = unsafe { &*self.words.as_ptr().add(index as usize) };
        word.fetch_or(bit, Ordering::SeqCst);
    }
}

impl Drop for FollowedBitmap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of that length; nothing refers to it any more.
        unsafe { libc::munmap(self.words.as_ptr().cast(), BYTES) };
    }
}
