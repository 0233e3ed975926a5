//! `shmtrace daemon` beside the most common batch work: short-lived containers, `docker run
//! --rm`, each failing in its small /dev/shm within a second of its start and removed at once,
//! their names reused, their mount namespace numbers recycled from one to the next. Every JSON
//! line, every diagnosis, every incident recording and every metric series names the
//! container each failure happened in; nothing goes to `runtime="unknown"`; each death counts
//! once; and with nothing lost, `shmtrace_unrecorded_total` stays at zero. Needs root and
//! Docker; fails loudly without them.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use shmtrace_tests::{
    daemon::{Daemon, total},
    docker,
    recording::replay,
    require_root, serial, tempdir,
};

/// Names, each reused by this many containers in turn: 30 containers in all.
const NAMES: usize = 3;
const RUNS_PER_NAME: usize = 10;

/// One run: which container it was, and the /dev/shm file its `dd` filled.
struct Run {
    name: String,
    id: String,
    file: String,
}

/// `docker run --rm` of a container that fills its 1 MiB /dev/shm with `dd`, which fails, and
/// whose shell then exits 1: the container lives well under a second.
fn run_once(image: &str, name: &str, file: &str, cidfile: &Path) -> String {
    let output = Command::new("docker")
        .args(["run", "--rm", "--network", "none", "--shm-size", "1m"])
        .arg("--cidfile")
        .arg(cidfile)
        .args(["--name", name, image, "sh", "-c"])
        .arg(format!("dd if=/dev/zero of={file} bs=64k count=32; exit 1"))
        .output()
        .expect("docker run");
    assert_eq!(
        output.status.code(),
        Some(1),
        "the container did not fail as planned: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::read_to_string(cidfile)
        .unwrap_or_else(|e| panic!("{}: {e}", cidfile.display()))
        .trim()
        .to_owned()
}

/// The runs, three names at once, each name's containers one after another.
fn churn(dir: &Path) -> Vec<Run> {
    let image = docker::image();
    let streams: Vec<_> = (0..NAMES)
        .map(|k| {
            let name = format!("churn{k}-{}", std::process::id());
            let dir = dir.to_owned();
            std::thread::spawn(move || {
                (0..RUNS_PER_NAME)
                    .map(|i| {
                        let file = format!("{}c{k}-i{i}", files_prefix());
                        let cidfile: PathBuf = dir.join(format!("c{k}-i{i}.cid"));
                        let id = run_once(image, &name, &file, &cidfile);
                        Run {
                            name: name.clone(),
                            id,
                            file,
                        }
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    streams
        .into_iter()
        .flat_map(|s| s.join().expect("a churn thread"))
        .collect()
}

/// What this test's files in /dev/shm are named with, so that its lines are told from those
/// of whatever else runs on the machine.
fn files_prefix() -> String {
    format!("/dev/shm/churn-{}-", std::process::id())
}

/// The failing `dd`'s /dev/shm file a line is about: its own path, or its diagnosis' failure's.
fn file_of(line: &Value) -> Option<&str> {
    line["path"]
        .as_str()
        .or_else(|| line["failures"][0]["path"].as_str())
}

#[test]
fn short_lived_containers_with_reused_names_are_each_named_in_every_line_diagnosis_recording_and_series()
 {
    require_root();
    docker::require_docker();
    let _serial = serial();
    let dir = tempdir();
    let record_dir = dir.join("incidents");
    let record_arg = record_dir.display().to_string();
    let daemon = Daemon::start(&["--record-dir", &record_arg, "--buffer-size", "64M"]);
    let started = Instant::now();
    let runs = churn(&dir);
    let churned = started.elapsed();
    let by_file: HashMap<&str, &Run> = runs.iter().map(|r| (r.file.as_str(), r)).collect();

    // Every failure counted, under its name.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = daemon.metrics();
        let all_in = runs.iter().all(|r| {
            total(
                &text,
                "shmtrace_shm_failures_total",
                &[("container", &r.name), ("errno", "ENOSPC")],
            ) >= RUNS_PER_NAME as f64
        });
        if all_in || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    // The incident recordings are written `--tail` (5 s) after their last failure.
    std::thread::sleep(Duration::from_secs(6));
    let (_, lines, stderr) = daemon.stop();
    let context = format!("{churned:?} of churn; stderr:\n{stderr}");

    let lost = total(&text, "shmtrace_events_lost_total", &[]);
    assert_eq!(
        lost, 0.0,
        "records were lost with a 64 MiB ring buffer, so the counts prove nothing (a machine \
         too busy for this test?)\n{text}\n{context}"
    );

    // The JSON lines: dd's failed write, its exit, and the diagnoses (dd's, and its shell's
    // that follows it) each name the container the file was in.
    let mut pid_run: HashMap<u64, &Run> = HashMap::new();
    let mut seen = HashMap::new();
    // The daemon sees the whole machine: a dd of another program's is none of this test's.
    for line in lines.iter().filter(|l| {
        l["comm"] == "dd"
            && l["errno"] == "ENOSPC"
            && file_of(l).is_some_and(|f| f.starts_with(&files_prefix()))
    }) {
        let file = file_of(line).unwrap_or_default();
        let run = by_file
            .get(file)
            .unwrap_or_else(|| panic!("a failure of no run of this test: {line}"));
        *seen.entry(file).or_insert(0) += 1;
        assert_eq!(
            line["container"]["id"],
            run.id.as_str(),
            "{line}\n{context}"
        );
        assert_eq!(line["container"]["name"], run.name.as_str(), "{line}");
        pid_run.insert(line["pid"].as_u64().unwrap(), run);
    }
    // A run missing here: the lines that name its container or its file, to tell a line lost
    // from one that no longer knew its file (`<inode 2 on 0:52>`) or its container.
    let missing: Vec<String> = runs
        .iter()
        .filter(|r| !seen.contains_key(r.file.as_str()))
        .map(|r| {
            let of_it: Vec<String> = lines
                .iter()
                .map(Value::to_string)
                .filter(|l| l.contains(&r.id) || l.contains(&r.file))
                .collect();
            format!("{} ({}): {of_it:#?}", r.file, r.id)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "not every run's failure has its JSON line: {missing:#?}\n{context}"
    );
    let mut diagnosed = 0;
    for line in &lines {
        let Some(pid) = line["pid"].as_u64() else {
            continue;
        };
        let follows = line["follows_pid"].as_u64();
        let Some(run) = pid_run
            .get(&pid)
            .or_else(|| follows.and_then(|p| pid_run.get(&p)))
        else {
            continue;
        };
        assert_eq!(
            line["container"]["id"],
            run.id.as_str(),
            "a line of {}'s run names another container: {line}\n{context}",
            run.file
        );
        assert!(line.get("container_unnamed").is_none(), "{line}");
        if line["event"] == "diagnosis" {
            assert_eq!(line["place"], run.name.as_str(), "{line}");
            diagnosed += 1;
        }
    }
    assert!(
        diagnosed >= runs.len(),
        "{diagnosed} diagnoses of the {} runs' failures\n{context}",
        runs.len()
    );

    // The metrics: each name's ten failures and twenty deaths (each run's dd, and the shell
    // that exited 1 after it), exactly: none went to another series (`runtime="unknown"`, a
    // short id), none was counted twice, nothing was made up for lost records. (Other
    // programs on the machine may fail in namespaces of no container meanwhile.)
    for k in 0..NAMES {
        let name = format!("churn{k}-{}", std::process::id());
        let of_it = [("container", name.as_str())];
        assert_eq!(
            total(&text, "shmtrace_shm_failures_total", &of_it),
            RUNS_PER_NAME as f64,
            "{name}'s containers failed {RUNS_PER_NAME} times\n{text}\n{context}"
        );
        assert_eq!(
            total(&text, "shmtrace_process_deaths_total", &of_it),
            2.0 * RUNS_PER_NAME as f64,
            "{name}'s containers: a dd and its shell died in each\n{text}\n{context}"
        );
    }
    assert_eq!(
        total(&text, "shmtrace_unrecorded_total", &[]),
        0.0,
        "nothing was lost, yet the daemon made up counts for lost records\n{text}\n{context}"
    );

    // The incident recordings: every diagnosis of a run's failure in them names its container.
    let mut recorded = 0;
    for entry in std::fs::read_dir(&record_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "shmtrace") {
            continue;
        }
        let replayed = replay("report", &path, &[]);
        replayed.assert_ok();
        for diagnosis in replayed.of("diagnosis") {
            let Some(run) = file_of(diagnosis).and_then(|f| by_file.get(f)) else {
                continue;
            };
            assert_eq!(
                diagnosis["container"]["id"],
                run.id.as_str(),
                "{} names another container than {}'s: {diagnosis}",
                path.display(),
                run.file
            );
            recorded += 1;
        }
    }
    assert!(
        recorded > 0,
        "no recording holds a diagnosis of the runs\n{context}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
