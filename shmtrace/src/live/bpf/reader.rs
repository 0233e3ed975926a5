//! Streaming records out of the ring buffer.
use std::{io, os::fd::AsRawFd};

use aya::maps::{MapData, RingBuf};
use bytes::{Bytes, BytesMut};
use tokio::io::{Interest, unix::AsyncFd};

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

    /// Waits until records are available, then appends all of them to `out`.
    pub async fn read(&mut self, out: &mut Vec<Bytes>) -> io::Result<()> {
        loop {
            let mut guard = self.ring.readable_mut().await?;
            let before = out.len();
            Self::copy_out(guard.get_inner_mut(), &mut self.arena, out);
            guard.clear_ready();
            if out.len() > before {
                return Ok(());
            }
        }
    }

    /// Appends every record already in the ring to `out`, without waiting.
    pub fn drain(&mut self, out: &mut Vec<Bytes>) {
        Self::copy_out(self.ring.get_mut(), &mut self.arena, out);
    }

    fn copy_out(ring: &mut RingBuf<MapData>, arena: &mut BytesMut, out: &mut Vec<Bytes>) {
        while let Some(record) = ring.next() {
            if arena.capacity() < record.len() {
                arena.reserve(record.len().max(1 << 20));
            }
            arena.extend_from_slice(&record);
            out.push(arena.split().freeze());
        }
    }
}

/// Registers an eBPF map's descriptor with the async runtime, for readability.
pub fn watch<T: AsRawFd>(map: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: aya map handles own their descriptor until dropped, and the AsyncFd owns the
    // handle, so the descriptor stays open and unchanged for the AsyncFd's whole life.
    unsafe { AsyncFd::register_with_interest(map, Interest::READABLE) }
        .map_err(|error| error.into_parts().1)
}
