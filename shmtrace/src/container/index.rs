//! Which container a process belongs to, for labelling events in host-wide mode.
//!
//! Events carry the mount namespace (and cgroup id) of the acting task; a container's
//! processes share its mount namespace. The index maps those back to containers, and a process
//! in none of them is `host`.
use std::{collections::HashMap, fmt};

use super::{
    Container, Runtime,
    cgroup::{self, PathClass},
    short_id,
};
use crate::proc_scan;

/// Containers by mount namespace and by cgroup v2 id.
#[derive(Clone, Debug, Default)]
pub struct ContainerIndex {
    containers: Vec<Container>,
    by_mntns: HashMap<u32, usize>,
    by_cgroup: HashMap<u64, usize>,
}

/// What to call the container of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label<'a> {
    /// Not in any container.
    Host,
    Container(&'a Container),
    /// In a container (by its cgroup) that the index does not hold yet: one started since it
    /// was built. Rebuild the index to describe it.
    Unlisted {
        runtime: Runtime,
    },
}

impl fmt::Display for Label<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Label::Host => f.write_str("host"),
            Label::Container(container) => f.write_str(&container.display_name()),
            Label::Unlisted { runtime } => write!(f, "{runtime} container"),
        }
    }
}

impl ContainerIndex {
    pub fn new(containers: Vec<Container>) -> ContainerIndex {
        let mut index = ContainerIndex::default();
        for container in containers {
            index.insert(container);
        }
        index
    }

    /// Adds or replaces (same id) a container, for one started or restarted since.
    pub fn insert(&mut self, container: Container) {
        let slot = match self.containers.iter().position(|c| c.id == container.id) {
            Some(slot) => {
                let old = &self.containers[slot];
                if let Some(ns) = old.mntns {
                    self.by_mntns.remove(&ns);
                }
                if let Some(id) = old.cgroup_id {
                    self.by_cgroup.remove(&id);
                }
                self.containers[slot] = container;
                slot
            }
            None => {
                self.containers.push(container);
                self.containers.len() - 1
            }
        };
        let container = &self.containers[slot];
        if let Some(ns) = container.mntns {
            self.by_mntns.insert(ns, slot);
        }
        if let Some(id) = container.cgroup_id {
            self.by_cgroup.insert(id, slot);
        }
    }

    pub fn containers(&self) -> &[Container] {
        &self.containers
    }

    /// The container of an event, from its mount namespace, or its cgroup v2 id where that
    /// identifies containers.
    pub fn label(&self, mntns: u32, cgroup_id: u64) -> Label<'_> {
        self.by_mntns
            .get(&mntns)
            .or_else(|| self.by_cgroup.get(&cgroup_id))
            .map_or(Label::Host, |slot| {
                Label::Container(&self.containers[*slot])
            })
    }

    /// The container of a mount namespace.
    pub fn for_mntns(&self, mntns: u32) -> Label<'_> {
        self.by_mntns.get(&mntns).map_or(Label::Host, |slot| {
            Label::Container(&self.containers[*slot])
        })
    }

    /// The container of a live process: by its mount namespace, else by its cgroup path
    /// (a container the index does not know yet shows as [`Label::Unlisted`]).
    pub fn for_pid(&self, pid: u32) -> Label<'_> {
        if let Some(label @ Label::Container(_)) =
            proc_scan::mount_namespace(pid).map(|ns| self.for_mntns(ns))
        {
            return label;
        }
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return Label::Host;
        };
        match cgroup::parse_proc_cgroup(&text) {
            PathClass::Container(found) => {
                match self.containers.iter().find(|c| c.id == found.id) {
                    Some(container) => Label::Container(container),
                    None => Label::Unlisted {
                        runtime: found.runtime,
                    },
                }
            }
            _ => Label::Host,
        }
    }
}

/// `docker 3f4e1bd2c2d8`: a container known only by id.
pub fn id_label(runtime: Runtime, id: &str) -> String {
    format!("{runtime} {}", short_id(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::{FoundBy, IpcMode, ShmInfo, State};

    fn container(id: &str, name: &str, mntns: u32) -> Container {
        Container {
            runtime: Runtime::Docker,
            found_by: FoundBy::CgroupScan,
            id: id.into(),
            name: name.into(),
            image: None,
            pod: None,
            namespace: None,
            pod_uid: None,
            sandbox_id: None,
            labels: Default::default(),
            pid: Some(1),
            mntns: Some(mntns),
            cgroup_id: None,
            shm: ShmInfo::default(),
            ipc: IpcMode::Private,
            state: State::Running,
        }
    }

    #[test]
    fn labels_by_mount_namespace_and_says_host_otherwise() {
        let mut index =
            ContainerIndex::new(vec![container("a", "web", 10), container("b", "db", 20)]);
        assert_eq!(index.label(10, 1).to_string(), "web");
        assert_eq!(index.for_mntns(30), Label::Host);
        assert_eq!(index.label(30, 1).to_string(), "host");
        // A restart gives the same id a new namespace: the old one no longer matches.
        index.insert(container("a", "web", 11));
        assert_eq!(index.for_mntns(10), Label::Host);
        assert_eq!(index.for_mntns(11).to_string(), "web");
        assert_eq!(index.containers().len(), 2);
        // Hostile names are escaped.
        index.insert(container("c", "evil\x1b[2J\nname", 40));
        assert_eq!(index.for_mntns(40).to_string(), "evil\\x1b[2J\\nname");
        let json = index.containers()[2].to_json().to_string();
        assert!(json.contains(r#""name":"evil\u001b[2J\nname""#), "{json}");
    }

    #[test]
    fn our_own_process_is_on_the_host() {
        let index = ContainerIndex::new(vec![container("a", "web", 10)]);
        assert_eq!(index.for_pid(std::process::id()), Label::Host);
        assert_eq!(
            id_label(Runtime::Podman, &"f".repeat(64)),
            "podman ffffffffffff"
        );
    }
}
