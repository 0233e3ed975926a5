//! What the runtimes say between surveys, on the daemon's I/O thread: containers' cgroups
//! as they are made (so that a record's cgroup id names its container however late it is
//! read), every Docker-API
//! runtime's event stream (containers named as they are created and start, however soon they
//! are removed; a started one described at once, while its main process runs, so that its
//! namespace and cgroup are known before its records are read), and the description of a
//! container the event loop wants named. Everything goes to the event loop as [`News`].
use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::mpsc;

use super::whose::ContainerRef;
use crate::{
    container::{
        Action, CgroupMatch, CgroupTree, CgroupWatch, Container, Resolver, Runtime, RuntimeEvent,
        watch_events,
    },
    live::proc_scan::start_ns,
};

/// What the runtimes said.
pub enum News {
    Event(RuntimeEvent),
    /// The cgroup (its v2 id) a container's processes are in, found as it started.
    Cgroup {
        id: u64,
        container: ContainerRef,
    },
    /// A container described, with its main process's start (`CLOCK_BOOTTIME` ns) if it runs.
    Described {
        container: Box<Container>,
        started_ns: Option<u64>,
    },
}

/// Most news waiting for the event loop; beyond, news is dropped (what it would have named
/// is named by a survey or a description instead, a moment later).
const QUEUE: usize = 4096;
/// How long a runtime's stream is waited for again after it ended or failed.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
/// Descriptions asked for at once, at most.
const DESCRIBING_AT_ONCE: usize = 4;

/// What the tasks share.
struct Shared {
    resolver: Resolver,
    tree: Option<CgroupTree>,
    news: mpsc::Sender<News>,
    describing: tokio::sync::Semaphore,
}

pub struct Runtimes(Arc<Shared>);

impl Runtimes {
    /// Starts following the event streams of the runtimes `resolver` reaches; returns the
    /// handle that asks for descriptions, and where the news arrives.
    pub fn start(resolver: Resolver) -> (Runtimes, mpsc::Receiver<News>) {
        let (news, receiver) = mpsc::channel(QUEUE);
        let shared = Arc::new(Shared {
            tree: CgroupTree::open(),
            describing: tokio::sync::Semaphore::new(DESCRIBING_AT_ONCE),
            resolver,
            news,
        });
        for (runtime, socket) in shared.resolver.event_sockets() {
            tokio::spawn(follow(runtime, socket, shared.clone()));
        }
        if let Some(tree) = &shared.tree {
            match CgroupWatch::start(tree.root()) {
                Ok((watch, already)) => {
                    send_cgroups(&shared.news, already);
                    tokio::spawn(watch_cgroups(watch, shared.news.clone()));
                }
                Err(error) => log::warn!("cannot watch the cgroup tree: {error}"),
            }
        }
        (Runtimes(shared), receiver)
    }

    /// Asks the runtime for `container` (its name is wanted); the answer comes as news.
    pub fn describe(&self, container: ContainerRef) {
        describe_in_background(self.0.clone(), container.runtime, container.id.to_string());
    }
}

/// One runtime's event stream, for as long as the daemon runs: read, and read again from the
/// last event seen when it ends. A container that starts is described at once, beside it.
async fn follow(runtime: Runtime, socket: PathBuf, shared: Arc<Shared>) {
    let mut since = None;
    loop {
        let answer = watch_events(&socket, runtime, Duration::from_secs(5), since, |event| {
            let started = event.action == Action::Started;
            let (runtime, id) = (event.runtime, event.id.clone());
            let _ = shared.news.try_send(News::Event(event));
            if started {
                // Its cgroup first, by the runtime's layout: the container may be gone before
                // the runtime describes it.
                if let Some(tree) = &shared.tree
                    && let Some(cgroup) = tree.id_of_container(runtime, &id)
                {
                    let _ = shared.news.try_send(News::Cgroup {
                        id: cgroup,
                        container: ContainerRef::new(runtime, &id),
                    });
                }
                describe_in_background(shared.clone(), runtime, id);
            }
        })
        .await;
        match answer {
            Ok(last) => since = last.or(since),
            Err(error) => log::debug!("{runtime}'s event stream: {error}"),
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

/// Containers' cgroups as they are made, for as long as the daemon runs.
async fn watch_cgroups(mut watch: CgroupWatch, news: mpsc::Sender<News>) {
    loop {
        match watch.next().await {
            Ok(made) => send_cgroups(&news, made),
            Err(error) => {
                log::warn!("watching the cgroup tree: {error}");
                return;
            }
        }
    }
}

fn send_cgroups(news: &mpsc::Sender<News>, cgroups: Vec<(u64, CgroupMatch)>) {
    for (id, found) in cgroups {
        let _ = news.try_send(News::Cgroup {
            id,
            container: ContainerRef::new(found.runtime, &found.id),
        });
    }
}

fn describe_in_background(shared: Arc<Shared>, runtime: Runtime, id: String) {
    tokio::spawn(async move {
        let Ok(_permit) = shared.describing.acquire().await else {
            return;
        };
        let Some(mut container) = shared.resolver.describe_id(runtime, &id).await else {
            return;
        };
        let pid = container.pid.filter(|_| container.state.is_running());
        if container.cgroup_id.is_none()
            && let (Some(pid), Some(tree)) = (pid, &shared.tree)
        {
            container.cgroup_id = tree.id_of(pid);
        }
        let _ = shared.news.try_send(News::Described {
            started_ns: pid.and_then(start_ns),
            container: Box::new(container),
        });
    });
}
