//! The daemon's descriptor limit: raised at start from the soft limit to the hard one
//! (systemd's default soft limit is 1,024, its hard one 524,288), and split between the
//! metrics port and everything else.
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Most metrics connections served at once: a Prometheus or two, the kubelet's probe and a
/// person with curl need a handful.
const MAX_CONNECTIONS: u64 = 128;

/// The open-files limit, after raising it.
pub struct OpenFiles {
    pub before: u64,
    pub now: u64,
    /// Why it could not be raised, if it could not.
    pub refused: Option<nix::Error>,
}

impl OpenFiles {
    /// Raises the soft `RLIMIT_NOFILE` to the hard limit.
    pub fn raise() -> nix::Result<OpenFiles> {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        // An unlimited hard limit still stops at the kernel's most descriptors per process.
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(1 << 20);
        let target = hard.min(nr_open);
        if soft >= target {
            return Ok(OpenFiles {
                before: soft,
                now: soft,
                refused: None,
            });
        }
        match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
            Ok(()) => Ok(OpenFiles {
                before: soft,
                now: target,
                refused: None,
            }),
            Err(error) => Ok(OpenFiles {
                before: soft,
                now: soft,
                refused: Some(error),
            }),
        }
    }

    /// The metrics port's share: a quarter of the descriptors, at most [`MAX_CONNECTIONS`],
    /// so that the probes' maps, the runtimes' sockets, /proc and the recordings keep the
    /// rest whatever the port sees.
    pub fn connections(&self) -> usize {
        (self.now / 4).clamp(4, MAX_CONNECTIONS) as usize
    }

    /// The start-up line's words on it.
    pub fn describe(&self) -> String {
        let served = self.connections();
        match (&self.refused, self.before == self.now) {
            (Some(error), _) => format!(
                "open files limit {} (raising it to the hard limit failed: {error}); at most \
                 {served} metrics connections at once",
                self.now
            ),
            (None, true) => format!(
                "open files limit {} (the hard limit; raise it with `ulimit -Hn` or systemd's \
                 LimitNOFILE= for more); at most {served} metrics connections at once",
                self.now
            ),
            (None, false) => format!(
                "open files limit raised from {} to the hard limit, {}; at most {served} \
                 metrics connections at once",
                self.before, self.now
            ),
        }
    }
}
