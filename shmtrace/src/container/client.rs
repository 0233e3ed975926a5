//! What every runtime client offers the resolver ([`RuntimeClient`]), and what they share below
//! it: the list row a query is matched against ([`Candidate`]) and the Kubernetes label helpers.
//! The clients (`docker`, `cri`) implement the trait; only `resolve` uses it, so no client
//! knows the resolver.
use std::{collections::BTreeMap, future::Future, pin::Pin};

use super::{Container, Runtime, State, endpoints::ProblemKind};

/// A future a runtime client returns, boxed so that clients of different runtimes can sit in
/// one list.
pub type ClientFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A connection to one container runtime's API.
pub trait RuntimeClient: Send {
    /// Which runtime answered (a Podman may answer on a Docker socket).
    fn runtime(&self) -> Runtime;
    /// Every container it knows, running or not, without pod sandboxes.
    fn candidates(&mut self) -> ClientFuture<'_, Result<Vec<Candidate>, ProblemKind>>;
    /// Everything about one container; `Ok(None)` when the runtime no longer knows it.
    fn describe<'a>(
        &'a mut self,
        id: &'a str,
    ) -> ClientFuture<'a, Result<Option<Container>, String>>;
}

/// A container as a runtime's list shows it: enough to match a query and to list names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub runtime: Runtime,
    pub id: String,
    pub name: String,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub state: State,
}

impl Candidate {
    /// As [`Container::display_name`] shows it, or `docker 3f4e1bd2c2d8` when it has no name.
    pub fn display_name(&self) -> String {
        if self.name.is_empty() {
            return id_label(self.runtime, &self.id);
        }
        shmtrace_core::model::container_label(
            &self.name,
            &self.id,
            self.namespace.as_deref(),
            self.pod.as_deref(),
        )
    }
}

/// The Kubernetes identity a container's labels carry (CRI runtimes, and cri-dockerd).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeLabels {
    pub container: Option<String>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub pod_uid: Option<String>,
}

pub fn kube_labels(labels: &BTreeMap<String, String>) -> KubeLabels {
    let get = |key: &str| labels.get(key).filter(|v| !v.is_empty()).cloned();
    KubeLabels {
        container: get("io.kubernetes.container.name"),
        pod: get("io.kubernetes.pod.name"),
        namespace: get("io.kubernetes.pod.namespace"),
        pod_uid: get("io.kubernetes.pod.uid"),
    }
}

/// Pause containers, where a runtime lists them among containers (cri-dockerd does; CRI
/// runtimes list sandboxes separately).
pub fn is_sandbox<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>) -> bool {
    labels.into_iter().any(|(k, v)| {
        (k == "io.kubernetes.docker.type" && v == "podsandbox")
            || (k == "io.cri-containerd.kind" && v == "sandbox")
    })
}

/// `docker 3f4e1bd2c2d8`: a container known only by id.
pub fn id_label(runtime: Runtime, id: &str) -> String {
    format!(
        "{runtime} {}",
        shmtrace_core::event::escape::text(super::short_id(id))
    )
}
