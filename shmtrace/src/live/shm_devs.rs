//! Forgetting the /dev/shm file systems that are gone. A tmpfs's device number is the
//! kernel's to give again once it is unmounted (the lowest free one, so at once in a churn of
//! containers), and the next file system to get it may be anything: a container's root, its
//! /dev, a scratch tmpfs. Left in `SHM_DEVS`, every file of that one would count as /dev/shm.

use std::collections::HashSet;

use crate::live::{
    bpf::{BpfError, Tracer},
    proc_scan,
};

/// Forgets a file system only when two sweeps in a row found it mounted at no /dev/shm: one
/// the probes learned just after a sweep read the mount tables is not taken for gone.
#[derive(Default)]
pub struct ShmDevSweep {
    absent_once: HashSet<u32>,
}

impl ShmDevSweep {
    /// Compares the probes' /dev/shm file systems with those mounted at a /dev/shm in some
    /// mount namespace now (`proc_scan::shm_devs`), and forgets those gone twice running.
    /// Returns how many are kept.
    pub fn sweep(&mut self, tracer: &mut Tracer) -> Result<usize, BpfError> {
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
        Ok(known - gone.len())
    }
}
