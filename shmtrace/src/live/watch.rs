//! Following containers while tracing: a container restarted under the same name gets a new
//! mount namespace, which the kernel filter must learn; one that stops must leave the filter
//! (its namespace number may be reused). Each traced container's /dev/shm is measured every
//! second, for the use-over-time picture and for `shm_used` in events. In host-wide mode, new
//! containers are learned so that events are labelled with them.
//!
//! While a followed container is not running, the probes hold what processes outside
//! shmtrace's namespace do (`live::hold`): when the container starts, its first processes'
//! records are released from the hold rather than missed in the second before it is seen.
use std::collections::HashMap;

use anyhow::Result;

use crate::{
    container::{Change, Container, IpcMode, Resolver},
    live::{bpf::Tracer, hold::Hold, proc_scan},
};
use shmtrace_core::{clock::boot_ns, pipeline::Pipeline};

pub enum Watch {
    /// `--container`: these containers, by what the user asked for.
    Containers {
        resolver: Resolver,
        followed: Vec<Followed>,
        /// Containers not followed that share a followed one's /dev/shm, by mount namespace
        /// (their id): named so that a diagnosis can say who holds the rest of it.
        sharers: HashMap<u32, String>,
    },
    /// `--all`: every running container, for labels, by mount namespace. Namespace numbers
    /// are reused once a container is gone, so the map is rebuilt from what runs now.
    Host {
        resolver: Resolver,
        labelled: HashMap<u32, String>,
    },
}

/// One container followed through its life.
pub struct Followed {
    pub container: Container,
    /// Running now (a stopped one is waited for).
    pub running: bool,
    /// Its first process was seen exiting, and its runtime has not said since what became of
    /// it: the probes hold records until it has (see `live::hold`).
    pub ending: bool,
}

impl Watch {
    pub fn containers(resolver: Resolver, containers: Vec<Container>) -> Watch {
        Watch::Containers {
            resolver,
            followed: containers
                .into_iter()
                .map(|container| Followed {
                    running: container.state.is_running(),
                    ending: false,
                    container,
                })
                .collect(),
            sharers: HashMap::new(),
        }
    }

    pub fn host(resolver: Resolver) -> Watch {
        Watch::Host {
            resolver,
            labelled: HashMap::new(),
        }
    }

    /// `pid` exited: if it was a followed container's first process, that container is
    /// ending, and this is its mount namespace.
    pub fn ended_by(&mut self, pid: u32) -> Option<u32> {
        match self {
            Watch::Containers { followed, .. } => {
                let one = followed
                    .iter_mut()
                    .find(|one| one.container.pid == Some(pid))?;
                one.ending = true;
                one.container.mntns
            }
            Watch::Host { .. } => None,
        }
    }

    /// Runs once a second.
    pub async fn check(
        &mut self,
        tracer: &mut Tracer,
        pipeline: &mut Pipeline,
        hold: &mut Hold,
    ) -> Result<()> {
        match self {
            Watch::Containers {
                resolver, followed, ..
            } => {
                for one in followed.iter_mut() {
                    follow(resolver, one, tracer, pipeline, hold).await?;
                }
                // Every second, as the probes start holding themselves when a followed
                // container's first process exits.
                tracer.hold(followed.iter().any(|one| !one.running || one.ending))?;
                self.name_sharers(pipeline).await?;
            }
            Watch::Host { resolver, labelled } => {
                let (containers, _problems) = resolver.running().await;
                let running: HashMap<u32, &Container> = containers
                    .iter()
                    .filter(|c| c.state.is_running())
                    .filter_map(|c| Some((c.mntns?, c)))
                    .collect();
                let gone: Vec<u32> = labelled
                    .iter()
                    .filter(|(mntns, id)| running.get(*mntns).is_none_or(|c| c.id != **id))
                    .map(|(mntns, _)| *mntns)
                    .collect();
                let now_ns = boot_ns().unwrap_or(0);
                for mntns in gone {
                    labelled.remove(&mntns);
                    pipeline.forget_container(mntns, now_ns)?;
                }
                for (mntns, container) in running {
                    if let std::collections::hash_map::Entry::Vacant(entry) = labelled.entry(mntns)
                    {
                        register(container, tracer, pipeline)?;
                        entry.insert(container.id.clone());
                    }
                }
            }
        }
        Ok(())
    }
}

impl Watch {
    /// Tells the pipeline about the containers that share a followed container's /dev/shm
    /// (`--ipc=container:`, `--ipc=shareable`, `--ipc=host`, a pod's): they are not traced,
    /// but what they hold of it is named in a diagnosis, by their names. Only when a followed
    /// container's /dev/shm can be shared, as it asks every runtime about every container.
    pub async fn name_sharers(&mut self, pipeline: &mut Pipeline) -> Result<()> {
        let Watch::Containers {
            resolver,
            followed,
            sharers,
        } = self
        else {
            return Ok(());
        };
        let devs: Vec<u32> = followed
            .iter()
            .filter(|one| one.running && can_share(&one.container.ipc))
            .filter_map(|one| one.container.shm.dev())
            .collect();
        if devs.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = followed
            .iter()
            .map(|one| one.container.id.as_str())
            .collect();
        let (containers, _problems) = resolver.running().await;
        for container in containers.iter().filter(|c| c.state.is_running()) {
            let (Some(mntns), Some(dev)) = (container.mntns, container.shm.dev()) else {
                continue;
            };
            if !devs.contains(&dev)
                || ids.contains(&container.id.as_str())
                || sharers.get(&mntns) == Some(&container.id)
            {
                continue;
            }
            pipeline.set_container(container.info(), boot_ns()?)?;
            sharers.insert(mntns, container.id.clone());
        }
        Ok(())
    }
}

/// Whether others may use a container's /dev/shm too.
fn can_share(ipc: &IpcMode) -> bool {
    matches!(
        ipc,
        IpcMode::Shareable | IpcMode::Host | IpcMode::Container(_) | IpcMode::PodSandbox { .. }
    )
}

async fn follow(
    resolver: &Resolver,
    one: &mut Followed,
    tracer: &mut Tracer,
    pipeline: &mut Pipeline,
    hold: &mut Hold,
) -> Result<()> {
    let name = one.container.display_name();
    let change = match resolver.recheck(&one.container).await {
        Ok(change) => change,
        Err(error) => {
            log::debug!("rechecking container {name}: {error}");
            return Ok(());
        }
    };
    match change {
        Change::Unchanged if one.running => sample(&one.container, pipeline)?,
        Change::Unchanged => {}
        Change::Restarted { container, same_id } => {
            if let Some(old) = one.container.mntns {
                tracer.remove_mount_namespace(old)?;
                hold.unfollow(old);
            }
            register(&container, tracer, pipeline)?;
            follow_processes(&container, tracer)?;
            release_held(&container, hold, pipeline)?;
            pipeline.notice(&format!(
                "container {name} {} (pid {}): following it",
                if same_id {
                    "restarted"
                } else {
                    "was replaced by a new one of that name"
                },
                container
                    .pid
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "?".into())
            ))?;
            one.container = *container;
            one.running = true;
            one.ending = false;
        }
        Change::Stopped { container } => {
            one.ending = false;
            if one.running {
                if let Some(old) = one.container.mntns {
                    tracer.remove_mount_namespace(old)?;
                    hold.unfollow(old);
                }
                pipeline.notice(&format!(
                    "container {name} stopped ({}); waiting for it to start again (Ctrl-C to \
                     stop)",
                    container.state
                ))?;
                one.running = false;
            }
            one.container = *container;
        }
        Change::Gone => {
            one.ending = false;
            if one.running {
                if let Some(old) = one.container.mntns {
                    tracer.remove_mount_namespace(old)?;
                    hold.unfollow(old);
                }
                pipeline.notice(&format!(
                    "container {name} was removed; waiting for a container of that name \
                     (Ctrl-C to stop)"
                ))?;
                one.running = false;
            }
        }
    }
    Ok(())
}

/// Puts a container in the kernel filter and tells the pipeline what it is.
pub fn register(container: &Container, tracer: &mut Tracer, pipeline: &mut Pipeline) -> Result<()> {
    if let Some(dev) = container.shm.dev() {
        tracer.add_shm_dev(dev, container.shm.is_tmpfs)?;
    }
    pipeline.set_container(container.info(), boot_ns()?)?;
    sample(container, pipeline)
}

/// Follows a container's processes (`--container`, not `--all`, which sees everyone): by
/// its namespace, and those running now by pid too, so that they stay followed to their
/// exit when the container stops (the probes stop matching its namespace when its first
/// process exits, before the others are killed).
pub fn follow_processes(container: &Container, tracer: &mut Tracer) -> Result<()> {
    if let Some(mntns) = container.mntns {
        tracer.add_mount_namespace(mntns, container.pid)?;
    }
    if let Some(first) = container.pid {
        for pid in proc_scan::process_tree(first) {
            tracer.add_target(pid)?;
        }
    }
    if let Some(cgroup) = container.cgroup_id {
        tracer.add_cgroup(cgroup)?;
    }
    Ok(())
}

/// Learns the container's running processes and what they already hold on /dev/shm
/// (descriptors, mappings), as `--pid` does: a process that mapped an object before the trace
/// and then dies of SIGBUS in it is gone by the time its fault is read, and its fault would
/// name no file; one killed when the container stops would have no container to its name.
pub fn seed_running(container: &Container, pipeline: &mut Pipeline) -> Result<()> {
    let Some(pid) = container.pid else {
        return Ok(());
    };
    let now = boot_ns()?;
    for pid in proc_scan::process_tree(pid) {
        if let Some(snapshot) = proc_scan::snapshot(pid) {
            pipeline.seed(&snapshot, now)?;
        }
    }
    Ok(())
}

/// Hands the container's held records on (see `live::hold`), saying how many were dropped.
pub fn release_held(container: &Container, hold: &mut Hold, pipeline: &mut Pipeline) -> Result<()> {
    let Some(mntns) = container.mntns else {
        return Ok(());
    };
    let since = container.pid.and_then(proc_scan::start_ns);
    let dropped = hold.follow(mntns, since);
    if dropped > 0 {
        pipeline.notice(&format!(
            "{dropped} records of container {} from before it was found were dropped: more \
             than {} MiB of records of unknown processes waited while it started",
            container.display_name(),
            crate::live::hold::HOLD_BYTES >> 20
        ))?;
    }
    Ok(())
}

/// Measures the container's /dev/shm now.
fn sample(container: &Container, pipeline: &mut Pipeline) -> Result<()> {
    let Some(pid) = container.pid else {
        return Ok(());
    };
    let Ok(shm) = crate::container::measure_shm(pid) else {
        return Ok(());
    };
    if let Some(capacity) = shm.capacity() {
        pipeline.capacity(capacity, Some(pid))?;
    }
    Ok(())
}

/// One line on a container's /dev/shm as it is now: its size, its use, and the files in it
/// (a leftover of an earlier run shows here first). `when`: `` at the start, ` at the end`.
pub fn shm_state(container: &Container, when: &str) -> String {
    use shmtrace_core::units::{count, human};
    let name = container.display_name();
    let Some(pid) = container.pid.filter(|_| container.state.is_running()) else {
        let gone = if container.ipc.describe().starts_with("private") {
            " (its private /dev/shm went with it)"
        } else {
            ""
        };
        return format!("shmtrace: container {name}{when}: not running{gone}");
    };
    let measured = match crate::container::measure_shm(pid) {
        Ok(info) => info.measured,
        Err(error) => return format!("shmtrace: container {name}{when}: /dev/shm: {error}"),
    };
    let Some(capacity) = measured else {
        return format!("shmtrace: container {name}{when}: /dev/shm could not be measured");
    };
    let size = if capacity.is_bounded() {
        human(capacity.size)
    } else {
        "no size limit".to_owned()
    };
    let percent = (capacity.used * 100)
        .checked_div(capacity.size)
        .map(|p| format!(" ({p}%)"))
        .unwrap_or_default();
    let mut files = crate::container::list_shm_files(pid)
        .map(|(_, files)| files)
        .unwrap_or_default();
    files.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    let listed: Vec<String> = files
        .iter()
        .take(3)
        .map(|f| {
            format!(
                "{} ({})",
                shmtrace_core::event::escape::bytes(f.name.as_encoded_bytes()),
                human(f.bytes)
            )
        })
        .collect();
    let there = match files.len() {
        0 => "no files in it".to_owned(),
        n => format!(
            "{} in it: {}{}",
            count(n as u64, "file"),
            listed.join(", "),
            if n > 3 { ", ..." } else { "" }
        ),
    };
    format!(
        "shmtrace: container {name}{when}: /dev/shm {size}, {} used{percent}; {there}",
        human(capacity.used)
    )
}

impl Watch {
    /// [`shm_state`] of each followed container now, for the end of the summary.
    pub fn closing_lines(&self) -> Vec<String> {
        match self {
            Watch::Containers { followed, .. } => followed
                .iter()
                .map(|one| shm_state(&one.container, " at the end"))
                .collect(),
            Watch::Host { .. } => Vec::new(),
        }
    }
}
