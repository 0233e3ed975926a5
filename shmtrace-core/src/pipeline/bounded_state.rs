//! Bounded state for a trace that runs for weeks (`shmtrace daemon`): the model forgets what
//! ended ([`World::with_retention`]), and the pipeline has everything that knows those
//! processes forget them too, keeps only the latest diagnoses, and says how much it holds and
//! what its caps dropped. The one-shot commands do none of this.
use anyhow::Result;

use super::Pipeline;
use crate::model::World;

/// What the analysis holds now, and what its caps dropped since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub processes: usize,
    pub objects: usize,
    /// Diagnoses the diagnoser remembers for those that may follow them.
    pub diagnoses: usize,
    /// Diagnoses kept for the closing summary.
    pub summary_diagnoses: usize,
    pub roles: usize,
    pub evicted: Evicted,
}

/// Entries dropped because a cap was reached, since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    pub processes: u64,
    pub objects: u64,
    pub summary_diagnoses: u64,
    pub table_rows: u64,
    /// Processes forgotten because they were gone with no exit record ([`Pipeline::forget_vanished`]).
    pub vanished: u64,
}

impl Pipeline {
    /// Keeps at most `max_diagnoses` diagnoses for the closing summary (the latest); the
    /// model's own bounds come with its [`World::with_retention`].
    pub fn bounded(mut self, max_diagnoses: usize) -> Pipeline {
        self.max_diagnoses = Some(max_diagnoses);
        self
    }

    /// Forgets what no longer matters at `now_ns` (boot time), in the model and everything
    /// that knows its processes. A process the model's cap drops alive has its failures so far
    /// diagnosed first.
    pub fn prune(&mut self, now_ns: u64) -> Result<()> {
        let diagnoser = &self.diagnoser;
        let mut due = self
            .world
            .due_to_forget(now_ns, |pid| diagnoser.has_pending(pid));
        for pid in &due {
            if let Some(diagnosis) = self.diagnoser.diagnose_now(*pid, &self.world) {
                self.show_diagnosis(diagnosis)?;
            }
        }
        // Those that ended quietly, unless a diagnosis may still name them.
        let diagnoser = &self.diagnoser;
        let quiet = self
            .world
            .quietly_ended(now_ns, |pid| diagnoser.remembers(pid));
        if !quiet.is_empty() {
            due.extend(quiet);
            due.sort_unstable();
            due.dedup();
        }
        self.forget_processes(&due);
        Ok(())
    }

    /// Processes the model thinks alive, with when each was first and last seen (boot time),
    /// for the caller to look for in /proc after records were lost.
    pub fn live_processes(&self) -> Vec<(u32, u64, u64)> {
        self.world.live_processes()
    }

    /// `pids` are gone, and their exit records were lost (the caller checked /proc): what
    /// failed in them is diagnosed now, and they are forgotten, counted as vanished. Without
    /// this, a process whose exit was lost holds its descriptors and mappings in the model
    /// until the cap on processes drops it.
    pub fn forget_vanished(&mut self, pids: &[u32]) -> Result<()> {
        for pid in pids {
            if let Some(diagnosis) = self.diagnoser.diagnose_now(*pid, &self.world) {
                self.show_diagnosis(diagnosis)?;
            }
        }
        self.forget_processes(pids);
        self.vanished += pids.len() as u64;
        Ok(())
    }

    /// Forgets `pid`, which ended before the kernel gave its number to the process now acting
    /// under it ([`World::ended_before`]), everywhere that knows it: in a one-shot trace too.
    pub(super) fn forget_ended(&mut self, pid: u32) {
        self.diagnoser.tally_forgotten(&[pid], &self.world);
        self.world.forget_ended(pid);
        self.diagnoser.forget(&[pid]);
        self.read_at_call.remove(&pid);
        self.read_at_failure.remove(&pid);
    }

    fn forget_processes(&mut self, pids: &[u32]) {
        self.diagnoser.tally_forgotten(pids, &self.world);
        self.world.forget(pids);
        self.diagnoser.forget(pids);
        for pid in pids {
            self.read_at_call.remove(pid);
            self.read_at_failure.remove(pid);
        }
    }

    /// The container of mount namespace `mntns` is gone, with the /dev/shm it had of its
    /// own: the objects named there before `before_ns` (when another container took the
    /// number, if one did) on any file system but `shared_dev` (the host's /dev/shm, whose
    /// files outlive the container) end. Returns how many.
    pub fn retire_namespace(
        &mut self,
        mntns: u32,
        shared_dev: Option<u32>,
        before_ns: Option<u64>,
    ) -> usize {
        self.world
            .retire_namespace(mntns, shared_dev, before_ns.unwrap_or(u64::MAX))
    }

    pub fn state(&self) -> State {
        let world: &World = &self.world;
        let remembered = self.diagnoser.remembered();
        let evictions = world.evictions();
        State {
            processes: world.process_count(),
            objects: world.object_count(),
            diagnoses: remembered.diagnoses,
            summary_diagnoses: self.diagnoses.len(),
            roles: remembered.roles,
            evicted: Evicted {
                processes: evictions.processes,
                objects: evictions.objects,
                summary_diagnoses: self.evicted_diagnoses,
                table_rows: remembered.evicted_table_rows,
                vanished: self.vanished,
            },
        }
    }
}
