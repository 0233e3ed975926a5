//! Tests against a real Docker daemon (`dockerd` on `/var/run/docker.sock`), as root.
//!
//! They fail, loudly, when Docker is not reachable: CI starts it (see docs/containers.md).
//! Containers get unique names (`shmtrace-test-PID-N-what`) and are removed when the guard
//! drops, also when a test fails. The image is a busybox root file system made here and
//! imported with `docker import`: no registry is needed.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use shmtrace::{
    container::{
        Change, ContainerError, Endpoint, FoundBy, IpcMode, Query, Resolver, Runtime, ShmError,
        ShmSource, State, host_shm_dev, measure_shm,
    },
    kernel_ids,
};
use shmtrace_tests::runtimes::{IMAGE, SOCKET, docker, image, unique, wait_for};

/// A container removed (with `docker rm -f`, by name) when dropped.
struct TestContainer {
    name: String,
}

impl TestContainer {
    /// `docker run -d --network none ARGS IMAGE COMMAND`.
    fn run(what: &str, args: &[&str], command: &[&str]) -> TestContainer {
        let container = TestContainer::named(unique(what));
        container.start_new(args, command);
        container
    }

    /// A guard for `name`, before anything exists under it.
    fn named(name: String) -> TestContainer {
        TestContainer { name }
    }

    fn start_new(&self, args: &[&str], command: &[&str]) {
        let image = image();
        let mut all = vec!["run", "-d", "--network", "none", "--name", &self.name];
        all.extend_from_slice(args);
        all.push(image);
        all.extend_from_slice(command);
        docker(&all);
    }

    fn id(&self) -> String {
        docker(&["inspect", "-f", "{{.Id}}", &self.name])
    }

    fn pid(&self) -> u32 {
        docker(&["inspect", "-f", "{{.State.Pid}}", &self.name])
            .parse()
            .unwrap()
    }

    fn exec(&self, command: &[&str]) -> std::process::Output {
        let mut all = vec!["exec", self.name.as_str()];
        all.extend_from_slice(command);
        Command::new("docker").args(&all).output().unwrap()
    }
}

impl Drop for TestContainer {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn resolver() -> Resolver {
    Resolver::with_endpoints(vec![Endpoint::docker(SOCKET)])
}

const SLEEP: &[&str] = &["sleep", "600"];

#[tokio::test]
async fn resolves_by_exact_name_never_by_substring() {
    let short = TestContainer::run("trainer", &[], SLEEP);
    let long = TestContainer::named(format!("{}-worker", short.name));
    long.start_new(&[], SLEEP);

    let found = resolver().resolve(&Query::name(&short.name)).await.unwrap();
    let container = found.container;
    assert_eq!(container.id, short.id());
    assert_eq!(container.name, short.name);
    assert_eq!(container.runtime, Runtime::Docker);
    assert_eq!(
        container.found_by,
        FoundBy::Api {
            socket: SOCKET.into()
        }
    );
    assert_eq!(container.image.as_deref(), Some(IMAGE));
    assert_eq!(container.state, State::Running);
    assert_eq!(container.pid, Some(short.pid()));
    let mntns = container.mntns.expect("a mount namespace");
    assert_eq!(Some(mntns), kernel_ids::mount_namespace(short.pid()));
    assert_ne!(Some(mntns), kernel_ids::mount_namespace(std::process::id()));
    assert!(!found.fallback);
    // Docker's default: 64 MiB, private.
    assert_eq!(container.shm.configured_bytes, Some(64 << 20));
    assert_eq!(container.shm.size_bytes(), Some(64 << 20));
    assert!(matches!(
        container.ipc,
        IpcMode::Private | IpcMode::Shareable
    ));

    let longer = resolver().resolve(&Query::name(&long.name)).await.unwrap();
    assert_eq!(longer.container.id, long.id());
    // Docker's `name=` filter would match this prefix; an exact lookup must not.
    let prefix = &short.name[..short.name.len() - 2];
    let error = resolver().resolve(&Query::name(prefix)).await.unwrap_err();
    assert!(matches!(error, ContainerError::NotFound { .. }), "{error}");
}

#[tokio::test]
async fn resolves_by_id_prefix() {
    let container = TestContainer::run("by-id", &[], SLEEP);
    let id = container.id();
    let found = resolver().resolve(&Query::id(&id[..12])).await.unwrap();
    assert_eq!(found.container.id, id);
    assert_eq!(found.container.name, container.name);
    let upper = resolver()
        .resolve(&Query::id(id[..16].to_uppercase()))
        .await
        .unwrap();
    assert_eq!(upper.container.id, id);
}

#[tokio::test]
async fn a_missing_name_lists_the_running_containers() {
    let running = TestContainer::run("listed", &[], SLEEP);
    let missing = unique("no-such-container");
    let error = resolver()
        .resolve(&Query::name(&missing))
        .await
        .unwrap_err();
    let ContainerError::NotFound {
        running: names,
        asked,
        ..
    } = &error
    else {
        panic!("expected NotFound, got {error}");
    };
    assert!(names.contains(&running.name), "{names:?}");
    assert_eq!(asked, &[format!("docker at {SOCKET}")]);
    let message = error.to_string();
    assert!(
        message.contains(&format!("no container named \"{missing}\"")),
        "{message}"
    );
    assert!(message.contains(&running.name), "{message}");
    println!("{message}");
}

#[tokio::test]
async fn a_stopped_container_says_so_and_can_be_waited_for() {
    let exited = TestContainer::named(unique("exited"));
    // `docker run` passes the container's status on: 3 here.
    let run = Command::new("docker")
        .args([
            "run",
            "--network",
            "none",
            "--name",
            &exited.name,
            image(),
            "sh",
            "-c",
            "exit 3",
        ])
        .status()
        .unwrap();
    assert_eq!(run.code(), Some(3));
    let error = resolver()
        .resolve(&Query::name(&exited.name))
        .await
        .unwrap_err();
    let ContainerError::NotRunning { container } = &error else {
        panic!("expected NotRunning, got {error}");
    };
    assert_eq!(container.state, State::Exited { code: Some(3) });
    assert_eq!(container.pid, None);
    assert_eq!(container.shm.source, ShmSource::Configured);
    assert_eq!(container.shm.size_bytes(), Some(64 << 20));
    let message = error.to_string();
    assert!(message.contains("exited with status 3"), "{message}");
    assert!(
        message.contains(&format!("docker start {}", exited.name)),
        "{message}"
    );
    assert!(message.contains("--wait"), "{message}");

    // A created container, started a second later, is waited for.
    let later = TestContainer::named(unique("later"));
    docker(&[
        "create",
        "--network",
        "none",
        "--name",
        &later.name,
        image(),
        "sleep",
        "600",
    ]);
    let name = later.name.clone();
    let starter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        docker(&["start", &name]);
    });
    let started = Instant::now();
    let found = resolver()
        .wait_until_running(&Query::name(&later.name), Duration::from_secs(30))
        .await
        .unwrap();
    starter.join().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(found.container.state, State::Running);
    assert_eq!(found.container.pid, Some(later.pid()));

    let error = resolver()
        .wait_until_running(&Query::name(&exited.name), Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        matches!(error, ContainerError::WaitTimedOut { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("exited with status 3"),
        "{error}"
    );
}

#[tokio::test]
async fn follows_a_restart_under_the_same_name() {
    let container = TestContainer::run("restart", &[], SLEEP);
    let first = resolver()
        .resolve(&Query::name(&container.name))
        .await
        .unwrap()
        .container;
    assert!(matches!(
        resolver().recheck(&first).await.unwrap(),
        Change::Unchanged
    ));

    docker(&["restart", "-t", "0", &container.name]);
    let Change::Restarted {
        container: second,
        same_id,
    } = resolver().recheck(&first).await.unwrap()
    else {
        panic!("a restart should be noticed");
    };
    assert!(same_id);
    assert_eq!(second.pid, Some(container.pid()));
    assert_ne!(second.pid, first.pid);
    // The new init has a new mount namespace, but its inode number may be the old one's:
    // namespace inode numbers are recycled (seen here). Compare pids, never namespaces alone.
    assert_eq!(second.mntns, kernel_ids::mount_namespace(container.pid()));

    docker(&["stop", "-t", "0", &container.name]);
    assert!(matches!(
        resolver().recheck(&second).await.unwrap(),
        Change::Stopped { .. }
    ));

    docker(&["rm", "-f", &container.name]);
    assert!(matches!(
        resolver().recheck(&second).await.unwrap(),
        Change::Gone
    ));

    // Re-created under the same name: a new id.
    container.start_new(&[], SLEEP);
    let Change::Restarted {
        container: third,
        same_id,
    } = resolver().recheck(&first).await.unwrap()
    else {
        panic!("a new container under the same name should be noticed");
    };
    assert!(!same_id);
    assert_eq!(third.id, container.id());
}

#[tokio::test]
async fn measures_a_small_shm_and_its_use() {
    let container = TestContainer::run("shm-1m", &["--shm-size", "1m"], SLEEP);
    let found = resolver()
        .resolve(&Query::name(&container.name))
        .await
        .unwrap()
        .container;
    let shm = found.shm.clone();
    assert_eq!(shm.size_bytes(), Some(1 << 20));
    assert_eq!(shm.size_option, Some(1 << 20));
    assert_eq!(shm.configured_bytes, Some(1 << 20));
    assert_eq!(
        shm.source,
        ShmSource::Measured {
            pid: container.pid()
        }
    );
    assert!(shm.is_tmpfs);
    assert_ne!(shm.dev(), host_shm_dev());
    let before = shm.used_bytes().unwrap();

    let dd = container.exec(&[
        "dd",
        "if=/dev/zero",
        "of=/dev/shm/half",
        "bs=1024",
        "count=512",
    ]);
    assert!(
        dd.status.success(),
        "{}",
        String::from_utf8_lossy(&dd.stderr)
    );
    let after = measure_shm(found.pid.unwrap()).unwrap();
    assert!(
        after.used_bytes().unwrap() >= before + (512 << 10),
        "{before} -> {after:?}"
    );

    // Filling it: the same ENOSPC a DataLoader worker meets.
    let full = container.exec(&[
        "dd",
        "if=/dev/zero",
        "of=/dev/shm/more",
        "bs=1024",
        "count=4096",
    ]);
    assert!(!full.status.success());
    assert!(String::from_utf8_lossy(&full.stderr).contains("No space left on device"));
    let full = measure_shm(found.pid.unwrap()).unwrap();
    assert_eq!(full.used_bytes(), full.size_bytes());
    println!(
        "--shm-size 1m: size {:?}, used {before} -> {:?} after 512 KiB -> {:?} when full",
        shm.size_bytes(),
        after.used_bytes(),
        full.used_bytes()
    );
}

#[tokio::test]
async fn notes_ipc_host() {
    let container = TestContainer::run("ipc-host", &["--ipc", "host"], SLEEP);
    let found = resolver()
        .resolve(&Query::name(&container.name))
        .await
        .unwrap()
        .container;
    assert_eq!(found.ipc, IpcMode::Host);
    assert_eq!(found.shm.dev(), host_shm_dev());
    assert_eq!(found.ipc.describe(), "the host's (--ipc=host)");
    // Docker still says ShmSize 64 MiB; the limit is the host's /dev/shm's.
    assert_eq!(found.shm.configured_bytes, None);
    assert_eq!(
        found.shm.size_bytes(),
        measure_shm(std::process::id()).unwrap().size_bytes()
    );
}

/// A container replaces its /dev/shm with symlinks to host paths. Read naively through
/// `/proc/PID/root`, the kernel would follow them on the host; shmtrace must not.
#[tokio::test]
async fn a_container_cannot_redirect_the_measurement_with_symlinks() {
    // A host-only directory with a tmpfs of a recognisable size.
    let host_dir = PathBuf::from(format!("/tmp/{}", unique("host-only")));
    std::fs::create_dir_all(&host_dir).unwrap();
    let mount = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
        .arg(&host_dir)
        .status()
        .unwrap();
    assert!(mount.success(), "mounting a tmpfs (tests run as root)");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _unmount = Unmount(host_dir.clone());

    // --ipc none: no tmpfs on /dev/shm, so the container's root may put a symlink there.
    let link = format!("ln -sfn {} /dev/shm && sleep 600", host_dir.display());
    let container = TestContainer::run("symlink", &["--ipc", "none"], &["sh", "-c", &link]);
    let pid = container.pid();
    wait_for(|| container.exec(&["test", "-L", "/dev/shm"]).status.success());

    // The attack is real: the naive path lands on the host's 3 MiB tmpfs.
    let naive = nix::sys::statfs::statfs(format!("/proc/{pid}/root/dev/shm").as_str()).unwrap();
    assert_eq!(naive.blocks() * naive.block_size() as u64, 3 << 20);
    // shmtrace resolves inside the container, where that path does not exist.
    assert!(matches!(measure_shm(pid), Err(ShmError::Missing { .. })));

    // `/dev/shm -> /`: the container's own root, not the host's.
    assert!(
        container
            .exec(&["ln", "-sfn", "/", "/dev/shm"])
            .status
            .success()
    );
    let measured = measure_shm(pid).unwrap();
    assert!(
        !measured.is_tmpfs,
        "the container's root is an overlay, not a tmpfs"
    );
    let host_root = std::fs::metadata("/").unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        measured.dev(),
        Some(kernel_ids::kernel_dev_from_stat(host_root.dev()))
    );

    // `/dev/shm -> /proc/1/root/tmp`: a magic link, refused.
    assert!(
        container
            .exec(&["ln", "-sfn", "/proc/1/root/tmp", "/dev/shm"])
            .status
            .success()
    );
    assert!(matches!(measure_shm(pid), Err(ShmError::MagicLink { .. })));

    // Through the resolver, the refusal becomes the reason the size is unknown.
    let found = resolver()
        .resolve(&Query::name(&container.name))
        .await
        .unwrap()
        .container;
    assert_eq!(found.ipc, IpcMode::NoShm);
    let ShmSource::Unavailable { reason } = &found.shm.source else {
        panic!("expected no measurement, got {:?}", found.shm);
    };
    assert!(reason.contains("magic link"), "{reason}");
}

#[tokio::test]
async fn a_daemon_that_is_down_falls_back_to_the_cgroup_scan() {
    let container = TestContainer::run("fallback", &[], SLEEP);
    // A socket file nobody listens on: what a stopped dockerd leaves behind.
    let dead = std::env::temp_dir().join(format!("{}.sock", unique("dead")));
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let down = Resolver::with_endpoints(vec![Endpoint::docker(&dead)]);

    let error = down
        .resolve(&Query::name(&container.name))
        .await
        .unwrap_err();
    let message = error.to_string();
    let ContainerError::NotFound {
        problems,
        fallback,
        running,
        ..
    } = &error
    else {
        panic!("expected NotFound, got {error}");
    };
    assert!(*fallback);
    assert_eq!(problems.len(), 1);
    assert!(message.contains("the Docker daemon at"), "{message}");
    assert!(message.contains("is not answering"), "{message}");
    assert!(message.contains("--container-id"), "{message}");
    let id = container.id();
    assert!(running.iter().any(|r| r.contains(&id[..12])), "{running:?}");
    println!("{message}");

    // By id, the scan finds it.
    let found = down.resolve(&Query::id(&id[..12])).await.unwrap();
    assert!(found.fallback);
    assert_eq!(found.problems.len(), 1);
    let scanned = found.container;
    assert_eq!(scanned.found_by, FoundBy::CgroupScan);
    assert_eq!(scanned.runtime, Runtime::Docker);
    assert_eq!(scanned.id, id);
    assert_eq!(scanned.pid, Some(container.pid()));
    assert_eq!(scanned.mntns, kernel_ids::mount_namespace(container.pid()));
    assert_eq!(scanned.shm.size_bytes(), Some(64 << 20));

    // A socket that does not exist at all, named explicitly, is reported too.
    let error = down.resolve(&Query::default()).await.unwrap_err();
    assert!(matches!(error, ContainerError::EmptyQuery), "{error}");

    let missing = Resolver::with_endpoints(vec![Endpoint::docker("/nonexistent/docker.sock")]);
    let error = missing.resolve(&Query::name("x")).await.unwrap_err();
    assert!(error.to_string().contains("no such socket"), "{error}");
    let _ = std::fs::remove_file(&dead);
}
