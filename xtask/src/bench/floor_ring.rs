//! The record floor's ring buffer, and the thread that drains it.
//!
//! The record floor's programs reserve a record and submit it unwritten, without waking
//! anyone (`floor`). Records must still be consumed, or the ring fills and
//! every reservation after fails early, which is cheaper than a tracer that keeps up. A thread
//! moves the consumer position past every submitted record each millisecond, as a reader that
//! copied nothing out would.
use std::{
    os::fd::{AsRawFd, OwnedFd},
    ptr::NonNull,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use anyhow::{Context, Result, bail};

/// shmtrace's default `--buffer-size` for a trace.
pub const RING_BYTES: u32 = 8 << 20;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_TYPE_RINGBUF: u32 = 27;
/// A record's length word: still being written, or discarded (UAPI `BPF_RINGBUF_*_BIT`).
const BUSY: u32 = 1 << 31;
const DISCARDED: u32 = 1 << 30;
/// Each record starts with an 8-byte header, and records are 8-byte aligned.
const RECORD_HEADER: u64 = 8;

/// The prefix of `union bpf_attr` that `BPF_MAP_CREATE` reads; the rest stays zero.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    rest: [u64; 12],
}

/// A BPF ring buffer that is drained for as long as it lives.
pub struct DrainedRing {
    map: OwnedFd,
    stop: Arc<AtomicBool>,
    drain: Option<JoinHandle<Result<u64>>>,
}

impl DrainedRing {
    pub fn create() -> Result<DrainedRing> {
        let mut attr = MapCreateAttr {
            map_type: BPF_MAP_TYPE_RINGBUF,
            max_entries: RING_BYTES,
            ..Default::default()
        };
        let map =
            super::bpf_syscall::bpf(BPF_MAP_CREATE, &mut attr).context("creating a ring buffer")?;
        let mapping = Mapping::new(&map)?;
        let stop = Arc::new(AtomicBool::new(false));
        let drain = {
            let stop = stop.clone();
            thread::spawn(move || mapping.drain(&stop))
        };
        Ok(DrainedRing {
            map,
            stop,
            drain: Some(drain),
        })
    }

    pub fn map_fd(&self) -> i32 {
        self.map.as_raw_fd()
    }
}

impl Drop for DrainedRing {
    /// Stops the drain. A ring that came within half of full made reservations fail, and the
    /// floor cheaper than it is: that is said, not hidden.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let Some(drain) = self.drain.take() else {
            return;
        };
        match drain.join() {
            Ok(Ok(peak)) if peak > RING_BYTES as u64 / 2 => eprintln!(
                "record floor: {peak} bytes waited in the {RING_BYTES}-byte ring at once; \
                 reservations may have failed, and the floor measured low"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(error)) => eprintln!("record floor: draining the ring failed: {error:#}"),
            Err(_) => eprintln!("record floor: the drain thread panicked"),
        }
    }
}

/// The ring's two mappings: the consumer position (ours to write), and the producer position
/// followed by the data, mapped twice in a row so a record never wraps.
struct Mapping {
    consumer: NonNull<libc::c_void>,
    producer: NonNull<libc::c_void>,
    page: usize,
}

// SAFETY: the mappings are plain shared memory, used by the drain thread alone once moved.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(map: &OwnedFd) -> Result<Mapping> {
        // SAFETY: no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let map_at = |len: usize, prot: libc::c_int, offset: usize| -> Result<NonNull<_>> {
            // SAFETY: a new shared mapping of the ring's descriptor, at offsets the kernel
            // defines for ring buffers; nothing else is mapped there.
            let address = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    prot,
                    libc::MAP_SHARED,
                    map.as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            if address == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error()).context("mapping the ring buffer");
            }
            NonNull::new(address).context("mmap returned NULL")
        };
        let consumer = map_at(page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = map_at(page + 2 * RING_BYTES as usize, libc::PROT_READ, page)?;
        Ok(Mapping {
            consumer,
            producer,
            page,
        })
    }

    /// Consumes submitted records until `stop`; returns the most bytes seen waiting at once.
    fn drain(self, stop: &AtomicBool) -> Result<u64> {
        // SAFETY: both positions are 8-byte words at the start of their pages, which stay
        // mapped while `self` lives; the kernel writes the producer's and reads ours.
        let (consumer, producer) = unsafe {
            (
                &*(self.consumer.as_ptr() as *const AtomicU64),
                &*(self.producer.as_ptr() as *const AtomicU64),
            )
        };
        let data = self.producer.as_ptr() as usize + self.page;
        let mask = RING_BYTES as u64 - 1;
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            let mut position = consumer.load(Ordering::Acquire);
            let end = producer.load(Ordering::Acquire);
            peak = peak.max(end - position);
            while position < end {
                // SAFETY: a record header inside the data mapping (the position is masked
                // into the first copy of the data pages), written by the kernel.
                let header = unsafe { &*((data + (position & mask) as usize) as *const AtomicU32) };
                let length = header.load(Ordering::Acquire);
                if length & BUSY != 0 {
                    break;
                }
                position += (RECORD_HEADER + (length & !(BUSY | DISCARDED)) as u64 + 7) & !7;
            }
            if position > end {
                bail!("a record ran past the producer position: the ring layout is not as read");
            }
            consumer.store(position, Ordering::Release);
            thread::sleep(Duration::from_millis(1));
        }
        Ok(peak)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the two mappings made in `new`, with their lengths; nothing refers to them
        // any more.
        unsafe {
            libc::munmap(self.consumer.as_ptr(), self.page);
            libc::munmap(self.producer.as_ptr(), self.page + 2 * RING_BYTES as usize);
        }
    }
}
