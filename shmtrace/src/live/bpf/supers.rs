//! Userspace's side of `SHM_SUPERS` and `SHM_ELSEWHERE`: which file systems are a /dev/shm
//! (see `shmtrace_common::supers`, and `shmtrace-ebpf/src/probes/shm_check.rs`).
//!
//! Userspace declares the /dev/shm it finds in the mount tables, so that the probes need not
//! judge them; the probes judge any other tmpfs they meet themselves, and forget every verdict
//! when a file system is made (a device number is reused by the next one mounted), so nothing
//! here needs pruning: a /dev/shm unmounted is forgotten at the next mount, the only way its
//! number can name another file system.
use std::sync::atomic::Ordering;

use aya::maps::{Array, HashMap, MapData};
use shmtrace_common::{
    KernelDev,
    supers::{self, ELSEWHERE, ENTRIES, FLAGS, GENERATION, KNOWN, SHM, WORDS},
};

use super::{BpfError, map_error, mapped::MappedWords};

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
            let generation = self
                .words
                .word(GENERATION)
                .map_or(0, |word| word.load(Ordering::SeqCst) as u32);
            if let Some(word) = self.words.word(index) {
                // As the probes do it; a verdict they give meanwhile wins.
                let _ = word.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |seen| {
                    Some(supers::with_verdict(
                        seen,
                        generation,
                        (KNOWN | SHM) << shift,
                    ))
                });
            }
            return Ok(());
        }
        self.elsewhere
            .insert(dev, 1, 0)
            .map_err(|e| map_error("SHM_ELSEWHERE", e))?;
        self.words.set(FLAGS, ELSEWHERE);
        Ok(())
    }

    /// How many file systems are taken for a /dev/shm now: each tmpfs whose verdict is
    /// [`SHM`] and was given since the last file system was made (an older one is judged again
    /// when met), and each /dev/shm that is not a tmpfs.
    pub fn count(&self) -> Result<usize, BpfError> {
        let generation = self
            .words
            .word(GENERATION)
            .map_or(0, |word| word.load(Ordering::Relaxed) as u32);
        let tmpfs: u32 = (0..WORDS)
            .filter_map(|index| self.words.word(index))
            .map(|word| word.load(Ordering::Relaxed))
            .filter(|word| supers::generation_of(*word) == generation)
            .map(|word| (word & SHM_BITS).count_ones())
            .sum();
        let elsewhere = self
            .elsewhere
            .keys()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| map_error("SHM_ELSEWHERE", e))?
            .len();
        Ok(tmpfs as usize + elsewhere)
    }
}

/// The [`SHM`] bit of each of a word's sixteen verdicts (two bits each, in its low half).
const SHM_BITS: u64 = 0xaaaa_aaaa;
