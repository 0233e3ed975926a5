//! Where container runtimes listen, and what a socket that did not answer means.
use std::{
    fmt,
    path::{Path, PathBuf},
};

use super::Runtime;

/// Which API a socket speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// The Docker Engine API (Docker, and Podman's compatible service).
    Docker,
    /// The Kubernetes CRI (containerd, CRI-O).
    Cri,
}

/// A runtime's socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// What the socket is expected to be; the answer to the version call corrects it
    /// (Podman behind `/var/run/docker.sock`, CRI-O on a containerd path).
    pub runtime: Runtime,
    pub api: Api,
    pub socket: PathBuf,
}

impl Endpoint {
    pub fn docker(socket: impl Into<PathBuf>) -> Endpoint {
        Endpoint {
            runtime: Runtime::Docker,
            api: Api::Docker,
            socket: socket.into(),
        }
    }

    pub fn podman(socket: impl Into<PathBuf>) -> Endpoint {
        Endpoint {
            runtime: Runtime::Podman,
            api: Api::Docker,
            socket: socket.into(),
        }
    }

    pub fn containerd(socket: impl Into<PathBuf>) -> Endpoint {
        Endpoint {
            runtime: Runtime::Containerd,
            api: Api::Cri,
            socket: socket.into(),
        }
    }

    pub fn crio(socket: impl Into<PathBuf>) -> Endpoint {
        Endpoint {
            runtime: Runtime::CriO,
            api: Api::Cri,
            socket: socket.into(),
        }
    }
}

/// The sockets tried when none is given: `DOCKER_HOST` (a `unix://` one) or Docker's two
/// usual paths, Podman's rootful and every user's rootless socket, containerd (and k3s's), and
/// CRI-O. Paths that are the same socket (`/var/run` is usually a link to `/run`) are tried once.
pub fn defaults() -> Vec<Endpoint> {
    let mut endpoints = Vec::new();
    match std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|host| host.strip_prefix("unix://").map(PathBuf::from))
    {
        Some(socket) => endpoints.push(Endpoint::docker(socket)),
        None => {
            endpoints.push(Endpoint::docker("/var/run/docker.sock"));
            endpoints.push(Endpoint::docker("/run/docker.sock"));
        }
    }
    endpoints.push(Endpoint::podman("/run/podman/podman.sock"));
    if let Ok(users) = std::fs::read_dir("/run/user") {
        let mut rootless: Vec<PathBuf> = users
            .filter_map(Result::ok)
            .map(|user| user.path().join("podman/podman.sock"))
            .collect();
        rootless.sort();
        endpoints.extend(rootless.into_iter().map(Endpoint::podman));
    }
    endpoints.push(Endpoint::containerd("/run/containerd/containerd.sock"));
    endpoints.push(Endpoint::containerd("/run/k3s/containerd/containerd.sock"));
    endpoints.push(Endpoint::crio("/var/run/crio/crio.sock"));
    endpoints.push(Endpoint::crio("/run/crio/crio.sock"));
    dedup(endpoints)
}

/// Drops endpoints whose socket is the same file as an earlier one's.
pub fn dedup(endpoints: Vec<Endpoint>) -> Vec<Endpoint> {
    let mut seen = Vec::new();
    endpoints
        .into_iter()
        .filter(|endpoint| {
            let key = std::fs::canonicalize(&endpoint.socket).unwrap_or(endpoint.socket.clone());
            if seen.contains(&key) {
                false
            } else {
                seen.push(key);
                true
            }
        })
        .collect()
}

/// A runtime that did not answer, and why: part of every result, so the CLI can say that a
/// daemon is down even when another runtime found the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeProblem {
    pub runtime: Runtime,
    pub socket: PathBuf,
    pub kind: ProblemKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// The socket exists but nothing listens (the daemon is down), or it does not answer.
    Down { reason: String },
    /// The socket refused us: shmtrace is not root (or in the runtime's group).
    Denied,
    /// Something answered, but not as the runtime should.
    Failed { reason: String },
    /// A containerd whose CRI plugin is disabled (Docker's own containerd, for example): it
    /// runs no Kubernetes containers, so this is not a failure.
    NoCri,
}

impl RuntimeProblem {
    /// Whether containers of this runtime may be running unseen, so the cgroup scan should
    /// look for them.
    pub fn hides_containers(&self) -> bool {
        !matches!(self.kind, ProblemKind::NoCri)
    }
}

impl fmt::Display for RuntimeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let socket = self.socket.display();
        match &self.kind {
            ProblemKind::Down { reason } => write!(
                f,
                "{} at {socket} is not answering ({reason}): {}",
                daemon(self.runtime),
                start_hint(self.runtime, &self.socket)
            ),
            ProblemKind::Denied => write!(
                f,
                "permission denied on {socket}: run shmtrace as root (it needs root for eBPF anyway)"
            ),
            ProblemKind::Failed { reason } => write!(f, "{reason}"),
            ProblemKind::NoCri => write!(
                f,
                "{socket} is a containerd without its CRI plugin (no Kubernetes containers there)"
            ),
        }
    }
}

fn daemon(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Docker => "the Docker daemon",
        Runtime::Podman => "the Podman API service",
        Runtime::Containerd => "containerd",
        Runtime::CriO => "CRI-O",
        Runtime::Unknown => "the container runtime",
    }
}

fn start_hint(runtime: Runtime, socket: &Path) -> String {
    match runtime {
        Runtime::Docker => "start it (systemctl start docker), or give its socket".into(),
        Runtime::Podman => format!(
            "start it (systemctl start podman.socket, or podman system service --time=0 unix://{})",
            socket.display()
        ),
        Runtime::Containerd => "start it (systemctl start containerd)".into(),
        Runtime::CriO => "start it (systemctl start crio)".into(),
        Runtime::Unknown => "start it".into(),
    }
}
