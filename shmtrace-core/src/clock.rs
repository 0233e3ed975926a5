//! Event times: the kernel stamps `CLOCK_BOOTTIME`; people and JSON want wall-clock time.
//!
//! The one place that reads `CLOCK_BOOTTIME`: the live side, trace headers and the output all
//! ask here.
use jiff::{Timestamp, tz::TimeZone};

/// `CLOCK_BOOTTIME` now, in nanoseconds: the clock of the kernel's timestamps.
pub fn boot_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Converts boot-time nanoseconds to wall-clock time, using the offset between the two clocks
/// measured when it is created.
#[derive(Clone, Debug)]
pub struct Clock {
    unix_minus_boot_ns: i128,
    zone: TimeZone,
}

impl Clock {
    /// Measures the offset now.
    pub fn now() -> Clock {
        let boot = i128::from(boot_ns());
        Clock::with_offset(Timestamp::now().as_nanosecond() - boot, TimeZone::system())
    }

    /// A clock with a known offset (a recorded trace carries its own).
    pub fn with_offset(unix_minus_boot_ns: i128, zone: TimeZone) -> Clock {
        Clock {
            unix_minus_boot_ns,
            zone,
        }
    }

    pub fn wall(&self, boot_ns: u64) -> Timestamp {
        Timestamp::from_nanosecond(boot_ns as i128 + self.unix_minus_boot_ns)
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// `16:51:37.123456`, local time.
    pub fn time_of_day(&self, boot_ns: u64) -> String {
        self.wall(boot_ns)
            .to_zoned_datetime(self.zone.clone())
            .strftime("%H:%M:%S%.6f")
            .to_string()
    }

    /// RFC 3339 in UTC with nanoseconds, for machines.
    pub fn rfc3339(&self, boot_ns: u64) -> String {
        format!("{:.9}", self.wall(boot_ns))
    }
}
