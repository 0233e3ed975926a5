//! A status line on the terminal while `size` and `record` run, which print nothing else until
//! something fails or they end: what is being measured (events, the /dev/shm in use, the peak
//! so far). Only when stderr is a terminal, at most four times a second, and cleared before
//! anything else is printed and at the end, so that no log or pipe ever holds it.
use std::{
    io::{IsTerminal, Write},
    time::{Duration, Instant},
};

use shmtrace_core::{pipeline::Status, units::human};

/// Redrawn at most this often.
const EVERY: Duration = Duration::from_millis(250);
/// Longest line drawn (a line longer than the terminal would not be erased by `\r`).
const WIDTH: usize = 78;

pub struct Progress {
    shown: bool,
    /// The line, and when it was last made.
    text: String,
    made: Option<Instant>,
}

impl Progress {
    /// A status line, if stderr is a terminal.
    pub fn on_terminal() -> Option<Progress> {
        std::io::stderr().is_terminal().then_some(Progress {
            shown: false,
            text: String::new(),
            made: None,
        })
    }

    /// Erases the line, before anything else is printed.
    pub fn clear(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
            self.shown = false;
        }
    }

    /// Draws the line again if it was erased; what it says changes at most every [`EVERY`].
    pub fn show(&mut self, status: impl FnOnce() -> Status) {
        let now = Instant::now();
        let stale = self.made.is_none_or(|made| now - made >= EVERY);
        if stale {
            let text = line(&status());
            self.made = Some(now);
            if text != self.text {
                self.text = text;
                self.shown = false;
            }
        }
        if !self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K{}", self.text);
            let _ = err.flush();
            self.shown = true;
        }
    }
}

/// `shmtrace: 1234 events · /dev/shm of 64.0 MiB: 12.0 MiB used, peak 46.0 MiB`: the
/// use as last measured, the peak as measured or as the traced objects' pages showed it.
pub fn line(status: &Status) -> String {
    let mut line = format!("shmtrace: {} events", status.events);
    if let Some(shm) = &status.shm {
        line.push_str(&format!(
            " · /dev/shm of {}: {} used, peak {}",
            human(shm.size),
            human(shm.used.max(shm.traced)),
            human(shm.peak_used.max(shm.traced_peak))
        ));
    }
    match line.char_indices().nth(WIDTH) {
        Some((cut, _)) => line[..cut].to_owned(),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shmtrace_core::pipeline::ShmStatus;

    #[test]
    fn says_what_is_measured_in_one_short_line() {
        let status = Status {
            events: 1234,
            processes: 5,
            shm: Some(ShmStatus {
                size: 64 << 20,
                used: 12 << 20,
                peak_used: 40 << 20,
                traced: 10 << 20,
                traced_peak: 46 << 20,
            }),
        };
        let text = line(&status);
        assert!(
            text == "shmtrace: 1234 events · /dev/shm of 64.0 MiB: 12.0 MiB used, peak 46.0 MiB",
            "{text}"
        );
        assert!(text.chars().count() <= WIDTH);
        assert_eq!(line(&Status::default()), "shmtrace: 0 events");
    }
}
