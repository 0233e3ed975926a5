//! The workload of `shmtrace demo` (`commands::demo` traces it): a real /dev/shm failure, with
//! no container.
//!
//! The workload runs in a private mount namespace whose /dev/shm is a 1 MiB tmpfs, and plays a
//! PyTorch training process whose DataLoader workers fail the two ways real ones do:
//!
//! 1. PyTorch >= 2.10: `openat` + `ftruncate` + `fallocate`, and `fallocate` returns ENOSPC.
//! 2. PyTorch <= 2.9: `ftruncate` + `mmap`, then writing the mapping faults with SIGBUS, the
//!    worker's handler reports it and re-raises, and the worker dies of signal 7.
//!
//! The namespace, and the tmpfs with it, disappear when the workload exits.
use std::{
    ffi::CString,
    io::Write,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    process::ExitCode,
};

use anyhow::{Context, Result, bail};

use nix::{
    mount::{MsFlags, mount},
    sched::{CloneFlags, unshare},
    sys::wait::{WaitStatus, waitpid},
    unistd::{ForkResult, fork, pipe},
};

/// Size of the demo's /dev/shm, as a tmpfs `size=` option and for people.
const SHM_SIZE_OPTION: &str = "1m";
pub const SHM_SIZE: &str = "1 MiB";
/// What the first scenario's workers ask for per batch.
const BATCH_BYTES: usize = 384 << 10;
/// What the second scenario's worker asks for per batch.
const LEGACY_BATCH_BYTES: usize = 768 << 10;
/// The workload's own exit status: a training run that crashed.
pub const WORKLOAD_STATUS: i32 = 1;

/// Entry point of the hidden `__demo-workload` subcommand: two training runs, one after the
/// other, in one private /dev/shm.
pub fn workload() -> Result<ExitCode> {
    private_shm().context("setting up the demo's private /dev/shm (the demo needs root)")?;
    set_name("demo")?;
    let first = run_training(training_with_fallocate)?;
    let second = run_training(training_with_mmap)?;
    let failed = first != 0 || second != 0;
    Ok(ExitCode::from(if failed {
        WORKLOAD_STATUS as u8
    } else {
        0
    }))
}

/// Forks a training process running `training`, and returns its exit status.
fn run_training(training: fn() -> Result<i32>) -> Result<i32> {
    // SAFETY: the workload is single-threaded.
    match unsafe { fork() }? {
        ForkResult::Child => {
            let code = match set_name("trainer").and_then(|()| training()) {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("{error:#}");
                    2
                }
            };
            std::process::exit(code)
        }
        ForkResult::Parent { child } => Ok(exit_code(wait(child)?)),
    }
}

/// PyTorch >= 2.10. The first worker fills /dev/shm with its two prefetched batches, so the
/// second worker's fallocate fails.
fn training_with_fallocate() -> Result<i32> {
    say(&format!(
        "training run 1 (PyTorch >= 2.10) starts a DataLoader: 2 workers, 2 batches of {} KiB \
         each in flight, in a {SHM_SIZE} /dev/shm",
        BATCH_BYTES >> 10
    ));
    let (holder, release) = spawn_worker(|ready| fallocate_worker(0, 2, Some(ready)))?;
    let failing = spawn_worker_now(|| fallocate_worker(1, 2, None))?;
    let status = wait(failing)?;
    say(&format!(
        "RuntimeError: DataLoader worker (pid {}) exited unexpectedly with exit code {}",
        failing.as_raw(),
        exit_code(status)
    ));
    drop(release);
    wait(holder)?;
    Ok(WORKLOAD_STATUS)
}

/// PyTorch <= 2.9: its worker maps a sparse file and dies writing it.
fn training_with_mmap() -> Result<i32> {
    say(&format!(
        "training run 2 (PyTorch <= 2.9) starts a DataLoader whose worker maps batches of {} KiB \
         without reserving them",
        LEGACY_BATCH_BYTES >> 10
    ));
    let legacy = spawn_worker_now(|| mmap_worker(2))?;
    let status = wait(legacy)?;
    if let WaitStatus::Signaled(_, signal, _) = status {
        say(&format!(
            "RuntimeError: DataLoader worker (pid {}) is killed by signal: {}.",
            legacy.as_raw(),
            signal_description(signal)
        ));
    }
    Ok(WORKLOAD_STATUS)
}

/// The workload's own messages, like a training script's. The pause lets the trace of what
/// came before reach the terminal first, so the two read in order.
fn say(text: &str) {
    std::thread::sleep(std::time::Duration::from_millis(150));
    eprintln!("[demo workload] {text}");
}

/// A private mount namespace with a tiny tmpfs on /dev/shm.
fn private_shm() -> Result<()> {
    unshare(CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS)")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("making mounts private")?;
    mount(
        Some("shmtrace-demo"),
        "/dev/shm",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={SHM_SIZE_OPTION},mode=1777").as_str()),
    )
    .context("mounting a tmpfs on /dev/shm")?;
    Ok(())
}

fn set_name(name: &str) -> Result<()> {
    let name = CString::new(name)?;
    nix::sys::prctl::set_name(&name).context("prctl(PR_SET_NAME)")
}

/// Forks a worker that signals readiness through a pipe and runs until the returned release
/// end is dropped.
fn spawn_worker(work: impl FnOnce(OwnedFd) -> i32) -> Result<(nix::unistd::Pid, OwnedFd)> {
    let (ready_read, ready_write) = pipe()?;
    let (release_read, release_write) = pipe()?;
    // SAFETY: the workload is single-threaded.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(ready_read);
            drop(release_write);
            let code = work(ready_write);
            // Hold the batches until the trainer lets go.
            let mut byte = [0u8; 1];
            let _ = nix::unistd::read(&release_read, &mut byte);
            std::process::exit(code);
        }
        ForkResult::Parent { child } => {
            drop(ready_write);
            drop(release_read);
            let mut byte = [0u8; 1];
            nix::unistd::read(&ready_read, &mut byte).context("waiting for a worker")?;
            Ok((child, release_write))
        }
    }
}

fn spawn_worker_now(work: impl FnOnce() -> i32) -> Result<nix::unistd::Pid> {
    // SAFETY: the workload is single-threaded.
    match unsafe { fork() }? {
        ForkResult::Child => std::process::exit(work()),
        ForkResult::Parent { child } => Ok(child),
    }
}

fn wait(pid: nix::unistd::Pid) -> Result<WaitStatus> {
    Ok(waitpid(pid, None)?)
}

fn exit_code(status: WaitStatus) -> i32 {
    match status {
        WaitStatus::Exited(_, code) => code,
        _ => -1,
    }
}

fn signal_description(signal: nix::sys::signal::Signal) -> &'static str {
    match signal {
        nix::sys::signal::Signal::SIGBUS => "Bus error",
        nix::sys::signal::Signal::SIGSEGV => "Segmentation fault",
        nix::sys::signal::Signal::SIGKILL => "Killed",
        _ => "signal",
    }
}

/// A shared-memory batch: what PyTorch's `THManagedMapAllocator` creates.
struct Batch {
    addr: *mut libc::c_void,
    len: usize,
}

/// `/dev/shm/torch_<pid>_<random>_<n>` with PyTorch's flags.
fn open_batch(index: usize) -> Result<(OwnedFd, String)> {
    let pid = std::process::id();
    let name = format!(
        "/dev/shm/torch_{pid}_{}_{index}",
        2_578_467_999u32.wrapping_add(pid)
    );
    let c_name = CString::new(name.clone())?;
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: plain open(2) of a NUL-terminated path.
    let fd = unsafe { libc::open(c_name.as_ptr(), flags, 0o600) };
    if fd < 0 {
        bail!("open {name}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, name))
}

fn map(fd: &OwnedFd, len: usize) -> Result<Batch> {
    // SAFETY: mapping a file we own; the mapping lives as long as the worker.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        bail!("mmap: {}", std::io::Error::last_os_error());
    }
    Ok(Batch { addr, len })
}

/// PyTorch >= 2.10: reserve with fallocate, so a full /dev/shm is an error, not a crash.
fn fallocate_worker(worker: usize, batches: usize, ready: Option<OwnedFd>) -> i32 {
    let _ = set_name("pt_data_worker");
    let mut held = Vec::new();
    for n in 0..batches {
        let (fd, name) = match open_batch(worker * 10 + n) {
            Ok(opened) => opened,
            Err(error) => {
                eprintln!("{error}");
                return 1;
            }
        };
        // SAFETY: plain syscalls on a descriptor we own.
        unsafe { libc::ftruncate(fd.as_raw_fd(), BATCH_BYTES as libc::off_t) };
        // SAFETY: as above.
        let rc = unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, BATCH_BYTES as libc::off_t) };
        if rc != 0 {
            let error = std::io::Error::last_os_error();
            let _ = std::fs::remove_file(&name);
            let errno = error.raw_os_error().unwrap_or(0);
            std::thread::sleep(std::time::Duration::from_millis(150));
            eprintln!(
                "RuntimeError: unable to allocate shared memory(shm) for file <{}>: {} ({errno})",
                name.trim_start_matches("/dev/shm"),
                nix::errno::Errno::from_raw(errno).desc(),
            );
            return 1;
        }
        let batch = match map(&fd, BATCH_BYTES) {
            Ok(batch) => batch,
            Err(error) => {
                eprintln!("{error}");
                return 1;
            }
        };
        // SAFETY: writing inside our own mapping, whose pages fallocate reserved.
        unsafe { std::ptr::write_bytes(batch.addr.cast::<u8>(), 0x5a, batch.len) };
        // PyTorch unlinks at once and passes the descriptor on: the memory stays in use.
        let _ = std::fs::remove_file(&name);
        held.push((fd, batch));
    }
    if let Some(ready) = ready {
        let _ = nix::unistd::write(&ready, &[1]);
    }
    let _ = std::io::stderr().flush();
    // The batches are handed over and released when the worker exits.
    std::mem::forget(held);
    0
}

/// PyTorch <= 2.9: ftruncate makes a sparse file, and nothing reserves its pages.
fn mmap_worker(worker: usize) -> i32 {
    let _ = set_name("pt_data_worker");
    install_bus_error_handler();
    for n in 0..2 {
        let (fd, name) = match open_batch(worker * 10 + n) {
            Ok(opened) => opened,
            Err(error) => {
                eprintln!("{error}");
                return 1;
            }
        };
        // SAFETY: plain syscalls on a descriptor we own.
        unsafe { libc::ftruncate(fd.as_raw_fd(), LEGACY_BATCH_BYTES as libc::off_t) };
        let batch = match map(&fd, LEGACY_BATCH_BYTES) {
            Ok(batch) => batch,
            Err(error) => {
                eprintln!("{error}");
                return 1;
            }
        };
        // Old PyTorch wrote a byte to check for space.
        // SAFETY: a one-byte write from a local buffer.
        unsafe { libc::write(fd.as_raw_fd(), [0u8].as_ptr().cast(), 1) };
        let _ = std::fs::remove_file(&name);
        // Filling the second batch runs past the end of /dev/shm: SIGBUS.
        // SAFETY: writing inside our own mapping; a page the tmpfs cannot back raises SIGBUS,
        // which is the point.
        unsafe { std::ptr::write_bytes(batch.addr.cast::<u8>(), 0x5a, batch.len) };
        std::mem::forget((fd, batch));
    }
    0
}

/// PyTorch's worker SIGBUS handler: explain, restore the default action, raise again.
fn install_bus_error_handler() {
    extern "C" fn on_sigbus(_: libc::c_int) {
        const MESSAGE: &[u8] = b"ERROR: Unexpected bus error encountered in worker. This might be \
            caused by insufficient shared memory (shm).\n";
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 150_000_000,
        };
        // SAFETY: only async-signal-safe calls. The pause lets the trace reach the terminal
        // first, as in `say`.
        unsafe {
            libc::nanosleep(&pause, std::ptr::null_mut());
            libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
            libc::signal(libc::SIGBUS, libc::SIG_DFL);
            libc::raise(libc::SIGBUS);
        }
    }
    // SAFETY: installing a handler that only makes async-signal-safe calls.
    unsafe {
        libc::signal(
            libc::SIGBUS,
            on_sigbus as extern "C" fn(libc::c_int) as usize,
        )
    };
}
