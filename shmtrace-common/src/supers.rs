//! The `SHM_SUPERS` map: which tmpfs file systems are a /dev/shm, by device number, written by
//! userspace and the probes alike.
//!
//! A tmpfs's device number is anonymous (major 0, a minor below [`MINOR_LIMIT`]), so two bits
//! per minor cover every one: [`KNOWN`] (the verdict is in) and [`SHM`] (it is mounted at
//! /dev/shm, in some mount namespace). Userspace sets both for the /dev/shm it finds in the
//! mount tables; the probes judge a tmpfs they meet unknown, once, by its mounts.
//!
//! A device number is reused once its file system is gone, by the next one mounted, which
//! may be no /dev/shm at all; so a verdict holds only until the next file system is made.
//! Every word carries, above its verdicts, the value of [`GENERATION`] when they were given,
//! and the probes add one to it whenever a `mount` or an `fsconfig` succeeds anywhere (the
//! calls that make a super block): a word of an older generation is unknown. Unmounts need
//! nothing: what was unmounted is only reused through a mount.
//!
//! [`FLAGS`] holds [`ELSEWHERE`]: some /dev/shm is not a tmpfs (a bind mount of a
//! directory), whose device is in `SHM_ELSEWHERE`.
use crate::dev::KernelDev;

/// Anonymous device minors: the kernel's `MINORMASK + 1`.
pub const MINOR_LIMIT: u32 = 1 << 20;
/// Minors per 64-bit word: two bits each in the low half, the generation in the high half.
const PER_WORD: u32 = 16;
/// The verdicts' words.
pub const WORDS: u32 = MINOR_LIMIT / PER_WORD;
/// The entry after them: flags.
pub const FLAGS: u32 = WORDS;
/// The entry after that: the generation, one more at every file system made.
pub const GENERATION: u32 = WORDS + 1;
/// `SHM_SUPERS`' entries.
pub const ENTRIES: u32 = WORDS + 2;

/// A minor's verdict is in.
pub const KNOWN: u64 = 1;
/// The file system is a /dev/shm.
pub const SHM: u64 = 2;
/// In [`FLAGS`]: some /dev/shm is not a tmpfs (`SHM_ELSEWHERE` is not empty).
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

/// The generation a word's verdicts were given in.
pub const fn generation_of(word: u64) -> u32 {
    (word >> 32) as u32
}

/// `word` with the verdict `bits` (shifted) added, in `generation`: the word's other
/// verdicts are kept if they are of that generation, and dropped if older.
pub const fn with_verdict(word: u64, generation: u32, bits: u64) -> u64 {
    let kept = if generation_of(word) == generation {
        word & 0xffff_ffff
    } else {
        0
    };
    (generation as u64) << 32 | kept | bits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_bits_per_anonymous_minor_under_a_generation() {
        assert_eq!(bits_of(KernelDev::new(0, 0)), Some((0, 0)));
        assert_eq!(bits_of(KernelDev::new(0, 17)), Some((1, 2)));
        assert_eq!(
            bits_of(KernelDev::new(0, MINOR_LIMIT - 1)),
            Some((WORDS - 1, 30))
        );
        assert_eq!(bits_of(KernelDev::new(8, 1)), None);
        let word = with_verdict(0, 7, (KNOWN | SHM) << 2);
        assert_eq!(generation_of(word), 7);
        // The same generation keeps the word's other verdicts, a newer one drops them.
        assert_eq!(with_verdict(word, 7, KNOWN << 4), 7 << 32 | 0b1_1100);
        assert_eq!(with_verdict(word, 8, KNOWN << 4), 8 << 32 | 0b1_0000);
    }
}
