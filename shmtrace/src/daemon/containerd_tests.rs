//! The daemon against a real containerd with its CRI plugin (the private instance of
//! `container::containerd_tests`): a pod made the way the kubelet makes one touches its
//! /dev/shm, and the daemon's metrics carry the container's `pod` and `namespace`. It runs the
//! real binary (built here with cargo), as root; it fails loudly without containerd or Docker.
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::container::{
    TEST_IMAGE, channel,
    containerd_tests::{Containerd, run_pod},
    proto,
};

/// The shmtrace binary of this workspace, built now.
fn shmtrace_binary() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--package",
            "shmtrace",
            "--bin",
            "shmtrace",
        ])
        .status()
        .expect("running cargo build");
    assert!(status.success(), "building shmtrace failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("debug/shmtrace")
}

fn get_metrics(addr: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn pods_made_through_the_cri_carry_pod_and_namespace_labels() {
    let binary = shmtrace_binary();
    let containerd = Containerd::start();
    let mut client = proto::runtime_service_client::RuntimeServiceClient::new(
        channel(&containerd.socket, Duration::from_secs(10))
            .await
            .expect("containerd's CRI socket"),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let daemon = Running(
        Command::new(&binary)
            .args([
                "daemon",
                "--listen",
                &addr,
                "--interval",
                "1s",
                "--cri-socket",
            ])
            .arg(&containerd.socket)
            .stdout(Stdio::null())
            .spawn()
            .expect("starting shmtrace daemon"),
    );

    let started = Instant::now();
    while get_metrics(&addr).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the daemon did not serve /metrics"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let uid = "7a2c9d4e-1b63-4d2f-8e4b-3c9a1d7f2b01";
    let (_, id) = run_pod(
        &mut client,
        &containerd.dir,
        "daemon-trainer-0",
        "daemon-ml",
        uid,
        "worker",
        TEST_IMAGE,
    )
    .await;
    // Let a survey see the pod, then touch its /dev/shm from inside.
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

    let wanted = r#"shmtrace_shm_used_bytes{container="worker",pod="daemon-trainer-0",namespace="daemon-ml",runtime="containerd"}"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = get_metrics(&addr);
        if let Some(line) = text.lines().find(|l| l.starts_with(wanted)) {
            let used: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            assert!(used >= 64 << 10, "{line}");
            break text;
        }
        assert!(Instant::now() < deadline, "no {wanted} in:\n{text}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        text.contains(r#"shmtrace_shm_size_bytes{container="worker",pod="daemon-trainer-0",namespace="daemon-ml",runtime="containerd"}"#),
        "{text}"
    );
    drop(daemon);
}
