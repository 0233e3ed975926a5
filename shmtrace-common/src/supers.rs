//! The `SHM_SUPERS` bitmap: which tmpfs file systems are a /dev/shm, by device number,
//! written by userspace and the probes alike.
//!
//! A tmpfs's device number is anonymous (major 0, a minor below [`MINOR_LIMIT`]), so two
//! bits per minor cover every one: [`KNOWN`] (its verdict is in) and [`SHM`] (it is mounted at
//! /dev/shm, in some mount namespace). Userspace sets both for the /dev/shm it finds in the
//! mount tables, the probes judge a tmpfs they meet unknown once by its mounts, and userspace
//! forgets the bits of a device no longer mounted: a device number, like its super block, is
//! reused once its file system is gone.
//!
//! The word after the bitmap's ([`FLAGS_WORD`]) holds [`ELSEWHERE`]: some /dev/shm is not a
//! tmpfs (a bind mount of a directory), whose device is in `SHM_ELSEWHERE`.
use crate::dev::KernelDev;

/// Anonymous device minors: the kernel's `MINORMASK + 1`.
pub const MINOR_LIMIT: u32 = 1 << 20;
/// Minors per 64-bit word: two bits each.
const PER_WORD: u32 = 32;
/// The bitmap's words.
pub const WORDS: u32 = MINOR_LIMIT / PER_WORD;
/// The word of flags after them.
pub const FLAGS_WORD: u32 = WORDS;
/// `SHM_SUPERS`' entries, flags included.
pub const ENTRIES: u32 = WORDS + 1;

/// A minor's verdict is in.
pub const KNOWN: u64 = 1;
/// The file system is a /dev/shm.
pub const SHM: u64 = 2;
/// In [`FLAGS_WORD`]: some /dev/shm is not a tmpfs (`SHM_ELSEWHERE` is not empty).
pub const ELSEWHERE: u64 = 1;

/// `TMPFS_MAGIC` (linux/magic.h): `s_magic` of a tmpfs, and of devtmpfs, which is one.
pub const TMPFS_MAGIC: u64 = 0x0102_1994;

/// The word holding `dev`'s bits and their shift in it, if `dev` is anonymous.
pub const fn bits_of(dev: KernelDev) -> Option<(u32, u32)> {
    if dev.major() != 0 {
        return None;
    }
    let minor = dev.minor();
    Some((minor / PER_WORD, (minor % PER_WORD) * 2))
}

/// The devices whose bits `word` (at `index`) has set to `bit`, with the shifts.
pub fn devices_in(index: u32, word: u64, bit: u64) -> impl Iterator<Item = KernelDev> {
    (0..PER_WORD)
        .filter(move |slot| (word >> (slot * 2)) & bit != 0)
        .map(move |slot| KernelDev::new(0, index * PER_WORD + slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_bits_per_anonymous_minor() {
        assert_eq!(bits_of(KernelDev::new(0, 0)), Some((0, 0)));
        assert_eq!(bits_of(KernelDev::new(0, 33)), Some((1, 2)));
        assert_eq!(
            bits_of(KernelDev::new(0, MINOR_LIMIT - 1)),
            Some((WORDS - 1, 62))
        );
        assert_eq!(bits_of(KernelDev::new(8, 1)), None);
        let word = (SHM | KNOWN) << 2 | KNOWN << 62;
        assert_eq!(
            devices_in(1, word, KNOWN).collect::<Vec<_>>(),
            [KernelDev::new(0, 33), KernelDev::new(0, 63)]
        );
        assert_eq!(
            devices_in(1, word, SHM).collect::<Vec<_>>(),
            [KernelDev::new(0, 33)]
        );
    }
}
