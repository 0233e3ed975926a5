//! Forgetting, for a trace that runs for weeks (`shmtrace daemon`): a process that ended is
//! dropped once nothing can ask about it any more, and caps on processes and objects are a
//! backstop (lost exit records, a node with more live processes than planned), with every
//! entry a cap drops counted. A host-wide trace (`--all`) forgets too, and sooner: a process
//! that ended quietly is dropped after [`Retention::quiet_linger_ns`]. The other one-shot
//! commands keep everything: forgetting is off unless [`World::with_retention`] turns it on.
use std::collections::{HashSet, VecDeque};

use super::World;
use crate::model::Annotation;

/// How long a host-wide trace (`--all`, the daemon) keeps a process that ended quietly: half a
/// second, so that a storm of short lives costs memory for the processes of the last half
/// second only, not for everything that ran within a linger.
pub const QUIET_LINGER_NS: u64 = 500_000_000;

/// How long what ended is kept, and the most kept at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// How long an exited process stays after its exit: a diagnosis that comes after it (a
    /// trainer dying of its worker's failure) and the flight recorder's window look it up.
    pub linger_ns: u64,
    /// How long a process that ended quietly stays: exit status 0 (or an exit that never
    /// touched shared memory), holding nothing. The caller still keeps those it knows more
    /// about ([`World::quietly_ended`]). At least `linger_ns` turns this tier off.
    pub quiet_linger_ns: u64,
    /// Most processes kept, alive or not.
    pub max_processes: usize,
    /// Most /dev/shm objects kept.
    pub max_objects: usize,
}

/// Entries dropped because a cap was reached (not because they ended), since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evictions {
    pub processes: u64,
    pub objects: u64,
}

#[derive(Debug)]
pub(super) struct Forgetting {
    retention: Retention,
    /// Exits in the order they came: (exit time, pid).
    exited: VecDeque<(u64, u32)>,
    /// Quiet exits in the order they came (see [`Retention::quiet_linger_ns`]).
    quiet: VecDeque<(u64, u32)>,
    /// Quiet exits still asked about after the short linger, in the order they came: they
    /// wait for the full linger like the others.
    late: VecDeque<(u64, u32)>,
    /// Exited long enough ago, but still asked about: the creator of a file still in
    /// /dev/shm (a leftover names it), or one the caller keeps.
    pinned: Vec<(u64, u32)>,
    evictions: Evictions,
}

impl Forgetting {
    /// One entry per exit, so that a storm of short lives costs the model no more than the
    /// processes a linger holds.
    pub(super) fn exited(&mut self, pid: u32, ts_ns: u64, quiet: bool) {
        if quiet && self.retention.quiet_linger_ns < self.retention.linger_ns {
            self.quiet.push_back((ts_ns, pid));
        } else {
            self.exited.push_back((ts_ns, pid));
        }
    }
}

/// Down to this share of a cap once it is exceeded, so that a model at its cap does not sort
/// everything again at every call.
fn below(cap: usize) -> usize {
    cap - cap / 10
}

impl World {
    /// A model that forgets what ended (see the module's documentation).
    pub fn with_retention(mut self, retention: Retention) -> World {
        self.forgetting = Some(Forgetting {
            retention,
            exited: VecDeque::new(),
            quiet: VecDeque::new(),
            late: VecDeque::new(),
            pinned: Vec::new(),
            evictions: Evictions::default(),
        });
        self
    }

    /// What the caps dropped so far.
    pub fn evictions(&self) -> Evictions {
        self.forgetting
            .as_ref()
            .map(|f| f.evictions)
            .unwrap_or_default()
    }

    /// Processes with no exit seen, and when each was first and last seen (boot time).
    pub fn live_processes(&self) -> Vec<(u32, u64, u64)> {
        self.processes
            .values()
            .filter(|p| p.exit.is_none())
            .map(|p| (p.pid, p.first_seen_ns, p.last_seen_ns))
            .collect()
    }

    pub fn process_count(&self) -> usize {
        self.processes.len()
    }

    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    /// The processes to forget at `now_ns` (boot time): those that exited more than the
    /// linger ago, and live ones that hold nothing, are nobody's parent and were silent as
    /// long, unless `keep` says otherwise or a live object names them as its creator;
    /// then, while over the cap, the others that ended or went silent longest ago (a live
    /// process whose exit record was lost, say), counted as evictions. Nothing is forgotten
    /// yet: the caller first tells what else knows them, then calls [`World::forget`].
    pub fn due_to_forget(&mut self, now_ns: u64, keep: impl Fn(u32) -> bool) -> Vec<u32> {
        let Some(forgetting) = &mut self.forgetting else {
            return Vec::new();
        };
        let linger = forgetting.retention.linger_ns;
        let mut candidates = std::mem::take(&mut forgetting.pinned);
        for ended in [&mut forgetting.exited, &mut forgetting.late] {
            while let Some(&(exit_ns, pid)) = ended.front() {
                if exit_ns.saturating_add(linger) > now_ns {
                    break;
                }
                ended.pop_front();
                candidates.push((exit_ns, pid));
            }
        }
        let mut due = Vec::new();
        let creators: HashSet<u32> = self.objects.values().filter_map(|o| o.creator).collect();
        if !candidates.is_empty() {
            for (exit_ns, pid) in candidates {
                // Forgotten already, or the number is another process's now.
                let Some(process) = self.processes.get(&pid) else {
                    continue;
                };
                if process.exit_ns != Some(exit_ns) {
                    continue;
                }
                if keep(pid) || creators.contains(&pid) {
                    forgetting.pinned.push((exit_ns, pid));
                } else {
                    due.push(pid);
                }
            }
        }
        // Live ones that hold nothing, are nobody's parent, and were silent for the linger: a
        // process seen only as it sent a signal or opened /dev/shm itself (a runtime, `ls`)
        // is not followed, and its exit is never seen. Should it act again, it is met anew.
        let parents: HashSet<u32> = self
            .processes
            .values()
            .filter(|p| p.alive())
            .filter_map(|p| p.parent)
            .collect();
        due.extend(
            self.processes
                .values()
                .filter(|p| {
                    p.alive()
                        && p.fds.is_empty()
                        && p.mappings.is_empty()
                        && p.last_seen_ns.saturating_add(linger) <= now_ns
                        && !parents.contains(&p.pid)
                        && !creators.contains(&p.pid)
                })
                .map(|p| p.pid)
                .filter(|pid| !keep(*pid)),
        );
        let cap = forgetting.retention.max_processes;
        let left = self.processes.len() - due.len();
        if left > cap {
            let excess = left - below(cap);
            let already: HashSet<u32> = due.iter().copied().collect();
            let mut others: Vec<_> = self
                .processes
                .values()
                .filter(|p| !already.contains(&p.pid))
                // Silent longest first, holding something or not: a live process dropped
                // this way is read from /proc again when it acts.
                .map(|p| (p.exit_ns.unwrap_or(p.last_seen_ns), p.pid))
                .collect();
            others.sort_unstable();
            due.extend(others.iter().take(excess).map(|(_, pid)| *pid));
            forgetting.evictions.processes += excess as u64;
        }
        due
    }

    /// Whether `pid` names a process that ended before `ts_ns`: a call or exec from it then is
    /// a new process's, which the kernel gave the number to, and whose fork the trace did not
    /// see (a host-wide trace follows no shell that never touched /dev/shm).
    pub fn ended_before(&self, pid: u32, ts_ns: u64) -> bool {
        self.processes
            .get(&pid)
            .and_then(|p| p.exit_ns)
            .is_some_and(|ended| ended < ts_ns)
    }

    /// Forgets `pid`, a process that ended before its number was given again
    /// ([`World::ended_before`]), whatever the retention: kept, it would lend the new process
    /// its name and command line. Its queued exit finds the number another's and passes.
    pub fn forget_ended(&mut self, pid: u32) {
        if self
            .processes
            .get(&pid)
            .is_some_and(|p| p.exit_ns.is_some())
        {
            self.drop_processes(&[pid]);
        }
    }

    fn drop_processes(&mut self, pids: &[u32]) {
        let mut note = Annotation::default();
        for pid in pids {
            let Some(process) = self.processes.remove(pid) else {
                continue;
            };
            self.unindex(process.pid, process.mntns);
            let fds = process.fds.values().map(|fd| fd.inode).collect();
            let maps = process.mappings.iter().map(|m| m.inode).collect();
            self.release(fds, maps, &mut note);
        }
    }

    /// The processes that ended quietly more than [`Retention::quiet_linger_ns`] before
    /// `now_ns`, and that nothing asks about: not the creator of a live object, not the parent
    /// of a live process, not one `keep` names (a failure, a diagnosis). The caller forgets
    /// them with [`World::forget`]; the others wait for the full linger like any other.
    pub fn quietly_ended(&mut self, now_ns: u64, keep: impl Fn(u32) -> bool) -> Vec<u32> {
        let Some(forgetting) = &mut self.forgetting else {
            return Vec::new();
        };
        let linger = forgetting.retention.quiet_linger_ns;
        let mut candidates = Vec::new();
        while let Some(&(exit_ns, pid)) = forgetting.quiet.front() {
            if exit_ns.saturating_add(linger) > now_ns {
                break;
            }
            forgetting.quiet.pop_front();
            // Forgotten already, or the number is another process's now.
            if self
                .processes
                .get(&pid)
                .is_some_and(|p| p.exit_ns == Some(exit_ns))
            {
                candidates.push((exit_ns, pid));
            }
        }
        if candidates.is_empty() {
            return Vec::new();
        }
        let creators: HashSet<u32> = self.objects.values().filter_map(|o| o.creator).collect();
        let parents: HashSet<u32> = self
            .processes
            .values()
            .filter(|p| p.alive())
            .filter_map(|p| p.parent)
            .collect();
        let mut due = Vec::with_capacity(candidates.len());
        for (exit_ns, pid) in candidates {
            if creators.contains(&pid) || parents.contains(&pid) || keep(pid) {
                forgetting.late.push_back((exit_ns, pid));
            } else {
                due.push(pid);
            }
        }
        due
    }

    /// Forgets `pids` (from [`World::due_to_forget`]); a process forgotten alive lets go of
    /// what it held. Then, while over the cap on objects, drops the oldest objects nobody
    /// holds, then the oldest others, counted as evictions.
    pub fn forget(&mut self, pids: &[u32]) {
        if self.forgetting.is_none() {
            return;
        }
        self.drop_processes(pids);
        let Some(forgetting) = &mut self.forgetting else {
            return;
        };
        let cap = forgetting.retention.max_objects;
        if self.objects.len() <= cap {
            return;
        }
        let excess = self.objects.len() - below(cap);
        forgetting.evictions.objects += excess as u64;
        let mut oldest: Vec<_> = self
            .objects
            .values()
            .map(|o| ((o.fds > 0 || o.mappings > 0, o.first_seen_ns), o.inode))
            .collect();
        oldest.sort_unstable_by_key(|(order, inode)| (*order, inode.dev, inode.ino));
        for (_, inode) in oldest.into_iter().take(excess) {
            // Dropped without saying it was freed.
            self.remove_object(inode);
        }
    }
}

#[cfg(test)]
#[path = "forgetting_tests.rs"]
mod tests;
