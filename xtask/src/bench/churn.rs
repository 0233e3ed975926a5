//! The benchmark's workload: PyTorch-like /dev/shm churn.
//!
//! Each iteration does what PyTorch does to pass one batch through shared memory: create
//! `/dev/shm/torch_<pid>_...` exclusively, size it (`ftruncate`, then `fallocate`, as current
//! PyTorch does), map it, write into the mapping, unmap, close and unlink. Every call is a direct
//! libc call, so the syscalls are exactly these and nothing else happens in the loop.
//!
//! It prints one JSON line on stdout: loop time, calls made (counted, not assumed, so that a
//! tracer's event count can be checked against them) and its own resource use.
use std::{
    ffi::CString,
    io::{self, Read, Write},
    ops::Range,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::ChurnArgs;

/// The calls an iteration makes, in order (`write` only with `--write-call`). Also the
/// `strace` and `perf trace` filter.
pub const CALLS: [&str; 8] = [
    "openat",
    "ftruncate",
    "fallocate",
    "write",
    "mmap",
    "munmap",
    "close",
    "unlink",
];

const PAGE: usize = 4096;

/// How many of each call (indexed like [`CALLS`]) succeeded.
#[derive(Clone, Copy, Default)]
pub struct Counts([u64; CALLS.len()]);

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    pub const BYTES: usize = 8 * CALLS.len();

    pub fn to_bytes(self) -> Vec<u8> {
        self.0.iter().flat_map(|n| n.to_ne_bytes()).collect()
    }

    /// Reads what `to_bytes` wrote; `bytes` must hold `BYTES` bytes.
    pub fn from_bytes(bytes: &[u8]) -> Counts {
        let mut counts = Counts::default();
        for (slot, chunk) in counts.0.iter_mut().zip(bytes.chunks_exact(8)) {
            *slot = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
        }
        counts
    }

    pub fn to_json(self) -> serde_json::Value {
        CALLS
            .iter()
            .zip(self.0)
            .map(|(name, n)| (name.to_string(), n.into()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

fn object_name(pid: u32, tag: &str, n: u64) -> CString {
    CString::new(format!("/dev/shm/torch_{pid}_{tag}_{n}")).expect("no NUL in a tag")
}

/// Removes objects a killed workload left behind: `torch_*_<tag>_*` in /dev/shm.
pub fn remove_leftovers(tag: &str) -> usize {
    let marker = format!("_{tag}_");
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("torch_") && name.contains(&marker)
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Refuses arguments no run can use, paired or not.
pub fn check_args(args: &ChurnArgs) -> Result<()> {
    if args.size == 0 || args.workers == 0 {
        bail!("--size and --workers must be positive");
    }
    if args.tag.contains(['/', '\0']) {
        bail!("--tag must not contain '/' or NUL");
    }
    Ok(())
}

/// The workload unpaired (`--pair-block 0`; the paired one is `pairs::workload`).
pub fn run(args: &ChurnArgs) -> Result<()> {
    if args.hold {
        // Let the benchmark read probe statistics before the loop.
        println!("{}", json!({ "ready": true }));
        wait_for_go()?;
    }
    let started = Instant::now();
    let counts = if args.workers == 1 {
        let mut counts = Counts::default();
        make_objects(args, 0..args.iterations, &mut counts)?;
        counts
    } else {
        fork_workers(args)?
    };
    let seconds = started.elapsed().as_secs_f64();
    let usage = Usage::of_self_and_children();
    println!(
        "{}",
        json!({
            "seconds": seconds,
            "size": args.size,
            "iterations": args.iterations,
            "workers": args.workers,
            "calls": counts.to_json(),
            "cpu_seconds": usage.cpu_seconds,
            "maxrss_kb": usage.maxrss_kb,
            "nvcsw": usage.nvcsw,
        })
    );
    io::stdout().flush()?;
    if args.hold {
        // ... and after it, until it closes our stdin.
        io::copy(&mut io::stdin(), &mut io::sink())?;
    }
    Ok(())
}

/// In a forked worker: die if the parent does, so that a killed workload leaves no worker
/// behind holding the benchmark's stdout pipe.
pub fn die_with_parent() {
    // SAFETY: prctl with these arguments only sets a signal number; getppid has no
    // preconditions, and _exit ends the process without touching shared state.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() == 1 {
            libc::_exit(1);
        }
    }
}

/// Flushes stdout, then waits for the benchmark to send a line on stdin.
pub fn wait_for_go() -> Result<()> {
    io::stdout().flush()?;
    let mut byte = [0u8; 1];
    while io::stdin().read(&mut byte)? == 1 && byte[0] != b'\n' {}
    Ok(())
}

/// Runs `args.workers` forked copies of the loop and adds up what they did.
fn fork_workers(args: &ChurnArgs) -> Result<Counts> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error()).context("pipe");
    }
    let [read_end, write_end] = fds;
    let mut pids = Vec::new();
    for _ in 0..args.workers {
        // SAFETY: this process is single-threaded, so the child may allocate; it leaves with
        // `_exit`, running no destructors or exit handlers of the parent's state.
        match unsafe { libc::fork() } {
            -1 => return Err(io::Error::last_os_error()).context("fork"),
            0 => {
                die_with_parent();
                let mut counts = Counts::default();
                let status = match make_objects(args, 0..args.iterations, &mut counts) {
                    Ok(()) => {
                        // One write of 64 bytes: atomic on a pipe, so reports never interleave.
                        let bytes = counts.to_bytes();
                        // SAFETY: writing a local buffer.
                        let n =
                            unsafe { libc::write(write_end, bytes.as_ptr().cast(), bytes.len()) };
                        if n == bytes.len() as isize { 0 } else { 1 }
                    }
                    Err(error) => {
                        eprintln!("churn worker: {error:#}");
                        1
                    }
                };
                // SAFETY: leaving the child without unwinding into the parent's code.
                unsafe { libc::_exit(status) };
            }
            pid => pids.push(pid),
        }
    }
    // SAFETY: closing our copy of the write end, so reads end when the workers are gone.
    unsafe { libc::close(write_end) };
    let mut failed = 0;
    for pid in pids {
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            failed += 1;
        }
    }
    let mut reports = Vec::new();
    // SAFETY: the read end is ours; File takes ownership and closes it.
    let mut pipe = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(read_end) };
    pipe.read_to_end(&mut reports)?;
    if failed > 0 {
        bail!("{failed} of {} workers failed", args.workers);
    }
    let mut total = Counts::default();
    for report in reports.chunks_exact(Counts::BYTES) {
        total.add(&Counts::from_bytes(report));
    }
    Ok(total)
}

/// The loop itself, over object numbers `range`. An object is unlinked even when a call on it
/// fails, so that a failing run does not fill /dev/shm.
pub fn make_objects(args: &ChurnArgs, range: Range<u64>, counts: &mut Counts) -> Result<()> {
    let pid = std::process::id();
    let size = args.size as usize;
    let header = [0x5au8; 64];
    for n in range {
        let name = object_name(pid, &args.tag, n);
        let result = one_object(&name, size, n, args.write_call, args.fill, &header, counts);
        if result.is_err() {
            // SAFETY: a NUL-terminated path.
            unsafe { libc::unlink(name.as_ptr()) };
        }
        result.with_context(|| format!("{} (iteration {n})", name.to_string_lossy()))?;
    }
    Ok(())
}

fn one_object(
    name: &CString,
    size: usize,
    n: u64,
    write_call: bool,
    fill: bool,
    header: &[u8],
    counts: &mut Counts,
) -> Result<()> {
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // The calls below are plain syscalls on our own descriptor, path and mapping; the mapping
    // is `size` bytes and only written within that range.
    // SAFETY: `name` is a NUL-terminated path.
    let fd = check(unsafe { libc::open(name.as_ptr(), flags, 0o600) }, "openat")?;
    counts.0[0] += 1;
    let result = (|| -> Result<()> {
        check(
            // SAFETY: our own descriptor.
            unsafe { libc::ftruncate(fd, size as libc::off_t) },
            "ftruncate",
        )?;
        counts.0[1] += 1;
        check(
            // SAFETY: our own descriptor.
            unsafe { libc::fallocate(fd, 0, 0, size as libc::off_t) },
            "fallocate",
        )?;
        counts.0[2] += 1;
        if write_call {
            let len = header.len().min(size);
            check(
                // SAFETY: `len` is at most `header.len()`, so the read stays in `header`.
                unsafe { libc::write(fd, header.as_ptr().cast(), len) } as i32,
                "write",
            )?;
            counts.0[3] += 1;
        }
        // SAFETY: a fresh shared mapping of our own descriptor, placed by the kernel.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error()).context("mmap");
        }
        counts.0[4] += 1;
        let bytes = map.cast::<u8>();
        if fill {
            // SAFETY: the mapping is `size` bytes, writable, and nothing else refers to it.
            unsafe { std::ptr::write_bytes(bytes, n as u8, size) };
        } else {
            // One store per page: every page is faulted in and dirtied, for the least work
            // besides the calls themselves (the hardest case for a tracer's relative cost).
            for offset in (0..size).step_by(PAGE) {
                // SAFETY: `offset < size`, inside the writable mapping.
                unsafe { std::ptr::write_volatile(bytes.add(offset), n as u8) };
            }
        }
        // SAFETY: the mapping made above, unmapped once; `bytes` is not used after.
        check(unsafe { libc::munmap(map, size) }, "munmap")?;
        counts.0[5] += 1;
        Ok(())
    })();
    // SAFETY: our own descriptor, closed once.
    check(unsafe { libc::close(fd) }, "close")?;
    counts.0[6] += 1;
    result?;
    // SAFETY: `name` is a NUL-terminated path.
    check(unsafe { libc::unlink(name.as_ptr()) }, "unlink")?;
    counts.0[7] += 1;
    Ok(())
}

fn check(ret: i32, call: &str) -> Result<i32> {
    if ret < 0 {
        Err(io::Error::last_os_error()).context(call.to_owned())
    } else {
        Ok(ret)
    }
}

/// User + system time of the calling process so far.
pub fn own_cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is valid, and getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Resource use of this process and the workers it reaped.
struct Usage {
    cpu_seconds: f64,
    maxrss_kb: i64,
    nvcsw: i64,
}

impl Usage {
    fn of_self_and_children() -> Usage {
        let get = |who| {
            // SAFETY: an all-zero rusage is valid, and getrusage fills it.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: `usage` is a valid, writable rusage.
            unsafe { libc::getrusage(who, &mut usage) };
            usage
        };
        let (me, children) = (get(libc::RUSAGE_SELF), get(libc::RUSAGE_CHILDREN));
        Usage {
            cpu_seconds: [me, children]
                .iter()
                .map(|u| seconds(u.ru_utime) + seconds(u.ru_stime))
                .sum(),
            maxrss_kb: me.ru_maxrss.max(children.ru_maxrss),
            nvcsw: me.ru_nvcsw + children.ru_nvcsw,
        }
    }
}

fn seconds(tv: libc::timeval) -> f64 {
    tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6
}
