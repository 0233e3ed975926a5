//! A container as events, diagnoses and trace files describe it: enough to name it, to say how
//! big its /dev/shm is, and to say how it was started (so advice speaks its language).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How the container was started, which decides how to change its /dev/shm size.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StartedBy {
    /// `docker run` (or the Engine API directly).
    DockerRun,
    /// docker compose, with its project and service.
    Compose { project: String, service: String },
    /// A Kubernetes pod.
    Kubernetes,
    /// `podman run`.
    Podman,
    #[default]
    Unknown,
}

impl StartedBy {
    /// From the runtime's name and the container's labels.
    pub fn detect(runtime: &str, labels: &BTreeMap<String, String>) -> StartedBy {
        if let (Some(project), Some(service)) = (
            labels.get("com.docker.compose.project"),
            labels.get("com.docker.compose.service"),
        ) {
            return StartedBy::Compose {
                project: project.clone(),
                service: service.clone(),
            };
        }
        if labels.contains_key("io.kubernetes.pod.name") {
            return StartedBy::Kubernetes;
        }
        match runtime {
            "docker" => StartedBy::DockerRun,
            "podman" => StartedBy::Podman,
            "containerd" | "cri-o" => StartedBy::Kubernetes,
            _ => StartedBy::Unknown,
        }
    }
}

/// The `container` object of JSON events, and what a trace file keeps of a container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerInfo {
    /// `docker`, `podman`, `containerd`, `cri-o`, or `unknown` (found by the cgroup scan).
    pub runtime: String,
    pub id: String,
    /// As the runtime gave it (JSON escapes what needs escaping; text output escapes it).
    pub name: String,
    pub image: Option<String>,
    /// Kubernetes pod and namespace.
    pub pod: Option<String>,
    pub namespace: Option<String>,
    /// /dev/shm size and use, in bytes, as last measured.
    pub shm_size: Option<u64>,
    pub shm_used: Option<u64>,
    /// Whose /dev/shm it uses, in words: `private`, `the host's (--ipc=host)`, ...
    pub ipc: String,
    pub started_by: StartedBy,
    /// Mount namespace and /dev/shm device: how events and measurements find it.
    #[serde(skip)]
    pub mntns: Option<u32>,
    #[serde(skip)]
    pub shm_dev: Option<u32>,
}

impl ContainerInfo {
    /// What to call it: `trainer`, or `namespace/pod/container` in Kubernetes. Escaped.
    pub fn label(&self) -> String {
        container_label(
            &self.name,
            &self.id,
            self.namespace.as_deref(),
            self.pod.as_deref(),
        )
    }

    /// One line for people: `container trainer (docker, image pytorch:2.4), /dev/shm private`.
    pub fn describe(&self) -> String {
        // A trace file from a stranger sets every one of these fields.
        let mut parts = vec![crate::event::escape::text(&self.runtime)];
        if let Some(image) = &self.image {
            parts.push(format!("image {}", crate::event::escape::text(image)));
        }
        let mut text = format!("container {} ({})", self.label(), parts.join(", "));
        if !self.ipc.is_empty() {
            text.push_str(&format!(
                ", /dev/shm {}",
                crate::event::escape::text(&self.ipc)
            ));
        }
        text
    }
}

/// A container's name for people: escaped, its short id when the name is unknown, and
/// `namespace/pod/name` in Kubernetes. The one container-name formatter.
pub fn container_label(name: &str, id: &str, namespace: Option<&str>, pod: Option<&str>) -> String {
    use crate::event::escape::text;
    let name = if name.is_empty() {
        text(short_id(id))
    } else {
        text(name)
    };
    match (namespace, pod) {
        (Some(namespace), Some(pod)) => format!("{}/{}/{name}", text(namespace), text(pod)),
        (None, Some(pod)) => format!("{}/{name}", text(pod)),
        _ => name,
    }
}

/// The first 12 characters of an id, as `docker ps` shows it (not escaped).
pub fn short_id(id: &str) -> &str {
    match id.char_indices().nth(12) {
        Some((end, _)) => &id[..end],
        None => id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_container_by_name_or_short_id_escaped() {
        let id = "5b1c7e0f1d8a".to_owned() + &"0".repeat(52);
        assert_eq!(container_label("", &id, None, None), "5b1c7e0f1d8a");
        assert_eq!(
            container_label("trainer", &id, Some("ml"), Some("job-0")),
            "ml/job-0/trainer"
        );
        assert_eq!(container_label("a\x1bb", &id, None, None), "a\\x1bb");
        // A hostile id: cut on a character boundary, escaped when shown.
        assert_eq!(short_id("ééééééééééééé"), "éééééééééééé");
        assert_eq!(short_id("abc"), "abc");
        assert_eq!(container_label("", "\x07bad", None, None), "\\x07bad");
    }
}
