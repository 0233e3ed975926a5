//! The ptrace source (issue 34), run as an ordinary user (uid 1000, no capability) against
//! the real kernel: the failures it must see, tied to what failed, and a traced program that
//! behaves as it does untraced. The same workloads as `kernel_diagnosis.rs`, in a 1 MiB tmpfs
//! of a private mount namespace, with the same assertions on their diagnoses.
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use shmtrace_tests::{
    diagnosis::*,
    require_root, serial, shmtrace_bin,
    workload::{MIB, USER, Workload},
};

/// PyTorch <= 2.9's failure: a worker's write into its mapping faults; the SIGBUS is tied to
/// the worker's own object and the offset in it, as the probes tie it.
#[test]
fn sigbus_is_tied_to_its_file_and_offset() {
    let _guard = serial();
    let script = "pytorch_mmap_sigbus.py";
    let workload = Workload::new(script, &["--load-ms", "20"]);
    let trace = workload.trace_unprivileged_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let trainer = main_pid(&trace.records, script);
    let failed = shm_full(&trace.records);
    let killed: Vec<&&Value> = failed
        .iter()
        .filter(|d| d["ending"]["signal"].is_string())
        .collect();
    assert!(!killed.is_empty(), "a worker died of SIGBUS:\n{}", dump());
    for d in killed {
        assert_worker_of(d, trainer, script, 2);
        assert_shm_full(d, MIB, &dump);
        assert_killed_by_sigbus(d);
        // One failure, as the probes see it: the fault, not the handler's re-raise (tgkill,
        // whose siginfo holds no address).
        assert_eq!(d["failures"].as_array().unwrap().len(), 1, "{d}");
        let own = format!("/dev/shm/torch_{}_", pid(d));
        assert_fault(&d["failures"][0], &own, 384 << 10);
    }
    assert_summary(&trace.records);
    let size = recommended(&workload, &trace.records);
    assert_enough_in_private_shm(&workload, size);
}

/// A `write` that fails on a /dev/shm descriptor (a semaphore's 32 bytes), seen although no
/// `write` elsewhere stops the program: its descriptor's filter was added when it was opened.
#[test]
fn a_failed_write_on_a_shm_descriptor_is_seen() {
    let _guard = serial();
    let script = "semaphore_enospc.py";
    let trace =
        Workload::new(script, &["--fill-bytes", "1M"]).trace_unprivileged_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let main = main_pid(&trace.records, script);
    let d = diagnoses(&trace.records)
        .into_iter()
        .find(|d| pid(d) == main)
        .unwrap_or_else(|| panic!("no diagnosis of the main process:\n{}", dump()));
    assert_eq!(d["cause"], "leftovers", "{d}");
    assert_call(&d["failures"][0], "write", "ENOSPC", "/dev/shm/sem.", 32);
    // The program's other writes (its messages to stderr) did not become records.
    let writes = trace
        .records
        .iter()
        .filter(|r| r["event"] == "write")
        .filter(|r| {
            !r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/dev/shm/"))
        })
        .count();
    assert_eq!(writes, 0, "{}", dump());
}

/// Descriptors passed over a Unix socket (PyTorch's file_descriptor strategy), and the
/// trainer out of descriptors: the recvmsg that dropped one, and the open that failed.
#[test]
fn passed_descriptors_and_the_descriptor_limit() {
    let _guard = serial();
    let script = "fd_limit.py";
    let trace = Workload::new(script, &[]).trace_unprivileged_in_private_shm(MIB);
    let dump = || trace.dump();
    assert_eq!(exit_code(&trace), Some(1), "{}", dump());
    let trainer = main_pid(&trace.records, script);
    assert!(shm_full(&trace.records).is_empty(), "{}", dump());
    let d = diagnoses(&trace.records)
        .into_iter()
        .find(|d| pid(d) == trainer)
        .unwrap_or_else(|| panic!("no diagnosis of the trainer:\n{}", dump()));
    assert_eq!(d["cause"], "fd_limit", "{d}");
    let failures = d["failures"].as_array().unwrap();
    assert_eq!(failures[0]["syscall"], "recvmsg", "{d}");
    assert_eq!(failures[0]["errno"], "MSG_CTRUNC", "{d}");
    assert!(
        failures
            .iter()
            .any(|f| f["syscall"] == "openat" && f["errno"] == "EMFILE"),
        "{d}"
    );
    // Before the limit, the trainer mapped what its workers passed it: received descriptors'
    // calls were seen.
    let mapped = trace
        .records
        .iter()
        .filter(|r| r["event"] == "mmap" && r["pid"] == trainer)
        .count();
    assert!(mapped > 0, "{}", dump());
}

/// `shmtrace --backend ptrace [ARGS] -- sh -c SCRIPT` as the ordinary user; stdout and stderr
/// go to a file of the test's, read back.
fn run_as_user(args: &[&str], script: &str) -> (Option<i32>, String) {
    require_root();
    let output = Command::new("setpriv")
        .args([
            "--reuid",
            USER,
            "--regid",
            USER,
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(shmtrace_bin())
        .args(["--backend", "ptrace"])
        .args(args)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("running setpriv");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

#[test]
fn the_command_behaves_as_it_does_untraced() {
    // Its exit status and its death by a signal are shmtrace's.
    assert_eq!(run_as_user(&[], "exit 3").0, Some(3));
    let (status, log) = run_as_user(&[], "kill -TERM $$");
    assert_eq!(status, Some(128 + 15), "{log}");
    // A stop signal stops it (job control), and SIGCONT from another process lets it go on.
    let (status, log) = run_as_user(
        &[],
        "(sleep 0.5; kill -CONT $$) & kill -STOP $$; echo resumed; wait",
    );
    assert_eq!(status, Some(0), "{log}");
    assert!(log.contains("resumed"), "{log}");
    // Signals handled by the program reach its handler; threads and children are followed.
    let (status, log) = run_as_user(
        &[],
        "trap 'echo got-usr1' USR1; kill -USR1 $$; /usr/bin/python3 -c 'import threading; \
         t = threading.Thread(target=print, args=(\"thread\",)); t.start(); t.join()'",
    );
    assert_eq!(status, Some(0), "{log}");
    assert!(log.contains("got-usr1") && log.contains("thread"), "{log}");
}

/// While stopped by a stop signal, the program is really stopped (state T), as a shell's
/// job control expects, until it is continued.
#[test]
fn a_stopped_program_stays_stopped_until_continued() {
    require_root();
    let mut child = Command::new("setpriv")
        .args([
            "--reuid",
            USER,
            "--regid",
            USER,
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(shmtrace_bin())
        .args([
            "--backend",
            "ptrace",
            "--",
            "sh",
            "-c",
            "echo $$; kill -STOP $$; echo resumed",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting shmtrace");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let pid: u32 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a pid: {line:?}"));
    let state = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().chars().next())
            })
            .flatten()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while state(pid) != Some('t') && state(pid) != Some('T') {
        assert!(
            Instant::now() < deadline,
            "pid {pid} never stopped: {:?}",
            state(pid)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // It stays so.
    std::thread::sleep(Duration::from_millis(500));
    assert!(matches!(state(pid), Some('t' | 'T')), "{:?}", state(pid));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGCONT,
    )
    .unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "resumed");
    assert!(child.wait().unwrap().success());
}

/// SIGTERM sent to shmtrace alone reaches the command, as with the probes.
#[test]
fn sigterm_is_passed_on() {
    require_root();
    let mut child = Command::new("setpriv")
        .args([
            "--reuid",
            USER,
            "--regid",
            USER,
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(shmtrace_bin())
        // --show-all: the exec of a command that touches no /dev/shm is otherwise not shown,
        // and it is the sign that the command runs.
        .args(["--backend", "ptrace", "--show-all", "--", "sleep", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting shmtrace");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    // The exec line says it runs.
    let mut line = String::new();
    let mut log = String::new();
    while !line.contains("execve") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "{log}");
        log.push_str(&line);
    }
    let started = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    log.push_str(&rest);
    let _ = child.wait();
    assert!(started.elapsed() < Duration::from_secs(4), "{log}");
    assert!(
        log.contains("passed SIGTERM on to the traced command"),
        "{log}"
    );
    assert!(log.contains("command killed by SIGTERM"), "{log}");
}

/// A program that wants to trace (a debugger, strace, py-spy) is told why it cannot, and
/// its attempt fails at once instead of hanging.
#[test]
fn a_nested_tracer_gets_a_clear_answer() {
    let started = Instant::now();
    let (status, log) = run_as_user(&[], "strace -f -o /dev/null true; echo strace=$?");
    assert!(started.elapsed() < Duration::from_secs(20), "{log}");
    assert_eq!(status, Some(0), "{log}");
    assert!(!log.contains("strace=0"), "strace failed: {log}");
    assert!(
        log.contains("cannot have another tracer, so its call fails with EPERM"),
        "{log}"
    );
}

/// `--pid` of one's own running process: it is followed from then on (a `dd` that fills a
/// 1 MiB /dev/shm started before shmtrace: its failed write is diagnosed), and a process of
/// another user is refused with the reason.
#[test]
fn pid_of_ones_own_process_is_followed_and_anothers_refused() {
    let _guard = serial();
    require_root();
    let dir = shmtrace_tests::tempdir();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // The workload waits for `go`, which comes once shmtrace says it traces it.
    let script = r#"
        d=$1; bin=$2
        (while [ ! -e "$d/go" ]; do sleep 0.05; done
         exec dd if=/dev/zero of=/dev/shm/big bs=256k count=8) &
        w=$!
        "$bin" --backend ptrace --json -o "$d/trace.jsonl" --pid "$w" 2>"$d/log" &
        s=$!
        i=0
        until grep -q "with ptrace" "$d/log"; do
            i=$((i+1)); [ $i -lt 400 ] || { echo "shmtrace did not start"; kill $w; break; }
            sleep 0.05
        done
        touch "$d/go"
        wait $w; echo "dd=$?"
        wait $s; echo "shmtrace=$?"
        "$bin" --backend ptrace --pid 1 2>&1; echo "pid1=$?"
    "#;
    let output = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount --make-rprivate / && mount -t tmpfs -o size=1m shmtrace-test /dev/shm && \
             exec setpriv --reuid 1000 --regid 1000 --clear-groups --inh-caps=-all \
             --bounding-set=-all sh -c \"$0\" sh \"$1\" \"$2\"",
        ])
        .arg(script)
        .arg(&dir)
        .arg(shmtrace_bin())
        .stdin(Stdio::null())
        .output()
        .expect("running unshare");
    let shown = String::from_utf8_lossy(&output.stdout).into_owned();
    let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
    let records = shmtrace_tests::read_json_lines(&dir.join("trace.jsonl"));
    let _ = std::fs::remove_dir_all(&dir);
    let dump = || {
        format!(
            "{shown}{}\n--- shmtrace's log\n{log}",
            String::from_utf8_lossy(&output.stderr)
        )
    };
    assert!(output.status.success(), "{}", dump());
    assert!(
        shown.contains("dd=1"),
        "dd failed for lack of room: {}",
        dump()
    );
    assert!(shown.contains("shmtrace=0"), "{}", dump());
    let failed_write = records
        .iter()
        .find(|r| r["event"] == "write" && r["errno"] == "ENOSPC")
        .unwrap_or_else(|| panic!("no write ENOSPC: {}", dump()));
    assert_eq!(failed_write["path"], "/dev/shm/big", "{}", dump());
    let d = diagnoses(&records)
        .into_iter()
        .find(|d| d["comm"] == "dd")
        .unwrap_or_else(|| panic!("no diagnosis of dd: {}", dump()));
    assert_eq!(d["cause"], "shm_full", "{}", dump());
    assert_eq!(d["shm"]["size"], MIB, "{}", dump());
    // Root's process: refused, and why.
    assert!(shown.contains("pid1=1"), "{}", dump());
    assert!(
        shown.contains("cannot trace pid 1 with ptrace")
            && shown.contains("only a process's own user may trace it"),
        "{}",
        dump()
    );
}
