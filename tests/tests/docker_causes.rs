//! The right cause on real programs in real Docker containers: each cause other than size (no
//! /dev/shm, a read-only one, files of killed processes), each checked by applying its fix;
//! and no false alarm on healthy runs of Chromium and a PyTorch training loop.
//! PostgreSQL's cases are in docker_postgres.rs.
use std::path::Path;

use serde_json::Value;
use shmtrace_tests::{
    docker::{Container, require_docker, wait_for},
    live::LiveTracer,
    pytorch, require_root, serial,
};

const PYTHON: &str = "/usr/bin/python3 -B";

fn setup() -> std::sync::MutexGuard<'static, ()> {
    let guard = serial();
    require_root();
    require_docker();
    guard
}

/// A finished, traced run of a script in a container.
struct Run {
    container: Container,
    /// The script's exit status.
    status: i32,
    records: Vec<Value>,
    log: String,
}

impl Run {
    fn dump(&self) -> String {
        let mut text: Vec<String> = self.records.iter().map(Value::to_string).collect();
        text.push(format!("shmtrace stderr: {}", self.log));
        text.join("\n")
    }

    fn diagnoses(&self) -> Vec<&Value> {
        self.records
            .iter()
            .filter(|r| r["event"] == "diagnosis")
            .collect()
    }

    /// Event records that say the program was hurt.
    fn failures(&self) -> Vec<&Value> {
        self.records
            .iter()
            .filter(|r| r["failure"] == true)
            .collect()
    }

    fn calls(&self, syscall: &str) -> Vec<&Value> {
        self.records
            .iter()
            .filter(|r| r["event"] == syscall)
            .collect()
    }

    fn only_diagnosis(&self) -> &Value {
        let diagnoses = self.diagnoses();
        assert_eq!(
            diagnoses.len(),
            1,
            "one diagnosis expected:\n{}",
            self.dump()
        );
        diagnoses[0]
    }
}

/// Runs `script` (busybox sh, workloads at /w, Python from the host) in a container started
/// with `flags`, traced with `shmtrace --container` from before its first call.
fn traced(prefix: &str, flags: &[&str], script: &str) -> Run {
    let workloads = format!("{}/workloads:/w:ro", env!("CARGO_MANIFEST_DIR"));
    let mut all = vec!["-v", &workloads, "-w", "/w"];
    all.extend(flags);
    let container = Container::run(
        prefix,
        &all,
        &format!(
            "while [ ! -e /work/go ]; do sleep 0.05; done; ({script}); echo $? > /work/status; \
             touch /work/done; sleep 600"
        ),
    );
    let tracer = LiveTracer::start(&["--container", &container.name]);
    container.signal("go");
    wait_for_long(&container.work.join("done"));
    let (status, log, records) = tracer.stop();
    assert_eq!(status.code(), Some(130), "{log}");
    let status = std::fs::read_to_string(container.work.join("status"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    Run {
        container,
        status,
        records,
        log,
    }
}

/// Like `wait_for`, for workloads that take longer than its ten seconds on a loaded machine.
fn wait_for_long(path: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} did not appear within 120 s",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Runs `script` untraced in a container with `flags`; its exit status.
fn untraced(prefix: &str, flags: &[&str], script: &str) -> i32 {
    let workloads = format!("{}/workloads:/w:ro", env!("CARGO_MANIFEST_DIR"));
    let mut all = vec!["-v", &workloads, "-w", "/w"];
    all.extend(flags);
    let container = Container::run(prefix, &all, script);
    container.wait() as i32
}

const MULTIPROCESSING_LOCK: &str =
    "/usr/bin/python3 -B -c 'import multiprocessing as mp; mp.Lock(); print(\"ok\")'";

#[test]
fn no_dev_shm_is_named_as_the_cause_and_its_fix_works() {
    let _guard = setup();
    let run = traced("causes-noshm", &["--ipc=none"], MULTIPROCESSING_LOCK);
    assert_ne!(run.status, 0, "the lock needs /dev/shm:\n{}", run.dump());
    let d = run.only_diagnosis();
    assert_eq!(d["cause"], "no_shm", "{}", run.dump());
    assert_eq!(d["shm_is_the_cause"], false);
    assert!(d["recommendation"].is_null(), "no size advice: {d}");
    let failure = &d["failures"][0];
    assert_eq!(failure["errno"], "ENOENT");
    assert!(
        failure["path"]
            .as_str()
            .unwrap()
            .starts_with("/dev/shm/sem."),
        "{failure}"
    );
    assert_eq!(d["program"], "Python multiprocessing");
    let explanation = d["explanation"].as_str().unwrap();
    assert!(explanation.contains("--ipc=none"), "{explanation}");
    assert!(explanation.contains("--ipc=private"), "{explanation}");

    // The fix: a private IPC namespace, which has a /dev/shm.
    assert_eq!(
        untraced(
            "causes-noshm-fixed",
            &["--ipc=private"],
            MULTIPROCESSING_LOCK
        ),
        0
    );
}

#[test]
fn read_only_dev_shm_is_named_as_the_cause_and_its_fix_works() {
    let _guard = setup();
    let run = traced(
        "causes-rofs",
        &["--tmpfs", "/dev/shm:ro,size=1m"],
        MULTIPROCESSING_LOCK,
    );
    assert_ne!(run.status, 0, "{}", run.dump());
    let d = run.only_diagnosis();
    assert_eq!(d["cause"], "read_only", "{}", run.dump());
    assert_eq!(d["failures"][0]["errno"], "EROFS");
    assert!(d["recommendation"].is_null(), "no size advice: {d}");
    let explanation = d["explanation"].as_str().unwrap();
    assert!(explanation.contains("/dev/shm:rw"), "{explanation}");

    // The fix, as advised: the same tmpfs, read-write.
    assert_eq!(
        untraced(
            "causes-rofs-fixed",
            &["--tmpfs", "/dev/shm:rw,size=1m"],
            MULTIPROCESSING_LOCK
        ),
        0
    );
}

/// PyTorch's `file_system` strategy: a run killed with SIGKILL leaves its batches in a 2 MiB
/// /dev/shm (1.3 MiB of it), so the next run, which alone fits, fails.
#[test]
fn leftovers_of_killed_processes_are_named_and_the_size_is_not_blamed() {
    let _guard = setup();
    let job = format!("{PYTHON} file_system_strategy.py --workers 2 --batch-bytes 256K");
    let need: u64 = std::process::Command::new("/usr/bin/python3")
        .args(["-B", "file_system_strategy.py", "--workers", "2"])
        .args(["--batch-bytes", "256K", "--required-shm"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/workloads"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().parse().unwrap())
        .unwrap();
    assert!(need <= 2 << 20, "one run alone must fit in 2 MiB: {need}");
    // Killed, then run again; then it waits for the test to apply the fix, and runs again.
    let script = format!(
        "{job} --kill-at 3 --kill job; echo $? > /work/killed; {job}; echo $? > /work/second; \
         while [ ! -e /work/fix ]; do sleep 0.05; done; {job}"
    );
    let workloads = format!("{}/workloads:/w:ro", env!("CARGO_MANIFEST_DIR"));
    let container = Container::run(
        "causes-leftovers",
        &["--shm-size", "2m", "-v", &workloads, "-w", "/w"],
        &format!(
            "while [ ! -e /work/go ]; do sleep 0.05; done; {script}; echo $? > /work/status; \
             touch /work/done; sleep 600"
        ),
    );
    let tracer = LiveTracer::start(&["--container", &container.name]);
    container.signal("go");
    wait_for_long(&container.work.join("second"));
    let (_, log, records) = tracer.stop();
    let run = Run {
        container,
        status: 0,
        records,
        log,
    };
    let read = |file: &str| {
        std::fs::read_to_string(run.container.work.join(file))
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(read("killed"), "137", "{}", run.dump());
    assert_eq!(read("second"), "1", "{}", run.dump());

    let d = run
        .diagnoses()
        .into_iter()
        .find(|d| !d["leftovers"].is_null())
        .unwrap_or_else(|| panic!("no diagnosis names the leftovers:\n{}", run.dump()));
    assert_eq!(d["cause"], "leftovers", "{d}");
    assert_eq!(d["shm_is_the_cause"], false, "{d}");
    assert!(d["recommendation"].is_null(), "the size is not blamed: {d}");
    let leftovers = &d["leftovers"];
    assert_eq!(leftovers["enough_without_them"], true, "{d}");
    let files = leftovers["files"].as_array().unwrap();
    assert!(files.len() >= 3, "{d}");
    // The files are those the killed run's workers made, and are named.
    let killed_workers: Vec<u64> = run
        .records
        .iter()
        .filter(|r| r["event"] == "exit" && r["signal"] == "SIGKILL")
        .filter_map(|r| r["pid"].as_u64())
        .collect();
    for file in files {
        let path = file["path"].as_str().unwrap();
        assert!(path.starts_with("/dev/shm/torch_"), "{file}");
        assert!(file["bytes"].as_u64().unwrap() >= 256 << 10, "{file}");
        assert!(
            killed_workers.contains(&file["creator_pid"].as_u64().unwrap()),
            "{file} was not made by a killed process {killed_workers:?}"
        );
        assert_eq!(file["creator_ending"], "killed by SIGKILL", "{file}");
    }
    let total: u64 = files.iter().map(|f| f["bytes"].as_u64().unwrap()).sum();
    assert_eq!(leftovers["bytes"].as_u64().unwrap(), total);
    let text = d["text"].to_string();
    assert!(text.contains("big enough"), "{text}");

    // The fix, as advised: remove them, and the same run succeeds in the same /dev/shm.
    let remove = leftovers["remove"].as_str().unwrap();
    assert!(
        remove.starts_with(&format!("docker exec {} rm -f -- ", run.container.name)),
        "{remove}"
    );
    let status = std::process::Command::new("sh")
        .args(["-c", remove])
        .status()
        .unwrap();
    assert!(status.success(), "{remove}");
    run.container.signal("fix");
    wait_for_long(&run.container.work.join("done"));
    assert_eq!(read("status"), "0", "the run after removing the leftovers");
}

/// A page heavy enough to make the renderer and the GPU process share many buffers.
fn heavy_page() -> String {
    let mut page = String::from("<html><body><svg width=1600 height=1200>");
    for i in 0..4000 {
        page.push_str(&format!(
            "<circle cx='{}' cy='{}' r='{}' fill='hsl({},80%,50%)' opacity='0.5'/>",
            (i * 37) % 1600,
            (i * 53) % 1200,
            5 + i % 60,
            i % 360
        ));
    }
    page.push_str("</svg><table>");
    for row in 0..300 {
        page.push_str("<tr>");
        for col in 0..30 {
            page.push_str(&format!(
                "<td style='background:hsl({},70%,60%)'>{}</td>",
                (row * 7 + col * 13) % 360,
                row * col
            ));
        }
        page.push_str("</tr>");
    }
    page.push_str(
        "</table><canvas id=c width=2000 height=2000></canvas><script>\
         var c=document.getElementById('c').getContext('2d');\
         for(var i=0;i<20000;i++){c.fillStyle='hsl('+i%360+',70%,50%)';\
         c.fillRect((i*7)%2000,(i*11)%2000,30,30);}</script></body></html>",
    );
    page
}

#[test]
fn healthy_chromium_in_a_1m_shm_gives_no_false_alarm() {
    let _guard = setup();
    let chromium = "/usr/lib/chromium/chromium";
    assert!(
        Path::new(chromium).exists(),
        "{chromium} is missing: apt-get install chromium (as .ci/run does)"
    );
    let pages = shmtrace_tests::tempdir();
    std::fs::write(pages.join("heavy.html"), heavy_page()).unwrap();
    let mount = format!("{}:/page:ro", pages.display());
    let run = traced(
        "causes-chromium",
        &[
            "--shm-size",
            "1m",
            "-v",
            "/etc:/etc:ro",
            "-v",
            &mount,
            "-e",
            "HOME=/tmp",
        ],
        &format!(
            "cd /tmp && {chromium} --headless --no-sandbox --disable-gpu \
             --window-size=1600,4000 --screenshot=/tmp/shot.png file:///page/heavy.html \
             && test -s /tmp/shot.png"
        ),
    );
    let _ = std::fs::remove_dir_all(&pages);
    assert_eq!(run.status, 0, "Chromium rendered the page:\n{}", run.dump());
    let memfds = run.calls("memfd_create");
    assert!(
        memfds
            .iter()
            .filter(|c| c["ret"].as_i64() >= Some(0))
            .count()
            >= 3,
        "Chromium made its shared memory with memfd_create:\n{}",
        run.dump()
    );
    // Its probe of kernel support is shown, and said to be one.
    assert!(
        memfds
            .iter()
            .any(|c| c["errno"] == "EINVAL" && c["expected"] == "a feature probe"),
        "the memfd_create probe:\n{}",
        run.dump()
    );
    assert_eq!(run.failures(), Vec::<&Value>::new(), "{}", run.dump());
    assert_eq!(run.diagnoses(), Vec::<&Value>::new(), "{}", run.dump());
}

#[test]
fn healthy_training_loop_gives_no_false_alarm() {
    let _guard = setup();
    // Real PyTorch: a tiny model trained for 3 epochs on batches from 2 DataLoader workers
    // per epoch, in a /dev/shm they fit in.
    let venv = pytorch::venv().display().to_string();
    let mut flags = vec!["--shm-size".to_owned(), "64m".to_owned()];
    flags.extend(pytorch::docker_mounts());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let run = traced(
        "causes-training",
        &flags,
        &format!("{venv}/bin/python -B torch_training.py --workers 2 --epochs 3"),
    );
    assert_eq!(run.status, 0, "the loss went down:\n{}", run.dump());
    let batches = run
        .calls("openat")
        .into_iter()
        .filter(|c| {
            c["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/dev/shm/torch_"))
                && c["ret"].as_i64() >= Some(0)
        })
        .count();
    // 4096 samples in batches of 256, for 3 epochs: 48 batches through /dev/shm.
    assert!(
        batches >= 48,
        "the workers shared their batches through /dev/shm ({batches} objects):\n{}",
        run.dump()
    );
    let workers: std::collections::HashSet<u64> = run
        .calls("openat")
        .iter()
        .filter(|c| {
            c["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/dev/shm/torch_"))
        })
        .filter_map(|c| c["pid"].as_u64())
        .collect();
    assert!(
        workers.len() >= 6,
        "2 workers in each of 3 epochs made them: {workers:?}"
    );
    eprintln!(
        "healthy PyTorch training: {batches} /dev/shm objects opened by {} processes, {} \
         events, no failure line, no diagnosis",
        workers.len(),
        run.records.len()
    );
    assert_eq!(run.failures(), Vec::<&Value>::new(), "{}", run.dump());
    assert_eq!(run.diagnoses(), Vec::<&Value>::new(), "{}", run.dump());
}

/// 30 `docker restart`s of a container that creates and removes a /dev/shm file each time: a
/// restarted container's fresh /dev/shm numbers its files as the last one did, and they must
/// stay apart. Each start waits until shmtrace says it follows the new container (its watcher
/// checks once a second) before making its files.
#[test]
fn restarts_keep_objects_apart() {
    let _guard = setup();
    let container = Container::run(
        "causes-restarts",
        &["--shm-size", "1m"],
        "while [ ! -e /work/go ]; do sleep 0.05; done; rm /work/go; \
         dd if=/dev/zero of=/dev/shm/causes-obj bs=4k count=4 2>/dev/null; \
         rm /dev/shm/causes-obj; dd if=/dev/zero of=/dev/shm/causes-kept bs=4k count=1 \
         2>/dev/null; touch /work/up; sleep 600",
    );
    container.signal("go");
    wait_for(&container.work.join("up"));
    let mut tracer = LiveTracer::start(&["--container", &container.name]);
    let followed = format!("shmtrace: container {} restarted", container.name);
    for _ in 0..30 {
        let _ = std::fs::remove_file(container.work.join("up"));
        container.restart();
        tracer.wait_for_line(&followed);
        container.signal("go");
        wait_for(&container.work.join("up"));
    }
    let (_, log, records) = tracer.stop();
    let summary = records
        .iter()
        .rev()
        .find(|r| r["event"] == "summary")
        .unwrap_or_else(|| panic!("no summary:\n{log}"));
    // Each start makes two files and removes one; the kept one of each run ends with its
    // /dev/shm at the next restart, and the last one is still there. On a busy machine
    // another test's container may get a stopped one's mount namespace number before the
    // watcher notices, and be traced too: so the summary's totals are checked against what
    // the records show of this container's own files.
    let created = summary["objects_created"].as_u64().unwrap();
    let freed = summary["objects_freed"].as_u64().unwrap();
    let ours = records
        .iter()
        .filter(|r| r["event"] == "openat" && r["ret"].as_i64() >= Some(0))
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/dev/shm/causes-"))
        })
        .count();
    assert_eq!(ours, 60, "{log}");
    assert!(created >= 60, "{summary}\n{log}");
    let left: Vec<&Value> = summary["remaining"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["linked"] == true
                && r["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/dev/shm/causes-"))
        })
        .collect();
    assert_eq!(left.len(), 1, "only the last run's kept file: {summary}");
    assert_eq!(left[0]["path"], "/dev/shm/causes-kept");
    if created == 60 {
        assert_eq!(freed, 59, "{summary}");
    }
    // No record was dropped. (Path reads may fail: runc's own paths, literals in pages of its
    // binary not yet touched when the container starts, cannot be read by a probe; they are
    // counted, and none of them is one of this container's files, all 60 of which were seen.)
    assert_eq!(
        summary["lost_by_reason"].get("ring_full"),
        None,
        "{summary}"
    );
    // No death at a restart is a failure: the runtime ended them on purpose. The first one
    // too, started before shmtrace: the probes match the signal's target by its container.
    let restart_deaths: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "exit" && r["signal"] == "SIGKILL" && r["comm"] == "sleep")
        .collect();
    assert!(restart_deaths.len() >= 30, "{log}");
    assert!(
        restart_deaths.iter().all(|r| r["failure"] == false),
        "{restart_deaths:?}"
    );
    // The signals that ended them are labelled with the container they were sent to.
    let signals: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "signal" && r["comm"] == "sleep")
        .collect();
    assert!(signals.len() >= 30, "{log}");
    for signal in signals {
        assert_eq!(
            signal["container"]["name"],
            container.name.as_str(),
            "{signal}"
        );
    }
}

/// Out of file descriptors, not of /dev/shm: a DataLoader-like trainer under a low
/// RLIMIT_NOFILE in a container. The fix advised (a higher limit) works in the same 1 MiB.
#[test]
fn fd_limit_in_a_container_is_not_blamed_on_shm_and_its_fix_works() {
    let _guard = setup();
    let run = traced(
        "causes-fdlimit",
        &["--shm-size", "1m"],
        &format!("{PYTHON} fd_limit.py"),
    );
    assert_eq!(run.status, 1, "{}", run.dump());
    let fd_limited: Vec<&Value> = run
        .diagnoses()
        .into_iter()
        .filter(|d| d["cause"] == "fd_limit")
        .collect();
    assert!(!fd_limited.is_empty(), "{}", run.dump());
    assert!(
        run.diagnoses()
            .iter()
            .all(|d| d["shm_is_the_cause"] == false),
        "{}",
        run.dump()
    );
    let explanation = fd_limited[0]["explanation"].as_str().unwrap();
    assert!(explanation.contains("--ulimit nofile"), "{explanation}");

    let nofile = std::process::Command::new("/usr/bin/python3")
        .args(["-B", "fd_limit.py", "--required-nofile"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/workloads"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap();
    assert_eq!(
        untraced(
            "causes-fdlimit-fixed",
            &["--shm-size", "1m"],
            &format!("{PYTHON} fd_limit.py --nofile {nofile}")
        ),
        0
    );
}
