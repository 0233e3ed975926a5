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
//! The announcement is a listening abstract Unix socket: nothing on disk, and the kernel
//! unbinds it when its holder exits, however it exits. Anyone can bind the name, so a detacher
//! believes it only from its own user or root, as the kernel tells who listens (`SO_PEERCRED`
//! of a connection to it): another user who binds it changes nothing. It is a courtesy, never
//! a lock: a run that cannot bind it attaches as before, and a detacher waits at most
//! [`HOLD_AT_MOST`] in all.
use std::{
    os::fd::RawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

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
    /// Takes the detachers' connections as they come, so that they never fill the queue.
    acceptor: Option<JoinHandle<()>>,
    done: Arc<AtomicBool>,
}

impl Drop for Announcement {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // SAFETY: our own descriptor, which the acceptor no longer uses.
        unsafe { libc::close(self.socket) };
    }
}

/// How often the acceptor looks whether the announcement ended.
const ACCEPTOR_LOOKS_EVERY_MS: i32 = 20;

/// Announces that this run is attaching, if nobody else does now (`None`: attach anyway).
pub fn announce() -> Option<Announcement> {
    announce_as(NAME)
}

/// Whether a run of this user or root is attaching now. Async-signal-safe (socket, connect,
/// getsockopt, geteuid and close only): the
/// detachers call it in a child forked from a multithreaded process.
pub fn someone_attaching() -> bool {
    someone_attaching_as(NAME)
}

fn announce_as(name: &[u8]) -> Option<Announcement> {
    let socket = seqpacket_socket()?;
    let (address, length) = address(name);
    // SAFETY: a valid address of `length` bytes; our own descriptor.
    let listening = unsafe {
        libc::bind(socket, (&raw const address).cast(), length) == 0
            && libc::listen(socket, 64) == 0
    };
    if !listening {
        // SAFETY: our own descriptor.
        unsafe { libc::close(socket) };
        return None;
    }
    let done = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let done = done.clone();
        std::thread::Builder::new()
            .name("shmtrace-announce".into())
            .spawn(move || accept_until(socket, &done))
            .ok()
    };
    Some(Announcement {
        socket,
        acceptor,
        done,
    })
}

/// Accepts and closes connections to the announcement until it ends.
fn accept_until(socket: RawFd, done: &AtomicBool) {
    while !done.load(Ordering::Relaxed) {
        let mut ready = libc::pollfd {
            fd: socket,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&raw mut ready, 1, ACCEPTOR_LOOKS_EVERY_MS) } <= 0 {
            continue;
        }
        // SAFETY: our listening socket; the connection is closed at once.
        let connection = unsafe {
            libc::accept4(
                socket,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if connection >= 0 {
            // SAFETY: the descriptor accept4 just gave us.
            unsafe { libc::close(connection) };
        }
    }
}

fn someone_attaching_as(name: &[u8]) -> bool {
    let Some(socket) = seqpacket_socket() else {
        return false;
    };
    let (address, length) = address(name);
    // SAFETY: a valid address of `length` bytes. Non-blocking: a listener that does not
    // accept (someone else's) cannot hold a detacher up.
    let connected = unsafe { libc::connect(socket, (&raw const address).cast(), length) } == 0;
    let trusted = connected && {
        // SAFETY: all zeros is a valid `ucred`, and the kernel writes at most its size.
        let mut peer: libc::ucred = unsafe { std::mem::zeroed() };
        let mut size = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: a `ucred` and its size.
        let read = unsafe {
            libc::getsockopt(
                socket,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&raw mut peer).cast(),
                &raw mut size,
            )
        } == 0;
        // SAFETY: no pointers.
        read && (peer.uid == 0 || peer.uid == unsafe { libc::geteuid() })
    };
    // SAFETY: our own descriptor.
    unsafe { libc::close(socket) };
    trusted
}

fn seqpacket_socket() -> Option<RawFd> {
    // SAFETY: no pointers.
    let socket = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
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

    /// Another user's process listening on the name holds nobody's releases back.
    #[test]
    fn an_announcement_by_another_user_is_not_believed() {
        let name = format!("shmtrace-attaching-other-{}", std::process::id()).into_bytes();
        let (address, length) = address(&name);
        let mut ready = [0; 2];
        // SAFETY: a two-descriptor array for the pipe.
        assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
        // SAFETY: the child only makes system calls, then exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: the child drops to another user and holds the name until killed.
            unsafe {
                let other: libc::uid_t = if libc::geteuid() == 65534 {
                    65533
                } else {
                    65534
                };
                if libc::setgid(other) != 0 || libc::setuid(other) != 0 {
                    libc::_exit(2);
                }
                let socket = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
                if libc::bind(socket, (&raw const address).cast(), length) != 0
                    || libc::listen(socket, 64) != 0
                {
                    libc::_exit(3);
                }
                libc::write(ready[1], b"x".as_ptr().cast(), 1);
                libc::pause();
                libc::_exit(0);
            }
        }
        // Only the child writes: with our copy of the write end closed, a child that could
        // not become another user (we are not root) ends the read instead of leaving it
        // waiting for good.
        // SAFETY: our own descriptor, not used again.
        unsafe { libc::close(ready[1]) };
        let mut byte = [0u8; 1];
        // SAFETY: reading one byte into a local buffer.
        let got = unsafe { libc::read(ready[0], byte.as_mut_ptr().cast(), 1) };
        let believed = got == 1 && someone_attaching_as(&name);
        // SAFETY: our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
            libc::close(ready[0]);
        }
        if got != 1 {
            // Only root can be another user; as an ordinary user the check is that our own
            // announcement is believed (above).
            assert!(
                !nix::unistd::Uid::effective().is_root(),
                "the child could not take the name as another user"
            );
            return;
        }
        assert!(
            !believed,
            "another user's listener on the name was believed"
        );
    }
}
