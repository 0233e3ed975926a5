//! CRI answers decoded from fixtures built with the real proto types.
//!
//! Their shape is that of containerd 1.6.20's answers captured on this project's CI host (see
//! `containerd_tests.rs`; run it with SHMTRACE_CAPTURE_CRI=1 to print them), abridged: the
//! verbose `info` JSON keys are `config, pid, removing, runtimeOptions, runtimeSpec,
//! runtimeType, sandboxID, snapshotKey, snapshotter`. CRI-O's `info` carries `sandboxID`, `pid`,
//! `runtimeSpec` and `privileged` (cri-o `server/container_status.go`). Every fixture goes
//! through the protobuf wire encoding first, as it would from the socket.
use std::collections::HashMap;

use prost::Message;

use super::*;

const ID: &str = "7921953505ba643ed869d557529aa806c31be7a0d6529f1d68e92628834f4b86";
const SANDBOX: &str = "9da1e721da8f8704523bdc059cd20b4ff048a23e3938e7953bdafad4dcf8016c";
const UID: &str = "6f1b7c3e-0a52-4c1e-9d3a-2b8f0c6e1a01";

fn wire<M: Message + Default>(message: M) -> M {
    M::decode(message.encode_to_vec().as_slice()).expect("decodes what it encoded")
}

fn kube_labels_map(container: &str) -> HashMap<String, String> {
    HashMap::from([
        ("io.kubernetes.pod.name".into(), "trainer-0".into()),
        ("io.kubernetes.container.name".into(), container.into()),
        ("io.kubernetes.pod.uid".into(), UID.into()),
        ("io.kubernetes.pod.namespace".into(), "ml".into()),
    ])
}

fn status(
    state: proto::ContainerState,
    exit_code: i32,
    pid: u32,
) -> proto::ContainerStatusResponse {
    let info = serde_json::json!({
        "sandboxID": SANDBOX,
        "pid": pid,
        "removing": false,
        "snapshotKey": ID,
        "snapshotter": "overlayfs",
        "runtimeType": "io.containerd.runc.v2",
        "runtimeOptions": {},
        "config": {"metadata": {"name": "worker"}, "command": ["sleep", "600"]},
        "runtimeSpec": {"ociVersion": "1.0.2-dev", "process": {"args": ["sleep", "600"]}},
    });
    wire(proto::ContainerStatusResponse {
        status: Some(proto::ContainerStatus {
            id: ID.into(),
            metadata: Some(proto::ContainerMetadata {
                name: "worker".into(),
                attempt: 0,
            }),
            state: state as i32,
            created_at: 1_795_973_084_978_946_120,
            started_at: 1_795_973_085_041_160_232,
            exit_code,
            image: Some(proto::ImageSpec {
                image: "docker.io/library/shmtrace-container-test:1".into(),
                ..Default::default()
            }),
            image_ref: "sha256:e829804679ee59e91a6b6e00c4f4ef0887a437a9cb4526afd61253c6c803adc8"
                .into(),
            labels: kube_labels_map("worker"),
            ..Default::default()
        }),
        info: HashMap::from([("info".into(), info.to_string())]),
    })
}

fn sandbox(ipc: proto::NamespaceMode) -> proto::PodSandboxStatusResponse {
    wire(proto::PodSandboxStatusResponse {
        status: Some(proto::PodSandboxStatus {
            id: SANDBOX.into(),
            metadata: Some(proto::PodSandboxMetadata {
                name: "trainer-0".into(),
                uid: UID.into(),
                namespace: "ml".into(),
                attempt: 0,
            }),
            state: proto::PodSandboxState::SandboxReady as i32,
            linux: Some(proto::LinuxPodSandboxStatus {
                namespaces: Some(proto::Namespace {
                    options: Some(proto::NamespaceOption {
                        network: proto::NamespaceMode::Node as i32,
                        pid: proto::NamespaceMode::Container as i32,
                        ipc: ipc as i32,
                        ..Default::default()
                    }),
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn decode(
    status: proto::ContainerStatusResponse,
    sandbox: Option<&proto::PodSandboxStatusResponse>,
) -> Container {
    let info = StatusInfo::from_info(&status.info);
    to_container(
        status,
        info,
        sandbox,
        Runtime::Containerd,
        Path::new("/run/containerd/containerd.sock"),
    )
    .expect("a container")
}

#[test]
fn decodes_a_running_pod_container() {
    let sandbox = sandbox(proto::NamespaceMode::Pod);
    let container = decode(
        status(proto::ContainerState::ContainerRunning, 0, 17705),
        Some(&sandbox),
    );
    assert_eq!(container.id, ID);
    assert_eq!(container.name, "worker");
    assert_eq!(container.pod.as_deref(), Some("trainer-0"));
    assert_eq!(container.namespace.as_deref(), Some("ml"));
    assert_eq!(container.pod_uid.as_deref(), Some(UID));
    assert_eq!(container.sandbox_id.as_deref(), Some(SANDBOX));
    assert_eq!(container.pid, Some(17705));
    assert_eq!(container.state, State::Running);
    assert_eq!(
        container.image.as_deref(),
        Some("docker.io/library/shmtrace-container-test:1")
    );
    assert_eq!(
        container.ipc,
        IpcMode::PodSandbox {
            sandbox_id: SANDBOX.into()
        }
    );
    assert_eq!(container.display_name(), "ml/trainer-0/worker");
}

#[test]
fn host_ipc_pods_use_the_hosts_shm() {
    let sandbox = sandbox(proto::NamespaceMode::Node);
    let container = decode(
        status(proto::ContainerState::ContainerRunning, 0, 17705),
        Some(&sandbox),
    );
    assert_eq!(container.ipc, IpcMode::Host);
}

#[test]
fn an_exited_container_has_no_pid() {
    let container = decode(status(proto::ContainerState::ContainerExited, 137, 0), None);
    assert_eq!(container.state, State::Exited { code: Some(137) });
    assert_eq!(container.pid, None);
    // Without the sandbox's status, the labels still name the pod.
    assert_eq!(container.pod.as_deref(), Some("trainer-0"));
}

#[test]
fn labels_win_over_metadata_and_metadata_fills_in() {
    let row = wire(proto::Container {
        id: ID.into(),
        pod_sandbox_id: SANDBOX.into(),
        metadata: Some(proto::ContainerMetadata {
            name: "worker".into(),
            attempt: 2,
        }),
        state: proto::ContainerState::ContainerRunning as i32,
        labels: kube_labels_map("worker"),
        ..Default::default()
    });
    let found = candidate(&row, Runtime::CriO);
    assert_eq!(found.name, "worker");
    assert_eq!(found.pod.as_deref(), Some("trainer-0"));
    assert_eq!(found.namespace.as_deref(), Some("ml"));
    assert_eq!(found.state, State::Running);

    let bare = proto::Container {
        labels: HashMap::new(),
        ..row
    };
    let found = candidate(&bare, Runtime::CriO);
    assert_eq!(found.name, "worker");
    assert_eq!(found.pod, None);
}

#[test]
fn knows_sandboxes_and_runtimes() {
    let pause = HashMap::from([("io.kubernetes.docker.type".into(), "podsandbox".into())]);
    assert!(is_sandbox(&pause));
    assert!(!is_sandbox(&kube_labels_map("worker")));
    assert_eq!(runtime_of("cri-o"), Some(Runtime::CriO));
    assert_eq!(runtime_of("containerd"), Some(Runtime::Containerd));
    assert_eq!(runtime_of("docker"), None);
}

#[test]
fn status_info_tolerates_missing_or_odd_json() {
    assert_eq!(
        StatusInfo::from_info(&HashMap::new()),
        StatusInfo::default()
    );
    let odd = HashMap::from([("info".into(), r#"{"pid": -1, "sandboxID": 7}"#.into())]);
    assert_eq!(StatusInfo::from_info(&odd), StatusInfo::default());
    // CRI-O's shape.
    let crio = HashMap::from([(
        "info".into(),
        format!(
            r#"{{"sandboxID": "{SANDBOX}", "pid": 4242, "privileged": false, "runtimeSpec": {{}}}}"#
        ),
    )]);
    assert_eq!(
        StatusInfo::from_info(&crio),
        StatusInfo {
            pid: Some(4242),
            sandbox_id: Some(SANDBOX.into())
        }
    );
    assert_eq!(
        state(42, None),
        State::Other("unknown (CRI state 42)".into())
    );
}
