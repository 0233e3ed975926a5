//! What part a process plays: the PyTorch trainer, one of its DataLoader workers, the shared
//! memory manager, NCCL, Python multiprocessing, or something else.
//!
//! Roles come from facts the model holds: names (workers rename themselves `pt_data_worker`),
//! lineage (a worker's trainer may be its grandparent when a forkserver started it), and the
//! names of the /dev/shm objects a process opened (`torch_*`, `nccl-*`, `psm_*`).
use std::collections::HashMap;

use serde::Serialize;

use super::base_name;
use crate::model::{FastMap, Process, World};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RoleKind {
    Trainer,
    DataloaderWorker,
    /// A thread of the trainer; only ever the role of an event, not of a process.
    PinMemory,
    ShmManager,
    Nccl,
    PythonMultiprocessing,
    /// A child sharing tensors through torch.multiprocessing that is no DataLoader worker.
    TorchMultiprocessing,
    Other,
}

impl RoleKind {
    pub fn describe(self) -> &'static str {
        match self {
            RoleKind::Trainer => "PyTorch trainer",
            RoleKind::DataloaderWorker => "DataLoader worker",
            RoleKind::PinMemory => "pin-memory thread",
            RoleKind::ShmManager => "torch_shm_manager",
            RoleKind::Nccl => "NCCL",
            RoleKind::PythonMultiprocessing => "Python multiprocessing",
            RoleKind::TorchMultiprocessing => "torch.multiprocessing",
            RoleKind::Other => "other",
        }
    }
}

/// A process's role, with what links it to others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role {
    pub kind: RoleKind,
    /// For a DataLoader worker: its index among its trainer's workers, in start order.
    pub worker_index: Option<u32>,
    /// For a DataLoader worker: the training process it serves.
    pub trainer: Option<u32>,
}

impl Role {
    pub const OTHER: Role = Role {
        kind: RoleKind::Other,
        worker_index: None,
        trainer: None,
    };

    /// Short form for a column: `trainer`, `worker 2`, `pin`, ...
    pub fn tag(&self) -> String {
        match (self.kind, self.worker_index) {
            (RoleKind::DataloaderWorker, Some(i)) => format!("worker {i}"),
            (RoleKind::DataloaderWorker, None) => "worker".to_owned(),
            (RoleKind::Trainer, _) => "trainer".to_owned(),
            (RoleKind::PinMemory, _) => "pin".to_owned(),
            (RoleKind::ShmManager, _) => "shm_manager".to_owned(),
            (RoleKind::Nccl, _) => "nccl".to_owned(),
            (RoleKind::PythonMultiprocessing, _) => "multiprocessing".to_owned(),
            (RoleKind::TorchMultiprocessing, _) => "torch_mp".to_owned(),
            (RoleKind::Other, _) => String::new(),
        }
    }

    /// In words: `DataLoader worker 1 of trainer 4242`.
    pub fn describe(&self) -> String {
        match (self.kind, self.worker_index, self.trainer) {
            (RoleKind::DataloaderWorker, Some(i), Some(t)) => {
                format!("DataLoader worker {i} of trainer pid {t}")
            }
            (RoleKind::DataloaderWorker, None, Some(t)) => {
                format!("DataLoader worker of trainer pid {t}")
            }
            (kind, _, _) => kind.describe().to_owned(),
        }
    }
}

/// Thread names PyTorch gives.
const WORKER_NAMES: [&str; 2] = ["pt_data_worker", "pt_multiprocess"];
const PIN_THREAD: &str = "pt_data_pin";
/// PyTorch 2.3 and 2.4 named the main process so.
const MAIN_THREAD: &str = "pt_main_thread";
/// `torch_shm_manager` cut to the 15 characters of a task name.
const SHM_MANAGER: &str = "torch_shm_manag";

/// Roles of every process the model knows, computed together because they depend on each
/// other (a trainer is what its workers point to).
///
/// Kept current with [`Roles::update`], which looks again only at the processes whose facts
/// changed: recomputing over every process ever seen made a long run's cost grow with the
/// square of its processes (a fork storm, DataLoaders restarting workers every epoch).
#[derive(Clone, Debug, Default)]
pub struct Roles {
    by_pid: FastMap<u32, Role>,
    /// Workers per (trainer, program), in start order: a worker's index is its place here.
    workers: HashMap<WorkerKey, Vec<(u64, u32)>>,
    /// Where each worker was filed.
    filed_under: HashMap<u32, WorkerKey>,
    /// Per key, workers forgotten from the front of its list ([`Roles::forget`]): later
    /// workers keep their numbers. A worker forgotten from the middle stays as pid 0.
    forgotten: HashMap<WorkerKey, u32>,
    /// `World::version` these roles reflect; `None` before the first computation.
    version: Option<u64>,
}

/// Workers are numbered per trainer and per program it ran (its exec time).
type WorkerKey = (Option<u32>, Option<u64>);

impl Roles {
    /// Brings the roles up to `world`'s version: only the processes changed since then are
    /// looked at again, or everything when the world's change log no longer reaches back.
    pub fn update(&mut self, world: &World) {
        if self.version == Some(world.version()) {
            return;
        }
        let changed: Option<Vec<u32>> = self
            .version
            .and_then(|version| world.changes_since(version))
            .map(Iterator::collect);
        match changed {
            Some(mut pids) => {
                pids.sort_unstable();
                pids.dedup();
                for pid in pids {
                    self.reclassify(world, pid);
                }
                self.version = Some(world.version());
            }
            None => *self = Roles::compute(world),
        }
    }

    /// One process's role again, from its own facts and its ancestors'.
    fn reclassify(&mut self, world: &World, pid: u32) {
        let Some(process) = world.process(pid) else {
            return;
        };
        let filed = self.filed_under.get(&pid).copied();
        if is_named_worker(process) || is_unnamed_worker(world, process) {
            let key = worker_key(world, process);
            if filed == Some(key) {
                return;
            }
            if let Some(old) = filed {
                self.unfile_worker(pid, old);
            }
            let list = self.workers.entry(key).or_default();
            let order = (process.first_seen_ns, pid);
            let at = list.partition_point(|k| *k < order);
            list.insert(at, order);
            self.filed_under.insert(pid, key);
            self.reindex(key, at);
            if let Some(trainer) = key.0 {
                self.by_pid.entry(trainer).or_insert(Role {
                    kind: RoleKind::Trainer,
                    ..Role::OTHER
                });
            }
            return;
        }
        if let Some(old) = filed {
            self.unfile_worker(pid, old);
        }
        // As in `compute`: a process its workers point to is their trainer, whatever else.
        let serves_workers = self
            .workers
            .iter()
            .any(|(key, list)| key.0 == Some(pid) && list.iter().any(|(_, p)| *p != 0));
        let kind = if serves_workers {
            Some(RoleKind::Trainer)
        } else {
            solo_role(world, process)
        };
        match kind {
            Some(kind) => {
                self.by_pid.insert(
                    pid,
                    Role {
                        kind,
                        ..Role::OTHER
                    },
                );
            }
            None => {
                self.by_pid.remove(&pid);
            }
        }
    }

    fn unfile_worker(&mut self, pid: u32, key: WorkerKey) {
        self.filed_under.remove(&pid);
        self.by_pid.remove(&pid);
        if let Some(list) = self.workers.get_mut(&key)
            && let Some(at) = list.iter().position(|(_, p)| *p == pid)
        {
            list.remove(at);
            self.reindex(key, at);
        }
    }

    /// Worker roles of the workers filed under `key`, from position `from` on.
    fn reindex(&mut self, key: WorkerKey, from: usize) {
        let Some(list) = self.workers.get(&key) else {
            return;
        };
        let base = self.forgotten.get(&key).copied().unwrap_or(0);
        for (index, (_, pid)) in list.iter().enumerate().skip(from) {
            if *pid == 0 {
                continue;
            }
            self.by_pid.insert(
                *pid,
                Role {
                    kind: RoleKind::DataloaderWorker,
                    worker_index: Some(base + index as u32),
                    trainer: key.0,
                },
            );
        }
    }

    /// Every role from scratch.
    pub fn compute(world: &World) -> Roles {
        let mut by_pid: FastMap<u32, Role> = FastMap::default();
        // Workers first: by name, or as a child of a trainer creating torch_ objects (older
        // PyTorch did not rename them).
        let mut workers: Vec<&Process> = world
            .processes()
            .filter(|p| is_named_worker(p) || is_unnamed_worker(world, p))
            .collect();
        workers.sort_by_key(|p| (p.first_seen_ns, p.pid));
        // Numbered per trainer and per program it ran: workers of a program it replaced with
        // exec are not this program's.
        let mut next_index: HashMap<WorkerKey, u32> = HashMap::new();
        let mut workers_by_key: HashMap<WorkerKey, Vec<(u64, u32)>> = HashMap::new();
        let mut filed_under = HashMap::new();
        for worker in &workers {
            let key = worker_key(world, worker);
            let trainer = key.0;
            workers_by_key
                .entry(key)
                .or_default()
                .push((worker.first_seen_ns, worker.pid));
            filed_under.insert(worker.pid, key);
            let index = next_index.entry(key).or_default();
            by_pid.insert(
                worker.pid,
                Role {
                    kind: RoleKind::DataloaderWorker,
                    worker_index: Some(*index),
                    trainer,
                },
            );
            *index += 1;
            if let Some(trainer) = trainer {
                by_pid.entry(trainer).or_insert(Role {
                    kind: RoleKind::Trainer,
                    ..Role::OTHER
                });
            }
        }
        for process in world.processes() {
            if by_pid.contains_key(&process.pid) {
                continue;
            }
            let Some(kind) = solo_role(world, process) else {
                continue;
            };
            by_pid.insert(
                process.pid,
                Role {
                    kind,
                    ..Role::OTHER
                },
            );
        }
        Roles {
            by_pid,
            workers: workers_by_key,
            filed_under,
            forgotten: HashMap::new(),
            version: Some(world.version()),
        }
    }

    /// Forgets a process the model forgot (`World::forget`). A worker's place in its
    /// trainer's list is kept, so that the workers after it keep their numbers.
    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
        if let Some(key) = self.filed_under.remove(&pid)
            && let Some(list) = self.workers.get_mut(&key)
        {
            if let Some(entry) = list.iter_mut().find(|(_, p)| *p == pid) {
                entry.1 = 0;
            }
            let gone = list.iter().take_while(|(_, p)| *p == 0).count();
            list.drain(..gone);
            *self.forgotten.entry(key).or_default() += gone as u32;
            if list.is_empty() {
                self.workers.remove(&key);
            }
        }
        // A trainer forgotten: nothing is numbered under it any more.
        self.forgotten
            .retain(|key, _| key.0 != Some(pid) || self.workers.contains_key(key));
    }

    /// How many processes have a role other than `other`.
    pub fn remembered(&self) -> usize {
        self.by_pid.len()
    }

    pub fn of(&self, pid: u32) -> Role {
        self.by_pid.get(&pid).copied().unwrap_or(Role::OTHER)
    }

    /// The role of one event's actor: the pin-memory thread is a thread of the trainer.
    pub fn of_thread(&self, pid: u32, thread_comm: &str) -> Role {
        if thread_comm == PIN_THREAD {
            return Role {
                kind: RoleKind::PinMemory,
                ..Role::OTHER
            };
        }
        self.of(pid)
    }

    /// Workers serving `trainer`.
    pub fn workers_of(&self, trainer: u32) -> impl Iterator<Item = (u32, Role)> + '_ {
        self.by_pid
            .iter()
            .filter(move |(_, r)| {
                r.kind == RoleKind::DataloaderWorker && r.trainer == Some(trainer)
            })
            .map(|(pid, r)| (*pid, *r))
    }
}

/// Where a worker is numbered: its trainer and the program the trainer ran when the worker
/// started (workers of a program the trainer replaced with exec are not this program's).
fn worker_key(world: &World, worker: &Process) -> WorkerKey {
    let trainer = trainer_of(world, worker);
    let program = trainer
        .and_then(|t| world.process(t))
        .and_then(|t| t.exec_ns)
        .filter(|exec| *exec <= worker.first_seen_ns);
    let trainer = trainer.filter(|t| {
        world
            .process(*t)
            .and_then(|t| t.exec_ns)
            .is_none_or(|exec| exec <= worker.first_seen_ns)
    });
    (trainer, program)
}

/// The role a process that is not a worker has from its own facts and its parent's, if any.
fn solo_role(world: &World, process: &Process) -> Option<RoleKind> {
    Some(if process.comm == SHM_MANAGER {
        RoleKind::ShmManager
    } else if process.comm == MAIN_THREAD || process.thread_names.contains(PIN_THREAD) {
        RoleKind::Trainer
    } else if process.opened.iter().any(|name| is_nccl(name)) {
        RoleKind::Nccl
    } else if process.opened.iter().any(|name| is_torch(name)) {
        // Forked from a process of the same program, or started by multiprocessing's
        // spawn or forkserver: a producer; a program started on its own is a trainer.
        let forked = process.exec_ns.is_none()
            && process
                .parent
                .and_then(|p| world.process(p))
                .is_some_and(|p| p.comm == process.comm);
        let spawned = process.argv.iter().any(|a| a.contains("multiprocessing"));
        if forked || spawned {
            RoleKind::TorchMultiprocessing
        } else {
            RoleKind::Trainer
        }
    } else if process.opened.iter().any(|name| is_python_mp(name)) {
        RoleKind::PythonMultiprocessing
    } else {
        return None;
    })
}

fn is_named_worker(process: &Process) -> bool {
    WORKER_NAMES.contains(&process.comm.as_str())
}

/// PyTorch 2.3 and 2.4 named the trainer `pt_main_thread` and left its workers unnamed: a
/// child of it that opens torch_ objects is a worker. Other children sharing tensors are
/// torch.multiprocessing producers, not DataLoader workers.
fn is_unnamed_worker(world: &World, process: &Process) -> bool {
    process.opened.iter().any(|name| is_torch(name))
        && process
            .parent
            .and_then(|p| world.process(p))
            .is_some_and(|parent| {
                parent.comm == MAIN_THREAD && process.comm == MAIN_THREAD && !is_forkserver(parent)
            })
}

/// The training process a worker serves: its nearest ancestor that is neither a worker nor a
/// multiprocessing forkserver (from Python 3.14, workers are the forkserver's children).
fn trainer_of(world: &World, worker: &Process) -> Option<u32> {
    let mut current = worker.parent?;
    for _ in 0..8 {
        let process = world.process(current)?;
        if !is_named_worker(process) && !is_forkserver(process) {
            return Some(current);
        }
        current = process.parent?;
    }
    None
}

fn is_forkserver(process: &Process) -> bool {
    process
        .argv
        .iter()
        .any(|arg| arg.contains("multiprocessing.forkserver"))
}

pub fn is_torch(path: &str) -> bool {
    base_name(path).starts_with("torch_")
}

pub fn is_nccl(path: &str) -> bool {
    base_name(path).starts_with("nccl-")
}

pub fn is_python_mp(path: &str) -> bool {
    let name = base_name(path);
    name.starts_with("psm_") || name.starts_with("sem.") || name.starts_with("pym-")
}
