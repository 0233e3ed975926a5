//! Calls applied to the model, fed decoded events built in code as the probes would send them.
use crate::{
    event::{Body, Event, InodeId, Syscall},
    model::world::{
        World,
        test_events::{DEV, MNTNS, SECOND, call, event},
    },
};

/// `pid` opens `/dev/shm/obj-<ino>` on descriptor 3.
fn open(world: &mut World, ts: u64, pid: u32, ino: u64) {
    let path = format!("/dev/shm/obj-{ino}");
    let flags = (libc::O_RDWR | libc::O_CREAT) as u64;
    world.apply(&event(
        ts,
        pid,
        call(
            Syscall::Openat,
            ino,
            Some(&path),
            [0, 0, flags, 0o600, 0, 0],
        ),
    ));
}

fn close(world: &mut World, ts: u64, pid: u32, ino: u64) {
    world.apply(&event(
        ts,
        pid,
        call(Syscall::Close, ino, None, [3, 0, 0, 0, 0, 0]),
    ));
}

fn fds(world: &World, ino: u64) -> u32 {
    world
        .object(&InodeId { dev: DEV, ino })
        .map_or(0, |o| o.fds)
}

/// `close` is reported at its entry with the file its descriptor named then. Another thread can
/// close the descriptor and reuse its number before that record comes: the close then releases
/// what the descriptor holds, not the record's file a second time.
#[test]
fn a_close_releases_what_its_descriptor_holds_when_it_comes() {
    let mut world = World::new();
    world.apply(&event(SECOND, 1, Body::Fork { child_pid: 2 }));
    world.apply(&event(SECOND, 1, Body::Fork { child_pid: 3 }));
    open(&mut world, SECOND + 1, 3, 10);
    open(&mut world, SECOND + 2, 2, 10);
    assert_eq!(fds(&world, 10), 2);
    // In 2, one thread closes descriptor 3 and another opens object 11 on it; then comes the
    // record of a third thread's close of descriptor 3, whose file was read before all that.
    close(&mut world, SECOND + 3, 2, 10);
    open(&mut world, SECOND + 4, 2, 11);
    close(&mut world, SECOND + 5, 2, 10);
    assert_eq!(fds(&world, 10), 1, "3 still holds object 10");
    assert_eq!(fds(&world, 11), 0, "the late close released object 11");
}

/// Namespaces sharing one /dev/shm (a pod, `--ipc=container:`): a name removed from one is
/// gone from the other, and the other's open of it that fails is told who removed it, whether
/// or not the remover's /dev/shm was known when it removed the name. In a private /dev/shm of
/// its own, the same name is another file.
#[test]
fn a_name_removed_from_a_namespace_sharing_the_dev_shm_is_told_to_the_next_open() {
    const OWNER: u32 = MNTNS;
    const SIDECAR: u32 = MNTNS + 1;
    const PRIVATE: u32 = MNTNS + 2;
    let at = |ts: u64, pid: u32, mntns: u32, body: Body| Event {
        mntns,
        ..event(ts, pid, body)
    };
    let unlink = |path: &str| {
        let Body::Call(mut call) = call(Syscall::Unlink, 0, Some(path), [0; 6]) else {
            unreachable!()
        };
        (call.fd, call.file, call.ret) = (None, None, 0);
        Body::Call(call)
    };
    let reopen = |path: &str| {
        let Body::Call(mut call) = call(Syscall::Openat, 0, Some(path), [0; 6]) else {
            unreachable!()
        };
        call.args[2] = libc::O_RDWR as u64;
        (call.fd, call.file, call.ret) = (None, None, -(libc::ENOENT as i64));
        Body::Call(call)
    };
    for remover_dev_known in [true, false] {
        let mut world = World::new();
        open(&mut world, SECOND, 10, 1);
        if remover_dev_known {
            world.learn_shm_dev(SIDECAR, DEV);
        }
        world.learn_shm_dev(PRIVATE, DEV + 1);
        // The same name removed from a private /dev/shm of its own: not the owner's file.
        world.apply(&at(2 * SECOND, 30, PRIVATE, unlink("/dev/shm/obj-1")));
        let note = world.apply(&at(3 * SECOND, 11, OWNER, reopen("/dev/shm/obj-1")));
        assert_eq!(
            note.name_removed, None,
            "removed from a /dev/shm of its own"
        );
        // The sidecar's rm, which opened nothing there.
        world.apply(&at(4 * SECOND, 20, SIDECAR, unlink("/dev/shm/obj-1")));
        let note = world.apply(&at(5 * SECOND, 11, OWNER, reopen("/dev/shm/obj-1")));
        let removal = note.name_removed.unwrap_or_else(|| {
            panic!("the sidecar's removal is not told (its /dev/shm known: {remover_dev_known})")
        });
        assert_eq!(removal.remover, 20);
        assert_eq!(removal.remover_mntns, SIDECAR);
        assert_eq!(removal.holders, vec![(10, "worker".to_owned())]);
        // The owner's name is gone: its file is freed when its holder lets go.
        assert!(!world.object(&InodeId { dev: DEV, ino: 1 }).unwrap().linked);
    }
}

/// GNU fts (`find`, `du`, `rm -r`): the directory opened by its whole path on descriptor 3,
/// moved to 4 by an untraced `fcntl(F_DUPFD_CLOEXEC)`, 3 closed; then names relative to 4.
/// The probes give the directory's inode behind 4, which names it. A directory of which the
/// trace saw no open is not taken for /dev/shm itself, unless it is the file system's root.
#[test]
fn a_name_relative_to_a_moved_directory_descriptor_is_named_by_the_directorys_inode() {
    let mut world = World::new();
    world.apply(&event(SECOND, 1, Body::Fork { child_pid: 2 }));
    let mut opened = call(
        Syscall::Openat,
        77,
        Some("/dev/shm/a/sub"),
        [libc::AT_FDCWD as u64, 0, libc::O_DIRECTORY as u64, 0, 0, 0],
    );
    if let Body::Call(c) = &mut opened
        && let Some(file) = &mut c.file
    {
        file.mode = libc::S_IFDIR | 0o755;
    }
    world.apply(&event(SECOND + 1, 2, opened));
    world.apply(&event(
        SECOND + 2,
        2,
        call(Syscall::Close, 77, None, [3, 0, 0, 0, 0, 0]),
    ));
    let relative = |dir_ino: Option<u64>| {
        let Body::Call(mut c) = call(Syscall::Unlinkat, 78, Some("f"), [4, 0, 0, 0, 0, 0]) else {
            unreachable!()
        };
        c.relative_to_shm = true;
        c.dir_ino = dir_ino;
        c
    };
    assert_eq!(
        world
            .resolve_relative(2, MNTNS, &relative(Some(77)))
            .as_deref(),
        Some("/dev/shm/a/sub/f")
    );
    // Another namespace's inode 77 is another directory.
    assert_eq!(
        world
            .resolve_relative(2, MNTNS + 1, &relative(Some(77)))
            .as_deref(),
        Some("/dev/shm/…/f")
    );
    assert_eq!(
        world.resolve_relative(2, MNTNS, &relative(Some(1))),
        None,
        "the root: /dev/shm/f as it is"
    );
    // An older trace, without the inode: descriptor 4 is unknown, as before.
    assert_eq!(world.resolve_relative(2, MNTNS, &relative(None)), None);
    // Its namespace gone, the number names nothing.
    world.forget_shm_dev(MNTNS);
    assert_eq!(
        world
            .resolve_relative(2, MNTNS, &relative(Some(77)))
            .as_deref(),
        Some("/dev/shm/…/f")
    );
}
