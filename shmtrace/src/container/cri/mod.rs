//! containerd and CRI-O through the Kubernetes Container Runtime Interface (gRPC,
//! `runtime.v1.RuntimeService`) on their unix sockets.
//!
//! Calls: `Version` (which runtime answers), `ListContainers` (everything, matched here),
//! `ContainerStatus{verbose}` (its `info` JSON holds the main pid and the sandbox id) and
//! `PodSandboxStatus` (pod name, namespace, and whether the pod uses the node's IPC namespace).
//!
//! The client in `runtime.v1.rs` is generated from `api.proto` (Kubernetes cri-api, as vendored
//! by the k8s-cri 0.11 crate) by `cargo xtask gen-cri`, and committed, so building needs no protoc.
use std::{collections::BTreeMap, path::Path, path::PathBuf, time::Duration};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{
    Container, FoundBy, IpcMode, Runtime, State,
    client::{Candidate, ClientFuture, RuntimeClient, is_sandbox, kube_labels},
    endpoints::ProblemKind,
    shm::ShmInfo,
};
use shmtrace_core::event::escape;

#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod proto {
    include!("runtime.v1.rs");
}

use proto::runtime_service_client::RuntimeServiceClient;

/// Why a CRI runtime could not answer.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("CRI runtime at {}: cannot connect: {reason}", socket.display())]
    Connect { socket: PathBuf, reason: String },
    #[error("{runtime} at {}: {call} failed: {status}", socket.display())]
    Call {
        runtime: Runtime,
        socket: PathBuf,
        call: &'static str,
        status: String,
    },
}

/// A connection to a CRI runtime.
#[derive(Clone, Debug)]
pub struct CriClient {
    socket: PathBuf,
    runtime: Runtime,
    client: RuntimeServiceClient<Channel>,
}

impl CriClient {
    /// Connects to the runtime at `socket` and asks which one it is.
    pub async fn connect(
        socket: &Path,
        runtime: Runtime,
        timeout: Duration,
    ) -> Result<CriClient, CriError> {
        let channel = channel(socket, timeout)
            .await
            .map_err(|reason| CriError::Connect {
                socket: socket.to_owned(),
                reason,
            })?;
        let mut client = CriClient {
            socket: socket.to_owned(),
            runtime,
            client: RuntimeServiceClient::new(channel),
        };
        let version = client
            .client
            .version(proto::VersionRequest {
                version: "v1".into(),
            })
            .await
            .map_err(|status| client.call_error("Version", status))?
            .into_inner();
        client.runtime = runtime_of(&version.runtime_name).unwrap_or(runtime);
        Ok(client)
    }

    /// Every container the runtime knows (sandboxes are not containers in the CRI).
    pub async fn list(&mut self) -> Result<Vec<Candidate>, CriError> {
        let answer = self
            .client
            .list_containers(proto::ListContainersRequest { filter: None })
            .await
            .map_err(|status| self.call_error("ListContainers", status))?
            .into_inner();
        Ok(answer
            .containers
            .iter()
            .filter(|c| !is_sandbox(&c.labels))
            .map(|c| candidate(c, self.runtime))
            .collect())
    }

    /// Everything about one container: its status, and its pod sandbox's.
    pub async fn describe(&mut self, id: &str) -> Result<Option<Container>, CriError> {
        let status = match self
            .client
            .container_status(proto::ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: true,
            })
            .await
        {
            Ok(answer) => answer.into_inner(),
            Err(status) if status.code() == tonic::Code::NotFound => return Ok(None),
            Err(status) => return Err(self.call_error("ContainerStatus", status)),
        };
        let info = StatusInfo::from_info(&status.info);
        let sandbox = match &info.sandbox_id {
            Some(sandbox_id) => self
                .client
                .pod_sandbox_status(proto::PodSandboxStatusRequest {
                    pod_sandbox_id: sandbox_id.clone(),
                    verbose: false,
                })
                .await
                .ok()
                .map(|answer| answer.into_inner()),
            None => None,
        };
        Ok(to_container(
            status,
            info,
            sandbox.as_ref(),
            self.runtime,
            &self.socket,
        ))
    }

    fn call_error(&self, call: &'static str, status: tonic::Status) -> CriError {
        CriError::Call {
            runtime: self.runtime,
            socket: self.socket.clone(),
            call,
            status: escape::text(&format!("{:?}: {}", status.code(), status.message())),
        }
    }
}

impl RuntimeClient for CriClient {
    fn runtime(&self) -> Runtime {
        self.runtime
    }

    fn candidates(&mut self) -> ClientFuture<'_, Result<Vec<Candidate>, ProblemKind>> {
        Box::pin(async move { self.list().await.map_err(problem) })
    }

    fn describe<'a>(
        &'a mut self,
        id: &'a str,
    ) -> ClientFuture<'a, Result<Option<Container>, String>> {
        Box::pin(async move {
            CriClient::describe(self, id)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// How a failed call shows among the runtimes that did not answer.
pub fn problem(error: CriError) -> ProblemKind {
    match error {
        CriError::Connect { reason, .. } => ProblemKind::Down { reason },
        // A containerd without the CRI plugin answers, but knows no RuntimeService.
        CriError::Call { ref status, .. } if status.starts_with("Unimplemented") => {
            ProblemKind::NoCri
        }
        other => ProblemKind::Failed {
            reason: other.to_string(),
        },
    }
}

/// A gRPC channel over the unix socket at `socket`.
pub async fn channel(socket: &Path, timeout: Duration) -> Result<Channel, String> {
    // The URI is required by the API but unused: the connector dials the socket.
    let path = socket.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| error_chain(&e))
}

/// `containerd` or `cri-o`, as `VersionResponse.runtime_name` spells them.
fn runtime_of(name: &str) -> Option<Runtime> {
    match name {
        "containerd" => Some(Runtime::Containerd),
        "cri-o" => Some(Runtime::CriO),
        _ => None,
    }
}

/// A row of `ListContainers`, for matching by name, pod and namespace.
fn candidate(container: &proto::Container, runtime: Runtime) -> Candidate {
    let labels: BTreeMap<String, String> = container.labels.clone().into_iter().collect();
    let kube = kube_labels(&labels);
    Candidate {
        runtime,
        id: container.id.clone(),
        name: kube
            .container
            .or_else(|| container.metadata.as_ref().map(|m| m.name.clone()))
            .unwrap_or_default(),
        pod: kube.pod,
        namespace: kube.namespace,
        state: state(container.state, None),
    }
}

fn state(raw: i32, exit_code: Option<i32>) -> State {
    match proto::ContainerState::try_from(raw) {
        Ok(proto::ContainerState::ContainerCreated) => State::Created,
        Ok(proto::ContainerState::ContainerRunning) => State::Running,
        Ok(proto::ContainerState::ContainerExited) => State::Exited {
            code: exit_code.map(i64::from),
        },
        Ok(proto::ContainerState::ContainerUnknown) | Err(_) => {
            State::Other(format!("unknown (CRI state {raw})"))
        }
    }
}

/// What the runtime adds under `info["info"]` in a verbose `ContainerStatus`: a JSON object
/// with `pid` and `sandboxID` in both containerd (`ContainerInfo` in
/// `pkg/cri/server/container_status.go`) and CRI-O (`server/container_status.go`).
#[derive(Debug, Default, PartialEq, Eq)]
struct StatusInfo {
    pid: Option<u32>,
    sandbox_id: Option<String>,
}

impl StatusInfo {
    fn from_info(info: &std::collections::HashMap<String, String>) -> StatusInfo {
        let Some(value) = info
            .get("info")
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        else {
            return StatusInfo::default();
        };
        StatusInfo {
            pid: value
                .get("pid")
                .and_then(serde_json::Value::as_u64)
                .and_then(|p| u32::try_from(p).ok())
                .filter(|p| *p > 0),
            sandbox_id: value
                .get("sandboxID")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
        }
    }
}

/// A verbose `ContainerStatus` answer as arbitrary bytes, through what reads it (fuzzing).
#[cfg(fuzzing)]
pub(super) fn fuzz_status(data: &[u8]) {
    use prost::Message;
    if let Ok(status) = proto::ContainerStatusResponse::decode(data) {
        let info = StatusInfo::from_info(&status.info);
        let sandbox = proto::PodSandboxStatusResponse::decode(data).ok();
        let _ = to_container(
            status,
            info,
            sandbox.as_ref(),
            Runtime::Containerd,
            Path::new("/run/containerd/containerd.sock"),
        );
    }
}

/// The container a verbose `ContainerStatus` (and its sandbox's status) describes.
fn to_container(
    status: proto::ContainerStatusResponse,
    info: StatusInfo,
    sandbox: Option<&proto::PodSandboxStatusResponse>,
    runtime: Runtime,
    socket: &Path,
) -> Option<Container> {
    let status_info = status.status?;
    let labels: BTreeMap<String, String> = status_info.labels.into_iter().collect();
    let kube = kube_labels(&labels);
    let sandbox_status = sandbox.and_then(|s| s.status.as_ref());
    let sandbox_meta = sandbox_status.and_then(|s| s.metadata.as_ref());
    let ipc_mode = sandbox_status
        .and_then(|s| s.linux.as_ref())
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .map(|o| o.ipc);
    let sandbox_id = info.sandbox_id.clone();
    let ipc = match (ipc_mode.map(proto::NamespaceMode::try_from), &sandbox_id) {
        (Some(Ok(proto::NamespaceMode::Node)), _) => IpcMode::Host,
        (_, Some(sandbox_id)) => IpcMode::PodSandbox {
            sandbox_id: sandbox_id.clone(),
        },
        _ => IpcMode::Unknown,
    };
    let running = status_info.state == proto::ContainerState::ContainerRunning as i32;
    Some(Container {
        runtime,
        found_by: FoundBy::Api {
            socket: socket.to_owned(),
        },
        id: status_info.id,
        name: kube
            .container
            .or_else(|| status_info.metadata.map(|m| m.name))
            .unwrap_or_default(),
        image: status_info
            .image
            .map(|i| {
                if i.user_specified_image.is_empty() {
                    i.image
                } else {
                    i.user_specified_image
                }
            })
            .filter(|i| !i.is_empty())
            .or_else(|| Some(status_info.image_ref).filter(|i| !i.is_empty())),
        pod: kube.pod.or_else(|| sandbox_meta.map(|m| m.name.clone())),
        namespace: kube
            .namespace
            .or_else(|| sandbox_meta.map(|m| m.namespace.clone())),
        pod_uid: kube.pod_uid.or_else(|| sandbox_meta.map(|m| m.uid.clone())),
        sandbox_id,
        labels,
        pid: info.pid.filter(|_| running),
        mntns: None,
        cgroup_id: None,
        shm: ShmInfo::default(),
        ipc,
        state: state(status_info.state, Some(status_info.exit_code)),
    })
}

/// An error and its causes on one line (tonic's transport errors say little at the top).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests;
