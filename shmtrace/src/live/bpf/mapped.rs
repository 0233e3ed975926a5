//! A BPF array of 64-bit words created with `BPF_F_MMAPABLE`, mapped into this process, so
//! that userspace updates its bits with atomic operations as the probes do: an update through
//! `bpf(2)` writes a whole word back, and could undo a bit the probes set meanwhile.
use std::{
    os::fd::{AsFd, AsRawFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::{Array, IterableMap, MapData};

/// The words, mapped read-write.
pub struct MappedWords {
    words: NonNull<AtomicU64>,
    len: u32,
    /// Kept open for as long as it is mapped.
    _map: Array<MapData, u64>,
}

// SAFETY: the mapping is shared memory accessed only through atomic operations.
unsafe impl Send for MappedWords {}

impl MappedWords {
    /// Maps `map`, which must hold `len` words.
    pub fn map(map: Array<MapData, u64>, len: u32) -> std::io::Result<MappedWords> {
        let fd = map.map().fd().as_fd().as_raw_fd();
        // SAFETY: a new shared mapping of a BPF array created with BPF_F_MMAPABLE, of its
        // exact size; nothing else is mapped there.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize * 8,
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
            .ok_or_else(|| std::io::Error::other("mmap of a BPF array returned address 0"))?;
        Ok(MappedWords {
            words,
            len,
            _map: map,
        })
    }

    /// Word `index`; `None` beyond the array.
    pub fn word(&self, index: u32) -> Option<&AtomicU64> {
        // SAFETY: `index` is within the mapping, whose words are 8-byte aligned and live as
        // long as `self`.
        (index < self.len).then(|| unsafe { &*self.words.as_ptr().add(index as usize) })
    }

    /// Sets `bits` in word `index`.
    pub fn set(&self, index: u32, bits: u64) {
        if let Some(word) = self.word(index) {
            word.fetch_or(bits, Ordering::SeqCst);
        }
    }
}

impl Drop for MappedWords {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of that length; nothing refers to it any more.
        unsafe { libc::munmap(self.words.as_ptr().cast(), self.len as usize * 8) };
    }
}
