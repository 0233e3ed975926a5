//! Calls applied to the model, fed decoded events built in code as the probes would send them.
use crate::{
    event::{Body, InodeId, Syscall},
    model::world::{
        World,
        test_events::{DEV, SECOND, call, event},
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
