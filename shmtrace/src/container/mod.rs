//! Finding containers and describing them: which runtime runs them, their main process and
//! mount namespace (what the kernel filter matches), their labels, and their /dev/shm.
//!
//! - `docker` talks to the Docker Engine API (and Podman's Docker-compatible API) over a unix
//!   socket, through `http`.
//! - `cri` talks to containerd and CRI-O through the Kubernetes CRI gRPC API.
//! - `cgroup` reads a process's cgroup paths and knows every runtime's layout; `scan` uses it
//!   to find containers from /proc alone when no runtime socket answers; `cgroup_tree` turns
//!   the cgroup v2 id a kernel record carries into its container, even once its process is
//!   gone; `cgroup_watch` sees containers' cgroups as the runtimes make them.
//! - `docker_events` follows the Docker (and Podman) event stream: containers named as they
//!   start, however soon they are removed.
//! - `shm` measures a container's /dev/shm through its root, safely (`rootfs`); `memory` reads
//!   the memory limit of this process's own cgroup and what it counts.
//! - `resolve` ties them together: look up by name or id, wait for a container to start, notice
//!   a restart. `index` labels processes (by pid or mount namespace) with their container.
//!
//! Everything here is library code the CLI calls; nothing prints. Names and labels come from
//! whoever created the container: display them with [`Container::display_name`] and
//! [`shmtrace_core::event::escape`], never raw.

mod cgroup;
mod cgroup_tree;
mod cgroup_watch;
mod client;
mod cri;
mod docker;
mod docker_events;
mod endpoints;
mod error;
#[cfg(fuzzing)]
pub mod fuzzing;
mod host;
pub mod memory;
mod resolve;
mod rootfs;
mod scan;
mod shm;
mod unix_http;

use std::{collections::BTreeMap, fmt, path::PathBuf};

pub use cgroup_tree::{CgroupOwner, CgroupTree};
pub use cgroup_watch::CgroupWatch;
pub use client::Candidate;
pub use docker_events::{Action, RuntimeEvent, watch as watch_events};
pub use error::ContainerError;
pub use resolve::{Change, Query, Resolver};
pub use shm::{ShmFile, ShmInfo, list_shm_files, measure_shm};
// What the runtime tests (tests/tests/*_runtimes.rs) reach for beyond what the CLI uses.
pub use cgroup::{CgroupMatch, PathClass, QosClass, parse_proc_cgroup};
pub use cri::{channel, proto};
pub use endpoints::Endpoint;
pub use host::cgroup_v2_id;
pub use shm::{ShmError, ShmSource, host_shm_dev};
// The one short-id and name formatters, for the runtime clients and the live side.
pub use client::id_label;
pub use shmtrace_core::model::short_id;

use shmtrace_core::event::escape;

/// Which container runtime runs a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Runtime {
    Docker,
    Podman,
    Containerd,
    CriO,
    /// Found by the cgroup scan under a layout that does not name its runtime (the kubelet's
    /// cgroupfs driver: `/kubepods/<qos>/pod<uid>/<id>`).
    Unknown,
}

impl Runtime {
    /// Lower-case name, as in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a container was found: from its runtime's API (names, images, labels and configured
/// /dev/shm size are known), or by the fallback scan of `/proc/*/cgroup` (only ids and what
/// /proc shows). The CLI tells the user when the fallback was used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FoundBy {
    Api { socket: PathBuf },
    CgroupScan,
}

/// What a container is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Created,
    Running,
    Paused,
    Restarting,
    Exited {
        code: Option<i64>,
    },
    Removing,
    Dead,
    /// A state this version does not know, as the runtime spelled it (escaped).
    Other(String),
}

impl State {
    /// Whether the container has processes that can be traced.
    pub fn is_running(&self) -> bool {
        matches!(self, State::Running | State::Paused)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            State::Created => f.write_str("created (never started)"),
            State::Running => f.write_str("running"),
            State::Paused => f.write_str("paused"),
            State::Restarting => f.write_str("restarting"),
            State::Exited { code: Some(code) } => write!(f, "exited with status {code}"),
            State::Exited { code: None } => f.write_str("exited"),
            State::Removing => f.write_str("being removed"),
            State::Dead => f.write_str("dead"),
            State::Other(text) => f.write_str(text),
        }
    }
}

/// Whose IPC namespace, and so whose /dev/shm, a container uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpcMode {
    /// Its own /dev/shm (Docker's `private`).
    Private,
    /// Its own /dev/shm, which other containers may join (Docker's `shareable`).
    Shareable,
    /// The host's /dev/shm (`--ipc=host`, or `hostIPC: true` in Kubernetes): every process on
    /// the host competes for the same space.
    Host,
    /// Another container's /dev/shm (`--ipc=container:NAME`); the value is what the runtime
    /// reported, a name or an id.
    Container(String),
    /// The /dev/shm of its pod's sandbox, shared by all containers of the pod (Kubernetes).
    PodSandbox { sandbox_id: String },
    /// No /dev/shm is mounted (Docker's `none`).
    NoShm,
    /// Not reported by the runtime, and not told apart by measurement.
    Unknown,
}

impl IpcMode {
    /// Words for a human line: `private`, `host`, `shared with container db`...
    pub fn describe(&self) -> String {
        match self {
            IpcMode::Private => "private".into(),
            IpcMode::Shareable => "private (shareable)".into(),
            IpcMode::Host => "the host's (--ipc=host)".into(),
            // Docker reports the id the name stood for: its short form, as `docker ps` has.
            IpcMode::Container(other) if cgroup::is_full_id(other) => {
                format!("shared with container {}", short_id(other))
            }
            IpcMode::Container(other) => format!("shared with container {}", escape::text(other)),
            IpcMode::PodSandbox { sandbox_id } => {
                format!("shared by the pod (sandbox {})", short_id(sandbox_id))
            }
            IpcMode::NoShm => "none (--ipc=none)".into(),
            IpcMode::Unknown => "unknown".into(),
        }
    }
}

/// A container, as its runtime (or the cgroup scan) describes it.
///
/// Strings are as the runtime gave them: they may hold anything. Escape before display.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub runtime: Runtime,
    pub found_by: FoundBy,
    /// Full id (64 hex digits for every runtime this module knows).
    pub id: String,
    /// Name without Docker's leading `/`; for Kubernetes the container's name in its pod.
    /// Empty when unknown (cgroup scan).
    pub name: String,
    /// Image as the user named it (`Config.Image`), or the CRI image reference.
    pub image: Option<String>,
    /// Kubernetes pod name (`io.kubernetes.pod.name`).
    pub pod: Option<String>,
    /// Kubernetes namespace (`io.kubernetes.pod.namespace`).
    pub namespace: Option<String>,
    /// Kubernetes pod uid, from the labels or the cgroup path.
    pub pod_uid: Option<String>,
    /// The pod sandbox this container belongs to (CRI).
    pub sandbox_id: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Main (init) process, in the host's pid namespace; `None` when not running.
    pub pid: Option<u32>,
    /// Mount namespace inode of the main process (`/proc/PID/ns/mnt`): what the kernel filter
    /// matches on every host.
    pub mntns: Option<u32>,
    /// cgroup v2 id of the main process's cgroup, only on a pure cgroup v2 host, where it
    /// identifies the container (on hybrid v1 hosts every task reports cgroup id 1).
    pub cgroup_id: Option<u64>,
    pub shm: ShmInfo,
    pub ipc: IpcMode,
    pub state: State,
}

impl Container {
    /// The first 12 characters of the id, as `docker ps` shows it.
    pub fn short_id(&self) -> &str {
        short_id(&self.id)
    }

    /// The name safe to print: escaped, the short id when the name is unknown, and
    /// `namespace/pod/name` for Kubernetes containers.
    pub fn display_name(&self) -> String {
        shmtrace_core::model::container_label(
            &self.name,
            &self.id,
            self.namespace.as_deref(),
            self.pod.as_deref(),
        )
    }

    /// What events, diagnoses and trace files keep of it.
    pub fn info(&self) -> shmtrace_core::model::ContainerInfo {
        let runtime = self.runtime.as_str().to_owned();
        shmtrace_core::model::ContainerInfo {
            started_by: shmtrace_core::model::StartedBy::detect(&runtime, &self.labels),
            runtime,
            id: self.id.clone(),
            name: self.name.clone(),
            image: self.image.clone(),
            pod: self.pod.clone(),
            namespace: self.namespace.clone(),
            shm_size: self.shm.size_bytes(),
            shm_used: self.shm.used_bytes(),
            ipc: self.ipc.describe(),
            mntns: self.mntns,
            shm_dev: self.shm.dev(),
        }
    }
}
