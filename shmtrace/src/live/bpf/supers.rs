//! Userspace's side of `SHM_SUPERS` and `SHM_ELSEWHERE`: which file systems are a /dev/shm
//! (see `shmtrace_common::supers`, and `shmtrace-ebpf/src/probes/shm_check.rs`).
//!
//! Userspace declares the /dev/shm it finds in the mount tables, and forgets those no longer
//! mounted: a device number, like the super block it names, is reused by the next file system
//! mounted, which may be no /dev/shm at all. The probes judge a tmpfs they meet unknown
//! themselves; that verdict too is forgotten once its file system is gone.
use std::collections::HashSet;

use aya::maps::{Array, HashMap, MapData};
use shmtrace_common::{
    KernelDev,
    supers::{self, ELSEWHERE, ENTRIES, FLAGS_WORD, KNOWN, SHM, WORDS},
};

use super::{BpfError, mapped::MappedWords, tracer::map_error};

/// The probes' verdicts on file systems, and the /dev/shm that are not a tmpfs.
pub struct ShmSupers {
    words: MappedWords,
    elsewhere: HashMap<MapData, u32, u32>,
}

impl ShmSupers {
    pub fn new(
        words: Array<MapData, u64>,
        elsewhere: HashMap<MapData, u32, u32>,
    ) -> std::io::Result<ShmSupers> {
        Ok(ShmSupers {
            words: MappedWords::map(words, ENTRIES)?,
            elsewhere,
        })
    }

    /// Declares `dev` (kernel encoding) a /dev/shm: a tmpfs by its device number, another
    /// file system (a bind mount of a directory) by the mount files are reached through.
    pub fn add(&mut self, dev: u32, tmpfs: bool) -> Result<(), BpfError> {
        if tmpfs && let Some((index, shift)) = supers::bits_of(KernelDev(dev)) {
            self.words.set(index, (KNOWN | SHM) << shift);
            return Ok(());
        }
        self.elsewhere
            .insert(dev, 1, 0)
            .map_err(|e| map_error("SHM_ELSEWHERE", e))?;
        self.words.set(FLAGS_WORD, ELSEWHERE);
        Ok(())
    }

    /// Forgets every verdict on a tmpfs whose device is not in `mounted` (every file
    /// system mounted now, in any mount namespace): its device number may already name
    /// another. Returns how many were forgotten. A file system mounted after `mounted` was
    /// read may lose its verdict too, which only costs the probes a judgement.
    pub fn forget_unmounted(&mut self, mounted: &HashSet<u32>) -> usize {
        let mut forgotten = 0;
        for index in 0..WORDS {
            let Some(word) = self.words.word(index) else {
                break;
            };
            let bits = word.load(std::sync::atomic::Ordering::Relaxed);
            if bits == 0 {
                continue;
            }
            let mut gone = 0u64;
            for dev in supers::devices_in(index, bits, KNOWN) {
                if !mounted.contains(&dev.0)
                    && let Some((_, shift)) = supers::bits_of(dev)
                {
                    gone |= (KNOWN | SHM) << shift;
                    forgotten += 1;
                }
            }
            if gone != 0 {
                self.words.clear(index, gone);
            }
        }
        forgotten
    }

    /// The tmpfs devices the probes or userspace hold to be a /dev/shm now.
    pub fn shm_devices(&self) -> Vec<u32> {
        (0..WORDS)
            .filter_map(|index| Some((index, self.words.word(index)?)))
            .flat_map(|(index, word)| {
                let bits = word.load(std::sync::atomic::Ordering::Relaxed);
                supers::devices_in(index, bits, SHM).map(|dev| dev.0)
            })
            .collect()
    }
}
