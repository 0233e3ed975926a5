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

/// [`Clock::rfc3339`] for times that come in order, as events do: the calendar part is
/// worked out once per second and only the nanoseconds are written for each time (the
/// calendar arithmetic and `fmt` were a tenth of replay's time).
#[derive(Default)]
pub struct Rfc3339Cache {
    /// The Unix second `text` holds the calendar part of.
    second: Option<i128>,
    /// The boot time at which that second starts: a time within the same second is told
    /// by a subtraction, without the 128-bit divisions (a replay asks for every event).
    second_starts: u64,
    /// `2026-11-29T16:51:37.123456789Z`: the last time written.
    text: String,
}

/// `.123456789Z`: what follows the seconds in [`Clock::rfc3339`].
const FRACTION_LEN: usize = 11;

impl Rfc3339Cache {
    /// The same text as `clock.rfc3339(boot_ns)`.
    pub fn rfc3339(&mut self, clock: &Clock, boot_ns: u64) -> &str {
        if self.second.is_some()
            && let Some(nanos) = boot_ns.checked_sub(self.second_starts)
            && nanos < 1_000_000_000
        {
            return self.write_nanos(nanos as u32);
        }
        let unix_ns = boot_ns as i128 + clock.unix_minus_boot_ns;
        let (second, nanos) = (
            unix_ns.div_euclid(1_000_000_000),
            unix_ns.rem_euclid(1_000_000_000),
        );
        if self.second != Some(second) {
            // Before 1970 or outside the calendar, the text is not one of seconds and a
            // fraction: written whole every time.
            self.second = None;
            self.text = clock.rfc3339(boot_ns);
            if unix_ns >= 0
                && clock.wall(boot_ns).is_some()
                && self.text.len() > FRACTION_LEN
                && let Some(starts) = boot_ns.checked_sub(nanos as u64)
            {
                self.second = Some(second);
                self.second_starts = starts;
            }
            return &self.text;
        }
        self.write_nanos(nanos as u32)
    }

    /// The cached second's text, with `nanos` as its fraction.
    fn write_nanos(&mut self, nanos: u32) -> &str {
        let cut = self.text.len() - FRACTION_LEN;
        self.text.truncate(cut);
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(nanos);
        self.text
            .push_str(&".000000000"[..FRACTION_LEN - 1 - digits.len()]);
        self.text.push_str(digits);
        self.text.push('Z');
        &self.text
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
    fn cached_times_read_as_the_clock_writes_them() {
        for offset in [
            1_700_000_000_000_000_000_i128,
            1_700_000_000_999_999_999,
            -5_000_000_000,
            -1,
            253_402_300_799_000_000_000, // the last second of 9999
            i128::MAX / 2,
        ] {
            let clock = Clock::test_with_offset(offset);
            let mut cache = Rfc3339Cache::default();
            for boot_ns in [
                0,
                1,
                999_999_999,
                1_000_000_000,
                1_000_000_001,
                1_000_000_001,
            ]
            .into_iter()
            .chain((0..3000).map(|i| 4_000_000_000 + i * 777_777))
            .chain([3, 10_000_000_000_000, 10_000_000_000_000, u64::MAX])
            {
                assert_eq!(
                    cache.rfc3339(&clock, boot_ns),
                    clock.rfc3339(boot_ns),
                    "offset {offset}, boot time {boot_ns}"
                );
            }
        }
    }

    #[test]
    fn the_boot_clock_reads() {
        assert!(boot_ns().unwrap() > 0);
    }
}
