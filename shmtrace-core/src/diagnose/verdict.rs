//! From a process's failures (or its death alone) to a [`Diagnosis`]: the decisive cause, the
//! program it is, the size to give /dev/shm, and for a process that died of another's failure
//! (a trainer after its worker), that other's cause.
use super::{
    DataloaderDemand, Demand, Diagnoser, Diagnosis, FileCountAdvice, NamedPid, Others, RemovedName,
    Role, RoleKind,
    failure::{Cause, Failure, FailureKind},
    file_count::advise_files,
    known,
    leftovers::summarise_leftovers,
    parallel_query, pressure,
    recommend::{self, Recommendation},
};
use crate::{
    capacity::Capacity,
    event::{Event, ExitStatus},
    model::{StartedBy, World},
};

/// What a later diagnosis needs of one already made: a trainer that dies after its worker
/// failed takes the worker's cause and recommendation.
#[derive(Clone, Debug)]
pub(super) struct Diagnosed {
    /// When its earliest failure happened; `None` when it had none (only a fatal signal).
    first_failure_ns: Option<u64>,
    cause: Cause,
    recommendation: Option<Recommendation>,
    files: Option<FileCountAdvice>,
    explanation: Option<String>,
    /// The /dev/shm whose files its processes grew by write, when its advice counted them:
    /// a later diagnosis that follows it counts the writers seen by then.
    written_on: Option<u32>,
    /// Its parent's entry for it in `failed_children`, to remove when it is forgotten.
    pub(super) filed_under: Option<(u32, u64)>,
}

impl Diagnoser {
    pub(super) fn on_death(
        &mut self,
        event: &Event,
        status: ExitStatus,
        killed_by: Option<u32>,
        world: &World,
    ) -> Option<Diagnosis> {
        let pid = event.pid;
        let failures = self.pending.remove(&pid).unwrap_or_default();
        let role = self.roles.of(pid);
        if failures.is_empty() {
            // Ended by another process on purpose (a parent stopping its children at
            // shutdown): nothing went wrong in it.
            if status.success() || killed_by.is_some() {
                return None;
            }
            // A trainer dying after one of its workers, or any process after its child: that
            // diagnosis says why.
            let failed_worker = self
                .first_failed_worker(pid)
                .or_else(|| self.first_failed_child(pid, world));
            if failed_worker.is_none()
                && let Some(refused) = self.refused_after_look(event, status, &status.describe())
            {
                return Some(self.diagnose(
                    pid,
                    event.mntns,
                    event.ts_ns,
                    Some(status),
                    vec![refused],
                    world,
                ));
            }
            let touched_shm = world
                .process(pid)
                .is_some_and(|p| !p.opened.is_empty() || role.kind != RoleKind::Other);
            // A rank of a parallel job that used /dev/shm and ended in error after a sibling
            // failed there (its peer gone, before its launcher could stop it): the sibling's
            // failure says why.
            let failed_worker = failed_worker.or_else(|| {
                touched_shm
                    .then(|| self.failed_sibling(pid, 0, &[], world))
                    .flatten()
            });
            let by_signal = matches!(status, ExitStatus::Signal { .. });
            if failed_worker.is_none() && !by_signal && !touched_shm {
                return None; // an ordinary non-zero exit, nothing to do with /dev/shm
            }
            let mut diagnosis = self.diagnose(
                pid,
                event.mntns,
                event.ts_ns,
                Some(status),
                Vec::new(),
                world,
            );
            if let Some(worker) = failed_worker {
                self.follow(&mut diagnosis, worker);
            }
            return Some(diagnosis);
        }
        // Ended on purpose by its launcher or parent after a sibling failed (the ranks of a
        // parallel job stopped when one fails): that sibling's failure is why, not its own
        // (a probe it recovered from, say).
        if let Some(sender) = killed_by
            && let Some(sibling) = self.failed_sibling(pid, sender, &failures, world)
        {
            let mut diagnosis = self.diagnose(
                pid,
                event.mntns,
                event.ts_ns,
                Some(status),
                Vec::new(),
                world,
            );
            self.follow(&mut diagnosis, sibling);
            return Some(diagnosis);
        }
        Some(self.diagnose(pid, event.mntns, event.ts_ns, Some(status), failures, world))
    }

    /// Of the children of `pid`'s parent and of `sender` (who killed it), other than `pid`,
    /// the one diagnosed with the earliest failure, when it failed before any of `failures`.
    fn failed_sibling(
        &self,
        pid: u32,
        sender: u32,
        failures: &[Failure],
        world: &World,
    ) -> Option<u32> {
        let own_first = failures.iter().map(|f| f.ts_ns).min().unwrap_or(u64::MAX);
        let parent = world.process(pid).and_then(|p| p.parent);
        [parent, Some(sender)]
            .into_iter()
            .flatten()
            .filter(|p| *p != 0)
            .filter_map(|p| self.first_failed_child(p, world))
            .filter(|child| *child != pid)
            .filter_map(|child| Some((self.diagnosed.get(&child)?.first_failure_ns?, child)))
            .filter(|(ns, _)| *ns < own_first)
            .min()
            .map(|(_, child)| child)
    }

    /// Of `trainer`'s diagnosed workers, the one whose failure came first; failing that (none
    /// had a failure of its own, say all were killed), the lowest pid.
    fn first_failed_worker(&self, trainer: u32) -> Option<u32> {
        let diagnosed: Vec<(u32, &Diagnosed)> = self
            .roles
            .workers_of(trainer)
            .filter_map(|(worker, _)| Some((worker, self.diagnosed.get(&worker)?)))
            .collect();
        diagnosed
            .iter()
            .filter_map(|(worker, d)| Some((d.first_failure_ns?, *worker)))
            .min()
            .map(|(_, worker)| worker)
            .or_else(|| diagnosed.iter().map(|(worker, _)| *worker).min())
    }

    /// Of `parent`'s children, the one diagnosed with the earliest failure: a multiprocessing
    /// parent whose writer died of SIGBUS, a launcher whose NCCL rank failed. Looked up in
    /// `failed_children`, not by a scan of every process: it is asked at every death by a
    /// signal, and a storm of them made a replay quadratic (issue 25). An entry counts while
    /// the child is still known as `parent`'s and diagnosed with that failure.
    fn first_failed_child(&self, parent: u32, world: &World) -> Option<u32> {
        self.failed_children
            .get(&parent)?
            .iter()
            .find(|(ns, child)| {
                world
                    .process(*child)
                    .is_some_and(|p| p.parent == Some(parent))
                    && self.diagnosed.get(child).and_then(|d| d.first_failure_ns) == Some(*ns)
            })
            .map(|(_, child)| *child)
    }

    /// Makes `diagnosis` (of a process with no failure of its own) point to the process whose
    /// failure it died of, and take that cause: a trainer killed by its worker's ENOSPC died of
    /// /dev/shm too, and the same size fixes it.
    fn follow(&mut self, diagnosis: &mut Diagnosis, followed: u32) {
        diagnosis.follows = Some(followed);
        let Some(other) = self.diagnosed.get(&followed).cloned() else {
            return;
        };
        if other.first_failure_ns.is_none() {
            return;
        }
        diagnosis.cause = other.cause;
        diagnosis.recommendation = other.recommendation.clone();
        // Writers that started after it failed want what each other wanted.
        if let (Some(dev), Some(r)) = (other.written_on, &mut diagnosis.recommendation)
            && let Some(growth) = self.write_growth(dev)
            && let Some(size) = growth.finished_size
        {
            let need = u64::from(growth.writers) * size;
            if recommend::with_headroom(need) > r.min_bytes {
                let started_by = diagnosis
                    .container
                    .as_ref()
                    .map_or(StartedBy::Unknown, |c| c.started_by.clone());
                let basis = format!(
                    "{} processes each growing a file by write(), {} each (what one that \
                     finished wrote)",
                    growth.writers,
                    crate::units::human(size)
                );
                *r = recommend::advise(need, &basis, &started_by);
            }
        }
        diagnosis.files = other.files.clone();
        diagnosis.explanation = other.explanation.clone();
        self.diagnosed.insert(
            diagnosis.pid,
            Diagnosed {
                first_failure_ns: None,
                filed_under: None,
                recommendation: diagnosis.recommendation.clone(),
                ..other
            },
        );
    }

    /// The size for a /dev/shm that was full: what the traced objects and others held, the
    /// requests failing with it, their growth, and a DataLoader's batches in flight.
    fn recommend_for_full(
        &self,
        pid: u32,
        role: &Role,
        primary: &Failure,
        capacity: Option<Capacity>,
        others: Option<&Others>,
        started_by: &StartedBy,
    ) -> Recommendation {
        let written = self
            .grown_by_write(primary)
            .and_then(|g| Some((g.writers, g.finished_size?)));
        let traced = primary.held;
        let (burst, growth) = self.pressure.at(primary);
        let dataloader = role
            .trainer
            .or((role.kind == RoleKind::Trainer).then_some(pid))
            .and_then(|t| {
                let stats = self.loaders.get(&t)?;
                let workers = self.roles.workers_of(t).count() as u32;
                (stats.batch_bytes > 0 && workers > 0).then(|| DataloaderDemand {
                    workers,
                    // A failure early in the run shows fewer than a DataLoader queues by
                    // default.
                    in_flight: stats.max_in_flight.max(recommend::DEFAULT_PREFETCH),
                    batch_bytes: stats.batch_bytes,
                })
            });
        recommend::recommend(
            &Demand {
                traced,
                others: capacity
                    .map(|c| {
                        let beyond = c.used.saturating_sub(traced);
                        // A DataLoader's batches reach the trainer through descriptors
                        // passed untraced, so the model misses some of their pages: there,
                        // use beyond the traced objects is the batches' own, which the
                        // DataLoader figure counts already; others' is at most what was
                        // there before.
                        match (&dataloader, self.first_used.get(&c.dev)) {
                            (Some(_), Some(first)) => beyond.min(*first),
                            _ => beyond,
                        }
                    })
                    .unwrap_or(0)
                    // What the others' files held, page by page as the machine showed
                    // them: more than the estimate when a traced object counted by its
                    // size (a mapping being filled at a SIGBUS) holds fewer pages. Not
                    // with a DataLoader, whose batches the trainer holds untraced.
                    .max(match (&dataloader, others) {
                        (None, Some(o)) => o.bytes,
                        _ => 0,
                    }),
                burst,
                growth,
                dataloader,
                capacity: capacity.map(|c| c.size),
                written,
            },
            self.nccl_seen,
            started_by,
        )
    }

    pub(super) fn diagnose(
        &mut self,
        pid: u32,
        mntns: u32,
        ts_ns: u64,
        ending: Option<ExitStatus>,
        mut failures: Vec<Failure>,
        world: &World,
    ) -> Diagnosis {
        let first_failure_ns = failures.iter().map(|f| f.ts_ns).min();
        // The decisive failure first: an OOM kill explains more than the ENOSPC before it.
        failures.sort_by_key(|f| (f.cause, f.ts_ns));
        let cause = match (failures.first(), ending) {
            (Some(f), _) => f.cause,
            (None, Some(ExitStatus::Signal { .. })) => Cause::Crash,
            _ => Cause::Other,
        };
        let process = world.process(pid);
        let role = self.roles.of(pid);
        let container = self.containers.get(&mntns).cloned().map(|mut c| {
            // Named, not numbered, when the container whose /dev/shm it joined is known.
            if let Some(owner) = self.joined(&c.ipc) {
                c.ipc = format!("{}{}", super::untraced_holders::JOINS, owner.name);
            }
            c
        });
        let title = process.and_then(|p| p.title.clone());
        let program = failures
            .iter()
            .find_map(|f| match &f.kind {
                FailureKind::Call { path: Some(p), .. }
                | FailureKind::Fault { path: Some(p), .. } => known::by_object(p),
                _ => None,
            })
            .or_else(|| {
                process.and_then(|p| {
                    known::by_process(&p.comm, title.as_deref())
                        .or_else(|| p.opened.iter().find_map(|o| known::by_object(o)))
                })
            });
        let program_role = program
            .zip(title.as_deref())
            .and_then(|(k, t)| known::role_in_title(k, t));
        let leftovers = failures
            .first()
            .filter(|f| f.cause == Cause::ShmFull && !f.leftovers.is_empty())
            .map(|f| summarise_leftovers(f, program, container.as_ref()));
        // A write growing its file asks for a block of what it wants: room for that block
        // says nothing of whether the rest would have fitted, when the files beside it are
        // its siblings' (made by writers of its burst, that ended while it or they ran), not
        // an earlier run's.
        let grown = failures.first().is_some_and(|f| {
            if f.leftovers.is_empty() || self.grown_by_write(f).is_none() {
                return false;
            }
            let began = super::growth::burst_began(pid, world);
            f.leftovers.iter().any(|l| {
                world
                    .process(l.creator_pid)
                    .and_then(|p| p.exit_ns)
                    .is_some_and(|ended| ended > began)
            })
        });
        let leftovers = leftovers.map(|mut l| {
            l.enough_without &= !grown;
            l
        });
        let cause = match (&leftovers, cause) {
            (Some(l), Cause::ShmFull) if l.enough_without => Cause::Leftovers,
            _ => cause,
        };
        let others = failures
            .first()
            .filter(|f| matches!(f.cause, Cause::ShmFull))
            .and_then(|f| self.others(f.dev?, &f.others, container.as_ref()));
        let started_by = container
            .as_ref()
            .map(|c| c.started_by.clone())
            .unwrap_or(StartedBy::Unknown);
        let trainer = role.trainer.map(|t| {
            (
                t,
                world.process(t).map(|p| p.argv.clone()).unwrap_or_default(),
            )
        });
        let primary = failures.first();
        let capacity = primary.and_then(|f| f.capacity);
        let usage = primary.and_then(|f| f.usage.clone());
        let looked = primary.and_then(|f| match &f.kind {
            FailureKind::SpaceCheck {
                need, need_basis, ..
            } => Some(need.zip(need_basis.clone())),
            _ => None,
        });
        let recommendation = match looked.clone() {
            // A program that decided from the free space it saw: its own rule says what it
            // needs, or nothing does.
            Some(need) => need.map(|(need, basis)| recommend::advise(need, &basis, &started_by)),
            None if cause == Cause::ShmFull => {
                let primary = primary.expect("a cause from a failure");
                match self.grown_by_write(primary) {
                    // Grown by write and none finished: what each needs is in no call.
                    Some(g) if g.finished_size.is_none() => None,
                    _ => Some(self.recommend_for_full(
                        pid,
                        &role,
                        &with_whole_query(primary, world),
                        capacity,
                        others.as_ref(),
                        &started_by,
                    )),
                }
            }
            None => None,
        };
        let growth_unseen = cause == Cause::ShmFull && recommendation.is_none() && looked.is_none();
        let files = (cause == Cause::InodesFull).then(|| {
            let dev = primary.and_then(|f| f.dev);
            let alternatives = match program.map(|k| k.program) {
                Some("PyTorch") => vec![
                    "fewer files at once: each batch in flight is one file, so fewer DataLoader workers or a lower prefetch_factor"
                        .to_owned(),
                ],
                _ => vec!["make fewer files at once (each shared object, semaphore or queue lock is one)"
                    .to_owned()],
            };
            advise_files(
                capacity.as_ref(),
                usage.as_ref().map_or(0, |u| u.objects),
                self.inode_refusals
                    .get(&dev.unwrap_or(0))
                    .copied()
                    .unwrap_or(0),
                alternatives,
                &started_by,
            )
        });
        let removed = primary
            .filter(|f| f.cause == Cause::NameRemoved)
            .and_then(|f| Some((f, f.removal.as_ref()?)))
            .map(|(f, r)| RemovedName {
                path: r.path.to_string(),
                by_pid: r.remover,
                by_comm: r.remover_comm.clone(),
                by_place: self.place(r.remover_mntns),
                by_argv: r.remover_argv.clone(),
                holders: r
                    .holders
                    .iter()
                    .map(|(pid, comm)| NamedPid {
                        pid: *pid,
                        comm: comm.clone(),
                    })
                    .collect(),
                made_by: r.maker,
                ns_before: f.ts_ns.saturating_sub(r.ts_ns),
            });
        let explanation = match (looked, &files, &removed) {
            _ if growth_unseen => Some(GROWTH_UNSEEN.to_owned()),
            (Some(None), _, _) => Some(NEED_UNSEEN.to_owned()),
            (_, Some(files), _) => Some(files.cause_text()),
            (_, _, Some(removed)) => Some(removed.cause_text()),
            _ => explain(cause),
        };
        let filed_under = first_failure_ns
            .zip(world.process(pid).and_then(|p| p.parent))
            .map(|(ns, parent)| (parent, ns));
        if let Some((parent, ns)) = filed_under {
            self.failed_children
                .entry(parent)
                .or_default()
                .insert((ns, pid));
        }
        self.diagnosed.insert(
            pid,
            Diagnosed {
                first_failure_ns,
                cause,
                recommendation: recommendation.clone(),
                files: files.clone(),
                explanation: explanation.clone(),
                written_on: primary
                    .filter(|_| recommendation.is_some())
                    .filter(|f| self.grown_by_write(f).is_some())
                    .and_then(|f| f.dev),
                filed_under,
            },
        );
        let already: Vec<&str> = recommendation
            .iter()
            .flat_map(|r| r.alternatives.iter().map(String::as_str))
            .collect();
        let program_alternatives = match cause {
            Cause::ShmFull | Cause::NoShm | Cause::ReadOnly => program
                .map(|k| k.alternatives)
                .unwrap_or_default()
                .iter()
                .filter(|alt| !already.iter().any(|a| known::same_setting(a, alt)))
                .map(|alt| (*alt).to_owned())
                .collect(),
            _ => Vec::new(),
        };
        Diagnosis {
            ts_ns,
            pid,
            container_pid: process.and_then(|p| p.nspid),
            comm: process.map(|p| p.comm.clone()).unwrap_or_default(),
            title,
            program,
            program_role,
            role,
            argv: process.map(|p| p.argv.clone()).unwrap_or_default(),
            trainer,
            place: self.place(mntns),
            container,
            ending,
            cause,
            workers_allocating: primary.map(|f| f.workers_allocating).unwrap_or(0),
            // The refusals seen, not the advice's estimate of who else would have asked.
            burst: primary
                .and_then(|f| Some(self.pressure.burst(f.dev?, f.ts_ns)))
                .unwrap_or_default(),
            failures,
            follows: None,
            capacity,
            usage,
            recommendation,
            files,
            removed,
            explanation,
            leftovers,
            others,
            program_alternatives,
            lost_events: self.lost_events,
        }
    }
}

/// For a /dev/shm filled by files grown with write() of which none was finished.
const GROWTH_UNSEEN: &str = "/dev/shm is too small, but by how much is in no call: its files \
     grow by write() with no size asked first, and none reached its full size before the \
     failures. Measure it on a roomy /dev/shm (shmtrace size -- CMD, or shmtrace size \
     --container NAME with a large --shm-size), and set that";

impl Diagnoser {
    /// When `failure` is a write to a file grown by writes (or a fault in one), what the
    /// writers on its /dev/shm show.
    fn grown_by_write(&self, failure: &Failure) -> Option<super::growth::WriteGrowth> {
        match &failure.kind {
            // A bulk write, as growers make: not a 32-byte semaphore's.
            FailureKind::Call {
                syscall: "write",
                request,
                ..
            } if *request >= 4096 => self.write_growth(failure.dev?),
            _ => None,
        }
    }
}

/// For a process that ended after looking at /dev/shm's free space, when its rule is not known.
const NEED_UNSEEN: &str = "what it saw of /dev/shm's free space is the likely reason it ended: \
     programs such as vLLM refuse to start when /dev/shm is small. What it needs is in no call \
     it made: measure it on a roomy /dev/shm (shmtrace size -- CMD, or shmtrace size \
     --container NAME with a large --shm-size), and set that";

/// For causes a bigger /dev/shm does not fix: what does.
fn explain(cause: Cause) -> Option<String> {
    let text = match cause {
        Cause::ShmFull | Cause::Leftovers | Cause::InodesFull | Cause::NameRemoved => {
            return None;
        }
        Cause::NoDirectory => {
            "a directory under /dev/shm that it creates files in does not exist (never made, or removed by a clean-up); /dev/shm itself is there. Make the directory before the program starts, or find what removes it"
        }
        Cause::HugePages => {
            "it asked for huge pages (SHM_HUGETLB or MAP_HUGETLB) and the pool had none left: neither /dev/shm nor kernel.shmmax refused it. Reserve more (sysctl -w vm.nr_hugepages=N; see HugePages_Free in /proc/meminfo), or let the program use ordinary pages"
        }
        Cause::NoShm => {
            "there is no /dev/shm to create files in: the container was started with \
             --ipc=none, or its image or sandbox has no /dev/shm. Give it one: drop --ipc=none \
             (docker run --ipc=private --shm-size=64m ..., compose ipc: private), or mount a \
             tmpfs there (docker run --tmpfs /dev/shm:rw,size=64m; Kubernetes: an emptyDir \
             with medium: Memory mounted at /dev/shm)"
        }
        Cause::ReadOnly => {
            "/dev/shm is mounted read-only (EROFS): programs need to create files there. \
             Mount it read-write (docker run --tmpfs /dev/shm:rw,size=64m, or drop ro/readonly \
             from its mount; Kubernetes: readOnly: false on the /dev/shm volumeMount)"
        }
        Cause::OomKill => {
            "the OOM killer ended it: the memory limit was reached. /dev/shm pages count \
             against the container's memory limit, so a bigger --shm-size alone makes this \
             worse: raise the memory limit (docker --memory, Kubernetes resources.limits.memory) \
             or use less /dev/shm"
        }
        Cause::MapLimit => {
            "mmap failed with ENOMEM: the process reached vm.max_map_count, not the end of \
             /dev/shm. Raise it (sysctl -w vm.max_map_count=262144) or keep fewer mappings"
        }
        Cause::FdLimit => {
            "it ran out of file descriptors (EMFILE/ENFILE), not of /dev/shm. Raise the limit \
             (ulimit -n 65536; docker run --ulimit nofile=65536:65536), or in PyTorch use \
             torch.multiprocessing.set_sharing_strategy('file_system')"
        }
        Cause::SysvLimit => {
            "a System V shared memory limit refused it (kernel.shmmax for one segment, \
             kernel.shmall for all, kernel.shmmni for their number; see ipcs -l): raise it with \
             sysctl, or docker run --sysctl kernel.shmmax=..."
        }
        Cause::Crash => {
            "it died of a signal with no /dev/shm failure before it: not a /dev/shm problem"
        }
        Cause::Other => "no /dev/shm failure was seen before it ended: not a /dev/shm problem",
    };
    Some(text.to_owned())
}

impl RemovedName {
    /// The cause, in words: what was removed, by whom, who still held it, and how long
    /// before the open that failed.
    pub fn cause_text(&self) -> String {
        use crate::event::escape::text;
        let holders = self
            .holders
            .iter()
            .map(|h| format!("pid {} {}", h.pid, text(&h.comm)))
            .collect::<Vec<_>>()
            .join(", ");
        let command = if self.by_argv.is_empty() {
            String::new()
        } else {
            format!(
                ", running `{}`",
                self.by_argv
                    .iter()
                    .map(|a| text(a))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        };
        format!(
            "{} was removed {:.2} s before this call by pid {} {} (in {}{command}) while {holders} \
             still held it: the name was gone, not /dev/shm's room. Find what removes names in \
             use (a clean-up script or cron sweep, a start-up wipe of /dev/shm, systemd-logind's \
             RemoveIPC=yes, a sibling's clean-up) and keep it from them",
            text(&self.path),
            self.ns_before as f64 / 1e9,
            self.by_pid,
            text(&self.by_comm),
            text(&self.by_place)
        )
    }
}

/// A failure on a PostgreSQL segment speaks for every process of its parallel query, not only
/// for those that shared its objects when it failed.
fn with_whole_query(primary: &Failure, world: &World) -> Failure {
    let mut primary = primary.clone();
    if pressure::is_postgres_segment(&primary.kind) {
        let query = parallel_query::processes(primary.pid, primary.ts_ns, world);
        primary.peers = primary.peers.max(query - 1);
    }
    primary
}
