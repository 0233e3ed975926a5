//! What each container is called, by id: as the runtime lists it while it runs, else as its
//! events said when it was created or started (a container `docker run --rm` removes a moment
//! after it starts is never listed running), else as the runtime described it when asked, else
//! as its list of stopped containers shows it. Kept a while after the container is gone, for
//! its last records and diagnoses.
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{metrics::ContainerLabels, whose::ContainerRef};
use crate::container::{Action, Candidate, Container, RuntimeEvent};
use shmtrace_core::model::{ContainerInfo, StartedBy};

/// A container's name and what the events and diagnoses say of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub labels: ContainerLabels,
    pub info: ContainerInfo,
    /// Gone (not listed, or removed) since.
    gone_since: Option<Instant>,
}

/// How long a gone container's name is kept: its last records are read, and its diagnoses
/// made, within seconds; a starved daemon may take longer.
const KEPT_AFTER_GONE: Duration = Duration::from_secs(300);
/// Most names kept; beyond, the longest gone go first.
const MAX_NAMES: usize = 16_384;

#[derive(Default)]
pub struct Names {
    by_id: HashMap<Arc<str>, Arc<Named>>,
}

impl Names {
    pub fn get(&self, id: &str) -> Option<&Arc<Named>> {
        self.by_id.get(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// A container the runtimes list as running: its name now.
    pub fn listed(&mut self, container: &Container) {
        let info = container.info();
        self.put(&container.id, labels_of(&info), info);
    }

    /// A container the runtimes list as stopped: the name its list shows, unless a fuller
    /// description is known.
    pub fn stopped(&mut self, candidate: &Candidate, now: Instant) {
        if self.by_id.contains_key(candidate.id.as_str()) {
            self.gone(&candidate.id, now);
            return;
        }
        let info = ContainerInfo {
            started_by: StartedBy::detect(candidate.runtime.as_str(), &Default::default()),
            runtime: candidate.runtime.as_str().to_owned(),
            id: candidate.id.clone(),
            name: candidate.name.clone(),
            pod: candidate.pod.clone(),
            namespace: candidate.namespace.clone(),
            ..ContainerInfo::default()
        };
        self.put(&candidate.id, labels_of(&info), info);
        self.gone(&candidate.id, now);
    }

    /// A container's event: its name and labels as they were then.
    pub fn event(&mut self, event: &RuntimeEvent, now: Instant) {
        let runtime = event.runtime.as_str().to_owned();
        let mut info = self
            .by_id
            .get(event.id.as_str())
            .map(|n| n.info.clone())
            .unwrap_or_else(|| ContainerInfo {
                runtime: runtime.clone(),
                id: event.id.clone(),
                ..ContainerInfo::default()
            });
        if !event.name.is_empty() {
            info.name = event.name.clone();
        }
        info.image = event.image.clone().or(info.image);
        info.pod = event.pod.clone().or(info.pod);
        info.namespace = event.namespace.clone().or(info.namespace);
        info.started_by = StartedBy::detect(&runtime, &event.labels);
        let before = self.by_id.get(event.id.as_str()).and_then(|n| n.gone_since);
        let gone = match event.action {
            Action::Created | Action::Started => None,
            Action::Renamed => before,
            Action::Died | Action::Destroyed => Some(before.unwrap_or(now)),
        };
        self.put(&event.id, labels_of(&info), info);
        if let Some(since) = gone {
            self.gone(&event.id, since);
        }
    }

    /// A container the runtime described when asked (it may have stopped since).
    pub fn described(&mut self, container: &Container, now: Instant) {
        let info = container.info();
        self.put(&container.id, labels_of(&info), info);
        if !container.state.is_running() {
            self.gone(&container.id, now);
        }
    }

    /// The container is gone (removed, or no longer listed) since `since`.
    pub fn gone(&mut self, id: &str, since: Instant) {
        if let Some(named) = self.by_id.get_mut(id) {
            Arc::make_mut(named).gone_since.get_or_insert(since);
        }
    }

    fn put(&mut self, id: &str, labels: ContainerLabels, info: ContainerInfo) {
        if !self.by_id.contains_key(id) && self.by_id.len() >= MAX_NAMES {
            let oldest = self
                .by_id
                .iter()
                .filter_map(|(id, n)| Some((n.gone_since?, id.clone())))
                .min();
            if let Some((_, id)) = oldest {
                self.by_id.remove(&id);
            }
        }
        self.by_id.insert(
            Arc::from(id),
            Arc::new(Named {
                labels,
                info,
                gone_since: None,
            }),
        );
    }

    /// Forgets the names of containers gone long enough.
    pub fn prune(&mut self, now: Instant) {
        self.by_id.retain(|_, named| {
            named
                .gone_since
                .is_none_or(|since| now.duration_since(since) < KEPT_AFTER_GONE)
        });
    }
}

/// The labels of a container's series: its name (its short id when it has none), pod,
/// namespace and runtime.
pub fn labels_of(info: &ContainerInfo) -> ContainerLabels {
    ContainerLabels {
        container: if info.name.is_empty() {
            shmtrace_core::model::short_id(&info.id).to_owned()
        } else {
            info.name.clone()
        },
        pod: info.pod.clone().unwrap_or_default(),
        namespace: info.namespace.clone().unwrap_or_default(),
        runtime: info.runtime.clone(),
    }
}

/// What is said of a container that no runtime named (it was gone before it could be asked,
/// and no event named it): its runtime and id.
pub fn unnamed(container: &ContainerRef) -> Arc<Named> {
    let info = ContainerInfo {
        runtime: container.runtime.as_str().to_owned(),
        id: container.id.to_string(),
        ..ContainerInfo::default()
    };
    Arc::new(Named {
        labels: labels_of(&info),
        info,
        gone_since: None,
    })
}
