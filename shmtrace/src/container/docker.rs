//! The Docker Engine API, and Podman's Docker-compatible API, over a unix socket.
//!
//! Calls: `GET /version` (unversioned, to negotiate), then `/vX.Y/containers/json?all=1` and
//! `/vX.Y/containers/{id}/json`. The list's `name=` filter is a regular expression matched
//! anywhere in the name, so names are matched here, exactly.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use super::{
    Container, FoundBy, IpcMode, Runtime, State,
    client::{Candidate, ClientFuture, RuntimeClient, is_sandbox, kube_labels},
    endpoints::ProblemKind,
    shm::{ShmInfo, ShmSource},
    unix_http::{self, HttpError},
};
use shmtrace_core::event::escape;

/// Newest API version this client was written against. The fields it reads exist since 1.25.
const MAX_API: ApiVersion = ApiVersion(1, 47);
const MIN_API: ApiVersion = ApiVersion(1, 25);

/// Why the Docker (or Podman) API could not answer.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("{runtime} at {}: {source}", socket.display())]
    Http {
        runtime: Runtime,
        socket: PathBuf,
        #[source]
        source: HttpError,
    },
    #[error("{runtime} at {}: {path} answered {status}: {message}", socket.display())]
    Status {
        runtime: Runtime,
        socket: PathBuf,
        path: String,
        status: u16,
        message: String,
    },
    #[error("{runtime} at {}: cannot decode the answer to {path}: {reason}", socket.display())]
    Decode {
        runtime: Runtime,
        socket: PathBuf,
        path: String,
        reason: String,
    },
    #[error(
        "{runtime} at {} speaks API {server} (oldest {min}), which shmtrace (API {MIN_API} to \
         {MAX_API}) cannot talk to; update {runtime} or shmtrace",
        socket.display()
    )]
    Version {
        runtime: Runtime,
        socket: PathBuf,
        server: ApiVersion,
        min: ApiVersion,
    },
}

impl DockerError {
    /// Whether the daemon is not running (as opposed to answering badly).
    pub fn is_not_listening(&self) -> bool {
        matches!(self, DockerError::Http { source, .. } if source.is_not_listening())
    }
}

/// A Docker API version, `1.41`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiVersion(pub u32, pub u32);

impl ApiVersion {
    fn parse(text: &str) -> Option<ApiVersion> {
        let (major, minor) = text.split_once('.')?;
        Some(ApiVersion(major.parse().ok()?, minor.parse().ok()?))
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0, self.1)
    }
}

/// A connection to one daemon, with the API version agreed.
#[derive(Clone, Debug)]
pub struct DockerClient {
    socket: PathBuf,
    runtime: Runtime,
    version: ApiVersion,
    timeout: Duration,
}

/// One row of `/containers/json`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Summary {
    pub id: String,
    #[serde(default)]
    pub names: Vec<String>,
    #[serde(default)]
    pub state: String,
    /// `null` when the container has none.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

impl Summary {
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.labels.clone().unwrap_or_default()
    }

    /// The container's own name: the first name without Docker's `/` (link aliases such as
    /// `/web/db` are other containers' views of it).
    pub fn name(&self) -> Option<&str> {
        self.names
            .iter()
            .filter_map(|n| n.strip_prefix('/').or(Some(n.as_str())))
            .find(|n| !n.contains('/'))
    }
}

/// The fields of `/containers/{id}/json` shmtrace uses.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Inspect {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub state: InspectState,
    #[serde(default)]
    pub config: InspectConfig,
    #[serde(default)]
    pub host_config: InspectHostConfig,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct InspectState {
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub pid: i64,
    #[serde(default)]
    pub exit_code: i64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct InspectConfig {
    #[serde(default)]
    pub image: String,
    /// `null` when the container has none.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct InspectHostConfig {
    #[serde(default)]
    pub shm_size: Option<i64>,
    #[serde(default)]
    pub ipc_mode: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct VersionAnswer {
    #[serde(default)]
    api_version: String,
    #[serde(default, rename = "MinAPIVersion")]
    min_api_version: String,
    #[serde(default)]
    components: Option<Vec<Component>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Component {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    #[serde(default)]
    message: String,
}

impl DockerClient {
    /// Connects to the daemon at `socket` and agrees on an API version: the daemon's newest
    /// if this client knows it, else this client's newest, which the daemon must still accept.
    /// `runtime` is what the socket is expected to be; a Podman answer on a Docker socket
    /// (`podman-docker`) is recognised.
    pub async fn connect(
        socket: &Path,
        runtime: Runtime,
        timeout: Duration,
    ) -> Result<DockerClient, DockerError> {
        let mut client = DockerClient {
            socket: socket.to_owned(),
            runtime,
            version: MIN_API,
            timeout,
        };
        let answer: VersionAnswer = client.get_json("/version").await?;
        if answer
            .components
            .iter()
            .flatten()
            .any(|c| c.name.contains("Podman"))
        {
            client.runtime = Runtime::Podman;
        }
        let server = ApiVersion::parse(&answer.api_version).unwrap_or(MIN_API);
        let min = ApiVersion::parse(&answer.min_api_version).unwrap_or(MIN_API);
        client.version = negotiate(server, min).ok_or_else(|| DockerError::Version {
            runtime: client.runtime,
            socket: socket.to_owned(),
            server,
            min,
        })?;
        Ok(client)
    }

    /// Every container, running or not.
    pub async fn list(&self) -> Result<Vec<Summary>, DockerError> {
        self.get_json(&format!("/v{}/containers/json?all=1", self.version))
            .await
    }

    /// One container by id (or exact name). `Ok(None)` when there is no such container.
    pub async fn inspect(&self, id_or_name: &str) -> Result<Option<Inspect>, DockerError> {
        let path = format!(
            "/v{}/containers/{}/json",
            self.version,
            percent_encode(id_or_name)
        );
        match self.get_json(&path).await {
            Ok(inspect) => Ok(Some(inspect)),
            Err(DockerError::Status { status: 404, .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `path` under the agreed API version: `/v1.41/events`.
    pub fn versioned(&self, path: &str) -> String {
        format!("/v{}{path}", self.version)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, DockerError> {
        let response = unix_http::get(&self.socket, path, self.timeout)
            .await
            .map_err(|source| DockerError::Http {
                runtime: self.runtime,
                socket: self.socket.clone(),
                source,
            })?;
        if !response.status.is_success() {
            let message = serde_json::from_slice::<ErrorAnswer>(&response.body)
                .map(|e| e.message)
                .unwrap_or_else(|_| String::from_utf8_lossy(&response.body).into_owned());
            return Err(DockerError::Status {
                runtime: self.runtime,
                socket: self.socket.clone(),
                path: path.to_owned(),
                status: response.status.as_u16(),
                message: escape::text(message.trim()),
            });
        }
        serde_json::from_slice(&response.body).map_err(|error| DockerError::Decode {
            runtime: self.runtime,
            socket: self.socket.clone(),
            path: path.to_owned(),
            reason: error.to_string(),
        })
    }
}

/// The version to speak: the server's newest, capped at ours, and no older than it accepts.
fn negotiate(server: ApiVersion, server_min: ApiVersion) -> Option<ApiVersion> {
    let version = server.min(MAX_API);
    (version >= server_min && version >= MIN_API).then_some(version)
}

/// Escapes what a URL path segment cannot hold (ids and names are `[a-zA-Z0-9_.-]`, but a
/// user's typo should give "not found", not a broken request).
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl RuntimeClient for DockerClient {
    fn runtime(&self) -> Runtime {
        self.runtime
    }

    fn candidates(&mut self) -> ClientFuture<'_, Result<Vec<Candidate>, ProblemKind>> {
        Box::pin(async move {
            let list = self.list().await.map_err(problem)?;
            Ok(list
                .into_iter()
                .filter(|s| !is_sandbox(s.labels().iter()))
                .map(|s| {
                    let kube = kube_labels(&s.labels());
                    Candidate {
                        runtime: self.runtime,
                        name: s.name().unwrap_or_default().to_owned(),
                        pod: kube.pod,
                        namespace: kube.namespace,
                        state: state(&s.state, 0),
                        id: s.id,
                    }
                })
                .collect())
        })
    }

    fn describe<'a>(
        &'a mut self,
        id: &'a str,
    ) -> ClientFuture<'a, Result<Option<Container>, String>> {
        Box::pin(async move {
            let inspect = self.inspect(id).await.map_err(|e| e.to_string())?;
            Ok(inspect.map(|i| to_container(i, self.runtime, &self.socket)))
        })
    }
}

/// How a failed call shows among the runtimes that did not answer.
pub fn problem(error: DockerError) -> ProblemKind {
    if matches!(&error, DockerError::Http { source, .. } if source.is_denied()) {
        return ProblemKind::Denied;
    }
    if error.is_not_listening() || matches!(error, DockerError::Http { .. }) {
        ProblemKind::Down {
            reason: match error {
                DockerError::Http { source, .. } => source.to_string(),
                other => other.to_string(),
            },
        }
    } else {
        ProblemKind::Failed {
            reason: error.to_string(),
        }
    }
}

/// The container an inspect answer describes, before /proc is consulted.
pub fn to_container(inspect: Inspect, runtime: Runtime, socket: &Path) -> super::Container {
    let labels = inspect.config.labels.unwrap_or_default();
    let pid = u32::try_from(inspect.state.pid).ok().filter(|p| *p > 0);
    let kube = kube_labels(&labels);
    super::Container {
        runtime,
        found_by: FoundBy::Api {
            socket: socket.to_owned(),
        },
        name: inspect.name.trim_start_matches('/').to_owned(),
        id: inspect.id,
        image: Some(inspect.config.image).filter(|i| !i.is_empty()),
        pod: kube.pod,
        namespace: kube.namespace,
        pod_uid: kube.pod_uid,
        sandbox_id: None,
        labels,
        pid,
        mntns: None,
        cgroup_id: None,
        shm: ShmInfo {
            configured_bytes: inspect
                .host_config
                .shm_size
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0),
            source: ShmSource::Configured,
            ..ShmInfo::default()
        },
        ipc: ipc_mode(&inspect.host_config.ipc_mode),
        state: state(&inspect.state.status, inspect.state.exit_code),
    }
}

/// Docker's `HostConfig.IpcMode`.
fn ipc_mode(text: &str) -> IpcMode {
    match text {
        "private" => IpcMode::Private,
        // Docker before 17.06 left it empty, meaning private; daemons since default to
        // `shareable` or `private` by configuration.
        "" => IpcMode::Private,
        "shareable" => IpcMode::Shareable,
        "host" => IpcMode::Host,
        "none" => IpcMode::NoShm,
        other => match other.strip_prefix("container:") {
            Some(target) => IpcMode::Container(target.to_owned()),
            None => IpcMode::Unknown,
        },
    }
}

/// Docker's `State.Status`.
pub fn state(status: &str, exit_code: i64) -> State {
    match status {
        "created" => State::Created,
        "running" => State::Running,
        "paused" => State::Paused,
        "restarting" => State::Restarting,
        "removing" => State::Removing,
        "exited" => State::Exited {
            code: Some(exit_code),
        },
        "dead" => State::Dead,
        // Podman's compat API also says `configured`, `stopped`, `stopping`.
        "configured" => State::Created,
        "stopped" | "stopping" => State::Exited {
            code: Some(exit_code),
        },
        other => State::Other(escape::text(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Abridged from `GET /containers/{id}/json` of Docker 20.10.24 on this project's CI host
    /// (`docker run -d --shm-size 1m --name shm-test shmtest:1 sleep 1000`).
    const INSPECT: &str = r#"{
        "Id": "5b1c7e0f1d8a4e3b9c2f6a7d8e9f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b",
        "Created": "2026-11-29T17:20:01.123Z",
        "Path": "sleep",
        "Args": ["1000"],
        "State": {"Status": "running", "Running": true, "Paused": false, "Restarting": false,
                  "OOMKilled": false, "Dead": false, "Pid": 23456, "ExitCode": 0, "Error": "",
                  "StartedAt": "2026-11-29T17:20:01.5Z", "FinishedAt": "0001-01-01T00:00:00Z"},
        "Image": "sha256:0f5a",
        "Name": "/shm-test",
        "HostConfig": {"IpcMode": "private", "ShmSize": 1048576, "PidMode": ""},
        "Config": {"Hostname": "5b1c7e0f1d8a", "Image": "shmtest:1", "Labels": {}}
    }"#;

    #[test]
    fn decodes_an_inspect_answer() {
        let inspect: Inspect = serde_json::from_str(INSPECT).unwrap();
        let container = to_container(inspect, Runtime::Docker, Path::new("/run/docker.sock"));
        assert_eq!(container.name, "shm-test");
        assert_eq!(container.image.as_deref(), Some("shmtest:1"));
        assert_eq!(container.pid, Some(23456));
        assert_eq!(container.state, State::Running);
        assert_eq!(container.ipc, IpcMode::Private);
        assert_eq!(container.shm.configured_bytes, Some(1 << 20));
        assert_eq!(container.short_id(), "5b1c7e0f1d8a");
    }

    #[test]
    fn decodes_a_stopped_container_with_null_labels() {
        let text = INSPECT
            .replace(r#""Status": "running""#, r#""Status": "exited""#)
            .replace(
                r#""Pid": 23456, "ExitCode": 0"#,
                r#""Pid": 0, "ExitCode": 137"#,
            )
            .replace(r#""Labels": {}"#, r#""Labels": null"#)
            .replace(r#""IpcMode": "private""#, r#""IpcMode": "container:db""#);
        let inspect: Inspect = serde_json::from_str(&text).unwrap();
        let container = to_container(inspect, Runtime::Docker, Path::new("/run/docker.sock"));
        assert_eq!(container.pid, None);
        assert_eq!(container.state, State::Exited { code: Some(137) });
        assert!(container.labels.is_empty());
        assert_eq!(container.ipc, IpcMode::Container("db".into()));
    }

    #[test]
    fn negotiates_the_api_version() {
        // Docker 20.10: speaks 1.41, accepts down to 1.12.
        assert_eq!(
            negotiate(ApiVersion(1, 41), ApiVersion(1, 12)),
            Some(ApiVersion(1, 41))
        );
        // Docker 28: speaks 1.50, refuses anything before 1.24: we speak our newest.
        assert_eq!(
            negotiate(ApiVersion(1, 50), ApiVersion(1, 24)),
            Some(MAX_API)
        );
        // A future daemon that dropped everything we know.
        assert_eq!(negotiate(ApiVersion(1, 60), ApiVersion(1, 50)), None);
        // Too old for us.
        assert_eq!(negotiate(ApiVersion(1, 24), ApiVersion(1, 12)), None);
        assert_eq!(ApiVersion::parse("1.41"), Some(ApiVersion(1, 41)));
        assert_eq!(ApiVersion::parse("v1"), None);
        assert!(
            ApiVersion(1, 9) < ApiVersion(1, 10),
            "numeric, not text, order"
        );
    }

    #[test]
    fn names_come_without_the_slash_and_without_link_aliases() {
        let summary: Summary =
            serde_json::from_str(r#"{"Id": "x", "Names": ["/web/db", "/db"], "State": "running"}"#)
                .unwrap();
        assert_eq!(summary.name(), Some("db"));
    }

    #[test]
    fn encodes_path_segments() {
        assert_eq!(percent_encode("trainer-1_a.b"), "trainer-1_a.b");
        assert_eq!(percent_encode("../x?y"), "..%2Fx%3Fy");
    }
}
