//! A long stream of raw records, as the probes send them, through a bounded pipeline: what the
//! analysis holds stays under its caps, and no failure goes undiagnosed.
use std::{cell::Cell, rc::Rc};

use shmtrace_common::{
    EventKind, ExitEvent, FileRef, ForkEvent, Header, PATH_LEN, PathEvent, Syscall, SyscallEvent,
    flags,
};

use super::*;
use crate::{
    clock::Clock,
    diagnose::Roles,
    model::{Annotation, Retention},
    output::Format,
};

const NS: u32 = 4026532177;
const SHM: u32 = 47;
const MS: u64 = 1_000_000;

fn bytes_of<T: zerocopy::IntoBytes + zerocopy::Immutable>(value: &T) -> Bytes {
    Bytes::copy_from_slice(value.as_bytes())
}

fn header(kind: EventKind, flags: u16, pid: u32, ts_ns: u64) -> Header {
    let mut comm = [0u8; 16];
    comm[..6].copy_from_slice(b"worker");
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
            dev: SHM,
            mode: libc::S_IFREG | 0o600,
            ino: u64::from(pid),
            size: 0,
            blocks: 0,
        },
        ..SyscallEvent::default()
    }
}

/// The records of a child of pid 1 that creates `/dev/shm/obj-PID`, asks it for 1 MiB (and is
/// refused when `fails`), and exits with status 1 (or 0), leaving the file behind.
fn short_life(pid: u32, ts: u64, fails: bool) -> Vec<Bytes> {
    let fork = ForkEvent {
        header: header(EventKind::Fork, 0, 1, ts),
        child_pid: pid,
        _pad: 0,
    };
    let name = format!("/dev/shm/obj-{pid}");
    let mut path = [0u8; PATH_LEN];
    path[..name.len()].copy_from_slice(name.as_bytes());
    let create = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
    let open = PathEvent {
        call: SyscallEvent {
            header: header(EventKind::Path, flags::FILE, pid, ts + 1),
            ..call(Syscall::Openat, pid, ts + 1, 3, [0, 0, create, 0o600, 0, 0])
        },
        path,
    };
    let ret = if fails { -(libc::ENOSPC as i64) } else { 0 };
    let fallocate = call(
        Syscall::Fallocate,
        pid,
        ts + 2,
        ret,
        [3, 0, 0, 1 << 20, 0, 0],
    );
    let exit = ExitEvent {
        header: header(EventKind::Exit, 0, pid, ts + 3),
        exit_code: i32::from(fails) << 8,
        _pad: 0,
    };
    vec![
        bytes_of(&fork),
        bytes_of(&open),
        bytes_of(&fallocate),
        bytes_of(&exit),
    ]
}

/// Counts the diagnoses the pipeline makes, whatever it keeps.
struct Count(Rc<Cell<usize>>);

impl Observer for Count {
    fn event(&mut self, _: &Event, _: &Annotation, _: &Role, _: &str, _: &World) {}
    fn seeded(&mut self, _: u32, _: u64, _: &World) {}
    fn capacity(&mut self, _: &Capacity) {}
    fn container(&mut self, _: &ContainerInfo) {}
    fn diagnosis(&mut self, _: &Diagnosis) {
        self.0.set(self.0.get() + 1);
    }
    fn finish(self: Box<Self>, _: &World, _: &Roles, _: u64, _: u64) -> Result<Option<String>> {
        Ok(None)
    }
}

fn pipeline(world: World, diagnosed: &Rc<Cell<usize>>) -> Pipeline {
    Pipeline::new(
        world,
        Diagnoser::new(4026531841),
        Output::new(
            Box::new(std::io::sink()),
            Format::Json,
            Clock::with_offset(0, jiff::tz::TimeZone::UTC),
            false,
        ),
        Filter::default(),
    )
    .with_observer(Box::new(Count(diagnosed.clone())))
}

const MAX_PROCESSES: usize = 500;
const MAX_OBJECTS: usize = 300;
const MAX_DIAGNOSES: usize = 50;

/// A pipeline bounded as the daemon's is, with the caps above and a one-second linger.
fn bounded_pipeline(diagnosed: &Rc<Cell<usize>>) -> Pipeline {
    let world = World::new().with_retention(Retention {
        linger_ns: 1000 * MS,
        quiet_linger_ns: 1000 * MS,
        max_processes: MAX_PROCESSES,
        max_objects: MAX_OBJECTS,
    });
    pipeline(world, diagnosed).bounded(MAX_DIAGNOSES)
}

#[test]
fn a_bounded_pipeline_holds_what_its_caps_allow_over_a_long_stream() {
    let diagnosed = Rc::new(Cell::new(0));
    let mut pipeline = bounded_pipeline(&diagnosed);
    let mut largest = State::default();
    let mut ts = MS;
    let mut failing = 0;
    for n in 0..20_000u32 {
        let fails = n % 10 == 0;
        failing += usize::from(fails);
        for record in short_life(2 + n, ts, fails) {
            pipeline.kernel_record(&record, &mut Recorded).unwrap();
        }
        // A hundred processes a second, pruned every second as the daemon does.
        ts += 10 * MS;
        if n % 100 == 99 {
            pipeline.prune(ts).unwrap();
            let state = pipeline.state();
            largest.processes = largest.processes.max(state.processes);
            largest.objects = largest.objects.max(state.objects);
            largest.diagnoses = largest.diagnoses.max(state.diagnoses);
            largest.roles = largest.roles.max(state.roles);
            largest.summary_diagnoses = largest.summary_diagnoses.max(state.summary_diagnoses);
        }
    }
    let state = pipeline.state();
    assert!(largest.processes <= MAX_PROCESSES + 100, "{largest:?}");
    assert!(largest.objects <= MAX_OBJECTS + 100, "{largest:?}");
    // Diagnoses are remembered only while their processes are.
    assert!(largest.diagnoses <= largest.processes, "{largest:?}");
    assert!(largest.roles <= largest.processes, "{largest:?}");
    assert_eq!(largest.summary_diagnoses, MAX_DIAGNOSES, "{largest:?}");
    // Every failing process was diagnosed; the summary's list dropped the oldest, counted.
    assert_eq!(diagnosed.get(), failing);
    assert_eq!(
        state.evicted.summary_diagnoses,
        (failing - MAX_DIAGNOSES) as u64,
        "{state:?}"
    );
    // Each process left its file: beyond the cap on objects, they were dropped and counted.
    assert!(
        state.evicted.objects >= (20_000 - MAX_OBJECTS - 100) as u64,
        "{state:?}"
    );
    // Processes end in time here: the cap on processes had nothing to drop.
    assert_eq!(state.evicted.processes, 0, "{state:?}");
}

#[test]
fn an_unbounded_pipeline_keeps_every_process_and_diagnosis() {
    let diagnosed = Rc::new(Cell::new(0));
    let mut pipeline = pipeline(World::new(), &diagnosed);
    let mut ts = MS;
    for n in 0..1_000u32 {
        for record in short_life(2 + n, ts, n % 10 == 0) {
            pipeline.kernel_record(&record, &mut Recorded).unwrap();
        }
        ts += 10 * MS;
        pipeline.prune(ts).unwrap();
    }
    let state = pipeline.state();
    assert_eq!(state.processes, 1_001, "{state:?}");
    assert_eq!(state.objects, 1_000, "{state:?}");
    assert_eq!(pipeline.diagnoses().len(), 100);
    assert_eq!(state.evicted, Evicted::default());
}

#[test]
fn processes_whose_exit_records_were_lost_are_forgotten_once_found_gone() {
    let diagnosed = Rc::new(Cell::new(0));
    let mut pipeline = bounded_pipeline(&diagnosed);
    // Ten processes that hold a descriptor and whose exits never came, five of them failing.
    let mut ts = MS;
    for n in 0..10u32 {
        let records = short_life(2 + n, ts, n % 2 == 0);
        for record in &records[..3] {
            pipeline.kernel_record(record, &mut Recorded).unwrap();
        }
        ts += 10 * MS;
    }
    // Pruning alone keeps them: they hold their files, as far as the model knows.
    pipeline.prune(ts + 10_000 * MS).unwrap();
    let live: Vec<u32> = pipeline
        .live_processes()
        .into_iter()
        .map(|(pid, _, _)| pid)
        .filter(|pid| *pid != 1)
        .collect();
    assert_eq!(live.len(), 10, "{live:?}");
    let before = pipeline.state().processes;

    pipeline.forget_vanished(&live).unwrap();
    let state = pipeline.state();
    assert_eq!(state.processes, before - 10, "{state:?}");
    assert_eq!(state.evicted.vanished, 10, "{state:?}");
    // The failures in them were diagnosed before they went.
    assert_eq!(diagnosed.get(), 5);
}
