//! The CLI as a user meets it: attaching to running processes, host-wide tracing, Ctrl-C,
//! lost events, the demo, and every error a user can run into.
use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use shmtrace_tests::{
    UNLINK, exerciser, live::LiveTracer, require_root, serial, shmtrace, trace_exerciser,
};

#[test]
fn attaches_to_a_running_process_and_its_private_shm() {
    let _guard = serial();
    require_root();
    // The target already runs in its own mount namespace with its own /dev/shm: shmtrace must
    // learn that file system from /proc, follow the process, and stop when it exits.
    let mut target = Command::new(exerciser())
        .args(["--private-shm", "1m", "wait-then", "fallocate-enospc"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(target.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    let pid = target.id().to_string();

    let tracer = LiveTracer::start(&["--pid", &pid]);
    target.stdin.take().unwrap().write_all(b"go\n").unwrap();
    target.wait().unwrap();
    let (status, stderr, records) = tracer.wait();
    assert!(status.success(), "{stderr}");
    let fallocate = records
        .iter()
        .find(|r| r["event"] == "fallocate")
        .unwrap_or_else(|| panic!("no fallocate: {records:?}\n{stderr}"));
    assert_eq!(fallocate["errno"], "ENOSPC");
    assert_eq!(fallocate["pid"].as_u64().unwrap().to_string(), pid);
    assert!(
        records
            .iter()
            .any(|r| r["event"] == "exit" && r["pid"].as_u64().unwrap().to_string() == pid)
    );
}

#[test]
fn host_wide_mode_sees_untraced_processes_and_ctrl_c_detaches_cleanly() {
    let _guard = serial();
    require_root();
    let tracer = LiveTracer::start(&["--all"]);
    let worker = Command::new(exerciser())
        .args(["--private-shm", "1m", "fallocate-enospc"])
        .status()
        .unwrap();
    assert!(worker.success());
    let (status, stderr, records) = tracer.stop();
    assert_eq!(status.code(), Some(130), "interrupted: {stderr}");
    assert!(
        records
            .iter()
            .any(|r| r["event"] == "fallocate" && r["errno"] == "ENOSPC"),
        "{records:?}"
    );
    assert!(
        records.iter().any(|r| r["event"] == "summary"),
        "a summary after Ctrl-C"
    );
}

/// Host-wide, the probes look only at the calls on descriptors of processes that touched
/// /dev/shm; these two never open anything there while shmtrace runs, and are still seen: one
/// held a /dev/shm file before shmtrace started, one is passed a descriptor over a socket.
#[test]
fn host_wide_mode_sees_descriptors_held_before_the_start_and_received_over_a_socket() {
    let _guard = serial();
    require_root();
    let mut holder = Command::new(exerciser())
        .args(["--private-shm", "1m", "hold-then-write"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert!(ready.starts_with("ready"), "{ready}");
    let holder_pid = holder.id() as u64;

    let tracer = LiveTracer::start(&["--all"]);
    holder.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(holder.wait().unwrap().success());
    let receiver = Command::new(exerciser())
        .args(["--private-shm", "2m", "receive-fd"])
        .output()
        .unwrap();
    assert!(
        receiver.status.success(),
        "{}",
        String::from_utf8_lossy(&receiver.stderr)
    );
    let (_, stderr, records) = tracer.stop();

    let held_write = records
        .iter()
        .find(|r| r["event"] == "write" && r["pid"] == holder_pid)
        .unwrap_or_else(|| panic!("no write of the earlier holder: {records:?}\n{stderr}"));
    assert_eq!(held_write["ret"], 4096, "{held_write}");
    assert!(
        held_write.to_string().contains("held_before"),
        "named from what it held at the start: {held_write}"
    );
    // The receiver is the exerciser's parent process: the process that mapped the file is
    // the one that never opened it.
    let opener = records
        .iter()
        .find(|r| r["event"] == "openat" && r.to_string().contains("/dev/shm/passed"))
        .unwrap_or_else(|| panic!("no open of the passed file: {records:?}"));
    let mapped = records
        .iter()
        .find(|r| r["event"] == "mmap" && r["pid"] != opener["pid"])
        .unwrap_or_else(|| panic!("the receiver's mmap was not seen: {records:?}\n{stderr}"));
    assert!(
        records
            .iter()
            .any(|r| r["event"] == "write" && r["pid"] == mapped["pid"] && r["ret"] == 4096),
        "the receiver's write was not seen: {records:?}"
    );
}

/// Host-wide, a file is on /dev/shm by its file system, not by its path (docs/probes.md):
/// a /dev/shm file made by a process with more than 64 descriptors (a grown table) is seen
/// and so is its write; so are files made through /proc/PID/root, by the process itself and
/// from the host; a file on another tmpfs is not; nor is a file on a tmpfs that took over the
/// device number of a /dev/shm unmounted a moment before.
#[test]
fn host_wide_mode_judges_a_file_by_its_file_system_not_its_path() {
    let _guard = serial();
    require_root();
    let tracer = LiveTracer::start(&["--all"]);
    let ready = |child: &mut std::process::Child| {
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("ready "), "{line}");
        line.split_whitespace()
            .skip(1)
            .map(|word| word.parse::<u64>().unwrap())
            .collect::<Vec<_>>()
    };
    let spawn = |scenario: &str| {
        Command::new(exerciser())
            .args(["--private-shm", "1m", scenario])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };

    let mut paths = spawn("other-paths");
    let paths_pid = ready(&mut paths)[0];
    // From the host, into the other namespace's /dev/shm.
    let from_host = format!("/proc/{paths_pid}/root/dev/shm/from-host");
    std::fs::write(&from_host, [1u8; 4096]).unwrap();
    std::fs::remove_file(&from_host).unwrap();
    paths.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(paths.wait().unwrap().success());

    // The kernel gives a freed device number to the next file system mounted anywhere: a
    // mount elsewhere on the machine in between (a chroot's /proc) takes it first. A few
    // tries; an attempt that lost it is a plain tmpfs, whose file must not be reported either.
    let mut tried = Vec::new();
    let devices = (0..5)
        .find_map(|_| {
            let mut remount = spawn("remount");
            let devices = ready(&mut remount);
            remount.stdin.take().unwrap().write_all(b"go\n").unwrap();
            assert!(remount.wait().unwrap().success());
            tried.push((devices[1], devices[2]));
            (devices[1] == devices[2]).then_some(devices)
        })
        .unwrap_or_else(|| {
            panic!(
                "in five tries the tmpfs mounted after the private /dev/shm was unmounted never \
                 took its device number (another mount took it first each time?), so \
                 forgetting it cannot be tested: (unmounted, mounted) {tried:?}"
            )
        });
    let (_, stderr, records) = tracer.stop();

    let opened = |pid: u64, path: &str| {
        records
            .iter()
            .find(|r| {
                r["event"] == "openat"
                    && r["pid"] == pid
                    && r["path"] == path
                    && r["ret"] == r["fd"]
            })
            .unwrap_or_else(|| panic!("no open of {path} by {pid}: {records:?}\n{stderr}"))
    };
    let grown = opened(paths_pid, "/dev/shm/grown");
    assert!(grown["fd"].as_u64().unwrap() > 64, "{grown}");
    assert!(
        records.iter().any(|r| r["event"] == "write"
            && r["pid"] == paths_pid
            && r["fd"] == grown["fd"]
            && r["ret"] == 4096),
        "no write to /dev/shm/grown: {records:?}"
    );
    // Named as the files are in that /dev/shm, not by the path that reached them.
    opened(paths_pid, "/dev/shm/by-proc-root");
    opened(u64::from(std::process::id()), "/dev/shm/from-host");
    // Its device number was a /dev/shm's just before the tmpfs that took it over.
    opened(devices[0], "/dev/shm/before-remount");
    let not_shm: Vec<_> = records
        .iter()
        .filter(|r| r.to_string().contains("not-shm"))
        .collect();
    assert!(
        not_shm.is_empty(),
        "files on other tmpfs reported: {not_shm:?}"
    );
}

#[test]
fn lost_events_are_counted_and_reported() {
    let _guard = serial();
    // A one-page ring buffer cannot hold a burst of 20 000 calls.
    let trace = trace_exerciser(
        &["--buffer-size", "4096"],
        &["--private-shm", "1m", "burst", "20000"],
    );
    let lost = trace.summary()["lost"].as_u64().unwrap();
    assert!(lost > 0, "{}", trace.stderr());
    let seen = trace
        .records
        .iter()
        .filter(|r| r["event"] == "ftruncate")
        .count() as u64;
    assert!(seen < 20_000);
    assert!(trace.stderr().contains("events lost"), "{}", trace.stderr());
    let reported: u64 = trace
        .events("lost")
        .iter()
        .filter_map(|r| r["lost"].as_u64())
        .sum();
    assert_eq!(reported, lost, "every loss is reported in the stream");
}

#[test]
fn no_loss_with_the_default_buffer() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["--private-shm", "1m", "burst", "5000"]);
    assert_eq!(trace.summary()["lost"], 0);
    assert_eq!(trace.events("openat").len(), 5000);
    assert_eq!(trace.events("ftruncate").len(), 5000);
    assert_eq!(trace.events("close").len(), 5000);
    assert_eq!(trace.events(UNLINK).len(), 5000);
}

/// Each thread that made a /dev/shm call holds a slot in the kernel's table of calls in flight
/// (16 384 of them) until it ends: after 20 000 threads, one after another, a last thread's
/// failing call is still seen, and nothing was lost on the way. (`--failed`: the successful
/// calls take their slots but send no records, so a slow reader cannot lose any.)
#[test]
fn threads_that_ended_leave_no_slot_behind() {
    let _guard = serial();
    let trace = trace_exerciser(&["--failed"], &["--private-shm", "1m", "threads", "20000"]);
    assert_eq!(trace.summary()["lost"], 0, "{}", trace.stderr());
    let failed = trace.events("fallocate");
    assert_eq!(failed.len(), 1, "{}", trace.stderr());
    assert_eq!(failed[0]["errno"], "ENOSPC", "{}", failed[0]);
    assert_eq!(failed[0]["object_size"], 16_384, "{}", failed[0]);
}

#[test]
fn exits_with_the_commands_status() {
    let _guard = serial();
    let trace = trace_exerciser(&[], &["exit", "3"]);
    assert_eq!(trace.output.status.code(), Some(3));
}

/// Issue 25, item 13: dd writes through a descriptor it moved with dup2, which the trace does
/// not see; the summary's peak was 2 MiB and its role's row 0 B. Both count the pages written.
#[test]
fn the_role_peak_counts_pages_dd_writes() {
    let _guard = serial();
    require_root();
    let dir = shmtrace_tests::tempdir();
    let out = dir.join("trace.jsonl");
    let shm = format!("/dev/shm/shmtrace-role-peak-{}", std::process::id());
    let output = shmtrace()
        .args(["--json", "-o"])
        .arg(&out)
        .args(["--", "dd", "if=/dev/zero", "bs=1M", "count=2"])
        .arg(format!("of={shm}"))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&shm);
    assert!(output.status.success(), "{output:?}");
    let records = shmtrace_tests::read_json_lines(&out);
    let _ = std::fs::remove_dir_all(&dir);
    let summary = records
        .iter()
        .find(|r| r["event"] == "summary")
        .unwrap_or_else(|| panic!("no summary: {records:?}"));
    assert_eq!(summary["peak_bytes"], 2 << 20, "{summary}");
    let roles = summary["roles"].as_array().unwrap();
    let dd = roles
        .iter()
        .find(|r| r["processes"] == 1)
        .unwrap_or_else(|| panic!("no row of dd's role: {summary}"));
    assert_eq!(dd["peak_bytes"], 2 << 20, "{summary}");
}

fn error_of(args: &[&str]) -> (Option<i32>, String) {
    let output = shmtrace().args(args).output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn clear_errors() {
    let _guard = serial();
    require_root();
    let (code, text) = error_of(&["--pid", "999999999"]);
    assert_eq!(code, Some(1));
    assert!(text.contains("no process with pid 999999999"), "{text}");

    let (code, text) = error_of(&["--", "/no/such/program", "arg"]);
    assert_eq!(code, Some(1));
    assert!(
        text.contains("/no/such/program: command not found"),
        "{text}"
    );

    let (code, text) = error_of(&[]);
    assert_eq!(code, Some(1));
    assert!(
        text.contains("nothing to trace: give --container NAME, a command after --"),
        "{text}"
    );

    let (code, text) = error_of(&["reprot", "t.shmtrace"]);
    assert_eq!(code, Some(2));
    assert!(text.contains("did you mean `shmtrace report`?"), "{text}");

    // With the probes asked for: by default a kernel they cannot load on falls back to ptrace.
    let (code, text) = error_of(&[
        "--backend",
        "ebpf",
        "--kernel-btf",
        "/no/btf/here",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        text.contains("has no BTF") && text.contains("CONFIG_DEBUG_INFO_BTF"),
        "{text}"
    );

    let (code, text) = error_of(&["--backend", "ebpf", "--buffer-size", "5000", "--", "true"]);
    assert_eq!(code, Some(1));
    assert!(text.contains("power of two"), "{text}");

    // Every I/O error names the file and what failed, once.
    let (code, text) = error_of(&["-o", "/no/such/dir/trace.txt", "--", "true"]);
    assert_eq!(code, Some(1));
    assert!(
        text.contains(
            "cannot write the output (-o): cannot create /no/such/dir/trace.txt: No such file or \
             directory (os error 2) (its directory does not exist)"
        ),
        "{text}"
    );
    assert_eq!(text.matches("os error").count(), 1, "{text}");
    let (code, text) = error_of(&["-o", "/proc/self/status", "--", "true"]);
    assert_eq!(code, Some(1));
    assert!(
        text.contains("writing /proc/self/status: Invalid argument"),
        "{text}"
    );
    let (code, text) = error_of(&["report", "/no/such/trace.shmtrace"]);
    assert_eq!(code, Some(1));
    assert!(
        text.contains("cannot open /no/such/trace.shmtrace: no such file"),
        "{text}"
    );
    assert!(!text.contains("byte offset"), "{text}");
}

#[test]
fn unprivileged_users_are_told_what_to_do() {
    let _guard = serial();
    require_root();
    // The probes, asked for: what is missing, and what to do.
    let output = shmtrace()
        .args(["--backend", "ebpf", "--", "true"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("needs root") && text.contains("CAP_BPF"),
        "{text}"
    );
    // By default: the command is traced with ptrace, and one line says so and why.
    let output = shmtrace()
        .args(["--", "sh", "-c", "exit 7"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(7), "{text}");
    let fallback: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tracing with ptrace instead"))
        .collect();
    assert_eq!(fallback.len(), 1, "{text}");
    assert!(
        fallback[0].contains("needs root") && fallback[0].contains("does not see"),
        "{text}"
    );
}

/// What a new user tries first (issue 21's check on every kernel of the matrix): `dd` filling
/// Docker's default 64 MiB /dev/shm, traced by `shmtrace -- CMD`.
#[test]
fn dd_filling_a_64_mib_shm_shows_the_failed_write_and_sends_to_size() {
    let _guard = serial();
    require_root();
    let dir = shmtrace_tests::tempdir();
    let out = dir.join("trace.jsonl");
    let output = shmtrace()
        .args(["--json", "-o"])
        .arg(&out)
        .args(["--", "unshare", "-m", "sh", "-c"])
        .arg(
            "mount --make-rprivate / && mount -t tmpfs -o size=64m tmpfs /dev/shm && \
             exec dd if=/dev/zero of=/dev/shm/big bs=1M count=100",
        )
        .output()
        .unwrap();
    let records = shmtrace_tests::read_json_lines(&out);
    let _ = std::fs::remove_dir_all(&dir);
    let dump = || {
        let lines: Vec<String> = records.iter().map(|r| r.to_string()).collect();
        format!(
            "{}\nstderr: {}",
            lines.join("\n"),
            String::from_utf8_lossy(&output.stderr)
        )
    };
    assert_eq!(output.status.code(), Some(1), "dd's own status: {}", dump());
    let failed_write = records
        .iter()
        .find(|r| r["event"] == "write" && r["errno"] == "ENOSPC")
        .unwrap_or_else(|| panic!("no write ENOSPC:\n{}", dump()));
    assert_eq!(failed_write["path"], "/dev/shm/big");
    assert_eq!(failed_write["size"], 1 << 20);
    let diagnosis = records
        .iter()
        .find(|r| r["event"] == "diagnosis")
        .unwrap_or_else(|| panic!("no diagnosis:\n{}", dump()));
    assert_eq!(diagnosis["comm"], "dd");
    assert_eq!(diagnosis["cause"], "shm_full", "{}", dump());
    assert_eq!(diagnosis["shm"]["size"], 64 << 20);
    assert_eq!(diagnosis["failures"][0]["syscall"], "write");
    // dd grows its file by write() and never asks for a size: no call says how much it
    // needs, so no size is advised, and the explanation sends the user to `shmtrace size`.
    assert!(diagnosis["recommendation"].is_null(), "{}", dump());
    assert!(
        diagnosis["explanation"]
            .as_str()
            .is_some_and(|text| text.contains("shmtrace size")),
        "{}",
        dump()
    );
}

#[test]
fn the_demo_explains_both_failures_and_leaves_nothing_behind() {
    let _guard = serial();
    require_root();
    let output = shmtrace()
        .args(["demo", "--color", "never"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("fallocate(") && text.contains("ENOSPC (No space left on device)"),
        "{text}"
    );
    assert!(text.contains("--- SIGBUS {si_code=BUS_ADRERR"), "{text}");
    assert!(
        text.contains("in /dev/shm/torch_"),
        "SIGBUS mapped back to its file: {text}"
    );
    assert!(text.contains("+++ killed by SIGBUS +++"), "{text}");
    // The demo's objects lived in its private /dev/shm: none of those it names may be in the
    // host's. (Look for exactly those: other programs may use the host's /dev/shm meanwhile.)
    let named: std::collections::BTreeSet<&str> = text
        .match_indices("/dev/shm/torch_")
        .map(|(at, _)| {
            let name = &text[at + "/dev/shm/".len()..];
            let end = name
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            &name[..end]
        })
        .collect();
    assert!(!named.is_empty(), "{text}");
    let left: Vec<_> = named
        .iter()
        .filter(|name| std::path::Path::new("/dev/shm").join(name).exists())
        .collect();
    assert!(
        left.is_empty(),
        "the demo left files in the host's /dev/shm: {left:?}"
    );
    // The demo's tmpfs lived in its private mount namespace: nowhere else may it appear.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains("shmtrace-demo"),
        "the demo left its tmpfs mounted: {mounts}"
    );
    readme_sample_is_what_the_demo_prints(&text);
}

/// The README's sample output is a real run of the demo: each of its lines, but for the times,
/// pids and addresses that differ from run to run, is a line the demo printed now, in order.
fn readme_sample_is_what_the_demo_prints(text: &str) {
    // Built in: a guest of the kernel matrix has the test binary, not the checkout.
    let readme = include_str!("../../README.md");
    let sample = readme
        .split("## Sample output")
        .nth(1)
        .and_then(|rest| rest.split("```text\n").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("README.md has a ## Sample output with a ```text block");
    let printed: Vec<String> = text.lines().map(run_independent).collect();
    let mut from = 0;
    for line in sample.lines() {
        if line.starts_with("$ ") || line.trim() == "..." {
            continue;
        }
        let wanted = run_independent(line);
        match printed[from..].iter().position(|p| *p == wanted) {
            Some(at) => from += at + 1,
            None => panic!(
                "README.md's sample output has a line the demo no longer prints (or not in this \
                 order): update the sample from a real run of the demo\n  README: {line}\n\
                 demo printed:\n{text}"
            ),
        }
    }
}

/// A line of the demo's output without what changes from run to run: the time and pid
/// columns, pids, the pids and counters in PyTorch's file names, addresses, and where the
/// binary is.
fn run_independent(line: &str) -> String {
    // The totals (`46 events in 1.0s from 6 processes; ...`) vary with the kernel and the
    // machine's speed: their figures do not count.
    if line.starts_with("shmtrace: ") && line.contains(" in ") && line.contains(" from ") {
        return line
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect();
    }
    let mut words: Vec<String> = Vec::new();
    let mut previous = "";
    // Columns are padded to the pids' widths: spaces do not count.
    for (i, word) in line.split_whitespace().enumerate() {
        let digits = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit());
        let is_time = word.len() == 15 && word.as_bytes().get(2) == Some(&b':');
        let new = if i == 0 && is_time {
            "TIME".to_owned()
        } else if (digits(word) && previous == "TIME") || previous == "pid" || previous == "(pid" {
            // The pid column (right-aligned after the time), and `pid N`.
            word.trim_start_matches(|c: char| c.is_ascii_digit())
                .to_owned()
                + "PID"
        } else if previous == "=" && digits(word) && line.contains("openat(") {
            // The descriptor an open returns: a guest of the kernel matrix starts the demo
            // with one more open than a terminal does.
            "FD".to_owned()
        } else if word.ends_with("/shmtrace")
            || (word.contains("/shmtrace-") && !word.contains("/dev/shm"))
        {
            // The binary: target/release/shmtrace, or a release artifact
            // (shmtrace-VERSION-TARGET), as the kernel matrix's guests run it.
            "SHMTRACE".to_owned()
        } else if word.ends_with('s')
            && word.len() > 1
            && word[..word.len() - 1].parse::<f64>().is_ok()
        {
            "SECONDS".to_owned() // the summary's `in 1.0s`
        } else {
            word.to_owned()
        };
        previous = if new == "TIME" { "TIME" } else { word };
        words.push(new);
    }
    let mut line = words.join(" ");
    // torch_<pid>_<counter>_<index>: keep the index.
    while let Some(at) = line.find("torch_") {
        let rest = &line[at + "torch_".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '_'))
            .unwrap_or(rest.len());
        let index = rest[..end].rsplit('_').next().unwrap_or("").to_owned();
        line = format!("{}TORCH#{index}{}", &line[..at], &rest[end..]);
    }
    // A descriptor argument, `ftruncate(4</dev/shm/...>`: its number, as above.
    let mut from = 0;
    while let Some(found) = line[from..].find('(') {
        let at = from + found + 1;
        let end = line[at..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(line.len(), |n| at + n);
        if end > at && line[end..].starts_with('<') {
            line.replace_range(at..end, "FD");
        }
        from = at;
    }
    while let Some(at) = line.find("0x") {
        let rest = &line[at + 2..];
        let end = rest
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(rest.len());
        line = format!("{}ADDR{}", &line[..at], &rest[end..]);
    }
    line
}

/// The leak check after the worst ending: SIGKILL gives shmtrace no chance to detach, and the
/// command it started lives on. The kernel must still free every program, map and link of
/// this shmtrace (other tracers running meanwhile keep theirs), and the survivor must not
/// have inherited any.
#[test]
fn sigkill_leaves_no_bpf_object_behind() {
    let _guard = serial();
    require_root();
    let dir = shmtrace_tests::tempdir();
    let ready = dir.join("ready");
    // The command starts once shmtrace is tracing: when it has written its mark, every
    // program is loaded and attached.
    let mut shmtrace = shmtrace()
        .args(["--", "sh", "-c", r#"touch "$0" && exec sleep 600"#])
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    shmtrace_tests::docker::wait_for(&ready);
    let held = shmtrace.bpf_objects();
    assert!(
        held.len() > 1,
        "a tracing shmtrace holds programs and maps: {held:?}"
    );
    let survivor = children_of(shmtrace.id());
    assert_eq!(survivor.len(), 1, "the traced sleep: {survivor:?}");
    let sleep = survivor[0];

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shmtrace.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let released = shmtrace.assert_released();
    assert!(released.is_superset(&held), "{held:?} vs {released:?}");

    // The command outlived shmtrace, and holds none of its objects.
    let alive = std::path::Path::new(&format!("/proc/{sleep}")).exists();
    let inherited = shmtrace_tests::bpf_objects::held_by(sleep);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sleep as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(alive, "the traced command should outlive a killed shmtrace");
    assert!(
        inherited.is_empty(),
        "the traced command inherited {inherited:?}"
    );
    println!(
        "SIGKILL of shmtrace: all of its {} BPF objects freed",
        released.len()
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The leak check itself must fail when an object outlives its shmtrace: here the test takes
/// a copy of one of shmtrace's program descriptors (pidfd_getfd), as a leaked descriptor in
/// a child would, and the check must name that program and this process as its holder.
#[test]
fn the_leak_check_fails_when_an_object_outlives_shmtrace() {
    let _guard = serial();
    require_root();
    let dir = shmtrace_tests::tempdir();
    let ready = dir.join("ready");
    let mut shmtrace = shmtrace()
        .args(["--", "sh", "-c", r#"touch "$0" && exec sleep 600"#])
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    shmtrace_tests::docker::wait_for(&ready);
    let pid = shmtrace.id();
    let sleep = children_of(pid);
    let (fd, prog) = first_program_fd(pid).expect("shmtrace holds a program");
    // SAFETY: plain system calls on integers; the descriptors returned are ours to close.
    let stolen = unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as libc::c_int;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let copy = libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) as libc::c_int;
        libc::close(pidfd);
        copy
    };
    assert!(
        stolen >= 0,
        "pidfd_getfd: {}",
        std::io::Error::last_os_error()
    );

    let verdict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        shmtrace.assert_released_within(std::time::Duration::from_secs(2))
    }));
    // SAFETY: closing the copy taken above, once.
    unsafe { libc::close(stolen) };
    for child in sleep {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let message = match verdict {
        Ok(objects) => panic!("the leak check passed with prog {prog} still held: {objects:?}"),
        Err(panic) => panic.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(
        message.contains(&format!("prog {prog} held by")),
        "{message}"
    );
    assert!(
        message.contains(&format!("{} (", std::process::id())),
        "names this test process as the holder: {message}"
    );
    // Once the copy is closed, the program goes.
    let program = shmtrace_tests::bpf_objects::Object {
        kind: shmtrace_tests::bpf_objects::Kind::Prog,
        id: prog,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while shmtrace_tests::bpf_objects::exists(program) {
        assert!(
            std::time::Instant::now() < deadline,
            "{program} stays loaded"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The first descriptor of `pid` that is a BPF program, and the program's id.
fn first_program_fd(pid: u32) -> Option<(i32, u32)> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()?;
    fds.filter_map(Result::ok).find_map(|entry| {
        let fd = entry.file_name().to_str()?.parse().ok()?;
        let info = std::fs::read_to_string(entry.path()).ok()?;
        // A link's fdinfo names its program too: take program descriptors only.
        if info.lines().any(|l| l.starts_with("link_id:")) {
            return None;
        }
        let id = info
            .lines()
            .find_map(|l| l.strip_prefix("prog_id:"))?
            .trim()
            .parse()
            .ok()?;
        Some((fd, id))
    })
}

/// Pids whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}
