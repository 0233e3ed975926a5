//! Taking turns with the releases of earlier runs, so that a start right after another run is
//! as fast as one after a pause.
//!
//! Releasing a syscall tracepoint's last attachment waits for RCU grace periods while holding
//! the kernel's `event_mutex`, which every new attachment takes too. An earlier run's
//! `shmtrace-detach` processes (`detach.rs`) release about 30 of them, one grace period each,
//! so a run started back to back used to wait for all of them, about a second, before its
//! own attachments went through. But an attachment to a tracepoint that still has one is
//! quick, and a release that is not the last one waits for nothing. So a run announces that it
//! is attaching, and detachers hold their releases while it does: it waits for the releases
//! already under way only, and theirs, once it has attached, no longer wait either.
//!
//! The announcement is a bound abstract Unix socket: nothing on disk, and the kernel unbinds
//! it when its holder exits, however it exits. Anyone can bind the name, so it is a courtesy,
//! never a lock: a run that cannot bind it attaches as before, and a detacher waits at most
//! [`HOLD_AT_MOST`] in all, whoever holds the name.
use std::{os::fd::RawFd, time::Duration};

/// The socket's abstract name (after the leading NUL).
const NAME: &[u8] = b"shmtrace-attaching";

/// The longest a detacher holds its releases, over all of them. A run attaches within a few
/// hundred milliseconds; the bound is for a name held by someone else.
pub const HOLD_AT_MOST: Duration = Duration::from_secs(3);

/// How long detachers wait before their first release: a loop's next run starts within it.
pub const FIRST_RELEASE_AFTER: Duration = Duration::from_millis(250);

/// How often a waiting detacher looks again.
pub const LOOK_EVERY: Duration = Duration::from_millis(25);

/// Held while this run loads and attaches its programs; dropping it ends the announcement.
pub struct Announcement {
    socket: RawFd,
}

impl Drop for Announcement {
    fn drop(&mut self) {
        // SAFETY: our own descriptor.
        unsafe { libc::close(self.socket) };
    }
}

/// Announces that this run is attaching, if nobody else does now (`None`: attach anyway).
pub fn announce() -> Option<Announcement> {
    announce_as(NAME)
}

/// Whether a run is attaching now. Async-signal-safe (socket, connect and close only): the
/// detachers call it in a child forked from a multithreaded process.
pub fn someone_attaching() -> bool {
    someone_attaching_as(NAME)
}

fn announce_as(name: &[u8]) -> Option<Announcement> {
    let socket = datagram_socket()?;
    let (address, length) = address(name);
    // SAFETY: a valid address of `length` bytes.
    let bound = unsafe { libc::bind(socket, (&raw const address).cast(), length) } == 0;
    if !bound {
        // SAFETY: our own descriptor.
        unsafe { libc::close(socket) };
        return None;
    }
    Some(Announcement { socket })
}

fn someone_attaching_as(name: &[u8]) -> bool {
    let Some(socket) = datagram_socket() else {
        return false;
    };
    let (address, length) = address(name);
    // SAFETY: a valid address of `length` bytes; connecting a datagram socket sends nothing,
    // and succeeds only if the name is bound.
    let connected = unsafe { libc::connect(socket, (&raw const address).cast(), length) } == 0;
    // SAFETY: our own descriptor.
    unsafe { libc::close(socket) };
    connected
}

fn datagram_socket() -> Option<RawFd> {
    // SAFETY: no pointers.
    let socket = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    (socket >= 0).then_some(socket)
}

/// The abstract address: a leading NUL, then `name`, and its exact length (an abstract name
/// is every byte given, trailing NULs included).
fn address(name: &[u8]) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: all zeros is a valid `sockaddr_un`.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = &name[..name.len().min(address.sun_path.len() - 1)];
    for (slot, byte) in address.sun_path[1..].iter_mut().zip(name) {
        *slot = *byte as libc::c_char;
    }
    let length = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (address, length as libc::socklen_t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_is_seen_until_it_is_dropped_and_is_not_taken_twice() {
        // A name of this test's own: a real run may be attaching meanwhile.
        let name = format!("shmtrace-attaching-test-{}", std::process::id()).into_bytes();
        assert!(!someone_attaching_as(&name));
        let announcement = announce_as(&name).expect("binding the name");
        assert!(someone_attaching_as(&name));
        assert!(
            announce_as(&name).is_none(),
            "a second run attaches without announcing"
        );
        drop(announcement);
        assert!(!someone_attaching_as(&name));
    }
}
