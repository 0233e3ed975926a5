//! The metrics port's connection slots: at most a fixed number of connections are served at
//! once, so that whoever can reach the port cannot take the descriptors the probes, the
//! runtimes' sockets and the recordings need (nor the memory each connection's buffers take).
//!
//! When every slot is taken, a new connection takes the slot of the connection idle longest,
//! if that one has been idle (no request begun) for [`EVICT_IDLE_AFTER`]: a flood of held,
//! silent connections cannot keep the kubelet's `/healthz` probe or a scrape out. Otherwise the
//! new connection is closed as soon as it is accepted. Both are counted.
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

/// A connection idle this long may lose its slot to a new one when all are taken. A client
/// that means to be served sends its request at once.
pub const EVICT_IDLE_AFTER: Duration = Duration::from_secs(1);

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
    /// When a request last began on it (or it was accepted), in ms since `epoch`.
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

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A slot for a connection accepted now, if one can be had.
    pub fn admit(self: &Arc<Connections>) -> Admission {
        let now = self.now_ms();
        let mut open = self.lock();
        let mut evicted = false;
        if open.slots.len() >= self.max {
            let idle_ms = EVICT_IDLE_AFTER.as_millis() as u64;
            let oldest = open
                .slots
                .iter()
                .map(|(id, entry)| (entry.active.load(Ordering::Relaxed), *id))
                .min();
            match oldest {
                Some((active, id)) if now.saturating_sub(active) >= idle_ms => {
                    if let Some(entry) = open.slots.remove(&id)
                        && let Some(evict) = entry.evict
                    {
                        // The connection may have ended meanwhile: nothing to close then.
                        let _ = evict.send(());
                    }
                    evicted = true;
                }
                _ => return Admission::Shed,
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

impl Activity {
    pub fn request_began(&self) {
        self.active
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_set_sheds_until_a_connection_has_been_idle_then_evicts_the_oldest() {
        let connections = Connections::new(2);
        let Admission::Admitted(mut first) = connections.admit() else {
            panic!("a free slot")
        };
        let Admission::Admitted(second) = connections.admit() else {
            panic!("a free slot")
        };
        assert!(matches!(connections.admit(), Admission::Shed));
        assert_eq!(connections.open(), 2);

        std::thread::sleep(EVICT_IDLE_AFTER + Duration::from_millis(50));
        // The second one is busy: the first, idle longest, goes.
        second.activity().request_began();
        let mut closed = first.evicted();
        let Admission::Evicted(third) = connections.admit() else {
            panic!("an idle slot to take")
        };
        assert!(closed.try_recv().is_ok(), "the evicted connection is told");
        assert_eq!(connections.open(), 2);
        drop(first);
        assert_eq!(connections.open(), 2, "its slot is the third's now");
        drop(third);
        drop(second);
        assert_eq!(connections.open(), 0);
    }
}
