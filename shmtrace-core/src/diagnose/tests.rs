//! The diagnoser fed hand-made events, as the probes would send them.
use super::*;
use crate::{
    capacity::Capacity,
    event::{Call, Exec, FileRef, InodeId},
};

const MNTNS: u32 = 4026531841;
const DEV: u32 = 47;

/// A trace built event by event, applied to a model and diagnosed as the pipeline does.
struct Run {
    world: World,
    diagnoser: Diagnoser,
    ts: u64,
    next_ino: u64,
    out: Vec<Diagnosis>,
    /// Each exit, and whether it is shown as a failure: (pid, failure).
    exits: Vec<(u32, bool)>,
}

impl Run {
    fn new() -> Run {
        Run::measured(1 << 20)
    }

    /// With /dev/shm last measured `used` bytes full (of 1 MiB).
    fn measured(used: u64) -> Run {
        let mut diagnoser = Diagnoser::new(MNTNS);
        diagnoser.capacity(Capacity {
            dev: DEV,
            size: 1 << 20,
            used,
            ts_ns: 0,
            files: None,
        });
        Run {
            world: World::new(),
            diagnoser,
            ts: 0,
            next_ino: 2,
            out: Vec::new(),
            exits: Vec::new(),
        }
    }

    fn event(&mut self, pid: u32, comm: &str, body: Body) {
        self.ts += 1_000;
        let event = Event {
            ts_ns: self.ts,
            cpu: 0,
            pid,
            tid: pid,
            comm: comm.to_owned(),
            mntns: MNTNS,
            cgroup_id: 1,
            container_match: false,
            body,
        };
        let note = self.world.apply(&event);
        if let Body::Exit(_) = &event.body {
            self.exits.push((pid, note.is_failure(&event)));
        }
        let done = self.diagnoser.observe(&event, &note, &self.world);
        self.out.extend(done);
    }

    fn exec(&mut self, pid: u32, argv: &[&str]) {
        let body = Body::Exec(Exec {
            filename: argv[0].to_owned(),
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            argv_truncated: false,
        });
        self.event(pid, "python3", body);
    }

    fn fork(&mut self, parent: u32, child: u32) {
        self.event(parent, "python3", Body::Fork { child_pid: child });
    }

    fn rename(&mut self, pid: u32, comm: &str) {
        let body = Body::Rename {
            pid,
            tid: pid,
            comm: comm.to_owned(),
        };
        self.event(pid, comm, body);
    }

    /// `openat(path, O_RDWR|O_CREAT|O_EXCL)` returning `fd` (or `-errno`).
    fn create(&mut self, pid: u32, comm: &str, path: &str, fd: i64) -> InodeId {
        let inode = InodeId {
            dev: DEV,
            ino: self.next_ino,
        };
        self.next_ino += 1;
        let flags = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
        let call = Call {
            syscall: Syscall::Openat,
            fd: (fd >= 0).then_some(fd as i32),
            ret: fd,
            args: [libc::AT_FDCWD as u64, 0, flags, 0o600, 0, 0],
            file: (fd >= 0).then_some(FileRef {
                inode,
                mode: libc::S_IFREG | 0o600,
                size: 0,
                allocated: 0,
            }),
            path: Some(path.to_owned()),
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        };
        self.event(pid, comm, Body::Call(call));
        inode
    }

    /// `fallocate(fd, 0, 0, len)` returning `-errno`.
    fn fallocate_fails(&mut self, pid: u32, comm: &str, fd: i32, inode: InodeId, len: u64) {
        let call = Call {
            syscall: Syscall::Fallocate,
            fd: Some(fd),
            ret: -(libc::ENOSPC as i64),
            args: [fd as u64, 0, 0, len, 0, 0],
            file: Some(FileRef {
                inode,
                mode: libc::S_IFREG | 0o600,
                size: len as i64,
                allocated: 0,
            }),
            path: None,
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        };
        self.event(pid, comm, Body::Call(call));
    }

    /// `write(fd, buf, len)` returning `ret`, leaving the object `allocated` bytes big.
    fn write(&mut self, pid: u32, comm: &str, fd: i32, inode: InodeId, len: u64, ret: i64) {
        let allocated = self.world.object(&inode).map_or(0, |o| o.allocated)
            + if ret > 0 { ret as u64 } else { 0 };
        let call = Call {
            syscall: Syscall::Write,
            fd: Some(fd),
            ret,
            args: [fd as u64, 0, len, 0, 0, 0],
            file: Some(FileRef {
                inode,
                mode: libc::S_IFREG | 0o600,
                size: allocated as i64,
                allocated,
            }),
            path: None,
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        };
        self.event(pid, comm, Body::Call(call));
    }

    /// `close(fd)` of `inode`, returning 0.
    fn close(&mut self, pid: u32, comm: &str, fd: i32, inode: InodeId) {
        let allocated = self.world.object(&inode).map_or(0, |o| o.allocated);
        let call = Call {
            syscall: Syscall::Close,
            fd: Some(fd),
            ret: 0,
            args: [fd as u64, 0, 0, 0, 0, 0],
            file: Some(FileRef {
                inode,
                mode: libc::S_IFREG | 0o600,
                size: allocated as i64,
                allocated,
            }),
            path: None,
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        };
        self.event(pid, comm, Body::Call(call));
    }

    /// `statfs("/dev/shm")` answering `free` of `size` (4 KiB blocks).
    fn statfs(&mut self, pid: u32, comm: &str, size: u64, free: u64) {
        const TMPFS_MAGIC: u64 = 0x0102_1994;
        let call = Call {
            syscall: Syscall::Statfs,
            fd: None,
            ret: 0,
            args: [0, 0, 4096, size / 4096, free / 4096, TMPFS_MAGIC],
            file: None,
            path: Some("/dev/shm".to_owned()),
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        };
        self.event(pid, comm, Body::Call(call));
    }

    fn exit(&mut self, pid: u32, comm: &str, code: i32) {
        self.event(pid, comm, Body::Exit(ExitStatus::Code(code).into()));
    }

    /// Its end by `signo`, with no core.
    fn killed(&mut self, pid: u32, comm: &str, signo: i32) {
        let status = ExitStatus::Signal {
            signo,
            core_dumped: false,
        };
        self.event(pid, comm, Body::Exit(status.into()));
    }

    fn of(&self, pid: u32) -> &Diagnosis {
        self.out
            .iter()
            .find(|d| d.pid == pid)
            .unwrap_or_else(|| panic!("no diagnosis of {pid}: {:#?}", self.out))
    }
}

const WORKER: &str = "pt_data_worker";

/// A trainer (100) with two workers (101, 102), started; nothing has failed yet.
fn trainer_with_two_workers() -> Run {
    let mut run = Run::new();
    run.exec(100, &["/usr/bin/python3", "train.py"]);
    for worker in [101, 102] {
        run.fork(100, worker);
        run.rename(worker, WORKER);
    }
    run
}

#[test]
fn a_trainer_follows_the_worker_that_failed_first_and_takes_its_cause() {
    let mut run = trainer_with_two_workers();
    // Worker 102 fails first; 101 fails later but exits first.
    let late = run.create(102, WORKER, "/dev/shm/torch_102_1_0", 5);
    run.fallocate_fails(102, WORKER, 5, late, 256 << 10);
    let early = run.create(101, WORKER, "/dev/shm/torch_101_1_0", 5);
    run.fallocate_fails(101, WORKER, 5, early, 256 << 10);
    run.exit(101, WORKER, 0);
    run.exit(102, WORKER, 0);
    run.exit(100, "python3", 1);

    let worker = run.of(102);
    assert_eq!(worker.cause, Cause::ShmFull);
    assert_eq!(worker.role.trainer, Some(100));
    let trainer = run.of(100);
    assert_eq!(trainer.role.kind, RoleKind::Trainer);
    assert_eq!(
        trainer.follows,
        Some(102),
        "the worker that failed first, not the lowest pid"
    );
    assert!(trainer.failures.is_empty());
    // It died of /dev/shm too: same cause and size, no "not a /dev/shm problem".
    assert_eq!(trainer.cause, Cause::ShmFull);
    assert_eq!(trainer.explanation, None);
    assert_eq!(trainer.recommendation, worker.recommendation);
    assert!(trainer.recommendation.is_some());
}

#[test]
fn a_trainer_following_a_worker_out_of_descriptors_says_so() {
    let mut run = trainer_with_two_workers();
    run.create(
        101,
        WORKER,
        "/dev/shm/torch_101_1_0",
        -(libc::EMFILE as i64),
    );
    run.exit(101, WORKER, 0);
    run.exit(102, WORKER, 0);
    run.exit(100, "python3", 1);

    assert_eq!(run.of(101).cause, Cause::FdLimit);
    let trainer = run.of(100);
    assert_eq!(trainer.follows, Some(101));
    assert_eq!(trainer.cause, Cause::FdLimit);
    assert_eq!(trainer.recommendation, None);
    assert!(
        trainer
            .explanation
            .as_deref()
            .is_some_and(|e| e.contains("file descriptors"))
    );
}

#[test]
fn a_trainer_whose_workers_did_not_fail_is_not_blamed_on_them() {
    let mut run = trainer_with_two_workers();
    run.create(101, WORKER, "/dev/shm/torch_101_1_0", 5);
    run.exit(101, WORKER, 0);
    run.exit(102, WORKER, 0);
    run.exit(100, "python3", 1);

    let trainer = run.of(100);
    assert_eq!(trainer.follows, None);
    assert_eq!(trainer.cause, Cause::Other);
}

#[test]
fn a_parent_follows_its_child_that_failed() {
    // multiprocessing: a parent (200) whose child (201) died of a full /dev/shm, and which then
    // exits 1 itself; another child (202) did nothing wrong.
    let mut run = Run::new();
    run.exec(200, &["/usr/bin/python3", "writers.py"]);
    run.fork(200, 201);
    run.fork(200, 202);
    let segment = run.create(201, "python3", "/dev/shm/psm_0123abcd", 3);
    run.fallocate_fails(201, "python3", 3, segment, 2 << 20);
    run.exit(201, "python3", 1);
    run.exit(202, "python3", 0);
    run.exit(200, "python3", 1);

    let child = run.of(201);
    assert_eq!(child.cause, Cause::ShmFull);
    let parent = run.of(200);
    assert_eq!(parent.follows, Some(201));
    assert_eq!(parent.cause, Cause::ShmFull);
    assert_eq!(parent.recommendation, child.recommendation);
}

#[test]
fn a_rank_ending_in_error_after_its_sibling_failed_follows_it() {
    // An MPI job: mpirun (300) and its ranks 301 and 302, both using /dev/shm. 301's segment
    // cannot be sized; 302, its peer gone, exits 1 itself before mpirun can stop it. 302 had
    // no failure of its own: 301's says why (it had been diagnosed "other").
    let mut run = Run::new();
    run.exec(300, &["/usr/bin/mpirun", "-n", "2", "python3", "ring.py"]);
    run.fork(300, 301);
    run.fork(300, 302);
    let own = run.create(302, "python3", "/dev/shm/ucx_posix_302", 3);
    run.close(302, "python3", 3, own);
    let segment = run.create(301, "python3", "/dev/shm/ucx_posix_301", 3);
    run.fallocate_fails(301, "python3", 3, segment, 4 << 20);
    run.exit(301, "python3", 1);
    run.exit(302, "python3", 1);

    let failed = run.of(301);
    assert_eq!(failed.cause, Cause::ShmFull);
    let peer = run.of(302);
    assert_eq!(peer.follows, Some(301));
    assert_eq!(peer.cause, Cause::ShmFull);
    assert_eq!(peer.recommendation, failed.recommendation);
}

#[test]
fn an_exit_status_is_a_failure_only_where_shared_memory_was_involved() {
    // `import torch` runs gcc to look for a library, which exits 1: nothing to do with
    // /dev/shm. A worker that failed on /dev/shm, and the trainer it took down, are failures.
    let mut run = Run::new();
    run.exec(200, &["/usr/bin/python3", "train.py"]);
    run.fork(200, 201);
    run.exit(201, "gcc", 1);
    run.fork(200, 202);
    let segment = run.create(202, "python3", "/dev/shm/psm_0123abcd", 3);
    run.fallocate_fails(202, "python3", 3, segment, 2 << 20);
    run.exit(202, "python3", 1);
    run.exit(200, "python3", 1);
    assert_eq!(run.exits, vec![(201, false), (202, true), (200, true)]);
}

#[test]
fn a_parent_whose_children_did_not_fail_gets_no_diagnosis() {
    let mut run = Run::new();
    run.exec(200, &["/bin/sh", "-c", "false"]);
    run.fork(200, 201);
    run.exit(201, "sh", 0);
    run.exit(200, "sh", 1);
    assert!(run.out.is_empty(), "{:#?}", run.out);
}

#[test]
fn used_is_at_least_what_traced_objects_held_at_the_failure() {
    // A filler writes 1 MiB, then sem_open's 32-byte write fails; /dev/shm was measured after
    // the program had unlinked both (0 bytes used), as happens live.
    let mut run = Run::measured(0);
    run.exec(300, &["/usr/bin/python3", "queues.py"]);
    let filler = run.create(300, "python3", "/dev/shm/filler", 3);
    for _ in 0..16 {
        run.write(300, "python3", 3, filler, 64 << 10, 64 << 10);
    }
    let sem = run.create(300, "python3", "/dev/shm/sem.AbCdEf", 4);
    run.write(300, "python3", 4, sem, 32, -(libc::ENOSPC as i64));
    run.exit(300, "python3", 1);

    let d = run.of(300);
    assert_eq!(d.cause, Cause::ShmFull);
    let capacity = d.capacity.expect("a capacity");
    assert_eq!(capacity.size, 1 << 20);
    assert_eq!(capacity.used, 1 << 20, "not the 0 measured too late");
}

#[test]
fn used_is_at_least_what_the_kernel_refused() {
    // Measured after the fact at 40%; nothing traced explains the rest (pages dirtied through
    // mappings). ENOSPC for 256 KiB at an unknown offset: at most 64 pages were free.
    let mut run = Run::measured(400 << 10);
    run.exec(400, &["/usr/bin/python3", "worker.py"]);
    let batch = run.create(400, WORKER, "/dev/shm/torch_400_1_0", 5);
    run.fallocate_fails(400, WORKER, 5, batch, 256 << 10);
    run.exit(400, WORKER, 1);
    let capacity = run.of(400).capacity.expect("a capacity");
    assert_eq!(capacity.used, (1 << 20) - (256 << 10));

    // A one-byte write needs one page: none was free.
    let mut run = Run::measured(0);
    run.exec(401, &["/usr/bin/python3", "worker.py"]);
    let batch = run.create(401, WORKER, "/dev/shm/torch_401_1_0", 5);
    run.write(401, WORKER, 5, batch, 1, -(libc::ENOSPC as i64));
    run.exit(401, WORKER, 1);
    assert_eq!(run.of(401).capacity.unwrap().used, 1 << 20);
}

/// Roles kept current change by change agree with roles computed from scratch, after every
/// event: named and unnamed workers, renames, a worker's own child, NCCL, a storm of short-lived
/// workers, and a second trainer.
#[test]
fn updated_roles_match_roles_computed_from_scratch() {
    fn check(run: &mut Run, step: &str) {
        let full = Roles::compute(&run.world);
        let updated = run.diagnoser.roles(&run.world).clone();
        for process in run.world.processes() {
            assert_eq!(
                updated.of(process.pid),
                full.of(process.pid),
                "pid {} after {step}",
                process.pid
            );
        }
    }
    let mut run = Run::new();
    run.exec(100, &["python3", "train.py"]);
    check(&mut run, "exec");
    for child in [101, 102] {
        run.fork(100, child);
        check(&mut run, "fork");
    }
    run.create(102, "python3", "/dev/shm/torch_102_1", 3);
    check(&mut run, "unnamed worker");
    run.rename(101, WORKER);
    check(&mut run, "named worker");
    run.fork(101, 104);
    run.create(104, WORKER, "/dev/shm/nccl-104", 3);
    check(&mut run, "a worker's child");
    run.exit(102, "python3", 0);
    check(&mut run, "exit");
    for child in 110..160 {
        run.fork(100, child);
        run.create(child, "python3", &format!("/dev/shm/torch_{child}_0"), 3);
        run.exit(child, "python3", 0);
        check(&mut run, "storm");
    }
    run.exec(200, &["python3", "other.py"]);
    run.rename(200, "pt_main_thread");
    run.fork(200, 201);
    run.rename(201, WORKER);
    check(&mut run, "second trainer");
    let roles = run.diagnoser.roles(&run.world);
    assert_eq!(roles.of(201).trainer, Some(200));
}

#[test]
fn a_role_peak_counts_a_shared_object_once_and_includes_writes() {
    let mut run = Run::new();
    run.exec(200, &["/usr/bin/python3", "share.py"]);
    let inode = run.create(200, "python3", "/dev/shm/shared", 5);
    run.write(200, "python3", 5, inode, 64 << 10, 64 << 10);
    run.fork(200, 201);
    // The child writes through the descriptor it inherited: one object, two holders.
    run.write(201, "python3", 5, inode, 4 << 10, 4 << 10);
    let table = run.diagnoser.table(&run.world);
    let (_, _, stats) = table
        .iter()
        .find(|(_, role, stats)| *role == RoleKind::Other && stats.processes == 2)
        .unwrap_or_else(|| panic!("{table:#?}"));
    assert_eq!(stats.peak_bytes, 68 << 10, "{table:#?}");
}

/// Issue 25, item 13: `dd of=/dev/shm/x` opens the file as 3, moves it to 1 with dup2 (which
/// is not traced), closes 3 and writes through 1. Its role's peak counted nothing: the
/// process held no descriptor of the object the model knew of.
#[test]
fn a_role_peak_counts_writes_through_a_descriptor_the_trace_did_not_see_opened() {
    let mut run = Run::new();
    run.exec(
        300,
        &[
            "/usr/bin/dd",
            "if=/dev/zero",
            "of=/dev/shm/x",
            "bs=1M",
            "count=2",
        ],
    );
    let inode = run.create(300, "dd", "/dev/shm/x", 3);
    run.close(300, "dd", 3, inode);
    run.write(300, "dd", 1, inode, 1 << 20, 1 << 20);
    run.write(300, "dd", 1, inode, 1 << 20, 1 << 20);
    run.close(300, "dd", 1, inode);
    run.exit(300, "dd", 0);
    let table = run.diagnoser.table(&run.world);
    let (_, _, stats) = table
        .iter()
        .find(|(_, _, stats)| stats.processes == 1)
        .unwrap_or_else(|| panic!("{table:#?}"));
    assert_eq!(stats.peak_bytes, 2 << 20, "{table:#?}");
}

#[test]
fn files_of_dead_processes_are_named_and_the_size_is_not_blamed() {
    let mut run = Run::measured(800 << 10);
    run.exec(300, &["/usr/bin/python3", "first.py"]);
    let left = run.create(300, "python3", "/dev/shm/torch_300_1", 5);
    run.write(300, "python3", 5, left, 768 << 10, 768 << 10);
    run.killed(300, "python3", libc::SIGKILL);
    run.exec(301, &["/usr/bin/python3", "second.py"]);
    let next = run.create(301, "python3", "/dev/shm/torch_301_1", 5);
    run.fallocate_fails(301, "python3", 5, next, 512 << 10);
    run.exit(301, "python3", 1);
    let d = run.of(301);
    assert_eq!(d.cause, Cause::Leftovers, "{d:#?}");
    assert!(d.recommendation.is_none(), "the size is not blamed: {d:#?}");
    let leftovers = d.leftovers.as_ref().expect("leftovers");
    assert!(leftovers.enough_without);
    assert_eq!(leftovers.files.len(), 1);
    assert_eq!(leftovers.files[0].path, "/dev/shm/torch_300_1");
    assert_eq!(leftovers.files[0].creator_pid, 300);
    assert_eq!(leftovers.files[0].creator_ending, "killed by SIGKILL");
    assert_eq!(leftovers.remove, "rm -f -- /dev/shm/torch_300_1");
    assert_eq!(d.program.map(|k| k.program), Some("PyTorch"));
}

#[test]
fn a_child_its_parent_kills_is_not_diagnosed() {
    let mut run = Run::new();
    run.exec(400, &["/usr/bin/chromium"]);
    run.fork(400, 401);
    run.event(
        400,
        "chromium",
        Body::Signal(crate::event::Signal {
            signo: libc::SIGKILL,
            code: 0,
            errno: 0,
            result: 0,
            addr: 0,
            target_pid: 401,
            target_tid: 401,
            target_comm: "chromium".into(),
            target_maps_shm: false,
        }),
    );
    run.killed(401, "chromium", libc::SIGKILL);
    run.exit(400, "chromium", 0);
    assert!(run.out.is_empty(), "{:#?}", run.out);
}

#[test]
fn a_process_first_met_through_the_kill_that_ends_it_is_ended_by_its_sender() {
    // A container's process that ran before the trace, killed by the runtime (pid 500).
    let mut run = Run::new();
    run.event(
        500,
        "runc",
        Body::Signal(crate::event::Signal {
            signo: libc::SIGKILL,
            code: 0,
            errno: 0,
            result: 0,
            addr: 0,
            target_pid: 600,
            target_tid: 600,
            target_comm: "sleep".into(),
            target_maps_shm: false,
        }),
    );
    run.killed(600, "sleep", libc::SIGKILL);
    assert_eq!(run.exits, vec![(600, false)]);
    assert_eq!(run.world.process(600).map(|p| p.mntns), Some(MNTNS));
    assert!(run.out.is_empty(), "{:#?}", run.out);
}

#[test]
fn base_names_are_what_follows_the_last_slash() {
    for (path, base) in [
        ("", ""),
        ("/", ""),
        ("torch_1_2", "torch_1_2"),
        ("/dev/shm/torch_1_2", "torch_1_2"),
        ("/dev/shm/a/nccl-x", "nccl-x"),
        ("/dev/shm/dir/", ""),
        ("/dev/shm/é/数据", "数据"),
    ] {
        assert_eq!(super::base_name(path), base, "{path:?}");
    }
    assert!(role::is_torch("/dev/shm/torch_1_2"));
    assert!(!role::is_torch("/dev/shm/x/no_torch_1"));
    assert!(role::is_nccl("nccl-shm"));
}

/// What the machine showed holding a full /dev/shm: a file of an untraced process in another
/// container that shares it is named with its pages, its holder and that container; the
/// traced process's own file is not counted among the others; the container whose /dev/shm
/// it is, is where the size goes.
#[test]
fn files_others_hold_on_a_shared_shm_are_named_with_their_container() {
    use crate::model::{HeldFile, Holder, ShmHolders};
    const HOLDER_MNTNS: u32 = 4026532000;
    let mut run = Run::measured(600 << 10);
    let container = |name: &str, id: &str, mntns: u32, ipc: &str| ContainerInfo {
        runtime: "docker".into(),
        id: id.into(),
        name: name.into(),
        ipc: ipc.into(),
        mntns: Some(mntns),
        shm_dev: Some(DEV),
        ..ContainerInfo::default()
    };
    let holder_id = "a".repeat(64);
    run.diagnoser.set_container(container(
        "holder",
        &holder_id,
        HOLDER_MNTNS,
        "private (shareable)",
    ));
    run.diagnoser.set_container(container(
        "writer",
        &"b".repeat(64),
        MNTNS,
        &format!("shared with container {}", &holder_id[..12]),
    ));
    run.exec(500, &["/usr/bin/python3", "writer.py"]);
    let own = run.create(500, "python3", "/dev/shm/more", 5);
    let file = |ino: u64, path: &str, bytes: u64, holders: Vec<Holder>| HeldFile {
        ino,
        path: path.into(),
        linked: true,
        bytes,
        size: bytes,
        holders,
    };
    run.diagnoser.holders(ShmHolders {
        dev: DEV,
        ts_ns: run.ts,
        files: vec![
            file(
                900,
                "/dev/shm/cache",
                600 << 10,
                vec![Holder {
                    pid: 42,
                    comm: "sleep".into(),
                    mntns: HOLDER_MNTNS,
                    open: true,
                    mapped: false,
                }],
            ),
            // The traced process's own file: counted as its demand, not as the others'.
            file(own.ino, "/dev/shm/more", 4096, Vec::new()),
        ],
    });
    run.fallocate_fails(500, "python3", 5, own, 512 << 10);
    run.exit(500, "python3", 1);
    let d = run.of(500);
    assert_eq!(d.cause, Cause::ShmFull, "{d:#?}");
    let others = d.others.as_ref().expect("others");
    assert_eq!(others.bytes, 600 << 10);
    assert_eq!(others.count, 1, "{others:#?}");
    assert_eq!(others.files[0].path, "/dev/shm/cache");
    let holder = &others.files[0].holders[0];
    assert_eq!((holder.pid, holder.place.as_str()), (42, "holder"));
    assert!(holder.in_container);
    assert_eq!(others.owner.as_deref(), Some("holder"));
    assert_eq!(others.shared_by.len(), 2, "{others:#?}");
    assert_eq!(
        d.container.as_ref().map(|c| c.ipc.as_str()),
        Some("shared with container holder")
    );
}

/// A process that looked at /dev/shm's free space and then exited unsuccessfully, with no call
/// failing: blamed on what it saw, without a size (nothing says what it needed). One that
/// looked and exited 0 gets nothing.
#[test]
fn an_unsuccessful_exit_after_a_look_at_the_free_space_is_blamed_on_it() {
    let mut run = Run::new();
    run.exec(300, &["/usr/bin/python3", "serve.py"]);
    run.statfs(300, "python3", 64 << 20, 60 << 20);
    run.exit(300, "python3", 1);
    let d = run.of(300);
    assert_eq!(d.cause, Cause::ShmFull);
    assert!(d.recommendation.is_none(), "{d:#?}");
    assert!(
        d.explanation
            .as_deref()
            .is_some_and(|e| e.contains("shmtrace size")),
        "{d:#?}"
    );
    assert_eq!(
        d.failures[0].headline(),
        "exited with status 1 with no call failing, after looking at /dev/shm's free space: \
         pid 300 saw 60.0 MiB free of 64.0 MiB on /dev/shm"
    );

    let mut healthy = Run::new();
    healthy.exec(300, &["/usr/bin/python3", "serve.py"]);
    healthy.statfs(300, "python3", 64 << 20, 60 << 20);
    healthy.exit(300, "python3", 0);
    assert!(healthy.out.is_empty(), "{:#?}", healthy.out);
}

/// Ray's raylet told to keep a 200 MiB store in /tmp after the driver saw 64 MiB free: the
/// size is Ray's rule (the store at most 90% of the free space) plus what was used when the
/// driver looked. A raylet whose store fits in what was seen gets nothing.
#[test]
fn a_ray_store_kept_out_of_dev_shm_gets_the_size_of_rays_rule() {
    // The driver looks at a /dev/shm with 6 MiB used.
    let raylet = |directory: &str, free: u64| {
        let mut run = Run::new();
        run.exec(400, &["/usr/bin/python3", "driver.py"]);
        run.statfs(400, "python3", free + (6 << 20), free);
        run.fork(400, 401);
        run.exec(
            401,
            &[
                "/venv/ray/core/src/ray/raylet/raylet",
                "--object_store_memory=209715200",
                &format!("--plasma_directory={directory}"),
            ],
        );
        run.event(
            401,
            "raylet",
            Body::Exit(
                ExitStatus::Signal {
                    signo: libc::SIGTERM,
                    core_dumped: false,
                }
                .into(),
            ),
        );
        run
    };
    let fell_back = raylet("/tmp/ray", 64 << 20);
    let d = fell_back.of(401);
    let recommendation = d.recommendation.as_ref().expect("a size");
    // 200 MiB / 0.9 + the 6 MiB used, + 20% headroom, rounded up to whole MiB.
    let need = (200u64 << 20) * 100 / 90 + 1 + (6 << 20);
    assert_eq!(recommendation.min_bytes, with_headroom(need));
    assert!(
        d.failures[0].headline().starts_with(
            "Ray's 200.0 MiB object store went to /tmp/ray instead of /dev/shm (slower): pid 400 \
             saw 64.0 MiB free"
        ),
        "{d:#?}"
    );

    // Kept in /dev/shm with room for Ray's rule: nothing; with less, the raylet shrank it.
    let kept = raylet("/dev/shm", 223 << 20);
    assert!(kept.out.is_empty(), "{:#?}", kept.out);
    let shrunk = raylet("/dev/shm", 222 << 20);
    assert!(
        shrunk.of(401).failures[0]
            .headline()
            .starts_with("Ray's raylet shrank its 200.0 MiB object store"),
        "{:#?}",
        shrunk.out
    );
}

/// A store the user put in /tmp (`_plasma_directory`) while /dev/shm had room for it: not
/// /dev/shm's doing, so no diagnosis.
#[test]
fn a_ray_store_put_elsewhere_by_choice_is_not_blamed_on_dev_shm() {
    let mut run = Run::new();
    run.exec(400, &["/usr/bin/python3", "driver.py"]);
    run.statfs(400, "python3", 1 << 30, 1 << 30);
    run.fork(400, 401);
    run.exec(
        401,
        &[
            "/venv/ray/core/src/ray/raylet/raylet",
            "--object_store_memory=209715200",
            "--plasma_directory=/tmp",
        ],
    );
    run.exit(401, "raylet", 0);
    assert!(run.out.is_empty(), "{:#?}", run.out);
}

impl Run {
    /// A System V `shmget(key, size, flags)` returning `ret`.
    fn shmget(&mut self, pid: u32, size: u64, flags: u64, ret: i64) {
        let call = Call {
            syscall: Syscall::Shmget,
            fd: None,
            ret,
            args: [0x1234, size, flags, 0, 0, 0],
            file: None,
            path: None,
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        };
        self.event(pid, "mpi_rank", Body::Call(call));
    }

    /// A System V `shmctl(id, cmd, NULL)` returning `ret`.
    fn shmctl(&mut self, pid: u32, cmd: u64, ret: i64) {
        let call = Call {
            syscall: Syscall::Shmctl,
            fd: None,
            ret,
            args: [0, cmd, 0, 0, 0, 0],
            file: None,
            path: None,
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        };
        self.event(pid, "mpi_rank", Body::Call(call));
    }

    /// `openat(path, O_RDWR)` of a name, returning `fd` or `-errno`.
    fn open_existing(&mut self, pid: u32, comm: &str, path: &str, fd: i64, inode: InodeId) {
        let call = Call {
            syscall: Syscall::Openat,
            fd: (fd >= 0).then_some(fd as i32),
            ret: fd,
            args: [libc::AT_FDCWD as u64, 0, libc::O_RDWR as u64, 0, 0, 0],
            file: (fd >= 0).then_some(FileRef {
                inode,
                mode: libc::S_IFREG | 0o600,
                size: 0,
                allocated: 0,
            }),
            path: Some(path.to_owned()),
            path_truncated: false,
            relative_to_shm: false,
            dir_ino: None,
        };
        self.event(pid, comm, Body::Call(call));
    }

    fn unlink(&mut self, pid: u32, comm: &str, path: &str) {
        self.event(pid, comm, Body::Call(Call::unlink(path)));
    }

    /// `kill(target, signo)` from `sender`.
    fn kill(&mut self, sender: u32, target: u32, signo: i32) {
        let signal = crate::event::Signal {
            signo,
            code: 0,
            errno: 0,
            result: 0,
            addr: 0,
            target_pid: target,
            target_tid: target,
            target_comm: "python3".to_owned(),
            target_maps_shm: false,
        };
        self.event(sender, "sh", Body::Signal(signal));
    }
}

#[test]
fn a_refused_huge_page_request_followed_by_its_fallback_is_a_probe() {
    const SHM_HUGETLB: u64 = libc::SHM_HUGETLB as u64;
    let create = (libc::IPC_CREAT | 0o600) as u64;
    let mut run = Run::new();
    run.exec(300, &["/usr/bin/rank"]);
    // Huge pages refused, then the same segment with ordinary pages at once: a probe.
    run.shmget(300, 8 << 20, create | SHM_HUGETLB, -(libc::ENOMEM as i64));
    run.shmget(300, 8 << 20, create, 7);
    run.exit(300, "mpi_rank", 1);
    assert!(
        run.out
            .iter()
            .all(|d| d.pid != 300 || d.cause != Cause::SysvLimit),
        "{:#?}",
        run.out
    );
    assert!(
        run.out.iter().all(|d| d.failures.is_empty()),
        "{:#?}",
        run.out
    );
    // UCX asks for the System V limits between its huge and its ordinary request, and a
    // loaded machine may take its time: still a probe, and a rank that then ends well has no
    // diagnosis.
    run.exec(303, &["/usr/bin/python3", "mpi_ring.py"]);
    run.shmget(303, 6 << 20, create | SHM_HUGETLB, -(libc::ENOMEM as i64));
    run.ts += 2 * super::fallback::FALLBACK_NS;
    run.shmctl(303, libc::IPC_INFO as u64, 7);
    run.shmget(303, 4 << 20, create, 8);
    run.exit(303, "python3", 0);
    assert!(run.out.iter().all(|d| d.pid != 303), "{:#?}", run.out);
    // Nor is one ended by its launcher diagnosed for its probe.
    run.exec(304, &["/usr/bin/python3", "mpi_ring.py"]);
    run.shmget(304, 6 << 20, create | SHM_HUGETLB, -(libc::ENOMEM as i64));
    run.shmctl(304, libc::IPC_INFO as u64, 7);
    run.shmget(304, 4 << 20, create, 9);
    run.kill(1, 304, libc::SIGTERM);
    run.killed(304, "python3", libc::SIGTERM);
    assert!(run.out.iter().all(|d| d.pid != 304), "{:#?}", run.out);
    // With no fallback, the pool of huge pages is the cause, never kernel.shmmax.
    run.exec(301, &["/usr/bin/rank"]);
    run.shmget(301, 8 << 20, create | SHM_HUGETLB, -(libc::ENOMEM as i64));
    run.exit(301, "mpi_rank", 1);
    let d = run.of(301);
    assert_eq!(d.cause, Cause::HugePages, "{d:#?}");
    assert!(
        d.explanation
            .as_deref()
            .unwrap()
            .contains("vm.nr_hugepages"),
        "{d:#?}"
    );
    // A failure the thread did not recover from at once stays one.
    run.exec(302, &["/usr/bin/rank"]);
    run.shmget(302, 8 << 20, create, -(libc::EINVAL as i64));
    run.exit(302, "mpi_rank", 1);
    assert_eq!(run.of(302).cause, Cause::SysvLimit);
}

#[test]
fn an_open_of_a_name_another_process_removed_while_held_names_the_removal() {
    let mut run = Run::new();
    run.exec(400, &["/usr/bin/python3", "owner.py"]);
    let inode = run.create(400, "python3", "/dev/shm/job_buf", 3);
    run.exec(401, &["/bin/rm", "/dev/shm/job_buf"]);
    run.unlink(401, "rm", "/dev/shm/job_buf");
    run.exit(401, "rm", 0);
    run.exec(402, &["/usr/bin/python3", "reader.py"]);
    run.open_existing(
        402,
        "python3",
        "/dev/shm/job_buf",
        -(libc::ENOENT as i64),
        inode,
    );
    run.exit(402, "python3", 1);
    let d = run.of(402);
    assert_eq!(d.cause, Cause::NameRemoved, "{d:#?}");
    let removed = d.removed.as_ref().expect("the removal");
    assert_eq!(removed.by_pid, 401);
    assert_eq!(removed.by_comm, "rm");
    assert_eq!(removed.by_argv, ["/bin/rm", "/dev/shm/job_buf"]);
    assert_eq!(removed.holders[0].pid, 400);
    assert!(removed.ns_before > 0);
    let text = d.explanation.as_deref().unwrap();
    assert!(
        text.contains("removed") && text.contains("pid 401 rm"),
        "{text}"
    );
    // A name that never existed is an existence check still.
    run.exec(403, &["/usr/bin/python3", "reader.py"]);
    run.open_existing(
        403,
        "python3",
        "/dev/shm/never",
        -(libc::ENOENT as i64),
        inode,
    );
    run.exit(403, "python3", 1);
    assert!(
        run.out
            .iter()
            .all(|d| d.pid != 403 || d.failures.is_empty())
    );
    // Nor does its maker removing it make an open of it fail.
    run.exec(404, &["/usr/bin/python3", "self.py"]);
    let own = run.create(404, "python3", "/dev/shm/own", 4);
    run.unlink(404, "python3", "/dev/shm/own");
    run.exec(405, &["/usr/bin/python3", "reader.py"]);
    run.open_existing(405, "python3", "/dev/shm/own", -(libc::ENOENT as i64), own);
    run.exit(405, "python3", 1);
    assert!(
        run.out
            .iter()
            .all(|d| d.pid != 405 || d.failures.is_empty())
    );
}

#[test]
fn a_look_at_the_free_space_is_no_decision_when_a_signal_ends_it() {
    let mut run = Run::new();
    run.exec(500, &["/usr/bin/python3", "serve.py"]);
    run.statfs(500, "python3", 64 << 20, 64 << 20);
    // Ctrl-C or docker stop, then it exits 130 on its own handler.
    run.kill(1, 500, libc::SIGINT);
    run.exit(500, "python3", 130);
    assert!(run.out.iter().all(|d| d.pid != 500), "{:#?}", run.out);
    // As the probes see it: no record of a SIGINT or SIGTERM that a handler caught, only the
    // status the handler exits with, 128 + the signal's number.
    for (pid, status) in [(504, 130), (505, 143), (506, 129)] {
        run.exec(pid, &["/usr/bin/python3", "serve.py"]);
        run.statfs(pid, "python3", 64 << 20, 64 << 20);
        run.exit(pid, "python3", status);
        assert!(run.out.iter().all(|d| d.pid != pid), "{:#?}", run.out);
    }
    // Roomy: what it saw is no reason to quit.
    run.exec(501, &["/usr/bin/python3", "serve.py"]);
    run.statfs(501, "python3", 16 << 30, 15 << 30);
    run.exit(501, "python3", 1);
    assert!(run.out.iter().all(|d| d.pid != 501), "{:#?}", run.out);
    // It looked, then made its file there anyway (Open MPI before each segment): the look
    // stopped nothing, and an exit 1 after is for another reason.
    run.exec(503, &["/usr/bin/python3", "rank.py"]);
    run.statfs(503, "python3", 64 << 20, 64 << 20);
    run.create(503, "python3", "/dev/shm/vader_segment.1", 5);
    run.statfs(503, "python3", 64 << 20, 60 << 20);
    run.exit(503, "python3", 1);
    assert!(
        run.out
            .iter()
            .all(|d| d.pid != 503 || d.cause != Cause::ShmFull),
        "{:#?}",
        run.out
    );
    // Small, and it quit on its own: that is what it decided from.
    run.exec(502, &["/usr/bin/python3", "serve.py"]);
    run.statfs(502, "python3", 64 << 20, 64 << 20);
    run.exit(502, "python3", 1);
    assert_eq!(run.of(502).cause, Cause::ShmFull);
}

/// Writers growing files by write(), started together by one shell: the first has finished
/// before the last began (a loaded machine), while the one between still ran. Its file is the
/// job's, not a leftover of an earlier run. Run one after the other, it is.
#[test]
fn a_file_of_a_finished_writer_of_the_same_burst_is_not_a_leftover() {
    const BLOCK: u64 = 128 << 10;
    // The first writer fills 512 KiB and ends; the last then fails its second block; with
    // `between`, another writer started before the first ended still runs.
    let last_writer = |between: bool| {
        let mut run = Run::new();
        run.exec(10, &["/bin/sh", "-c", "writers"]);
        run.fork(10, 11);
        if between {
            run.fork(10, 12);
        }
        let first = run.create(11, "dd", "/dev/shm/part1", 3);
        for _ in 0..4 {
            run.write(11, "dd", 3, first, BLOCK, BLOCK as i64);
        }
        run.exit(11, "dd", 0);
        run.fork(10, 13);
        let last = run.create(13, "dd", "/dev/shm/part3", 3);
        run.write(13, "dd", 3, last, BLOCK, BLOCK as i64);
        run.write(13, "dd", 3, last, BLOCK, -(libc::ENOSPC as i64));
        run.exit(13, "dd", 1);
        run.of(13).cause
    };
    assert_ne!(last_writer(true), Cause::Leftovers);
    assert_eq!(last_writer(false), Cause::Leftovers);
}

/// CI, stop 40: of two NCCL ranks that both failed, the launcher stopped the second before it
/// could exit. Its diagnosis named its own failure and a killed ending, and the table counted
/// no death for it.
#[test]
fn a_process_that_failed_and_was_then_stopped_by_its_launcher_counts_as_a_death() {
    let mut run = Run::measured(1 << 20);
    run.exec(600, &["/usr/bin/mpirun", "-n", "2", "rank"]);
    run.fork(600, 601);
    run.exec(601, &["/usr/bin/rank"]);
    let inode = run.create(601, "rank", "/dev/shm/nccl-abcdef", 5);
    run.fallocate_fails(601, "rank", 5, inode, 2 << 20);
    run.kill(600, 601, libc::SIGTERM);
    run.killed(601, "rank", libc::SIGTERM);
    assert_eq!(run.of(601).failures.len(), 1, "{:#?}", run.out);
    let table = run.diagnoser.table(&run.world);
    let deaths: u64 = table.iter().map(|(_, _, stats)| stats.deaths).sum();
    assert_eq!(deaths, 1, "{table:#?}");
}

/// Seen under load in the Open MPI UCX recipe: a rank looked, made its first segment, looked
/// again, found no room for the next and exited 1 with no call failing. Its going ahead after
/// the first look hid the second.
#[test]
fn a_look_after_going_ahead_can_still_be_why_a_process_quit() {
    const MIB: u64 = 1 << 20;
    let mut run = Run::new();
    run.exec(700, &["/usr/bin/python3", "mpi_ring.py"]);
    run.statfs(700, "python3", 8 * MIB, 8 * MIB);
    run.create(700, "python3", "/dev/shm/vader_segment.0", 17);
    run.statfs(700, "python3", 8 * MIB, 0);
    run.exit(700, "python3", 1);
    assert_eq!(run.of(700).cause, Cause::ShmFull, "{:#?}", run.out);
}

/// Also under load: a rank refused huge pages was stopped by its launcher before it could
/// take ordinary ones. It never showed it needed huge pages; a sibling's failure stopped it.
#[test]
fn a_huge_page_request_cut_short_by_a_launcher_is_no_cause() {
    const SHM_HUGETLB: u64 = libc::SHM_HUGETLB as u64;
    let create = (libc::IPC_CREAT | 0o600) as u64;
    let mut run = Run::new();
    run.exec(710, &["/usr/bin/mpirun", "-np", "2", "rank"]);
    run.fork(710, 711);
    run.exec(711, &["/usr/bin/python3", "mpi_ring.py"]);
    run.shmget(711, 6 << 20, create | SHM_HUGETLB, -(libc::ENOMEM as i64));
    run.kill(710, 711, libc::SIGTERM);
    run.killed(711, "python3", libc::SIGTERM);
    assert!(run.out.iter().all(|d| d.pid != 711), "{:#?}", run.out);
}

/// Issue 37, the hour-long container soak: beside another churn of containers, 35 busybox `dd`
/// runs that filled their /dev/shm were diagnosed "no /dev/shm failure was seen". Right after
/// its refused write, dd reports it on its stderr, `2>/dev/null`: a device node on the
/// container's /dev, a tmpfs whose device number a /dev/shm of the churn had had moments
/// before (the probes keep such a number up to two sweeps). That successful write of the same
/// thread was taken for a fallback from the refused one. A device node holds no /dev/shm
/// memory: a call on it is no /dev/shm call.
#[test]
fn a_write_to_a_device_node_is_no_fallback_from_a_refused_write() {
    let mut run = Run::new();
    run.exec(
        800,
        &[
            "/bin/dd",
            "if=/dev/zero",
            "of=/dev/shm/fill",
            "bs=64k",
            "count=32",
        ],
    );
    let fill = run.create(800, "dd", "/dev/shm/fill", 1);
    for _ in 0..16 {
        run.write(800, "dd", 1, fill, 64 << 10, 64 << 10);
    }
    run.write(800, "dd", 1, fill, 64 << 10, -(libc::ENOSPC as i64));
    // `dd: /dev/shm/fill: No space left on device` to /dev/null, at once.
    let message = 44;
    let null = Call {
        syscall: Syscall::Write,
        fd: Some(2),
        ret: message,
        args: [2, 0, message as u64, 0, 0, 0],
        file: Some(FileRef {
            inode: InodeId {
                dev: DEV + 1,
                ino: 6,
            },
            mode: libc::S_IFCHR | 0o666,
            size: 0,
            allocated: 0,
        }),
        path: None,
        path_truncated: false,
        relative_to_shm: false,
        dir_ino: None,
    };
    run.event(800, "dd", Body::Call(null));
    // Nor is /dev/null taken for a /dev/shm object that dd holds.
    let null = InodeId {
        dev: DEV + 1,
        ino: 6,
    };
    assert!(run.world.object(&null).is_none());
    run.exit(800, "dd", 1);

    let dd = run.of(800);
    assert_eq!(dd.cause, Cause::ShmFull, "{dd:#?}");
    assert_eq!(dd.failures.len(), 1, "{dd:#?}");
}
