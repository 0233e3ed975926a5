//! Tests against a real containerd with its CRI plugin, which the test starts itself: a private
//! instance (own root, state and socket under a temporary directory) beside Docker's, with the
//! cgroupfs driver, so its pods land under `/kubepods/besteffort/pod<uid>/<id>` as the kubelet's
//! cgroupfs driver would put them. Images come from Docker (`docker save | ctr import`).
//!
//! The pod is made the way the kubelet makes one: a sandbox with the `io.kubernetes.pod.*`
//! labels, host networking (no CNI here), and a container with the kubelet's
//! `io.kubernetes.container.name` label. It fails loudly without containerd or Docker.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use shmtrace::{
    container::{
        ContainerError, Endpoint, FoundBy, IpcMode, PathClass, QosClass, Query, Resolver, Runtime,
        State, channel, parse_proc_cgroup, proto,
    },
    kernel_ids,
};
use shmtrace_tests::runtimes::{IMAGE, docker, image, import_busybox_image, unique, wait_for};

const PAUSE_IMAGE: &str = "shmtrace-container-test-pause:1";

/// A private containerd, killed and cleaned up when dropped.
pub(crate) struct Containerd {
    pub(crate) dir: PathBuf,
    pub(crate) socket: PathBuf,
    child: Child,
}

impl Containerd {
    pub(crate) fn start() -> Containerd {
        // The images are Docker's: make them there first.
        let image = image();
        import_busybox_image(PAUSE_IMAGE, &[r#"ENTRYPOINT ["/bin/sleep", "2147483647"]"#]);

        let dir = PathBuf::from(format!("/tmp/{}", unique("containerd")));
        std::fs::create_dir_all(dir.join("net.d")).unwrap();
        let socket = dir.join("containerd.sock");
        let default = Command::new("containerd")
            .args(["config", "default"])
            .output()
            .expect("containerd is not installed (Debian: apt-get install containerd)");
        let config = String::from_utf8(default.stdout)
            .unwrap()
            .replace(
                "root = \"/var/lib/containerd\"",
                &format!("root = \"{}/root\"", dir.display()),
            )
            .replace(
                "state = \"/run/containerd\"",
                &format!("state = \"{}/state\"", dir.display()),
            )
            .replace(
                "address = \"/run/containerd/containerd.sock\"",
                &format!("address = \"{}\"", socket.display()),
            )
            .replace(
                "conf_dir = \"/etc/cni/net.d\"",
                &format!("conf_dir = \"{}/net.d\"", dir.display()),
            );
        let config = set_sandbox_image(&config, &format!("docker.io/library/{PAUSE_IMAGE}"));
        // Pause asks for oom_score_adj -998, which needs CAP_SYS_RESOURCE; sandboxes such as
        // this project's CI refuse it ("failed to update /proc/self/oom_score_adj").
        let config = config.replace(
            "restrict_oom_score_adj = false",
            "restrict_oom_score_adj = true",
        );
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let containerd = Containerd { dir, socket, child };
        wait_for(|| containerd.socket.exists());
        for tag in [image, PAUSE_IMAGE] {
            containerd.import(tag);
        }
        containerd
    }

    /// `docker save TAG | ctr -n k8s.io images import -`.
    fn import(&self, tag: &str) {
        let mut save = Command::new("docker")
            .args(["save", tag])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let import = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io", "images", "import", "-"])
            .stdin(save.stdout.take().unwrap())
            .output()
            .expect("ctr (from Debian's containerd package)");
        assert!(save.wait().unwrap().success(), "docker save {tag}");
        assert!(
            import.status.success(),
            "ctr images import {tag}: {}",
            String::from_utf8_lossy(&import.stderr)
        );
    }
}

fn set_sandbox_image(config: &str, image: &str) -> String {
    config
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("sandbox_image =") {
                format!("    sandbox_image = \"{image}\"")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("containerd's log, last lines first:\n{}", tail.join("\n"));
        }
        // Pods first: their shims would outlive containerd.
        let socket = self.socket.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(remove_all_pods(&socket));
        })
        .join();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        // Leftover mounts (shm of sandboxes, rootfs of containers) under the directory.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
            let dir = self.dir.display().to_string();
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|p| p.starts_with(&dir))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for point in points {
                let _ = Command::new("umount").arg("-l").arg(point).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn remove_all_pods(socket: &Path) {
    let Ok(channel) = channel(socket, Duration::from_secs(5)).await else {
        return;
    };
    let mut client = proto::runtime_service_client::RuntimeServiceClient::new(channel);
    let Ok(pods) = client
        .list_pod_sandbox(proto::ListPodSandboxRequest { filter: None })
        .await
    else {
        return;
    };
    for pod in pods.into_inner().items {
        let _ = client
            .stop_pod_sandbox(proto::StopPodSandboxRequest {
                pod_sandbox_id: pod.id.clone(),
            })
            .await;
        let _ = client
            .remove_pod_sandbox(proto::RemovePodSandboxRequest {
                pod_sandbox_id: pod.id,
            })
            .await;
    }
}

/// Namespaces as the kubelet asks for a pod with `hostNetwork: true`.
fn namespaces() -> proto::NamespaceOption {
    proto::NamespaceOption {
        network: proto::NamespaceMode::Node as i32,
        pid: proto::NamespaceMode::Container as i32,
        ipc: proto::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// Runs a pod with one container, the way the kubelet would; returns (sandbox id, container id).
pub(crate) async fn run_pod(
    client: &mut proto::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    dir: &Path,
    pod: &str,
    namespace: &str,
    uid: &str,
    container: &str,
    image: &str,
) -> (String, String) {
    let pod_labels = HashMap::from([
        ("io.kubernetes.pod.name".to_owned(), pod.to_owned()),
        (
            "io.kubernetes.pod.namespace".to_owned(),
            namespace.to_owned(),
        ),
        ("io.kubernetes.pod.uid".to_owned(), uid.to_owned()),
    ]);
    let sandbox_config = proto::PodSandboxConfig {
        metadata: Some(proto::PodSandboxMetadata {
            name: pod.into(),
            uid: uid.into(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        log_directory: dir.join("logs").join(uid).display().to_string(),
        labels: pod_labels.clone(),
        linux: Some(proto::LinuxPodSandboxConfig {
            cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
            security_context: Some(proto::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sandbox = client
        .run_pod_sandbox(proto::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let mut labels = pod_labels;
    labels.insert("io.kubernetes.container.name".into(), container.into());
    let created = client
        .create_container(proto::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(proto::ContainerConfig {
                metadata: Some(proto::ContainerMetadata {
                    name: container.into(),
                    attempt: 0,
                }),
                image: Some(proto::ImageSpec {
                    image: format!("docker.io/library/{image}"),
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "600".into()],
                log_path: format!("{container}.log"),
                labels,
                linux: Some(proto::LinuxContainerConfig {
                    security_context: Some(proto::LinuxContainerSecurityContext {
                        namespace_options: Some(namespaces()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id;
    client
        .start_container(proto::StartContainerRequest {
            container_id: created.clone(),
        })
        .await
        .expect("StartContainer");
    (sandbox, created)
}

#[tokio::test]
async fn finds_kubernetes_containers_in_a_real_containerd() {
    let containerd = Containerd::start();
    let mut client = proto::runtime_service_client::RuntimeServiceClient::new(
        channel(&containerd.socket, Duration::from_secs(10))
            .await
            .expect("containerd's CRI socket"),
    );
    let image = IMAGE;
    let uid_a = "6f1b7c3e-0a52-4c1e-9d3a-2b8f0c6e1a01";
    let uid_b = "6f1b7c3e-0a52-4c1e-9d3a-2b8f0c6e1a02";
    let (sandbox_a, id_a) = run_pod(
        &mut client,
        &containerd.dir,
        "trainer-0",
        "ml",
        uid_a,
        "worker",
        image,
    )
    .await;
    // Same container name in another pod: the pod tells them apart.
    let (_, id_b) = run_pod(
        &mut client,
        &containerd.dir,
        "trainer-1",
        "ml",
        uid_b,
        "worker",
        image,
    )
    .await;

    let resolver = Resolver::with_endpoints(vec![Endpoint::containerd(&containerd.socket)]);
    let error = resolver.resolve(&Query::name("worker")).await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("matches several containers"), "{message}");
    assert!(message.contains("ml/trainer-0/worker"), "{message}");
    println!("{message}");

    let query = Query {
        name: Some("worker".into()),
        pod: Some("trainer-0".into()),
        namespace: Some("ml".into()),
        id: None,
    };
    let found = resolver.resolve(&query).await.expect("worker in trainer-0");
    assert!(!found.fallback);
    let container = found.container;
    println!("{container:#?}");
    assert_eq!(container.id, id_a);
    assert_eq!(container.runtime, Runtime::Containerd);
    assert_eq!(
        container.found_by,
        FoundBy::Api {
            socket: containerd.socket.clone()
        }
    );
    assert_eq!(container.name, "worker");
    assert_eq!(container.pod.as_deref(), Some("trainer-0"));
    assert_eq!(container.namespace.as_deref(), Some("ml"));
    assert_eq!(container.pod_uid.as_deref(), Some(uid_a));
    assert_eq!(container.sandbox_id.as_deref(), Some(sandbox_a.as_str()));
    assert_eq!(container.display_name(), "ml/trainer-0/worker");
    assert_eq!(container.state, State::Running);
    assert_eq!(
        container.ipc,
        IpcMode::PodSandbox {
            sandbox_id: sandbox_a.clone()
        }
    );
    let pid = container.pid.expect("the main pid, from the verbose info");
    assert_eq!(container.mntns, kernel_ids::mount_namespace(pid));
    // containerd gives each pod a 64 MiB /dev/shm, shared by its containers.
    assert_eq!(container.shm.size_bytes(), Some(64 << 20));
    assert!(container.shm.is_tmpfs);
    assert!(container.image.as_deref().unwrap().contains(image));

    // The verbose info shape the fixtures in `tests.rs` copy.
    let raw = client
        .container_status(proto::ContainerStatusRequest {
            container_id: id_a.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&raw.info["info"]).unwrap();
    let keys: Vec<&String> = info.as_object().unwrap().keys().collect();
    println!("ContainerStatus info keys: {keys:?}");
    assert_eq!(info["pid"].as_u64(), Some(u64::from(pid)));
    assert_eq!(info["sandboxID"].as_str(), Some(sandbox_a.as_str()));
    if std::env::var_os("SHMTRACE_CAPTURE_CRI").is_some() {
        let mut raw = raw;
        raw.info
            .insert("info".into(), serde_json::to_string_pretty(&info).unwrap());
        println!("{raw:#?}");
    }

    // By id prefix, and the other pod's container.
    let other = resolver.resolve(&Query::id(&id_b[..12])).await.unwrap();
    assert_eq!(other.container.pod.as_deref(), Some("trainer-1"));
    assert_ne!(
        other.container.shm.dev(),
        container.shm.dev(),
        "one /dev/shm per pod"
    );

    // The cgroup layout is the kubelet's cgroupfs one, and the scan reads it.
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    println!("{text}");
    match parse_proc_cgroup(&text) {
        PathClass::Container(found) => {
            assert_eq!(found.id, id_a);
            assert_eq!(found.pod_uid.as_deref(), Some(uid_a));
            assert_eq!(found.qos, Some(QosClass::BestEffort));
        }
        other => panic!("expected a container cgroup, got {other:?} from {text}"),
    }

    // A sandbox is not a container: it never matches.
    let error = resolver
        .resolve(&Query::id(&sandbox_a[..12]))
        .await
        .unwrap_err();
    assert!(matches!(error, ContainerError::NotFound { .. }), "{error}");
    drop(docker(&["version", "--format", "{{.Server.Version}}"]));
}

/// `shmtrace daemon` against this containerd: a pod made the way the kubelet makes one touches
/// its /dev/shm, and the daemon's metrics carry the container's `pod` and `namespace`.
#[tokio::test]
async fn the_daemons_metrics_carry_pod_and_namespace_labels() {
    shmtrace_tests::require_root();
    let containerd = Containerd::start();
    let mut client = proto::runtime_service_client::RuntimeServiceClient::new(
        channel(&containerd.socket, Duration::from_secs(10))
            .await
            .expect("containerd's CRI socket"),
    );
    let socket = containerd.socket.to_str().unwrap().to_owned();
    let daemon =
        shmtrace_tests::daemon::Daemon::start(&["--interval", "1s", "--cri-socket", &socket]);
    let uid = "7a2c9d4e-1b63-4d2f-8e4b-3c9a1d7f2b01";
    let (_, id) = run_pod(
        &mut client,
        &containerd.dir,
        "daemon-trainer-0",
        "daemon-ml",
        uid,
        "worker",
        IMAGE,
    )
    .await;
    // Let a survey see the pod, then make an object in its /dev/shm from inside.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let exec = client
        .exec_sync(proto::ExecSyncRequest {
            container_id: id,
            cmd: ["dd", "if=/dev/zero", "of=/dev/shm/x", "bs=1k", "count=64"]
                .map(str::to_owned)
                .to_vec(),
            timeout: 10,
        })
        .await
        .expect("ExecSync")
        .into_inner();
    assert_eq!(
        exec.exit_code,
        0,
        "dd in the pod: {}",
        String::from_utf8_lossy(&exec.stderr)
    );
    let labels = [
        ("container", "worker"),
        ("pod", "daemon-trainer-0"),
        ("namespace", "daemon-ml"),
        ("runtime", "containerd"),
    ];
    // The series appears with the first /dev/shm call; its use is measured at the next
    // survey: wait for the measurement, not just the series.
    let text = daemon.wait_for_metric(Duration::from_secs(30), |line| {
        line.starts_with("shmtrace_shm_used_bytes")
            && labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
            && line
                .rsplit(' ')
                .next()
                .and_then(|value| value.parse::<f64>().ok())
                .is_some_and(|used| used >= (64 << 10) as f64)
    });
    let used = shmtrace_tests::daemon::sample(&text, "shmtrace_shm_used_bytes", &labels).unwrap();
    assert!(used >= (64 << 10) as f64, "{text}");
    assert!(
        shmtrace_tests::daemon::sample(&text, "shmtrace_shm_size_bytes", &labels).is_some(),
        "{text}"
    );
    let (status, _, stderr) = daemon.stop();
    assert!(status.success(), "{stderr}");
}
