//! Streaming records out of the ring buffer.
use std::{io, os::fd::AsRawFd};

use aya::maps::{MapData, RingBuf};
use bytes::{Bytes, BytesMut};
use tokio::io::{Interest, unix::AsyncFd};

/// Most record bytes copied out of the ring at a time. A tracer that fell behind (a fork
/// storm on a busy machine) finds megabytes waiting: copied all at once, with a handle per
/// record, they would cost as much heap again as the ring itself. Left in the ring, they cost
/// nothing more.
const BATCH_BYTES: usize = 1 << 20;

/// Reads raw records from the ring buffer as they arrive.
pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Records are copied out of the ring into this arena and handed on as cheap `Bytes` views,
    /// so a burst costs one allocation, not one per record.
    arena: BytesMut,
}

impl EventReader {
    /// Must be called inside the async runtime.
    pub fn new(ring: RingBuf<MapData>) -> io::Result<EventReader> {
        Ok(EventReader {
            ring: watch(ring)?,
            arena: BytesMut::with_capacity(1 << 20),
        })
    }

    /// Waits until records are available, then appends them to `out`, at most
    /// [`BATCH_BYTES`] of them: the rest is read by the next call, at once.
    pub async fn read(&mut self, out: &mut Vec<Bytes>) -> io::Result<()> {
        loop {
            let mut guard = self.ring.readable_mut().await?;
            let before = out.len();
            let more = Self::copy_out(guard.get_inner_mut(), &mut self.arena, out);
            // Left ready while records remain: the ring only signals new ones.
            if !more {
                guard.clear_ready();
            }
            if out.len() > before {
                return Ok(());
            }
        }
    }

    /// Appends the records already in the ring to `out`, without waiting, at most
    /// [`BATCH_BYTES`] of them; `true` when more may remain.
    pub fn drain(&mut self, out: &mut Vec<Bytes>) -> bool {
        Self::copy_out(self.ring.get_mut(), &mut self.arena, out)
    }

    fn copy_out(ring: &mut RingBuf<MapData>, arena: &mut BytesMut, out: &mut Vec<Bytes>) -> bool {
        let mut copied = 0;
        while copied < BATCH_BYTES {
            let Some(record) = ring.next() else {
                return false;
            };
            if arena.capacity() < record.len() {
                arena.reserve(record.len().max(1 << 20));
            }
            arena.extend_from_slice(&record);
            copied += record.len();
            out.push(arena.split().freeze());
        }
        true
    }
}

/// Registers an eBPF map's descriptor with the async runtime, for readability.
fn watch<T: AsRawFd>(map: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: aya map handles own their descriptor until dropped, and the AsyncFd owns the
    // handle, so the descriptor stays open and unchanged for the AsyncFd's whole life.
    unsafe { AsyncFd::register_with_interest(map, Interest::READABLE) }
        .map_err(|error| error.into_parts().1)
}
