//! Makes real /dev/shm system calls for the end-to-end tests, one scenario per invocation:
//! `shm-exerciser [--private-shm SIZE] SCENARIO [ARGS]`.
//!
//! With `--private-shm`, it first moves into a private mount namespace with a tmpfs of that
//! size on /dev/shm (and a private IPC namespace), so failures are real and nothing leaks.
//! Every call goes through libc directly, so the syscalls are exactly the ones named.
use std::{
    ffi::{CStr, CString},
    io::Read,
    os::fd::{AsRawFd, IntoRawFd, RawFd},
    process::exit,
};

use nix::{
    sched::CloneFlags,
    sys::wait::waitpid,
    unistd::{ForkResult, fork},
};

/// The path's address, after reading it once. A syscall tracepoint cannot fault a page in, so
/// a literal in a page of the binary not yet touched is read at `sys_exit` instead
/// (docs/probes.md). `untouched-path` tests that; the other scenarios are about other things.
fn resident(path: &'static CStr) -> *const libc::c_char {
    for byte in path.to_bytes_with_nul() {
        // SAFETY: a reference to a byte of a live CStr is valid for reads.
        unsafe { std::ptr::read_volatile(byte) };
    }
    path.as_ptr()
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--private-shm") {
        let size = args.get(1).cloned().unwrap_or_else(|| usage());
        private_shm(&size);
        args.drain(..2);
    }
    let scenario = args.first().cloned().unwrap_or_else(|| usage());
    let rest = &args[1..];
    match scenario.as_str() {
        "fallocate-enospc" => fallocate_enospc(),
        "write-enospc" => write_enospc(),
        "failures" => failures(rest),
        "sigbus" => sigbus(),
        "sigbus-when-told" => sigbus_when_told(rest),
        "shmget" => shmget(),
        "fork-tree" => fork_tree(),
        "die-by-signal" => die_by_signal(rest),
        "relative" => relative(),
        "statfs" => statfs(),
        "untouched-path" => untouched_path(),
        "openat2" => openat2(),
        "memfd" => memfd(),
        "munmap" => munmap(),
        "hostile-name" => hostile_name(),
        "burst" => burst(rest),
        "threads" => threads(rest),
        "leader-exits-first" => leader_exits_first(),
        "wait-then" => wait_then(rest),
        "hold-then-write" => hold_then_write(),
        "receive-fd" => receive_fd(),
        "exit" => exit(rest.first().and_then(|c| c.parse().ok()).unwrap_or(0)),
        "open-syscall" => open_syscall(),
        "other-paths" => other_paths(),
        "remount" => remount(),
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("usage: shm-exerciser [--private-shm SIZE] SCENARIO [ARGS]");
    exit(2)
}

fn check(rc: i64, what: &str) -> i64 {
    if rc < 0 {
        eprintln!("{what}: {}", std::io::Error::last_os_error());
    }
    rc
}

/// A private mount and IPC namespace with a `size` tmpfs on /dev/shm.
fn private_shm(size: &str) {
    shmtrace_workload::private_shm("exerciser", size, CloneFlags::CLONE_NEWIPC)
        .expect("a private /dev/shm (run as root)");
}

/// open(2); a failure is reported and gives -1, so the scenario's next calls fail as they
/// would in the program it plays.
fn open(path: &str, flags: i32) -> RawFd {
    match shmtrace_workload::open(path, flags) {
        Ok(fd) => fd.into_raw_fd(),
        Err(error) => {
            eprintln!("{error}");
            -1
        }
    }
}

const CREATE: i32 = shmtrace_workload::PYTORCH_CREATE;

/// PyTorch >= 2.10: ftruncate then fallocate of 2 MiB in a 1 MiB /dev/shm.
fn fallocate_enospc() {
    let fd = open("/dev/shm/torch_fallocate_0", CREATE);
    // SAFETY: calls on our own fresh descriptor and NUL-terminated literal paths.
    unsafe {
        check(libc::ftruncate(fd, 2 << 20) as i64, "ftruncate");
        check(libc::fallocate(fd, 0, 0, 2 << 20) as i64, "fallocate");
        libc::unlink(resident(c"/dev/shm/torch_fallocate_0"));
        libc::close(fd);
    }
}

/// A multiprocessing semaphore file written into a full /dev/shm.
fn write_enospc() {
    let filler = open("/dev/shm/filler", CREATE);
    let mut page = vec![0x11u8; 4096];
    // SAFETY: writes from a local buffer until the tmpfs is full.
    while unsafe { libc::write(filler, page.as_mut_ptr().cast(), page.len()) } > 0 {}
    let sem = open("/dev/shm/sem.exerciser", CREATE);
    // SAFETY: a 32-byte write from a local buffer, like CPython's SemLock.
    unsafe {
        check(
            libc::write(sem, [0u8; 32].as_ptr().cast(), 32) as i64,
            "write sem",
        )
    };
}

/// Fills /dev/shm, then `count` more writes of a page, which fail with ENOSPC: prints how many
/// calls failed in all (the fill's last write too), which a tracer must have counted. Given a
/// directory, it creates DIR/filled once full and waits for DIR/go before the `count` writes
/// (a tracer can stop reading in between).
fn failures(args: &[String]) {
    let count: usize = args.first().and_then(|c| c.parse().ok()).unwrap_or(1000);
    let wait_in = args.get(1).map(std::path::PathBuf::from);
    let filler = open("/dev/shm/filler", CREATE);
    let page = [0x11u8; 4096];
    let mut failed = 0;
    let mut write = || {
        // SAFETY: a write from a local buffer to our own descriptor.
        let written = unsafe { libc::write(filler, page.as_ptr().cast(), page.len()) };
        if written < 0 {
            failed += 1;
        }
        written
    };
    while write() > 0 {}
    if let Some(dir) = &wait_in {
        std::fs::write(dir.join("filled"), b"").expect("writing DIR/filled");
        while !dir.join("go").exists() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    for _ in 0..count {
        write();
    }
    println!("failed {failed}");
}

/// PyTorch <= 2.9: ftruncate 2 MiB (sparse), mmap, fill: SIGBUS past 1 MiB.
fn sigbus() {
    let fd = shmtrace_workload::open("/dev/shm/psm_sigbus", CREATE).expect("open psm_sigbus");
    // SAFETY: a plain syscall on our own descriptor.
    unsafe { libc::ftruncate(fd.as_raw_fd(), 2 << 20) };
    let addr = shmtrace_workload::map_shared(&fd, 2 << 20).expect("mmap psm_sigbus");
    println!("mapped at {:#x}", addr as usize);
    // SAFETY: written only within our own 2 MiB mapping; SIGBUS past the tmpfs is the point.
    unsafe { std::ptr::write_bytes(addr, 0x5a, 2 << 20) };
}

/// As `sigbus`, in two steps: maps, then creates DIR/mapped and waits for DIR/go before
/// touching the pages, so that a tracer can start in between (a process already running, with
/// its mapping, when shmtrace attaches).
fn sigbus_when_told(args: &[String]) {
    let dir = std::path::PathBuf::from(args.first().cloned().unwrap_or_else(|| usage()));
    let fd = shmtrace_workload::open("/dev/shm/psm_sigbus", CREATE).expect("open psm_sigbus");
    // SAFETY: a plain syscall on our own descriptor.
    unsafe { libc::ftruncate(fd.as_raw_fd(), 2 << 20) };
    let addr = shmtrace_workload::map_shared(&fd, 2 << 20).expect("mmap psm_sigbus");
    std::fs::write(dir.join("mapped"), b"").expect("writing DIR/mapped");
    while !dir.join("go").exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: written only within our own 2 MiB mapping; SIGBUS past the tmpfs is the point.
    unsafe { std::ptr::write_bytes(addr, 0x5a, 2 << 20) };
}

/// System V: limits lowered in our own IPC namespace, then calls that fail and one that works.
fn shmget() {
    std::fs::write("/proc/sys/kernel/shmmax", "1048576")
        .expect("lower shmmax (needs --private-shm)");
    // SAFETY: System V calls with valid arguments; the segment is attached and removed by us only.
    unsafe {
        // Over shmmax: EINVAL.
        check(
            libc::shmget(libc::IPC_PRIVATE, 2 << 20, libc::IPC_CREAT | 0o600) as i64,
            "shmget big",
        );
        // A key that does not exist, without IPC_CREAT: ENOENT.
        check(libc::shmget(0x5157, 4096, 0o600) as i64, "shmget missing");
        let id = check(
            libc::shmget(0x5158, 65536, libc::IPC_CREAT | 0o600) as i64,
            "shmget",
        ) as i32;
        let addr = libc::shmat(id, std::ptr::null(), 0);
        libc::shmdt(addr);
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
    }
}

/// Parent -> child -> grandchild; only the grandchild touches /dev/shm.
fn fork_tree() {
    // SAFETY: the exerciser is single-threaded.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            // SAFETY: the exerciser is single-threaded.
            match unsafe { fork() }.unwrap() {
                ForkResult::Child => {
                    let fd = open("/dev/shm/grandchild_object", CREATE);
                    // SAFETY: our own fresh descriptor and a NUL-terminated literal path.
                    unsafe {
                        libc::ftruncate(fd, 8192);
                        libc::unlink(resident(c"/dev/shm/grandchild_object"));
                    }
                    println!("grandchild {}", std::process::id());
                    exit(0);
                }
                ForkResult::Parent { child } => {
                    waitpid(child, None).unwrap();
                    exit(0);
                }
            }
        }
        ForkResult::Parent { child } => {
            waitpid(child, None).unwrap();
        }
    }
}

/// Kills itself with the named signal (default SIGSEGV).
fn die_by_signal(args: &[String]) {
    let signo = args
        .first()
        .and_then(|s| s.parse().ok())
        .unwrap_or(libc::SIGSEGV);
    // SAFETY: resets and raises a signal in our own process.
    unsafe {
        libc::signal(signo, libc::SIG_DFL);
        libc::raise(signo);
    }
    exit(0)
}

/// Names relative to a /dev/shm directory descriptor and to a /dev/shm working directory.
fn relative() {
    // SAFETY: calls with NUL-terminated literal paths and descriptors we own.
    unsafe {
        let dir = libc::open(resident(c"/dev/shm"), libc::O_RDONLY | libc::O_DIRECTORY);
        let fd = libc::openat(dir, resident(c"via_dirfd"), CREATE, 0o600);
        check(fd as i64, "openat dirfd");
        libc::unlinkat(dir, resident(c"via_dirfd"), 0);
        libc::chdir(resident(c"/dev/shm"));
        let fd = libc::openat(libc::AT_FDCWD, resident(c"via_cwd"), CREATE, 0o600);
        check(fd as i64, "openat cwd");
        libc::unlink(resident(c"via_cwd"));
    }
}

/// Asks for /dev/shm's free space every way glibc's `statvfs` and `fstatvfs` do, after
/// filling 1 MiB of it: `statfs` of the directory and of a file in it, `fstatfs` of a
/// descriptor of each; and `statfs` of /tmp, which is not /dev/shm's business.
fn statfs() {
    let file = open("/dev/shm/filled", CREATE);
    let page = [0x22u8; 4096];
    for _ in 0..256 {
        // SAFETY: a write from a local buffer to our own descriptor.
        check(
            unsafe { libc::write(file, page.as_ptr().cast(), page.len()) } as i64,
            "write filled",
        );
    }
    // SAFETY: `statfs` fills the buffer it is given; the paths are NUL-terminated literals.
    unsafe {
        let mut buf: libc::statfs = std::mem::zeroed();
        check(
            libc::statfs(resident(c"/dev/shm"), &mut buf) as i64,
            "statfs /dev/shm",
        );
        check(
            libc::statfs(resident(c"/dev/shm/filled"), &mut buf) as i64,
            "statfs file",
        );
        check(
            libc::statfs(resident(c"/tmp"), &mut buf) as i64,
            "statfs /tmp",
        );
        let dir = libc::open(resident(c"/dev/shm"), libc::O_RDONLY | libc::O_DIRECTORY);
        check(libc::fstatfs(dir, &mut buf) as i64, "fstatfs dir");
        check(libc::fstatfs(file, &mut buf) as i64, "fstatfs file");
    }
}

/// Opens and unlinks a /dev/shm name whose bytes sit in pages no one has touched yet: each is a
/// fresh private mapping of a file holding the path, so the probe at `sys_enter` cannot read it.
fn untouched_path() {
    let name = format!("/dev/shm/untouched-{}\0", std::process::id());
    let holder = format!("/tmp/shm-exerciser-path-{}", std::process::id());
    std::fs::write(&holder, name.as_bytes()).expect("writing the path file");
    let file = std::fs::File::open(&holder).expect("opening the path file");
    let _ = std::fs::remove_file(&holder);
    let map = || {
        // SAFETY: a new read-only private mapping of a file we hold open; nothing reads it here.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED, "mmap of the path file");
        page as *const libc::c_char
    };
    let (for_open, for_unlink) = (map(), map());
    // SAFETY: both mappings hold the NUL-terminated path.
    unsafe {
        let fd = libc::openat(libc::AT_FDCWD, for_open, CREATE, 0o600);
        check(fd as i64, "openat through an untouched page");
        libc::close(fd);
        check(
            libc::unlink(for_unlink) as i64,
            "unlink through an untouched page",
        );
    }
}

fn openat2() {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: CREATE as u64,
        mode: 0o600,
        resolve: 0x04, /* RESOLVE_NO_SYMLINKS */
    };
    // SAFETY: `how` is a valid `open_how` of the size passed, and the path is NUL-terminated.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            resident(c"/dev/shm/via_openat2"),
            &how as *const OpenHow,
            size_of::<OpenHow>(),
        );
        check(fd, "openat2");
        libc::unlink(resident(c"/dev/shm/via_openat2"));
    }
}

fn memfd() {
    // SAFETY: a NUL-terminated literal name.
    unsafe {
        check(
            libc::memfd_create(resident(c"torch-memfd"), libc::MFD_CLOEXEC) as i64,
            "memfd",
        )
    };
}

/// What musl's `shm_open` does on x86-64 (Alpine's PostgreSQL, say): `open(2)`, not
/// `openat(2)`, then ftruncate of 64 KiB, close, unlink. x86-64 only: newer architectures have
/// no `open`.
fn open_syscall() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a NUL-terminated literal path; calls on our own fresh descriptor.
    unsafe {
        let fd = check(
            libc::syscall(
                libc::SYS_open,
                resident(c"/dev/shm/musl_open_0"),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            ),
            "open",
        ) as i32;
        check(libc::ftruncate(fd, 65536) as i64, "ftruncate");
        libc::close(fd);
        libc::unlink(resident(c"/dev/shm/musl_open_0"));
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        eprintln!("open-syscall: this architecture has no open(2)");
        exit(2)
    }
}

/// Maps four pages and unmaps the middle two.
fn munmap() {
    let fd = open("/dev/shm/unmapped", CREATE);
    // SAFETY: maps our own 16 KiB file and unmaps two of its pages, which nothing refers to.
    unsafe {
        libc::ftruncate(fd, 16384);
        let addr = libc::mmap(
            std::ptr::null_mut(),
            16384,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        );
        libc::munmap(addr.cast::<u8>().add(4096).cast(), 8192);
        libc::unlink(resident(c"/dev/shm/unmapped"));
        libc::close(fd);
    }
}

/// A name with a terminal escape and a newline.
fn hostile_name() {
    let fd = open("/dev/shm/evil\x1b[2J\nname", CREATE);
    // SAFETY: closes our own descriptor and unlinks a NUL-terminated literal path.
    unsafe {
        libc::close(fd);
        libc::unlink(resident(c"/dev/shm/evil\x1b[2J\nname"));
    }
}

/// `count` create/size/close/unlink rounds as fast as possible.
fn burst(args: &[String]) {
    let count: usize = args.first().and_then(|c| c.parse().ok()).unwrap_or(10_000);
    for i in 0..count {
        let name = format!("/dev/shm/burst_{i}");
        let fd = open(&name, CREATE);
        let c = CString::new(name).unwrap();
        // SAFETY: our own fresh descriptor and a NUL-terminated path we own.
        unsafe {
            libc::ftruncate(fd, 4096);
            libc::close(fd);
            libc::unlink(c.as_ptr());
        }
    }
}

/// `count` threads, one after another, each sizing the same object once: more threads than
/// shmtrace has slots for calls in flight, so slots not freed as their threads end show as
/// lost calls. Then one more thread asks for 2 MiB of it (ENOSPC in a 1 MiB /dev/shm).
fn threads(args: &[String]) {
    let count: usize = args.first().and_then(|c| c.parse().ok()).unwrap_or(20_000);
    let fd = open("/dev/shm/threads_0", CREATE);
    let in_a_thread = |call: Box<dyn FnOnce() + Send>| {
        std::thread::spawn(call)
            .join()
            .expect("a thread of the scenario")
    };
    for i in 0..count {
        let size = 4096 * (i as i64 % 4 + 1);
        // SAFETY: sizes our own descriptor.
        in_a_thread(Box::new(move || unsafe {
            check(libc::ftruncate(fd, size) as i64, "ftruncate");
        }));
    }
    // SAFETY: allocates in our own descriptor.
    in_a_thread(Box::new(move || unsafe {
        check(libc::fallocate(fd, 0, 0, 2 << 20) as i64, "fallocate");
    }));
    // SAFETY: closes our own descriptor and unlinks a NUL-terminated literal path.
    unsafe {
        libc::close(fd);
        libc::unlink(c"/dev/shm/threads_0".as_ptr());
    }
}

/// The main thread leaves (as with `pthread_exit`) while another thread goes on to create,
/// size and remove an object: the process lives until that thread is done.
fn leader_exits_first() {
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let fd = open("/dev/shm/after_the_leader", CREATE);
        // SAFETY: sizes and closes our own descriptor, unlinks a NUL-terminated literal path.
        unsafe {
            check(libc::ftruncate(fd, 8192) as i64, "ftruncate");
            libc::close(fd);
            libc::unlink(resident(c"/dev/shm/after_the_leader"));
        }
    });
    // The raw `exit` system call ends the calling thread only. (`pthread_exit` would unwind
    // through Rust's `main`, which aborts on a foreign unwind.)
    // SAFETY: ends the main thread, which holds nothing the other thread needs; the process
    // ends when that thread returns.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    unreachable!("the exit system call returned");
}

/// Reads a line from stdin (the test attaches in between), then runs the named scenario.
/// Opens a /dev/shm file, says `ready PID`, and after a byte on stdin writes 4 KiB to it:
/// a process that held /dev/shm before shmtrace started.
fn hold_then_write() {
    let fd = open("/dev/shm/held_before", CREATE);
    println!("ready {}", std::process::id());
    let mut byte = [0u8; 1];
    let _ = std::io::stdin().read(&mut byte);
    // SAFETY: a write from a local buffer to our own descriptor, then an unlink of a literal.
    unsafe {
        check(
            libc::write(fd, [7u8; 4096].as_ptr().cast(), 4096) as i64,
            "write held_before",
        );
        libc::unlink(resident(c"/dev/shm/held_before"));
        libc::close(fd);
    }
}

/// A child creates a 1 MiB /dev/shm file, removes its name and passes its descriptor over a
/// socket (SCM_RIGHTS), as PyTorch's DataLoader workers do; this process, which never opens
/// anything in /dev/shm, receives it, maps it and writes to it.
fn receive_fd() {
    let mut pair = [0; 2];
    // SAFETY: socketpair fills the array.
    check(
        unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, pair.as_mut_ptr()) } as i64,
        "socketpair",
    );
    // SAFETY: the child only makes plain calls and exits.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let fd = open("/dev/shm/passed", CREATE);
            // SAFETY: calls on our own descriptors; the message carries one descriptor.
            unsafe {
                libc::ftruncate(fd, 1 << 20);
                libc::unlink(resident(c"/dev/shm/passed"));
                send_fd(pair[1], fd);
                libc::_exit(0);
            }
        }
        ForkResult::Parent { child } => {
            // SAFETY: as below.
            let fd = unsafe { receive_one_fd(pair[0]) };
            waitpid(child, None).expect("waitpid");
            // SAFETY: maps and writes within the 1 MiB file we were passed.
            unsafe {
                let addr = libc::mmap(
                    std::ptr::null_mut(),
                    1 << 20,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
                if addr == libc::MAP_FAILED {
                    eprintln!("mmap: {}", std::io::Error::last_os_error());
                    exit(1);
                }
                *(addr as *mut u8) = 1;
                check(
                    libc::write(fd, [3u8; 4096].as_ptr().cast(), 4096) as i64,
                    "write passed",
                );
                libc::munmap(addr, 1 << 20);
                libc::close(fd);
            }
            println!("received {fd}");
        }
    }
}

/// Room for one `cmsghdr` carrying one descriptor, aligned as the kernel wants it.
#[repr(C, align(8))]
struct OneFdControl([u8; 24]);

/// Sends `fd` over socket `socket`, with one byte of data.
///
/// # Safety
/// `socket` and `fd` are open descriptors.
unsafe fn send_fd(socket: RawFd, fd: RawFd) {
    let mut data = [b'x'];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = OneFdControl([0; 24]);
    // SAFETY: msghdr is plain data; the fields that matter are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    // SAFETY: CMSG_* compute within the control buffer set above.
    unsafe {
        msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(4) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<i32>(), fd);
        check(libc::sendmsg(socket, &msg, 0) as i64, "sendmsg");
    }
}

/// Receives one descriptor sent by [`send_fd`].
///
/// # Safety
/// `socket` is an open descriptor.
unsafe fn receive_one_fd(socket: RawFd) -> RawFd {
    let mut data = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = OneFdControl([0; 24]);
    // SAFETY: as in `send_fd`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    // SAFETY: the kernel fills the buffers set above.
    unsafe {
        if check(libc::recvmsg(socket, &mut msg, 0) as i64, "recvmsg") < 0 {
            exit(1);
        }
        let header = libc::CMSG_FIRSTHDR(&msg);
        if header.is_null() || (*header).cmsg_type != libc::SCM_RIGHTS {
            eprintln!("recvmsg: no descriptor came");
            exit(1);
        }
        std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<i32>())
    }
}

fn wait_then(args: &[String]) {
    println!("ready {}", std::process::id());
    let mut byte = [0u8; 1];
    let _ = std::io::stdin().read(&mut byte);
    match args.first().map(String::as_str) {
        Some("fallocate-enospc") => fallocate_enospc(),
        Some("fork-tree") => fork_tree(),
        _ => {}
    }
}

/// Writes 4 KiB to `fd`.
fn write_page(fd: RawFd, what: &str) {
    // SAFETY: a write from a local buffer to a descriptor of ours.
    check(
        unsafe { libc::write(fd, [7u8; 4096].as_ptr().cast(), 4096) } as i64,
        what,
    );
}

/// Mounts a tmpfs, which is no /dev/shm, on a fresh directory of this (private) mount
/// namespace, and returns the directory.
fn other_tmpfs(name: &str) -> String {
    let dir = format!("/tmp/shm-exerciser-{name}-{}", std::process::id());
    std::fs::create_dir(&dir).expect("a directory for another tmpfs");
    nix::mount::mount(
        Some("other"),
        dir.as_str(),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .expect("mounting another tmpfs (with --private-shm, as root)");
    dir
}

fn remove_other_tmpfs(dir: &str) {
    let _ = nix::mount::umount(dir);
    let _ = std::fs::remove_dir(dir);
}

/// A /dev/shm file is known by its file system, whatever path reaches it (with
/// `--private-shm`). With more than 64 descriptors open (a grown descriptor table, as a
/// PyTorch trainer's), creates /dev/shm/grown and writes to it; prints `ready PID`, and after
/// a line on stdin (the test meanwhile reaches this /dev/shm through /proc/PID/root), creates
/// /proc/self/root/dev/shm/by-proc-root, and a file on another tmpfs, no /dev/shm, writing to
/// each.
fn other_paths() {
    let held: Vec<RawFd> = (0..100)
        .map(|_| open("/dev/null", libc::O_RDONLY))
        .collect();
    let grown = open("/dev/shm/grown", CREATE);
    write_page(grown, "write grown");
    println!("ready {}", std::process::id());
    let mut byte = [0u8; 1];
    let _ = std::io::stdin().read(&mut byte);
    let by_root = open("/proc/self/root/dev/shm/by-proc-root", CREATE);
    write_page(by_root, "write by-proc-root");
    let dir = other_tmpfs("other-paths");
    let elsewhere = open(&format!("{dir}/not-shm"), CREATE);
    write_page(elsewhere, "write not-shm");
    // SAFETY: closes of our own descriptors.
    unsafe {
        libc::close(elsewhere);
        libc::close(by_root);
        libc::close(grown);
        for fd in held {
            libc::close(fd);
        }
    }
    remove_other_tmpfs(&dir);
    let _ = std::fs::remove_file("/dev/shm/grown");
    let _ = std::fs::remove_file("/dev/shm/by-proc-root");
}

/// A device number taken over (with `--private-shm`): a file is made in this /dev/shm (its
/// file system is then known as one), which is then unmounted, and another tmpfs, no
/// /dev/shm, mounted at once, which takes the device number it left. Prints
/// `ready PID OLD_DEV NEW_DEV`; after a line on stdin, creates a file on the new tmpfs and
/// writes to it.
fn remount() {
    let first = open("/dev/shm/before-remount", CREATE);
    let old = stat_dev("/dev/shm");
    // SAFETY: a close of our own descriptor.
    unsafe { libc::close(first) };
    nix::mount::umount("/dev/shm").expect("unmounting the private /dev/shm");
    let dir = other_tmpfs("remount");
    println!("ready {} {old} {}", std::process::id(), stat_dev(&dir));
    let mut byte = [0u8; 1];
    let _ = std::io::stdin().read(&mut byte);
    let fd = open(&format!("{dir}/not-shm-reused"), CREATE);
    write_page(fd, "write not-shm-reused");
    // SAFETY: a close of our own descriptor.
    unsafe { libc::close(fd) };
    remove_other_tmpfs(&dir);
}

fn stat_dev(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").dev()
}
