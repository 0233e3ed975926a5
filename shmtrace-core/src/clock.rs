//! Event times: the kernel stamps `CLOCK_BOOTTIME`; people and JSON want wall-clock time.
//!
//! The one place that reads `CLOCK_BOOTTIME`: the live side, trace headers and the output all
//! ask here.
use jiff::{Timestamp, tz::TimeZone};

/// Converts boot-time nanoseconds to wall-clock time, using the offset between the two clocks
/// measured when it is created.
#[derive(Clone, Debug)]
pub struct Clock {
    unix_minus_boot_ns: i128,
    zone: TimeZone,
}

impl Clock {
    /// Measures the offset now.
    pub fn now() -> std::io::Result<Clock> {
        let boot = i128::from(boot_ns()?);
        Ok(Clock::with_offset(
            Timestamp::now().as_nanosecond() - boot,
            TimeZone::system(),
        ))
    }

    /// A clock with a known offset (a recorded trace carries its own).
    pub fn with_offset(unix_minus_boot_ns: i128, zone: TimeZone) -> Clock {
        Clock {
            unix_minus_boot_ns,
            zone,
        }
    }

    /// The wall-clock time of a boot time; `None` when it is beyond what a calendar shows (a
    /// corrupt or hostile trace file's offset), rather than a made-up 1970.
    pub fn wall(&self, boot_ns: u64) -> Option<Timestamp> {
        Timestamp::from_nanosecond(boot_ns as i128 + self.unix_minus_boot_ns).ok()
    }

    /// `16:51:37.123456`, local time.
    pub fn time_of_day(&self, boot_ns: u64) -> String {
        match self.wall(boot_ns) {
            Some(time) => time
                .to_zoned_datetime(self.zone.clone())
                .strftime("%H:%M:%S%.6f")
                .to_string(),
            None => self.out_of_range(boot_ns),
        }
    }

    /// RFC 3339 in UTC with nanoseconds, for machines.
    pub fn rfc3339(&self, boot_ns: u64) -> String {
        match self.wall(boot_ns) {
            Some(time) => format!("{time:.9}"),
            None => self.out_of_range(boot_ns),
        }
    }

    fn out_of_range(&self, boot_ns: u64) -> String {
        format!("(no calendar time: boot time {boot_ns} ns, clock offset out of range)")
    }
}

/// `CLOCK_BOOTTIME` now, the clock of the kernel's timestamps. An error rather than 0: every
/// time shown would be wrong.
pub fn boot_ns() -> std::io::Result<u64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_err(|errno| {
        std::io::Error::other(format!("reading CLOCK_BOOTTIME: {}", errno.desc()))
    })?;
    Ok(now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64)
}

impl Clock {
    #[cfg(test)]
    fn test_with_offset(offset: i128) -> Clock {
        Clock::with_offset(offset, TimeZone::UTC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_beyond_the_calendar_is_said_not_shown_as_1970() {
        let clock = Clock::test_with_offset(i128::from(i64::MAX) * 1000);
        assert!(clock.wall(5).is_none());
        let text = clock.rfc3339(5);
        assert!(!text.contains("1970"), "{text}");
        assert!(text.contains("out of range"), "{text}");
        assert!(clock.time_of_day(5).contains("out of range"));
        let fine = Clock::test_with_offset(1_700_000_000_000_000_000);
        assert!(fine.rfc3339(0).starts_with("2023-11-14T22:13:20"));
    }

    #[test]
    fn the_boot_clock_reads() {
        assert!(boot_ns().unwrap() > 0);
    }
}
