//! Tests against real Podman (Debian's podman 4.3): containers made with the podman CLI, found
//! through the Docker-compatible API of a `podman system service` the test starts on a private
//! socket. Fails loudly when podman is not installed.
//!
//! This host has no systemd, so podman runs with `--cgroup-manager cgroupfs` (containers under
//! `/libpod_parent/libpod-<id>`) and `--events-backend file`. Its default `nofile`/`nproc`
//! limits (1048576) exceed what the sandbox lets runc set, so containers get explicit ones.
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use shmtrace::{
    container::{
        Endpoint, FoundBy, IpcMode, PathClass, Query, Resolver, Runtime, ShmSource, State,
        parse_proc_cgroup,
    },
    kernel_ids,
};
use shmtrace_tests::runtimes::{cli, unique, wait_for};

const IMAGE: &str = "localhost/shmtrace-podman-test:1";
const GLOBAL: &[&str] = &["--cgroup-manager", "cgroupfs", "--events-backend", "file"];

fn podman(args: &[&str]) -> String {
    cli("podman", GLOBAL, args, "install it: apt-get install podman")
}

/// `podman import` of a busybox root file system.
fn import_image() {
    let root = std::env::temp_dir().join(unique("podman-rootfs"));
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).expect("busybox-static");
    for applet in ["sh", "sleep", "dd", "test"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let import = Command::new("podman")
        .args(GLOBAL)
        .args(["import", "-", IMAGE])
        .stdin(tar.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(
        tar.wait().unwrap().success(),
        "tar of the test root file system"
    );
    assert!(
        import.status.success(),
        "{}",
        String::from_utf8_lossy(&import.stderr)
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// `podman system service` on a private socket, stopped when dropped.
struct Service {
    socket: PathBuf,
    child: Child,
}

impl Service {
    fn start() -> Service {
        let socket = std::env::temp_dir().join(format!("{}.sock", unique("podman")));
        let child = Command::new("podman")
            .args(GLOBAL)
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("podman system service");
        let service = Service { socket, child };
        wait_for(|| service.socket.exists());
        service
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

struct PodmanContainer(String);

impl Drop for PodmanContainer {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(GLOBAL)
            .args(["rm", "-f", "-t", "0", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[tokio::test]
async fn finds_podman_containers_through_its_docker_api() {
    import_image();
    let service = Service::start();
    let container = PodmanContainer(unique("podman"));
    podman(&[
        "run",
        "-d",
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--shm-size",
        "2m",
        "--name",
        &container.0,
        IMAGE,
        "sleep",
        "600",
    ]);
    let pid: u32 = podman(&["inspect", "-f", "{{.State.Pid}}", &container.0])
        .parse()
        .unwrap();

    // Listed as a Docker socket: the version answer says it is Podman.
    let resolver = Resolver::with_endpoints(vec![Endpoint::docker(&service.socket)]);
    let found = resolver.resolve(&Query::name(&container.0)).await.unwrap();
    let found = found.container;
    assert_eq!(found.runtime, Runtime::Podman);
    assert_eq!(
        found.found_by,
        FoundBy::Api {
            socket: service.socket.clone()
        }
    );
    assert_eq!(found.name, container.0);
    assert_eq!(found.image.as_deref(), Some(IMAGE));
    assert_eq!(found.state, State::Running);
    assert_eq!(found.pid, Some(pid));
    assert_eq!(found.mntns, kernel_ids::mount_namespace(pid));
    assert_eq!(found.shm.configured_bytes, Some(2 << 20));
    assert_eq!(found.shm.size_bytes(), Some(2 << 20));
    assert_eq!(found.shm.source, ShmSource::Measured { pid });
    assert!(matches!(found.ipc, IpcMode::Shareable | IpcMode::Private));

    // Its cgroup, as podman's cgroupfs manager makes it.
    match parse_proc_cgroup(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap()) {
        PathClass::Container(cgroup) => {
            assert_eq!(cgroup.runtime, Runtime::Podman);
            assert_eq!(cgroup.id, found.id);
            assert!(
                cgroup.path.starts_with("/libpod_parent/libpod-"),
                "{}",
                cgroup.path
            );
        }
        other => panic!("expected podman's cgroup, got {other:?}"),
    }

    podman(&["stop", "-t", "0", &container.0]);
    let error = resolver
        .resolve(&Query::name(&container.0))
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("podman start {}", container.0)),
        "{error}"
    );
}
