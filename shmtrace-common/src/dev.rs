//! Device numbers as the kernel keeps them (`sb->s_dev`), which is not how stat(2) shows them.

/// A `dev_t` in the kernel's internal encoding, `major << 20 | minor`: what the probes read
/// from `super_block.s_dev`, what `SHM_SUPERS` indexes its verdicts by (the minor) and what
/// `SHM_ELSEWHERE` is keyed by.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelDev(pub u32);

impl KernelDev {
    const MINOR_BITS: u32 = 20;

    pub const fn new(major: u32, minor: u32) -> KernelDev {
        KernelDev((major << Self::MINOR_BITS) | (minor & ((1 << Self::MINOR_BITS) - 1)))
    }

    pub const fn major(self) -> u32 {
        self.0 >> Self::MINOR_BITS
    }

    pub const fn minor(self) -> u32 {
        self.0 & ((1 << Self::MINOR_BITS) - 1)
    }

    /// From a `st_dev` of stat(2), in glibc's encoding (major in bits 8-19 and 32-43, minor in
    /// bits 0-7 and 20-31).
    pub const fn from_stat(st_dev: u64) -> KernelDev {
        let major = ((st_dev >> 8) & 0xfff) | ((st_dev >> 32) & !0xfff);
        let minor = (st_dev & 0xff) | ((st_dev >> 12) & !0xff);
        KernelDev::new(major as u32, minor as u32)
    }
}

/// `major:minor`, as /proc/PID/maps and mountinfo print it.
impl core::fmt::Display for KernelDev {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}:{}", self.major(), self.minor())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_the_kernel() {
        let dev = KernelDev::new(0, 26);
        assert_eq!(dev.0, 26);
        assert_eq!(KernelDev::new(259, 3).0, (259 << 20) | 3);
        assert_eq!((dev.major(), dev.minor()), (0, 26));
        // glibc's makedev(259, 3) and makedev(0, 1048575).
        assert_eq!(KernelDev::from_stat((259 << 8) | 3), KernelDev::new(259, 3));
        assert_eq!(
            KernelDev::from_stat(0xff | (0xfff00 << 12)),
            KernelDev::new(0, 0xfffff)
        );
    }
}
