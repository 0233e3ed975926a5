//! Namespaces whose container ended, held until every record written before the daemon
//! learned of the end has been read. The runtime's word that a container died comes by
//! another road than its records: a daemon a little behind the ring buffer can hear of the
//! death before it reads the container's last calls. Its /dev/shm objects retired then, those
//! calls would name a file the analysis no longer knows (`<inode 2 on 0:52>`).
use super::fleet::Ended;

/// How far behind the newest record read the records written before it may still come: a
/// record is stamped when its call began, so one of a slow call lands after younger ones.
const STRAGGLERS_NS: u64 = 1_000_000_000;

#[derive(Default)]
pub struct Endings {
    /// Each ending, with when the daemon learned of it (boot clock).
    pending: Vec<(Ended, u64)>,
    /// Every record written before this (boot clock) has been read.
    read_through_ns: u64,
}

impl Endings {
    /// `ended` was learned at `learned_ns`.
    pub fn learned(&mut self, ended: Vec<Ended>, learned_ns: u64) {
        self.pending
            .extend(ended.into_iter().map(|ended| (ended, learned_ns)));
    }

    /// A read found the ring buffer empty: it began at `began_ns`.
    pub fn caught_up(&mut self, began_ns: u64) {
        self.read_through_ns = self.read_through_ns.max(began_ns);
    }

    /// A record stamped `ts_ns` was read: on a ring buffer that is never empty, what was
    /// written a while before it has been read too.
    pub fn read_record(&mut self, ts_ns: u64) {
        self.caught_up(ts_ns.saturating_sub(STRAGGLERS_NS));
    }

    /// The endings whose containers' records have all been read, oldest first.
    pub fn due(&mut self) -> Vec<Ended> {
        let read_through = self.read_through_ns;
        let (due, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(_, learned_ns)| *learned_ns <= read_through);
        self.pending = waiting;
        due.into_iter().map(|(ended, _)| ended).collect()
    }

    /// How many endings are held.
    pub fn held(&self) -> usize {
        self.pending.len()
    }

    /// Every ending, due or not (the daemon is stopping, everything read).
    pub fn all(&mut self) -> Vec<Ended> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(ended, _)| ended)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(mntns: u32) -> Ended {
        Ended {
            mntns,
            container: None,
        }
    }

    #[test]
    fn an_ending_waits_until_what_was_written_before_it_was_learned_is_read() {
        let mut endings = Endings::default();
        endings.learned(vec![ended(1)], 100);
        assert!(endings.due().is_empty(), "nothing read yet");
        endings.caught_up(99);
        assert!(
            endings.due().is_empty(),
            "the read began before the death was heard of"
        );
        endings.caught_up(100);
        assert_eq!(endings.due(), vec![ended(1)]);
        assert!(endings.due().is_empty(), "due once");
    }

    #[test]
    fn on_a_ring_that_is_never_empty_a_record_well_after_the_ending_lets_it_go() {
        let mut endings = Endings::default();
        endings.learned(vec![ended(1)], 5 * STRAGGLERS_NS);
        endings.learned(vec![ended(2)], 7 * STRAGGLERS_NS);
        endings.read_record(5 * STRAGGLERS_NS);
        assert!(endings.due().is_empty(), "a straggler may still come");
        assert_eq!(endings.held(), 2);
        endings.read_record(6 * STRAGGLERS_NS);
        assert_eq!(endings.due(), vec![ended(1)]);
        assert_eq!(endings.held(), 1);
        assert_eq!(endings.all(), vec![ended(2)]);
        assert_eq!(endings.held(), 0);
        assert!(endings.all().is_empty());
    }
}
