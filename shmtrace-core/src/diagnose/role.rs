//! What part a process plays: the PyTorch trainer, one of its DataLoader workers, the shared
//! memory manager, NCCL, Python multiprocessing, or something else.
//!
//! Roles come from facts the model holds: names (workers rename themselves `pt_data_worker`),
//! lineage (a worker's trainer may be its grandparent when a forkserver started it), and the
//! names of the /dev/shm objects a process opened (`torch_*`, `nccl-*`, `psm_*`).
use std::collections::HashMap;

use serde::Serialize;

use crate::model::{Process, World};

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
#[derive(Clone, Debug, Default)]
pub struct Roles {
    by_pid: HashMap<u32, Role>,
}

impl Roles {
    pub fn compute(world: &World) -> Roles {
        let mut by_pid: HashMap<u32, Role> = HashMap::new();
        // Workers first: by name, or as a child of a trainer creating torch_ objects (older
        // PyTorch did not rename them).
        let mut workers: Vec<&Process> = world
            .processes()
            .filter(|p| is_named_worker(p) || is_unnamed_worker(world, p))
            .collect();
        workers.sort_by_key(|p| (p.first_seen_ns, p.pid));
        // Numbered per trainer and per program it ran: workers of a program it replaced with
        // exec are not this program's.
        let mut next_index: HashMap<(Option<u32>, Option<u64>), u32> = HashMap::new();
        for worker in &workers {
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
            let index = next_index.entry((trainer, program)).or_default();
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
            let kind = if process.comm == SHM_MANAGER {
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
        Roles { by_pid }
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

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
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
