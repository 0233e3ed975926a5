//! Two real Docker containers sharing one /dev/shm: `holder` (`--ipc=shareable`) keeps a
//! 40 MiB file open there with a sleeping process, and `writer` (`--ipc=container:holder`)
//! fails to allocate 40 MiB more. Only the writer is traced. Its diagnosis must name what
//! holds the rest (the holder's file with its pages, the process that has it open, its
//! container), say that the two share one /dev/shm and how, and advise a size that works when
//! applied to the container whose /dev/shm it is: both recreated with it, the writer succeeds.
use serde_json::Value;
use std::time::Duration;

use shmtrace_tests::{
    diagnosis::{diagnoses, summary},
    docker::{Container, require_docker, wait_for},
    live::LiveTracer,
    read_json_lines,
    recording::{Recorder, replay},
    require_root, tempdir,
};

const MIB: u64 = 1 << 20;

/// The holder's script: fill 40 MiB, say so, and keep the file open while sleeping.
const HOLD: &str = "dd if=/dev/zero of=/dev/shm/cache bs=1M count=40 2>/dev/null && \
     touch /work/up && exec sleep 600 < /dev/shm/cache";

/// The writer's: wait for the go, then ask for 40 MiB at once, as posix_fallocate does.
const FALLOCATE: &str = "while [ ! -e /work/go ]; do sleep 0.05; done; /usr/bin/python3 -c \
     'import os; fd = os.open(\"/dev/shm/more\", os.O_CREAT | os.O_RDWR, 0o600); \
     os.posix_fallocate(fd, 0, 40 << 20)'";

/// Or size 40 MiB with ftruncate and fill it through a mapping, which dies of SIGBUS when the
/// pages run out (PyTorch <= 2.9's way, multiprocessing.shared_memory's).
const MAP_AND_FILL: &str = "while [ ! -e /work/go ]; do sleep 0.05; done; /usr/bin/python3 -c \
     'import os, mmap; fd = os.open(\"/dev/shm/more\", os.O_CREAT | os.O_RDWR, 0o600); \
     os.ftruncate(fd, 40 << 20); m = mmap.mmap(fd, 40 << 20); m[:] = bytes(40 << 20)'";

fn run_holder(shm_size: &str) -> Container {
    let holder = Container::run(
        "shared-holder",
        &["--ipc=shareable", &format!("--shm-size={shm_size}")],
        HOLD,
    );
    wait_for(&holder.work.join("up"));
    holder
}

fn run_writer(holder: &Container, shm_size: &str, script: &str) -> Container {
    Container::run(
        "shared-writer",
        &[
            &format!("--ipc=container:{}", holder.name),
            &format!("--shm-size={shm_size}"),
        ],
        script,
    )
}

#[test]
fn the_diagnosis_names_the_other_container_its_process_and_file_and_the_size_works() {
    shared(FALLOCATE, 1, "fallocate");
}

#[test]
fn the_same_when_the_writer_dies_of_sigbus_filling_a_mapping() {
    shared(MAP_AND_FILL, 128 + libc::SIGBUS as i64, "SIGBUS");
}

/// Runs `script` as the writer beside the holder, traced; checks the diagnosis (its first
/// failure `failed`: a system call or a signal) and applies its advice.
fn shared(script: &str, exit_code: i64, failed: &str) {
    require_root();
    require_docker();
    let holder = run_holder("64m");
    let writer = run_writer(&holder, "64m", script);
    let mut tracer = LiveTracer::start(&["--container", &writer.name]);
    writer.signal("go");
    assert_eq!(
        writer.wait(),
        exit_code,
        "the writer fails for lack of room"
    );
    tracer.wait_for_line("shmtrace: container");
    let (_, log, records) = tracer.stop();
    let dump = || {
        let mut lines: Vec<String> = records.iter().map(Value::to_string).collect();
        lines.push(log.clone());
        lines.join("\n")
    };
    let d = diagnoses(&records)
        .into_iter()
        .find(|d| d["comm"] == "python3")
        .unwrap_or_else(|| panic!("no diagnosis of the writer:\n{}", dump()));
    assert_eq!(d["cause"], "shm_full", "{d}");
    let first = &d["failures"][0];
    assert!(
        first["syscall"] == failed || first["signal"] == failed,
        "{d}"
    );

    // What holds the rest: the holder's file, by its pages, open by its sleeping process.
    let others = &d["others"];
    assert_eq!(others["bytes"], 40 * MIB, "{d}");
    let files = others["files"].as_array().expect("others' files");
    assert_eq!(files.len(), 1, "{d}");
    assert_eq!(files[0]["path"], "/dev/shm/cache", "{d}");
    assert_eq!(files[0]["bytes"], 40 * MIB, "{d}");
    let holders = files[0]["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{d}");
    assert_eq!(holders[0]["comm"], "sleep", "{d}");
    assert_eq!(holders[0]["pid"], holder.pid(), "{d}");
    assert_eq!(holders[0]["container"], holder.name.as_str(), "{d}");
    assert_eq!(holders[0]["open"], true, "{d}");

    // Who shares it, and how; whose it is, so the size is set there.
    let shared: Vec<(String, String)> = others["shared_by"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["container"].as_str().unwrap().to_owned(),
                s["ipc"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        shared.contains(&(holder.name.clone(), "private (shareable)".to_owned())),
        "{d}"
    );
    assert!(
        shared.contains(&(
            writer.name.clone(),
            format!("shared with container {}", holder.name)
        )),
        "{d}"
    );
    assert_eq!(others["owner"], holder.name.as_str(), "{d}");
    assert_eq!(
        d["container"]["ipc"],
        format!("shared with container {}", holder.name),
        "named, not numbered: {d}"
    );
    let text = d["text"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        text.contains(&format!(
            "/dev/shm/cache (40.0 MiB), open by pid {} sleep in container {}",
            holder.pid(),
            holder.name
        )),
        "{text}"
    );

    // One /dev/shm, one piece of advice, naming the container to set it on.
    let advice = summary(&records)["recommendations"].as_array().unwrap();
    assert_eq!(advice.len(), 1, "{}", dump());
    assert_eq!(advice[0]["owner"], holder.name.as_str(), "{}", dump());
    let size = d["recommendation"]["min_bytes"].as_u64().unwrap();
    assert!(size >= 80 * MIB, "both files must fit: {d}");

    // Applied: both recreated with the advised size, the writer now fits beside the holder.
    drop(writer);
    drop(holder);
    let shm_size = format!("{size}b");
    let holder = run_holder(&shm_size);
    let writer = run_writer(&holder, &shm_size, script);
    writer.signal("go");
    assert_eq!(
        writer.wait(),
        0,
        "the writer still fails with --shm-size={shm_size}"
    );
}

/// Recorded, the same scenario replays to the same account of the others: what the machine
/// showed at the failure is in the file, as nothing of it can be asked again.
#[test]
fn a_recording_keeps_what_the_others_held() {
    require_root();
    require_docker();
    let holder = run_holder("64m");
    let writer = run_writer(&holder, "64m", FALLOCATE);
    let dir = tempdir();
    let file = dir.join("trace.shmtrace");
    let live = dir.join("live.jsonl");
    let recorder = Recorder::start(
        &[
            "--container",
            &writer.name,
            "--json",
            "-o",
            file.to_str().unwrap(),
        ],
        &live,
        "shmtrace: tracing container",
    );
    writer.signal("go");
    assert_eq!(writer.wait(), 1);
    std::thread::sleep(Duration::from_millis(500));
    let (status, stderr) = recorder.interrupt();
    assert_eq!(status.code(), Some(130), "{stderr}");
    let live = read_json_lines(&live);
    let replayed = replay("report", &file, &[]);
    replayed.assert_ok();
    let others = |records: &[Value]| -> Value {
        diagnoses(records)
            .into_iter()
            .find(|d| d["comm"] == "python3")
            .map(|d| d["others"].clone())
            .unwrap_or(Value::Null)
    };
    let seen = others(&live);
    assert_eq!(seen["files"][0]["path"], "/dev/shm/cache", "{stderr}");
    assert_eq!(
        seen["files"][0]["holders"][0]["container"],
        holder.name.as_str()
    );
    assert_eq!(others(&replayed.records), seen, "{}", replayed.stderr());
    let _ = std::fs::remove_dir_all(dir);
}
