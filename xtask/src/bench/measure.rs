//! Running one process and measuring it: wall time, CPU and context switches from `wait4`, its
//! own peak memory, and what it printed.
use std::{
    fs::File,
    io::{BufRead, BufReader, Write},
    os::unix::fs::FileExt,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// How often the process's peak memory is sampled.
const RSS_POLL: Duration = Duration::from_millis(10);

/// A process started by [`Running::spawn`].
pub struct Running {
    child: Child,
    started: Instant,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Lines already taken by `wait_for_line`, kept for `Finished::stdout`.
    taken: Vec<String>,
    stdout: JoinHandle<()>,
    stderr: Arc<Stderr>,
    stderr_reader: JoinHandle<()>,
    peak_kb: Arc<AtomicU64>,
    poller: JoinHandle<()>,
}

/// A process's stderr as it arrives, for waiting on a line while it runs.
#[derive(Default)]
struct Stderr {
    state: Mutex<StderrState>,
    grew: Condvar,
}

#[derive(Default)]
struct StderrState {
    text: String,
    /// The process closed it: it has ended, or will print nothing more.
    closed: bool,
}

impl Stderr {
    fn read_from(&self, err: impl std::io::Read) {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let mut state = self.lock();
            state.text.push_str(&line);
            state.text.push('\n');
            self.grew.notify_all();
        }
        self.lock().closed = true;
        self.grew.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, StderrState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn take(&self) -> String {
        std::mem::take(&mut self.lock().text)
    }
}

/// A process that has exited.
pub struct Finished {
    pub wall_seconds: f64,
    /// When the process was reaped.
    pub exited_at: Instant,
    /// The raw `wait4` status.
    pub status: i32,
    /// User + system time of the process alone (its threads included), to 10 ms.
    pub own_cpu_seconds: f64,
    /// Voluntary context switches of the process and every descendant it waited for.
    pub nvcsw: i64,
    /// The process's own peak resident set (`VmHWM`), without its children. If it ended
    /// before the first sample, `ru_maxrss`, the largest peak of it and its waited-for
    /// descendants.
    pub peak_rss_kb: u64,
    pub stdout: Vec<String>,
    pub stderr: String,
}

impl Finished {
    pub fn success(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }

    pub fn describe_status(&self) -> String {
        if libc::WIFEXITED(self.status) {
            format!("exit status {}", libc::WEXITSTATUS(self.status))
        } else if libc::WIFSIGNALED(self.status) {
            format!("killed by signal {}", libc::WTERMSIG(self.status))
        } else {
            format!("wait status {:#x}", self.status)
        }
    }
}

impl Running {
    /// Starts `command` with stdout and stderr captured; stdin is a pipe if `stdin_pipe`,
    /// otherwise /dev/null.
    pub fn spawn(command: &mut Command, stdin_pipe: bool) -> Result<Running> {
        command
            .stdin(if stdin_pipe {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {command:?}"))?;
        let pid = child.id();
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let (send, lines) = mpsc::channel();
        let stdout = thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Stderr::default());
        let stderr_reader = {
            let stderr = stderr.clone();
            thread::spawn(move || stderr.read_from(err))
        };
        let peak_kb = Arc::new(AtomicU64::new(0));
        let poller = {
            let peak_kb = peak_kb.clone();
            // Opened once: the open file stays bound to this process, so a later pid reuse
            // cannot make us read another's status. Reads fail once it is a zombie.
            let status = File::open(format!("/proc/{pid}/status")).ok();
            thread::spawn(move || {
                if let Some(status) = status {
                    poll_peak_rss(&status, &peak_kb);
                }
            })
        };
        Ok(Running {
            child,
            started,
            stdin,
            lines,
            taken: Vec::new(),
            stdout,
            stderr,
            stderr_reader,
            peak_kb,
            poller,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the next stdout line for which `wanted` holds, or for stdout to close.
    pub fn wait_for_line(&mut self, wanted: impl Fn(&str) -> bool) -> Option<String> {
        for line in self.lines.iter() {
            self.taken.push(line.clone());
            if wanted(&line) {
                return Some(line);
            }
        }
        None
    }

    /// Waits until a line of stderr contains `wanted`; fails, with what it printed, when the
    /// process closes stderr (it has ended) or `timeout` passes first.
    pub fn wait_for_stderr(&self, wanted: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut state = self.stderr.lock();
        loop {
            if state.text.lines().any(|line| line.contains(wanted)) {
                return Ok(());
            }
            let pid = self.pid();
            if state.closed {
                bail!("pid {pid} ended before printing {wanted:?}: {}", state.text);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "pid {pid} printed no {wanted:?} in {timeout:?}: {}",
                    state.text
                );
            }
            state = self
                .stderr
                .grew
                .wait_timeout(state, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    pub fn send_line(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin is not a pipe")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Reaps the process with `wait4`, for its resource use.
    pub fn finish(mut self) -> Result<Finished> {
        self.stdin = None;
        let pid = self.child.id() as libc::pid_t;
        let own_cpu_seconds = own_cpu_at_exit(pid)?;
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let reaped = loop {
            // SAFETY: reaping our own child; std's `Child` is not waited on afterwards.
            let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            if r == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
                continue;
            }
            break r;
        };
        let exited_at = Instant::now();
        let wall_seconds = exited_at.duration_since(self.started).as_secs_f64();
        if reaped != pid {
            bail!("wait4: {}", std::io::Error::last_os_error());
        }
        // A tracer's probes stay attached until its detacher has let them go: the next run
        // must not pay for them.
        wait_for_background_detach()?;
        let _ = self.poller.join();
        let _ = self.stdout.join();
        let mut stdout = std::mem::take(&mut self.taken);
        stdout.extend(self.lines.try_iter());
        let _ = self.stderr_reader.join();
        let stderr = self.stderr.take();
        Ok(Finished {
            exited_at,
            wall_seconds,
            status,
            own_cpu_seconds,
            nvcsw: usage.ru_nvcsw,
            peak_rss_kb: match self.peak_kb.load(Ordering::Relaxed) {
                0 => usage.ru_maxrss as u64,
                sampled => sampled,
            },
            stdout,
            stderr,
        })
    }
}

/// Waits for `pid` to exit without reaping it, and reads its own CPU time from the zombie's
/// `/proc/PID/stat` (`utime` + `stime`). `wait4`'s figure includes the children it reaped, and
/// not every tracer reaps the command it runs (perf trace does not), so it cannot be used to
/// tell the tracer's time from the workload's.
fn own_cpu_at_exit(pid: libc::pid_t) -> Result<f64> {
    loop {
        // SAFETY: an all-zero siginfo is valid; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waiting on our own child, leaving it a zombie (WNOWAIT).
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            break;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error).context("waitid");
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may hold spaces: state is
    // field 3, utime and stime fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<f64>().ok());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    match (ticks(14), ticks(15)) {
        (Some(user), Some(system)) => Ok((user + system) / hz),
        _ => bail!("unreadable /proc/{pid}/stat: {stat}"),
    }
}

/// Samples `VmHWM` (a high-water mark, so sampling misses at most the last interval's growth)
/// until the process is gone.
fn poll_peak_rss(status: &File, peak_kb: &AtomicU64) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok(n) = status.read_at(&mut buf, 0) else {
            return;
        };
        let text = String::from_utf8_lossy(&buf[..n]);
        let Some(kb) = text
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        else {
            return; // a zombie: its memory is gone
        };
        peak_kb.fetch_max(kb, Ordering::Relaxed);
        thread::sleep(RSS_POLL);
    }
}

/// Waits until no `shmtrace-detach` process is left (shmtrace hands its probes to one to let
/// the kernel release them while it exits), and says how long that took.
pub fn wait_for_background_detach() -> Result<Duration> {
    let started = Instant::now();
    while detachers_running() {
        if started.elapsed() > Duration::from_secs(30) {
            bail!("a shmtrace-detach process still runs 30 s after shmtrace exited");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(started.elapsed())
}

fn detachers_running() -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
            // A zombie has let go of everything already.
            stat.contains("(shmtrace-detach) ") && !stat.contains("(shmtrace-detach) Z")
        })
    })
}
