//! Each probe path, triggered by real system calls and seen through the real binary's JSON.
use serde_json::Value;
use shmtrace_tests::{
    UNLINK, exerciser, live::LiveTracer, read_json_lines, require_root, scaled, serial, shmtrace,
    tempdir, trace_exerciser,
};

fn errno(record: &Value) -> Option<&str> {
    record["errno"].as_str()
}

#[test]
fn fallocate_enospc_on_a_full_tmpfs() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "1m", "fallocate-enospc"]);
    assert!(trace.output.status.success(), "{}", trace.dump());
    let open = trace.events("openat");
    let open = open
        .iter()
        .find(|r| r["path"] == "/dev/shm/torch_fallocate_0")
        .unwrap_or_else(|| panic!("no openat of the object:\n{}", trace.dump()));
    assert_eq!(open["flags"], "O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC");
    // It made a file (with RESOLVE_BENEATH, as it once asked, an absolute path fails with
    // EXDEV, which the probes no longer report).
    assert!(open["ret"].as_i64().unwrap() >= 0, "{}", trace.dump());
    assert_eq!(open["mode"], "0600");
    let fd = open["ret"].as_i64().unwrap();
    assert!(fd >= 0);

    let ftruncate = &trace.events("ftruncate")[0];
    assert_eq!(ftruncate["size"], 2 << 20);
    assert_eq!(ftruncate["ret"], 0);
    assert_eq!(ftruncate["fd"], fd);
    assert_eq!(ftruncate["path"], "/dev/shm/torch_fallocate_0");

    let fallocate = &trace.events("fallocate")[0];
    assert_eq!(errno(fallocate), Some("ENOSPC"), "{}", trace.dump());
    assert_eq!(fallocate["ret"], -28);
    assert_eq!(fallocate["size"], 2 << 20);
    assert_eq!(fallocate["offset"], 0);
    assert_eq!(fallocate["path"], "/dev/shm/torch_fallocate_0");

    let unlink = &trace.events(UNLINK)[0];
    assert_eq!(unlink["path"], "/dev/shm/torch_fallocate_0");
    assert_eq!(unlink["ret"], 0);
    let close = &trace.events("close")[0];
    assert_eq!(close["fd"], fd);
    assert_eq!(close["freed"][0], "/dev/shm/torch_fallocate_0");
    assert_eq!(trace.summary()["failed_calls"], 1);
    assert_eq!(trace.summary()["lost"], 0);
}

#[test]
fn write_enospc_of_a_semaphore() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "1m", "write-enospc"]);
    let writes = trace.events("write");
    let sem = writes
        .iter()
        .find(|r| r["path"] == "/dev/shm/sem.exerciser")
        .unwrap_or_else(|| panic!("no write to the semaphore:\n{}", trace.dump()));
    assert_eq!(errno(sem), Some("ENOSPC"));
    assert_eq!(sem["size"], 32);
    // The filler's writes succeeded until the tmpfs was full, then one failed.
    let filler: Vec<_> = writes
        .iter()
        .filter(|r| r["path"] == "/dev/shm/filler")
        .collect();
    assert_eq!(filler.len(), 257, "256 pages of 4 KiB, then ENOSPC");
    assert_eq!(errno(filler.last().unwrap()), Some("ENOSPC"));
    assert_eq!(filler[0]["object_bytes"], 4096);
}

#[test]
fn sigbus_address_maps_back_to_its_file() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "1m", "sigbus"]);
    assert_eq!(
        trace.output.status.code(),
        Some(128 + 7),
        "shmtrace exits like the command"
    );
    let mmap = &trace.events("mmap")[0];
    assert_eq!(mmap["path"], "/dev/shm/psm_sigbus");
    assert_eq!(mmap["size"], 2 << 20);
    let base =
        u64::from_str_radix(mmap["addr"].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();

    let signal = &trace.events("signal")[0];
    assert_eq!(signal["signal"], "SIGBUS");
    assert_eq!(signal["code"], "BUS_ADRERR");
    assert_eq!(signal["path"], "/dev/shm/psm_sigbus", "{}", trace.dump());
    let addr = u64::from_str_radix(
        signal["addr"].as_str().unwrap().trim_start_matches("0x"),
        16,
    )
    .unwrap();
    let offset = signal["offset"].as_u64().unwrap();
    assert_eq!(
        addr - base,
        offset,
        "offset is the address inside the mapping"
    );
    // A 1 MiB tmpfs fills up at 1 MiB (less what the kernel keeps).
    assert!((900 << 10..=1 << 20).contains(&offset), "fault at {offset}");

    let exit = trace.events("exit");
    let exit = exit.last().unwrap();
    assert_eq!(exit["signal"], "SIGBUS");
}

#[test]
fn system_v_failures_and_success() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "1m", "shmget"]);
    let gets = trace.events("shmget");
    assert_eq!(gets.len(), 3, "{}", trace.dump());
    assert_eq!(errno(gets[0]), Some("EINVAL"), "over shmmax");
    assert_eq!(gets[0]["size"], 2 << 20);
    assert_eq!(gets[0]["key"], "0x0");
    assert_eq!(
        errno(gets[1]),
        Some("ENOENT"),
        "missing key without IPC_CREAT"
    );
    assert_eq!(gets[1]["key"], "0x5157");
    assert!(gets[2]["shmid"].as_i64().unwrap() >= 0);
    let shmid = gets[2]["shmid"].clone();
    let at = &trace.events("shmat")[0];
    assert_eq!(at["shmid"], shmid);
    assert!(at["addr"].as_str().unwrap().starts_with("0x"));
    assert_eq!(trace.events("shmdt")[0]["ret"], 0);
    let ctl = &trace.events("shmctl")[0];
    assert_eq!(ctl["flags"], "IPC_RMID");
    assert_eq!(ctl["shmid"], shmid);
}

/// What a program saw of /dev/shm's free space: `statfs` of a path in it and `fstatfs` of a
/// descriptor of it, with the figures `statvfs` users compute; nothing for other file systems.
#[test]
fn statfs_of_dev_shm_shows_the_free_space_seen() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "4m", "statfs"]);
    assert!(trace.output.status.success(), "{}", trace.dump());
    let statfs = trace.events("statfs");
    let paths: Vec<&str> = statfs.iter().filter_map(|r| r["path"].as_str()).collect();
    assert_eq!(paths, ["/dev/shm", "/dev/shm/filled"], "{}", trace.dump());
    let fstatfs = trace.events("fstatfs");
    assert_eq!(fstatfs.len(), 2, "{}", trace.dump());
    assert_eq!(fstatfs[1]["path"], "/dev/shm/filled");
    for seen in statfs.iter().chain(&fstatfs) {
        assert_eq!(seen["ret"], 0, "{seen}");
        assert_eq!(seen["size"], 4 << 20, "{seen}");
        assert_eq!(seen["free"], 3 << 20, "{seen}");
        assert_eq!(seen["failure"], false, "{seen}");
    }
    assert_eq!(trace.summary()["failed_calls"], 0);
    assert_eq!(trace.summary()["lost"], 0);
}

#[test]
fn follows_forks_to_grandchildren() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["fork-tree"]);
    let forks = trace.events("fork");
    assert_eq!(forks.len(), 2, "{}", trace.dump());
    let child = forks[0]["child_pid"].as_u64().unwrap();
    assert_eq!(
        forks[1]["pid"].as_u64().unwrap(),
        child,
        "the child forks the grandchild"
    );
    let grandchild = forks[1]["child_pid"].as_u64().unwrap();
    let open = trace
        .events("openat")
        .into_iter()
        .find(|r| r["path"] == "/dev/shm/grandchild_object")
        .expect("the grandchild's openat");
    assert_eq!(open["pid"].as_u64().unwrap(), grandchild);
    let exits: Vec<u64> = trace
        .events("exit")
        .iter()
        .filter_map(|r| r["pid"].as_u64())
        .collect();
    assert!(exits.contains(&grandchild) && exits.contains(&child));
}

#[test]
fn exit_by_signal() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["die-by-signal", "11"]);
    assert_eq!(trace.output.status.code(), Some(128 + 11));
    let signal = &trace.events("signal")[0];
    assert_eq!(signal["signal"], "SIGSEGV");
    assert_eq!(signal["code"], "SI_TKILL");
    let exit = &trace.events("exit")[0];
    assert_eq!(exit["signal"], "SIGSEGV");
    assert_eq!(trace.summary()["deaths_by_signal"], 1);
}

/// The probes judge each exit (`shm_death`, what the daemon's death count counts, kept in the
/// kernel too): a process killed by a SIGBUS in its /dev/shm mapping died of it, and so did the
/// shell that then exited 3; not a process whose writes failed but that exited 0, one that
/// failed nothing, nor a shell whose child failed and that was then stopped by SIGTERM.
#[test]
fn exits_are_judged_deaths_of_a_full_dev_shm_by_what_failed_before() {
    let _guard = serial();
    require_root();
    let ex = exerciser().display().to_string();
    let script = format!(
        "{ex} --private-shm 1m sigbus; {ex} --private-shm 1m failures 3; sh -c 'exit 1'; \
         sh -c '{ex} --private-shm 1m failures 3; kill -TERM $$'; exit 3"
    );
    let dir = tempdir();
    let out = dir.join("trace.jsonl");
    let output = shmtrace()
        .args(["--json", "-o"])
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .output()
        .expect("running shmtrace");
    let records = read_json_lines(&out);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    // Each process by its last command line (a shell's holds the commands it runs).
    let argv_of = |pid: &Value| -> String {
        records
            .iter()
            .rfind(|r| r["event"] == "exec" && &r["pid"] == pid)
            .map(|r| r["argv"].to_string())
            .unwrap_or_default()
    };
    let judged: Vec<(String, bool)> = records
        .iter()
        .filter(|r| r["event"] == "exit")
        .map(|r| {
            let death = r["shm_death"]
                .as_bool()
                .unwrap_or_else(|| panic!("an exit without shm_death: {r}"));
            (argv_of(&r["pid"]), death)
        })
        .collect();
    let deaths_of = |part: &str| -> Vec<bool> {
        judged
            .iter()
            .filter(|(argv, _)| argv.contains(part))
            .map(|(_, death)| *death)
            .collect()
    };
    assert_eq!(deaths_of("\"sigbus\""), [true], "{judged:#?}");
    assert_eq!(deaths_of("\"failures\""), [false, false], "{judged:#?}");
    assert_eq!(deaths_of("\"exit 1\""), [false], "{judged:#?}");
    assert_eq!(deaths_of("kill -TERM $$\"]"), [false], "{judged:#?}");
    // The outer shell by the script's start: an exec record's argv is cut short, and how far
    // the script's end reaches depends on the length of the checkout's path.
    assert_eq!(deaths_of(" sigbus; "), [true], "{judged:#?}");
}

#[test]
fn paths_relative_to_a_shm_directory() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "1m", "relative"]);
    let paths: Vec<&str> = trace
        .events("openat")
        .iter()
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert!(paths.contains(&"/dev/shm/via_dirfd"), "{}", trace.dump());
    assert!(paths.contains(&"/dev/shm/via_cwd"), "{}", trace.dump());
    let unlinks: Vec<&str> = trace
        .events("unlinkat")
        .into_iter()
        .chain(trace.events("unlink"))
        .filter_map(|r| r["path"].as_str())
        .collect();
    assert!(unlinks.contains(&"/dev/shm/via_dirfd") && unlinks.contains(&"/dev/shm/via_cwd"));
}

#[test]
fn paths_in_pages_not_yet_touched_are_read_when_the_call_returns() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "1m", "untouched-path"]);
    assert_eq!(trace.summary()["lost"], 0, "{}", trace.dump());
    let open = trace.events("openat");
    let path = open
        .iter()
        .filter_map(|r| r["path"].as_str())
        .find(|path| path.starts_with("/dev/shm/untouched-"))
        .unwrap_or_else(|| panic!("no openat of the untouched path: {}", trace.dump()));
    let unlinked = trace
        .events(UNLINK)
        .iter()
        .any(|r| r["path"].as_str() == Some(path) && r["ret"] == 0);
    assert!(unlinked, "no unlink of {path}: {}", trace.dump());
}

#[test]
fn openat2_memfd_and_partial_munmap() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["openat2"]);
    let open = &trace.events("openat2")[0];
    assert_eq!(open["path"], "/dev/shm/via_openat2");
    assert_eq!(open["flags"], "O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC");

    let trace = trace_exerciser(&[], &["memfd"]);
    let memfd = &trace.events("memfd_create")[0];
    assert_eq!(memfd["path"], "torch-memfd");
    assert!(memfd["ret"].as_i64().unwrap() >= 0);

    let trace = trace_exerciser(&[], &["munmap"]);
    let unmap = &trace.events("munmap")[0];
    assert_eq!(unmap["path"], "/dev/shm/unmapped", "{}", trace.dump());
    assert_eq!(unmap["size"], 8192);
    // Two pieces of the mapping remain after the hole, so closing and unlinking do not free it;
    // the exit does.
    assert!(trace.events("close")[0]["freed"].is_null());
    assert_eq!(trace.events("exit")[0]["freed"][0], "/dev/shm/unmapped");
}

/// musl, Alpine's libc, opens and `shm_open`s with `open(2)` on x86-64, not `openat(2)`: the
/// open is reported with its path and flags, what follows names the file, and host-wide the
/// process is followed from that open, so its `ftruncate` is seen at all. (arm64 has no
/// `open`.)
#[cfg(target_arch = "x86_64")]
#[test]
fn open_of_musl_is_traced_like_openat() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "1m", "open-syscall"]);
    let open = &trace.events("open")[0];
    assert_eq!(open["path"], "/dev/shm/musl_open_0", "{}", trace.dump());
    assert_eq!(open["flags"], "O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC");
    assert!(open["ret"].as_i64().unwrap() >= 0);
    let ftruncate = &trace.events("ftruncate")[0];
    assert_eq!(
        ftruncate["path"],
        "/dev/shm/musl_open_0",
        "{}",
        trace.dump()
    );

    let tracer = LiveTracer::start(&["--all"]);
    let status = std::process::Command::new(exerciser())
        .args(["--private-shm", "1m", "open-syscall"])
        .status()
        .unwrap();
    assert!(status.success());
    tracer.wait_for_record(|r| r["event"] == "ftruncate" && r["path"] == "/dev/shm/musl_open_0");
    let (status, log, _) = tracer.stop();
    assert_eq!(status.code(), Some(130), "{log}");
}

/// A process whose main thread leaves first (as with `pthread_exit`) lives on in its other
/// threads: it
/// stays traced, and its one exit is its last thread's.
#[test]
fn a_process_outlives_its_main_thread() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["leader-exits-first"]);
    let kinds: Vec<&str> = trace
        .records
        .iter()
        .filter(|r| r["path"] == "/dev/shm/after_the_leader" || r["event"] == "exit")
        .filter_map(|r| r["event"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["openat", "ftruncate", "close", UNLINK, "exit"],
        "{}",
        trace.dump()
    );
    let exit = &trace.events("exit")[0];
    assert_ne!(
        exit["tid"], exit["pid"],
        "the last thread was not the main one"
    );
}

#[test]
fn failed_mode_keeps_failures_and_drops_successes() {
    let _guard = serial();
    let trace = trace_exerciser(&["--failed"], &["--private-shm", "1m", "fallocate-enospc"]);
    let kinds: Vec<&str> = trace
        .records
        .iter()
        .filter_map(|r| r["event"].as_str())
        .filter(|e| *e != "summary")
        .collect();
    assert_eq!(kinds, ["fallocate", "diagnosis"], "{}", trace.dump());
    assert_eq!(trace.records[0]["errno"], "ENOSPC");
}

#[test]
fn hostile_names_are_escaped() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "1m", "hostile-name"]);
    let open = &trace.events("openat")[0];
    assert_eq!(open["path"], "/dev/shm/evil\\x1b[2J\\nname");
    // And in text output, no raw escape or newline reaches the terminal.
    let dir = shmtrace_tests::tempdir();
    let out = dir.join("trace.txt");
    let status = shmtrace_tests::shmtrace()
        .args(["--color", "never", "-o"])
        .arg(&out)
        .arg("--")
        .arg(shmtrace_tests::exerciser())
        .args(["--private-shm", "1m", "hostile-name"])
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(!text.contains('\x1b'), "{text}");
    assert!(
        text.contains(r#""/dev/shm/evil\\x1b[2J\\nname""#) || text.contains("evil\\x1b[2J\\nname"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The container filter in the kernel, on any kernel the matrix boots (no container runtime
/// there): a container made by hand the way runtimes make one (its own mount namespace with a
/// 1 MiB /dev/shm, in a cgroup v2 named as Docker's cgroupfs driver names it), which shmtrace
/// finds by the cgroup scan because no runtime answers, beside a process that fails the same
/// way in a namespace of its own outside the cgroup. Only the container's failure is reported,
/// and it is attributed to the container. Real Docker, Podman and containerd containers are
/// traced in the `docker_*`, `podman_*` and `containerd_*` tests on the host.
#[test]
fn the_container_filter_follows_a_containers_namespace_and_cgroup_alone() {
    let _guard = serial();
    require_root();
    let cgroup2 = cgroup2_mount().expect(
        "no cgroup2 file system is mounted: the container filter's test puts its container in \
         one (mount -t cgroup2 none /sys/fs/cgroup)",
    );
    let id: String = format!(
        "{:016x}",
        u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    )
    .repeat(4)
    .chars()
    .take(64)
    .collect();
    let cgroup = cgroup2.join("docker").join(&id);
    std::fs::create_dir_all(&cgroup).expect("making the container's cgroup");
    let dir = tempdir();
    let ex = exerciser().display().to_string();
    // Each waits for `go`, in a mount namespace of its own with a 1 MiB /dev/shm; the container's
    // shell joins the cgroup first.
    let start = |name: &str, join: Option<&std::path::Path>| {
        let join = join
            .map(|cg| format!("echo $$ > {}/cgroup.procs && ", cg.display()))
            .unwrap_or_default();
        let script = format!(
            "{join}mount -t tmpfs -o size=1m tmpfs /dev/shm && touch {ready} && \
             while [ ! -e {go} ]; do sleep 0.05; done; {ex} fallocate-enospc; exit 0",
            ready = dir.join(format!("{name}.ready")).display(),
            go = dir.join("go").display(),
        );
        std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .spawn()
            .expect("starting a process in a mount namespace of its own (util-linux unshare)")
    };
    let mut container = start("container", Some(&cgroup));
    let mut outsider = start("outsider", None);
    let deadline = std::time::Instant::now() + scaled(std::time::Duration::from_secs(20));
    while !(dir.join("container.ready").exists() && dir.join("outsider.ready").exists()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the processes never got ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // No runtime answers at that socket, so shmtrace scans /proc/*/cgroup for the id.
    let tracer = LiveTracer::start(&[
        "--container-id",
        &id,
        "--docker-socket",
        "/nonexistent/docker.sock",
    ]);
    std::fs::write(dir.join("go"), "").unwrap();
    let outsider_pid = outsider.id();
    assert!(container.wait().unwrap().success());
    assert!(outsider.wait().unwrap().success());
    tracer.wait_for_record(|r| r["event"] == "fallocate" && r["errno"] == "ENOSPC");
    let (_, log, records) = tracer.stop();
    let _ = std::fs::remove_dir(&cgroup);
    let _ = std::fs::remove_dir(cgroup2.join("docker"));
    let _ = std::fs::remove_dir_all(&dir);
    let failures: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "fallocate" && r["errno"] == "ENOSPC")
        .collect();
    assert_eq!(failures.len(), 1, "{records:#?}\n{log}");
    assert_eq!(failures[0]["container"]["id"], id.as_str(), "{log}");
    // Both failed alike; only the container's is there, and nothing of the outsider's shell.
    assert!(
        !records
            .iter()
            .any(|r| r["pid"].as_u64() == Some(u64::from(outsider_pid))),
        "{records:#?}"
    );
}

/// Where a cgroup2 file system is mounted (`/sys/fs/cgroup` on a pure cgroup v2 host,
/// `/sys/fs/cgroup/unified` on a hybrid one).
fn cgroup2_mount() -> Option<std::path::PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mount_point = before.split_whitespace().nth(4)?;
        (after.split_whitespace().next()? == "cgroup2").then(|| mount_point.into())
    })
}
