//! The metrics port's connection slots: at most a fixed number of connections are served at
//! once, so that whoever can reach the port cannot take the descriptors the probes, the
//! runtimes' sockets and the recordings need (nor the memory each connection's buffers take).
//!
//! When every slot is taken, a new connection takes the slot of the connection idle longest
//! (whose last request, or whose accept, is oldest), which is closed: a flood of held, silent
//! connections cannot keep the kubelet's `/healthz` probe or a scrape out, since a client that
//! means to be served sends its request at once, and is served before a flood of newer
//! connections reaches it. Only when every slot is answering a request now is the new
//! connection closed as soon as it is accepted. Both are counted.
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use tokio::sync::oneshot;

/// What became of a connection just accepted.
pub enum Admission {
    /// Served in this slot.
    Admitted(Slot),
    /// Served in the slot of an idle connection, which is closed.
    Evicted(Slot),
    /// Every slot is busy: close it.
    Shed,
}

pub struct Connections {
    max: usize,
    epoch: Instant,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    slots: HashMap<u64, Entry>,
}

struct Entry {
    /// When a request last began on it (or it was accepted), in µs since `epoch`; `SERVING`
    /// while a request is being answered.
    active: Arc<AtomicU64>,
    /// Closes the connection when its slot is taken.
    evict: Option<oneshot::Sender<()>>,
}

impl Connections {
    pub fn new(max: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max: max.max(1),
            epoch: Instant::now(),
            open: Mutex::default(),
        })
    }

    /// Connections holding a slot now.
    pub fn open(&self) -> usize {
        self.lock().slots.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // A panic while holding it leaves the map as consistent as before the panic.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// A slot for a connection accepted now, if one can be had.
    pub fn admit(self: &Arc<Connections>) -> Admission {
        let now = self.now_us();
        let mut open = self.lock();
        let mut evicted = false;
        if open.slots.len() >= self.max {
            let oldest = open
                .slots
                .iter()
                .map(|(id, entry)| (entry.active.load(Ordering::Relaxed), *id))
                .filter(|(active, _)| *active != SERVING)
                .min();
            match oldest {
                Some((_, id)) => {
                    if let Some(entry) = open.slots.remove(&id)
                        && let Some(evict) = entry.evict
                    {
                        // The connection may have ended meanwhile: nothing to close then.
                        let _ = evict.send(());
                    }
                    evicted = true;
                }
                None => return Admission::Shed,
            }
        }
        let id = open.next_id;
        open.next_id += 1;
        let active = Arc::new(AtomicU64::new(now));
        let (evict, evicted_rx) = oneshot::channel();
        open.slots.insert(
            id,
            Entry {
                active: active.clone(),
                evict: Some(evict),
            },
        );
        let slot = Slot {
            id,
            connections: self.clone(),
            activity: Activity {
                active,
                epoch: self.epoch,
            },
            evicted: Some(evicted_rx),
        };
        if evicted {
            Admission::Evicted(slot)
        } else {
            Admission::Admitted(slot)
        }
    }
}

/// A connection's hold on a slot, given back when dropped.
pub struct Slot {
    id: u64,
    connections: Arc<Connections>,
    activity: Activity,
    evicted: Option<oneshot::Receiver<()>>,
}

impl Slot {
    /// For the request handler, to say a request began.
    pub fn activity(&self) -> Activity {
        self.activity.clone()
    }

    /// Resolves when the slot is given to another connection: the connection must close.
    pub fn evicted(&mut self) -> oneshot::Receiver<()> {
        self.evicted.take().expect("taken once")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.lock().slots.remove(&self.id);
    }
}

#[derive(Clone)]
pub struct Activity {
    active: Arc<AtomicU64>,
    epoch: Instant,
}

/// `Entry::active` while a request is being answered: not to be evicted then.
const SERVING: u64 = u64::MAX;

impl Activity {
    /// A request is being answered: its connection keeps its slot until [`Activity::answered`].
    pub fn serving(&self) {
        self.active.store(SERVING, Ordering::Relaxed);
    }

    /// The answer is made: the connection is idle from now.
    pub fn answered(&self) {
        self.active
            .store(self.epoch.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_full_set_evicts_the_connection_idle_longest_and_sheds_only_when_all_are_serving() {
        let connections = Connections::new(2);
        let Admission::Admitted(mut first) = connections.admit() else {
            panic!("a free slot")
        };
        let Admission::Admitted(mut second) = connections.admit() else {
            panic!("a free slot")
        };
        std::thread::sleep(Duration::from_millis(2));
        // The first was accepted first, but made a request since: the second goes.
        first.activity().serving();
        first.activity().answered();
        let mut first_closed = first.evicted();
        let mut second_closed = second.evicted();
        let Admission::Evicted(third) = connections.admit() else {
            panic!("an idle slot to take")
        };
        assert!(first_closed.try_recv().is_err(), "the first keeps its slot");
        assert!(
            second_closed.try_recv().is_ok(),
            "the second is told to close"
        );
        assert_eq!(connections.open(), 2);
        drop(second);
        assert_eq!(connections.open(), 2, "its slot is the third's now");

        // Both answering a request: the newcomer is shed.
        first.activity().serving();
        third.activity().serving();
        assert!(matches!(connections.admit(), Admission::Shed));
        drop(third);
        drop(first);
        assert_eq!(connections.open(), 0);
    }
}
