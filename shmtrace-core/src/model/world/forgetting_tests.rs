//! Forgetting, fed decoded events built in code as the probes would send them.
use super::*;
use crate::{
    event::{Body, ExitStatus, Syscall},
    model::world::test_events::{DEV, MNTNS, SECOND, call, event},
};

/// A child of pid 1 that creates `/dev/shm/obj-N`, then removes it (unless `leave`), and
/// exits: the events of its whole life, starting at `ts`.
fn short_life(world: &mut World, ts: u64, pid: u32, leave: bool) {
    let path = format!("/dev/shm/obj-{pid}");
    let create = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
    world.apply(&event(ts, 1, Body::Fork { child_pid: pid }));
    world.apply(&event(
        ts + 1,
        pid,
        call(
            Syscall::Openat,
            u64::from(pid),
            Some(&path),
            [0, 0, create, 0o600, 0, 0],
        ),
    ));
    if !leave {
        world.apply(&event(
            ts + 2,
            pid,
            call(Syscall::Unlink, u64::from(pid), Some(&path), [0; 6]),
        ));
    }
    world.apply(&event(
        ts + 3,
        pid,
        call(Syscall::Close, u64::from(pid), None, [3, 0, 0, 0, 0, 0]),
    ));
    world.apply(&event(ts + 4, pid, Body::Exit(ExitStatus::Code(0).into())));
}

fn retention(max_processes: usize, max_objects: usize) -> Retention {
    Retention {
        linger_ns: 10 * SECOND,
        quiet_linger_ns: 10 * SECOND,
        max_processes,
        max_objects,
    }
}

#[test]
fn without_retention_the_model_keeps_every_process() {
    let mut world = World::new();
    for pid in 2..1002 {
        short_life(&mut world, u64::from(pid) * SECOND, pid, false);
    }
    assert!(world.due_to_forget(u64::MAX, |_| false).is_empty());
    world.forget(&[2, 3]);
    assert_eq!(world.process_count(), 1001);
    assert_eq!(world.evictions(), Evictions::default());
}

#[test]
fn an_exited_process_is_kept_for_the_linger_then_forgotten() {
    let mut world = World::new().with_retention(retention(1000, 1000));
    short_life(&mut world, SECOND, 2, false);
    // The parent, silent since, is kept by the caller here.
    let parent = |pid| pid == 1;
    assert!(world.due_to_forget(5 * SECOND, parent).is_empty());
    // Kept while the caller still needs it (a failure not yet diagnosed).
    assert!(world.due_to_forget(20 * SECOND, |pid| pid <= 2).is_empty());
    assert_eq!(world.due_to_forget(21 * SECOND, parent), vec![2]);
    world.forget(&[2]);
    assert!(!world.knows(2));
    assert!(world.knows(1), "the parent is alive");
    assert_eq!(world.evictions(), Evictions::default());
}

#[test]
fn the_creator_of_a_file_left_in_dev_shm_is_kept_while_the_file_is_there() {
    let mut world = World::new().with_retention(retention(1000, 1000));
    short_life(&mut world, SECOND, 2, true);
    let parent = |pid| pid == 1;
    assert!(world.due_to_forget(60 * SECOND, parent).is_empty());
    assert!(world.knows(2), "a leftover's diagnosis names who made it");
    // Removed by someone else: the creator no longer matters.
    let path = "/dev/shm/obj-2";
    world.apply(&event(
        61 * SECOND,
        1,
        call(Syscall::Unlink, 2, Some(path), [0; 6]),
    ));
    assert_eq!(world.due_to_forget(62 * SECOND, parent), vec![2]);
}

/// A node's weeks in small: 100,000 short-lived processes, a hundred a second, one in ten
/// leaving a file in /dev/shm that is never removed, exit records lost for one in fifty. What
/// is kept stays under the caps, and everything the caps dropped is counted.
#[test]
fn a_long_stream_of_short_lived_processes_stays_under_the_caps() {
    const MAX_PROCESSES: usize = 2000;
    const MAX_OBJECTS: usize = 1000;
    let mut world = World::new().with_retention(retention(MAX_PROCESSES, MAX_OBJECTS));
    let mut ts = SECOND;
    let mut largest = (0, 0);
    for n in 0..100_000u32 {
        let pid = 2 + n % 4_000_000;
        if n % 50 == 0 {
            // Its exit record was lost: it looks alive forever, holding its file open.
            let path = format!("/dev/shm/held-{pid}");
            let create = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
            world.apply(&event(ts, 1, Body::Fork { child_pid: pid }));
            world.apply(&event(
                ts + 1,
                pid,
                call(
                    Syscall::Openat,
                    u64::from(pid),
                    Some(&path),
                    [0, 0, create, 0o600, 0, 0],
                ),
            ));
        } else {
            short_life(&mut world, ts, pid, n % 10 == 0);
        }
        ts += SECOND / 100;
        if n % 100 == 0 {
            let due = world.due_to_forget(ts, |_| false);
            world.forget(&due);
            largest.0 = largest.0.max(world.process_count());
            largest.1 = largest.1.max(world.object_count());
        }
    }
    // Between two calls, a second of processes (a hundred) comes on top.
    assert!(largest.0 <= MAX_PROCESSES + 100, "{largest:?}");
    assert!(largest.1 <= MAX_OBJECTS + 100, "{largest:?}");
    let evictions = world.evictions();
    // The lost exits, and the leftovers beyond the cap, were dropped and counted.
    assert!(evictions.processes > 0, "{evictions:?}");
    assert!(
        evictions.objects >= (9_000 - MAX_OBJECTS - 100) as u64,
        "{evictions:?}"
    );
    // Those the cap dropped are the silent ones: the processes that exited within the
    // linger are all still there, for the diagnoses that may come after them.
    let recent = (ts - 10 * SECOND) / (SECOND / 100);
    for n in (recent as u32 + 1..100_000).filter(|n| n % 10 != 0) {
        assert!(world.knows(2 + n), "pid {} exited within the linger", 2 + n);
    }
    assert!(world.knows(1), "the long-lived parent stays");
    // What is still counted as held on the file system is what the kept objects hold.
    let held: u64 = world.live_objects().map(|o| o.allocated).sum();
    assert_eq!(world.usage(DEV).unwrap().allocated, held);
    assert_eq!(world.totals().processes_seen, 100_001);
}

#[test]
fn a_live_process_that_holds_nothing_and_stays_silent_is_forgotten_unless_a_parent() {
    let mut world = World::new().with_retention(retention(1000, 1000));
    // Pid 1 forks 2 and 3; 3 opens an object and keeps it; 2 does nothing more; their exits
    // are never seen.
    world.apply(&event(SECOND, 1, Body::Fork { child_pid: 2 }));
    world.apply(&event(SECOND, 1, Body::Fork { child_pid: 3 }));
    let create = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
    world.apply(&event(
        SECOND,
        3,
        call(
            Syscall::Openat,
            3,
            Some("/dev/shm/kept"),
            [0, 0, create, 0o600, 0, 0],
        ),
    ));
    assert!(world.due_to_forget(5 * SECOND, |_| false).is_empty());
    // Silent for the linger: 2 goes; 3 holds a file, 1 is 3's parent.
    assert_eq!(world.due_to_forget(12 * SECOND, |_| false), vec![2]);
}

#[test]
fn a_namespace_retired_before_a_time_keeps_what_came_after() {
    let mut world = World::new();
    // One container leaves /dev/shm/obj-2; another, with the same namespace number, makes
    // /dev/shm/obj-3 after it started at 50 s.
    short_life(&mut world, SECOND, 2, true);
    short_life(&mut world, 60 * SECOND, 3, true);
    assert_eq!(world.retire_namespace(MNTNS, Some(DEV + 1), 50 * SECOND), 1);
    let left: Vec<_> = world
        .live_objects()
        .filter_map(|o| o.path.as_deref().map(str::to_owned))
        .collect();
    assert_eq!(left, vec!["/dev/shm/obj-3".to_owned()]);
    // Files on the shared /dev/shm outlive any container.
    assert_eq!(world.retire_namespace(MNTNS, Some(DEV), u64::MAX), 0);
}

/// A sandbox's /dev/shm goes with its namespace, unless a live process elsewhere still holds
/// one of its files: that keeps the file system, and its device number, alive.
#[test]
fn a_namespace_retired_keeps_what_a_live_process_elsewhere_holds() {
    let mut world = World::new();
    short_life(&mut world, SECOND, 2, true);
    // Pid 3 opens /dev/shm/obj-3, keeps it open, and moves to another namespace (`setns`).
    let create = (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64;
    world.apply(&event(
        2 * SECOND,
        3,
        call(
            Syscall::Openat,
            3,
            Some("/dev/shm/obj-3"),
            [0, 0, create, 0o600, 0, 0],
        ),
    ));
    let mut moved = event(
        3 * SECOND,
        3,
        Body::Rename {
            pid: 3,
            tid: 3,
            comm: "elsewhere".to_owned(),
        },
    );
    moved.mntns = MNTNS + 1;
    world.apply(&moved);
    assert_eq!(world.retire_namespace(MNTNS, Some(DEV + 1), u64::MAX), 1);
    let left: Vec<_> = world
        .live_objects()
        .filter_map(|o| o.path.as_deref().map(str::to_owned))
        .collect();
    assert_eq!(left, vec!["/dev/shm/obj-3".to_owned()]);
    // Once it lets go, the file goes with its namespace.
    world.apply(&event(
        4 * SECOND,
        3,
        Body::Exit(ExitStatus::Code(0).into()),
    ));
    assert_eq!(world.retire_namespace(MNTNS, Some(DEV + 1), u64::MAX), 1);
    assert_eq!(world.live_objects().count(), 0);
}

#[test]
fn a_directory_is_no_object() {
    let mut world = World::new();
    // `ls /dev/shm` closes its descriptor of the directory: no path, the mode says what it is.
    let mut close = call(Syscall::Close, 1, None, [3, 0, 0, 0, 0, 0]);
    if let Body::Call(call) = &mut close {
        call.file.as_mut().unwrap().mode = libc::S_IFDIR | 0o1777;
    }
    world.apply(&event(SECOND, 2, close));
    assert_eq!(world.object_count(), 0);
}

#[test]
fn a_process_that_ended_quietly_goes_after_the_short_linger_unless_it_still_matters() {
    let mut world = World::new().with_retention(Retention {
        linger_ns: 60 * SECOND,
        quiet_linger_ns: SECOND,
        max_processes: 1000,
        max_objects: 1000,
    });
    // 2 removes its file and exits 0; 3 leaves its file behind; 4 fails its create and
    // exits 1; 5 forks 6, which lives on.
    short_life(&mut world, SECOND, 2, false);
    short_life(&mut world, SECOND, 3, true);
    world.apply(&event(SECOND, 1, Body::Fork { child_pid: 4 }));
    let mut refused = call(Syscall::Openat, 4, Some("/dev/shm/obj-4"), [0; 6]);
    if let Body::Call(call) = &mut refused {
        call.ret = -i64::from(libc::ENOSPC);
        call.file = None;
    }
    world.apply(&event(SECOND + 1, 4, refused));
    world.apply(&event(
        SECOND + 2,
        4,
        Body::Exit(ExitStatus::Code(1).into()),
    ));
    world.apply(&event(SECOND, 1, Body::Fork { child_pid: 5 }));
    world.apply(&event(SECOND + 1, 5, Body::Fork { child_pid: 6 }));
    world.apply(&event(
        SECOND + 2,
        5,
        Body::Exit(ExitStatus::Code(0).into()),
    ));
    // 7 ends quietly too, but the caller still needs it (a diagnosis names it).
    short_life(&mut world, SECOND, 7, false);
    assert!(
        world
            .quietly_ended(SECOND + SECOND / 2, |_| false)
            .is_empty()
    );
    assert_eq!(world.quietly_ended(3 * SECOND, |pid| pid == 7), vec![2]);
    // Asked once: what stayed goes with the full linger, like any other.
    assert!(world.quietly_ended(10 * SECOND, |_| false).is_empty());
    world.forget(&[2]);
    assert!(!world.knows(2));
    let mut due = world.due_to_forget(62 * SECOND, |pid| pid == 1 || pid == 6);
    due.sort();
    assert_eq!(due, vec![4, 5, 7], "3 made a leftover");
    assert_eq!(world.evictions(), Evictions::default());
}

#[test]
fn without_a_shorter_quiet_linger_nothing_is_quiet() {
    let mut world = World::new().with_retention(retention(1000, 1000));
    short_life(&mut world, SECOND, 2, false);
    assert!(world.quietly_ended(60 * SECOND, |_| false).is_empty());
}
