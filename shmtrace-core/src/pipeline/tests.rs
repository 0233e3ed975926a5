//! The pipeline against a machine that answers as a real one would.
use shmtrace_common::{
    EventKind, ExecEvent, ExitEvent, FileRef, ForkEvent, Header, PATH_LEN, PathEvent, Syscall,
    SyscallEvent, flags,
};

use super::*;
use crate::{clock::Clock, output::Format};

const NS: u32 = 4026532177;
const HOST_SHM: u32 = 26;
const PRIVATE_SHM: u32 = 47;

/// The machine as the pipeline asks it: /dev/shm is the host's until the namespace mounts
/// its own, and nothing can be measured once every process is gone.
struct Machine {
    shm: u32,
    gone: bool,
}

impl Environment for Machine {
    fn snapshot(&mut self, _: u32) -> Option<ProcSnapshot> {
        None
    }

    fn measure(&mut self, _: &[u32], ts_ns: u64) -> Option<Capacity> {
        (!self.gone).then_some(Capacity {
            dev: self.shm,
            size: if self.shm == PRIVATE_SHM {
                1 << 20
            } else {
                64 << 20
            },
            used: 0,
            ts_ns,
            files: None,
        })
    }
}

fn bytes_of<T: zerocopy::IntoBytes + zerocopy::Immutable>(value: &T) -> Bytes {
    Bytes::copy_from_slice(value.as_bytes())
}

fn header(kind: EventKind, flags: u16, pid: u32, ts_ns: u64) -> Header {
    let mut comm = [0u8; 16];
    comm[..7].copy_from_slice(b"python3");
    Header {
        kind: kind as u16,
        flags,
        ts_ns,
        pid,
        tid: pid,
        mntns: NS,
        cgroup_id: 1,
        comm,
        ..Header::default()
    }
}

fn call(syscall: Syscall, pid: u32, ts_ns: u64, ret: i64, args: [u64; 6]) -> SyscallEvent {
    SyscallEvent {
        header: header(EventKind::Syscall, flags::FILE, pid, ts_ns),
        syscall: syscall as u16,
        fd: 3,
        ret,
        args,
        file: FileRef {
            dev: PRIVATE_SHM,
            mode: libc::S_IFREG | 0o600,
            ino: 9,
            size: 0,
            blocks: 0,
        },
        ..SyscallEvent::default()
    }
}

fn pipeline() -> Pipeline {
    Pipeline::new(
        World::new(),
        Diagnoser::new(4026531841),
        Output::new(
            Box::new(std::io::sink()),
            Format::Json,
            Clock::with_offset(0, jiff::tz::TimeZone::UTC),
            false,
        ),
        Filter::default(),
    )
}

/// `pid`'s 32-byte write to its /dev/shm object fails with ENOSPC, and it exits 1.
fn fail_and_exit(pipeline: &mut Pipeline, machine: &mut Machine, pid: u32) {
    let write = call(
        Syscall::Write,
        pid,
        3,
        -(libc::ENOSPC as i64),
        [3, 0, 32, 0, 0, 0],
    );
    pipeline.kernel_record(&bytes_of(&write), machine).unwrap();
    let exit = ExitEvent {
        header: header(EventKind::Exit, 0, pid, 4),
        exit_code: 1 << 8,
        _pad: 0,
    };
    pipeline.kernel_record(&bytes_of(&exit), machine).unwrap();
}

#[test]
fn a_shm_mounted_after_the_namespace_was_seen_is_measured_while_its_processes_live() {
    let mut pipeline = pipeline();
    let mut machine = Machine {
        shm: HOST_SHM,
        gone: false,
    };
    // `unshare -m` then a fork: first sight of the namespace, /dev/shm still the host's.
    let fork = ForkEvent {
        header: header(EventKind::Fork, 0, 10, 1),
        child_pid: 11,
        _pad: 0,
    };
    pipeline
        .kernel_record(&bytes_of(&fork), &mut machine)
        .unwrap();
    // A 1 MiB tmpfs is mounted on /dev/shm; a semaphore is created on it.
    machine.shm = PRIVATE_SHM;
    let flags = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
    let mut path = [0u8; PATH_LEN];
    path[..19].copy_from_slice(b"/dev/shm/sem.AbCdEf");
    let open = PathEvent {
        call: SyscallEvent {
            header: header(EventKind::Path, flags::FILE, 11, 2),
            ..call(Syscall::Openat, 11, 2, 3, [0, 0, flags, 0o600, 0, 0])
        },
        path,
    };
    pipeline
        .kernel_record(&bytes_of(&open), &mut machine)
        .unwrap();
    // Its write fails; by the time the events are read, every process has exited.
    machine.gone = true;
    fail_and_exit(&mut pipeline, &mut machine, 11);

    let diagnosis = &pipeline.diagnoses()[0];
    assert_eq!(diagnosis.pid, 11);
    let capacity = diagnosis
        .capacity
        .expect("the size of the /dev/shm that filled up");
    assert_eq!(capacity.dev, PRIVATE_SHM);
    assert_eq!(capacity.size, 1 << 20);
}

/// `unshare -m sh -c 'mount -t tmpfs ... /dev/shm; exec prog'`: the namespace is first seen
/// before the mount, and the program fails and is gone before its calls are read. Only the
/// measurement made at its exec knows the size of the /dev/shm that filled up.
#[test]
fn a_shm_mounted_before_an_exec_is_measured_at_the_exec() {
    let mut pipeline = pipeline();
    let mut machine = Machine {
        shm: HOST_SHM,
        gone: false,
    };
    let mut filename = [0u8; PATH_LEN];
    filename[..2].copy_from_slice(b"sh");
    let exec = |ts_ns| ExecEvent {
        header: header(EventKind::Exec, 0, 10, ts_ns),
        args_len: 0,
        _pad: 0,
        filename,
        args: [0; shmtrace_common::ARGS_LEN],
    };
    pipeline
        .kernel_record(&bytes_of(&exec(1)), &mut machine)
        .unwrap();
    machine.shm = PRIVATE_SHM;
    pipeline
        .kernel_record(&bytes_of(&exec(2)), &mut machine)
        .unwrap();
    machine.gone = true;
    fail_and_exit(&mut pipeline, &mut machine, 10);

    let diagnosis = &pipeline.diagnoses()[0];
    let capacity = diagnosis
        .capacity
        .expect("the size of the /dev/shm that filled up");
    assert_eq!(capacity.dev, PRIVATE_SHM);
    assert_eq!(capacity.size, 1 << 20);
}

/// Process entries scanned while replaying a storm of `n` children of one process in a
/// container with a private /dev/shm, each creating a /dev/shm file and killed by SIGKILL: the
/// shape of issue 25's trace, whose replay took 0.31 s for 10k processes and 41.9 s for 100k.
/// Every exit asks whether the container's last process ended, and every death by a signal
/// whether a child of it had failed first.
fn scanned_in_a_storm(n: u32) -> u64 {
    let mut pipeline = pipeline();
    let mut machine = Machine {
        shm: PRIVATE_SHM,
        gone: false,
    };
    pipeline
        .set_container(
            ContainerInfo {
                runtime: "docker".into(),
                id: "c0ffee".into(),
                name: "storm".into(),
                ipc: "private".into(),
                mntns: Some(NS),
                shm_dev: Some(PRIVATE_SHM),
                ..ContainerInfo::default()
            },
            0,
        )
        .unwrap();
    let flags = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
    let mut ts = 10;
    for i in 0..n {
        let child = 1000 + i;
        ts += 3;
        let fork = ForkEvent {
            header: header(EventKind::Fork, 0, 10, ts),
            child_pid: child,
            _pad: 0,
        };
        pipeline
            .kernel_record(&bytes_of(&fork), &mut machine)
            .unwrap();
        let name = format!("/dev/shm/storm-{i}");
        let mut path = [0u8; PATH_LEN];
        path[..name.len()].copy_from_slice(name.as_bytes());
        let mut open = call(
            Syscall::Openat,
            child,
            ts + 1,
            3,
            [0, 0, flags, 0o600, 0, 0],
        );
        open.header.kind = EventKind::Path as u16;
        open.file.ino = 100 + u64::from(i);
        let open = PathEvent { call: open, path };
        pipeline
            .kernel_record(&bytes_of(&open), &mut machine)
            .unwrap();
        let exit = ExitEvent {
            header: header(EventKind::Exit, 0, child, ts + 2),
            exit_code: libc::SIGKILL,
            _pad: 0,
        };
        pipeline
            .kernel_record(&bytes_of(&exit), &mut machine)
            .unwrap();
    }
    pipeline.world.scanned()
}

/// Issue 25, item 4: replay must be linear in the processes of a trace. Counted as work done
/// (process entries visited by scans of every process), not timed: before the fix each exit
/// and each death by a signal scanned every process seen so far, n²/2 entries for n.
#[test]
fn a_storm_of_processes_is_replayed_without_a_scan_per_process() {
    let small = scanned_in_a_storm(1000);
    let large = scanned_in_a_storm(4000);
    // Linear: four times the processes, at most about four times the work (plus a constant);
    // quadratic would be sixteen times.
    assert!(
        large <= 5 * small + 10_000,
        "scans visited {small} process entries for 1000 processes, {large} for 4000"
    );
    assert!(
        large <= 10 * 4000,
        "{large} process entries visited for 4000 processes"
    );
}

/// A replay forgets a container at its recorded end, as the live side did: a later failure in
/// the same namespace number (another container's, once the number is reused) is not put in
/// it (issue 25: an incident recording named a container that had exited 3 s before).
#[test]
fn a_recorded_container_end_stops_naming_its_namespace() {
    let place_of_failure = |ended: bool| {
        let mut pipeline = pipeline();
        let mut machine = Machine {
            shm: PRIVATE_SHM,
            gone: false,
        };
        let described = crate::record::ContainerDescription {
            id: "a".repeat(64),
            name: Some("pgboot".into()),
            runtime: Some("docker".into()),
            mntns: Some(NS),
            ..Default::default()
        };
        pipeline
            .user_record(1, &UserRecord::Container(Box::new(described)))
            .unwrap();
        if ended {
            pipeline
                .user_record(2, &UserRecord::ContainerEnd { mntns: NS })
                .unwrap();
        }
        fail_and_exit(&mut pipeline, &mut machine, 500);
        pipeline.diagnoses()[0].place.clone()
    };
    assert!(place_of_failure(false).contains("pgboot"));
    assert!(!place_of_failure(true).contains("pgboot"));
}

/// What a pipeline writes, kept to read back.
#[derive(Clone, Default)]
struct Written(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Written {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A machine whose /proc is asked, and answers nothing.
#[derive(Default)]
struct Asked {
    snapshots: Vec<u32>,
}

impl Environment for Asked {
    fn snapshot(&mut self, pid: u32) -> Option<ProcSnapshot> {
        self.snapshots.push(pid);
        None
    }

    fn measure(&mut self, _: &[u32], _: u64) -> Option<Capacity> {
        None
    }
}

/// An open of a name someone else removed while its owner held it is a failure everywhere a
/// failure is decided: in its event line, in the closing count of failed calls, for the read
/// of the failing process's /proc at its first failure, and before the model (what the live
/// side reads early). An open of a name that never existed is an existence check everywhere.
#[test]
fn an_open_of_a_removed_name_gets_one_answer_everywhere() {
    let written = Written::default();
    let mut pipeline = Pipeline::new(
        World::new(),
        Diagnoser::new(4026531841),
        Output::new(
            Box::new(written.clone()),
            Format::Json,
            Clock::with_offset(0, jiff::tz::TimeZone::UTC),
            false,
        ),
        Filter::default(),
    );
    let mut machine = Asked::default();
    let path_call = |syscall: Syscall, pid: u32, ts: u64, ret: i64, flags: u64, name: &str| {
        let mut call = call(syscall, pid, ts, ret, [0, 0, flags, 0o600, 0, 0]);
        call.header.kind = EventKind::Path as u16;
        if ret < 0 || syscall == Syscall::Unlink {
            call.header.flags = 0;
        }
        call.file.ino = 9 + u64::from(name.len() as u8 % 2);
        let mut path = [0u8; PATH_LEN];
        path[..name.len()].copy_from_slice(name.as_bytes());
        bytes_of(&PathEvent { call, path })
    };
    let create = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
    let records = [
        // The owner makes the name and holds it; another process removes it.
        path_call(Syscall::Openat, 10, 10, 3, create, "/dev/shm/job_buf"),
        path_call(Syscall::Unlink, 20, 20, 0, 0, "/dev/shm/job_buf"),
        // The reader works, then attaches by name; then looks for a name never made.
        path_call(Syscall::Openat, 30, 30, 3, create, "/dev/shm/reader_a"),
        path_call(
            Syscall::Openat,
            30,
            40,
            -(libc::ENOENT as i64),
            libc::O_RDWR as u64,
            "/dev/shm/job_buf",
        ),
        path_call(
            Syscall::Openat,
            31,
            50,
            -(libc::ENOENT as i64),
            libc::O_RDWR as u64,
            "/dev/shm/never_made",
        ),
    ];
    for (i, record) in records.iter().enumerate() {
        let event = decode(record).unwrap();
        let Body::Call(call) = &event.body else {
            unreachable!()
        };
        // Before the model: nothing it may call a failure is set aside.
        if i >= 3 {
            assert!(call.may_be_failure(), "{call:?}");
        }
        let before = pipeline.world.expected_error(&event, call);
        let note_expected = {
            pipeline.kernel_record(record, &mut machine).unwrap();
            let text = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
            let line: serde_json::Value =
                serde_json::from_str(text.lines().last().unwrap()).unwrap();
            assert_eq!(line["failure"], before.is_none() && call.failed(), "{line}");
            line["expected"].as_str().map(str::to_owned)
        };
        assert_eq!(note_expected.as_deref(), before, "record {i}");
        match i {
            3 => assert_eq!(before, None, "the removed name's open"),
            4 => assert_eq!(before, Some("an existence check")),
            _ => {}
        }
    }
    assert_eq!(pipeline.world.totals().failed_calls, 1);
    // /proc read once more for the reader, at its first failure, than for the process whose
    // open was an existence check.
    let reads = |pid: u32| machine.snapshots.iter().filter(|p| **p == pid).count();
    assert_eq!(reads(30), reads(31) + 1, "{:?}", machine.snapshots);
}

/// Issue 37, the hour-long container soak: 6 failing containers' `dd` was diagnosed under the
/// name of a process long gone (`pt_data_worker`, `rm`, `busybox`) that had had its pid. The
/// probes see no fork of dd (host-wide, the container's shell never touched /dev/shm), so its
/// first record was its open, and the model took it for the process that ended with that pid.
/// A call from a pid whose process ended before it is a new process's: learned afresh.
#[test]
fn a_pid_given_again_is_a_new_process_not_the_one_that_ended() {
    let mut pipeline = pipeline().diagnoses_only();
    let mut machine = Asked::default();
    let named = |comm: &[u8], kind: EventKind, flags: u16, ts_ns: u64| {
        let mut header = header(kind, flags, 500, ts_ns);
        header.comm = [0; 16];
        header.comm[..comm.len()].copy_from_slice(comm);
        header
    };
    let mut record = |record: Bytes| pipeline.kernel_record(&record, &mut machine).unwrap();
    // A worker uses /dev/shm and ends well.
    let write = SyscallEvent {
        header: named(b"pt_data_worker", EventKind::Syscall, flags::FILE, 1),
        ..call(Syscall::Write, 500, 1, 32, [3, 0, 32, 0, 0, 0])
    };
    record(bytes_of(&write));
    let exit = |comm: &[u8], ts_ns: u64, status: i32| ExitEvent {
        header: named(comm, EventKind::Exit, 0, ts_ns),
        exit_code: status << 8,
        _pad: 0,
    };
    record(bytes_of(&exit(b"pt_data_worker", 2, 0)));
    // Minutes later, dd gets its pid, and fills its /dev/shm.
    let refused = SyscallEvent {
        header: named(b"dd", EventKind::Syscall, flags::FILE, 200 * 1_000_000_000),
        ..call(
            Syscall::Write,
            500,
            200 * 1_000_000_000,
            -(libc::ENOSPC as i64),
            [1, 0, 65536, 0, 0, 0],
        )
    };
    record(bytes_of(&refused));
    record(bytes_of(&exit(b"dd", 200 * 1_000_000_000 + 1, 1)));

    let diagnoses = pipeline.diagnoses();
    assert_eq!(diagnoses.len(), 1, "{diagnoses:#?}");
    assert_eq!(diagnoses[0].comm, "dd", "{diagnoses:#?}");
    assert_eq!(diagnoses[0].failures[0].comm, "dd", "{diagnoses:#?}");
}
