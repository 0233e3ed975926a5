//! Forgetting the /dev/shm file systems that are gone. A tmpfs's device number is the
//! kernel's to give again once it is unmounted (the lowest free one, so at once in a churn of
//! containers), and the next file system to get it may be anything: a container's root, its
//! /dev, a scratch tmpfs. Left in `SHM_DEVS`, every file of that one would count as /dev/shm.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use crate::live::{
    bpf::{BpfError, Tracer},
    proc_scan,
};

/// How often the mount tables are read: a tmpfs gone is forgotten within two of these,
/// before a churn of containers is likely to have given its number to more than a few files
/// of another.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Forgets a file system only when two sweeps in a row found it mounted at no /dev/shm: one
/// the probes learned just after a sweep read the mount tables is not taken for gone.
pub struct ShmDevSweep {
    absent_once: HashSet<u32>,
    last: Instant,
    /// File systems taken for a /dev/shm as of the last sweep.
    kept: usize,
}

impl Default for ShmDevSweep {
    fn default() -> ShmDevSweep {
        ShmDevSweep {
            absent_once: HashSet::new(),
            last: Instant::now(),
            kept: 0,
        }
    }
}

impl ShmDevSweep {
    /// File systems the probes take for a /dev/shm, as of the last sweep.
    pub fn kept(&self) -> usize {
        self.kept
    }

    /// Sweeps when the last sweep is [`SWEEP_EVERY`] old: compares the probes' /dev/shm file
    /// systems with those mounted at a /dev/shm in some mount namespace now
    /// (`proc_scan::shm_devs`), and forgets those gone twice running.
    pub fn sweep_when_due(&mut self, tracer: &mut Tracer) -> Result<(), BpfError> {
        if self.last.elapsed() < SWEEP_EVERY {
            return Ok(());
        }
        self.last = Instant::now();
        let mounted: HashSet<u32> = proc_scan::shm_devs().into_iter().collect();
        let devs = tracer.shm_devs()?;
        let known = devs.len();
        let (gone, absent): (Vec<u32>, Vec<u32>) = devs
            .into_iter()
            .filter(|dev| !mounted.contains(dev))
            .partition(|dev| self.absent_once.contains(dev));
        for dev in &gone {
            tracer.forget_shm_dev(*dev)?;
        }
        self.absent_once = absent.into_iter().collect();
        self.kept = known - gone.len();
        Ok(())
    }
}
