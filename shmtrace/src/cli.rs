//! Command-line interface. Every flag is documented here, where it is defined; `--help` is the
//! manual.
use std::{ffi::OsString, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

use shmtrace_core::diagnose::RoleKind;

/// Parses the command line as [`Cli::parse`] does, and exits the same way on an error; a
/// misspelt subcommand (`shmtrace reprot`) gets the subcommand it resembles, which clap does
/// not offer here (anything may follow as the command to trace). `--help` starts with which
/// source a trace would use here.
pub fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let args: Vec<OsString> = std::env::args_os().collect();
    let parsed = Cli::command()
        .before_help(crate::mode_here())
        .try_get_matches_from(&args)
        .and_then(|matches| Cli::from_arg_matches(&matches));
    match parsed {
        Ok(cli) => cli,
        Err(error) => {
            if error.kind() == clap::error::ErrorKind::UnknownArgument
                && let Some(word) = args.get(1).and_then(|a| a.to_str())
                && let Some(near) = similar_subcommand(word)
            {
                eprintln!(
                    "shmtrace: error: no command {word:?}; did you mean `shmtrace {near}`? \
                     (a program to trace goes after --: shmtrace -- {word} ...)"
                );
                std::process::exit(2);
            }
            error.exit()
        }
    }
}

/// The visible subcommand `word` is a slip of (at most two letters off), if any.
fn similar_subcommand(word: &str) -> Option<String> {
    use clap::CommandFactory;
    if word.starts_with('-') {
        return None;
    }
    Cli::command()
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().to_owned())
        .map(|name| (strsim::damerau_levenshtein(word, &name), name))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, name)| name)
}

/// Explain why programs in containers run out of shared memory.
///
/// shmtrace follows every /dev/shm object a process creates, sizes, maps and removes (and System
/// V shared memory), with eBPF probes in the kernel, and shows each failure as it happens:
/// fallocate or write returning ENOSPC, SIGBUS from touching a page of a full /dev/shm, a
/// DataLoader worker killed by a signal. When something fails it says which process, why, and
/// what /dev/shm size to set.
///
/// Examples:
///   sudo shmtrace --container trainer       every process of a container, by name
///   sudo shmtrace -- python train.py        trace a command and its children
///   sudo shmtrace --pid 4242                trace a running process tree
///   sudo shmtrace --all --failed            every /dev/shm failure on the host
///   sudo shmtrace record -o t.shmtrace --container trainer    record, then:
///   shmtrace report t.shmtrace              the diagnosis, from the file
///   sudo shmtrace size --container trainer  the /dev/shm size it needs, measured
///   sudo shmtrace demo                      see it explain a real failure, no setup needed
#[derive(Parser, Debug)]
#[command(name = "shmtrace", version, verbatim_doc_comment)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub target: TargetArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Record a trace to a file, to look at later or attach to a bug report.
    ///
    /// Takes the same target options as live tracing. Prints diagnoses as they happen and a
    /// summary at the end; the file holds every event; on a terminal, a status line (events,
    /// /dev/shm use, peak so far) shows it recording. Writing is crash-safe: if shmtrace is
    /// killed, everything up to the last flush (at most 100 ms earlier) reads back.
    Record(RecordArgs),
    /// Print the diagnosis and summary of a recorded trace.
    Report(ReportArgs),
    /// Replay the events of a recorded trace, as live tracing shows them.
    Show(ShowArgs),
    /// Measure how much /dev/shm a workload needs, and the size to give it.
    ///
    /// Runs a command (`-- CMD`) or watches processes (`--pid`) or containers (`--container`)
    /// while they work, on a /dev/shm roomy enough for them, and prints the peak of /dev/shm
    /// memory allocated at once (pages, not nominal sizes), per /dev/shm and per role; the
    /// moment of the peak and what was live then; and the size to set, in docker, compose and
    /// Kubernetes terms, reached as one line says. Diagnoses of any failure go to stderr.
    ///
    /// Exit status: the command's (130 after Ctrl-C without one). With --budget it is a CI
    /// gate, and the status is the verdict, never the command's: 0 fits, 3 does not fit,
    /// 4 fits but the command failed, 5 not measured (processes failed for lack of /dev/shm:
    /// the peak is what fitted); the command's own status is printed (`command` line,
    /// `command.exit_code` and `command.signal` with --json).
    ///
    /// On a terminal, a status line (events, /dev/shm use, peak so far) shows it is measuring.
    ///
    /// Examples:
    ///   sudo shmtrace size -- python train.py
    ///   sudo shmtrace size --budget 1g --container trainer
    ///   shmtrace report --size run.shmtrace          the same, from a recording
    #[command(verbatim_doc_comment)]
    Size(SizeArgs),
    /// Check the /dev/shm this process sees, without tracing and without privileges.
    ///
    /// In well under a second: its size, use, inodes and mount options, and whether it is the
    /// container's own tmpfs, one mounted there (the host's, an emptyDir) or missing; the
    /// memory limit of this cgroup (v1 or v2), the /dev/shm pages it already counts, and which
    /// limit a workload meets first (ENOSPC, or the OOM killer when the memory limit is
    /// smaller); `ulimit -n` and `-l`; the files in /dev/shm by memory held, with the
    /// processes that hold them, so leftovers are named; the runtime or platform, with the fix
    /// in its terms.
    ///
    /// Exit status: 0, or with --min 3 when /dev/shm (or what the memory limit leaves of it)
    /// is smaller than SIZE, or cannot be written.
    ///
    /// Examples:
    ///   shmtrace check
    ///   shmtrace check --min 2g && python train.py      in an entrypoint
    ///   shmtrace check --json
    #[command(verbatim_doc_comment)]
    Check(CheckArgs),
    /// Run as a node agent: trace every container on the host, for weeks, in bounded memory.
    ///
    /// Serves Prometheus metrics (/metrics) and a health check (/healthz) on --listen, writes
    /// every failure and diagnosis to stdout as one JSON line (docs/json.md), and with
    /// --record-dir keeps a flight recording of each incident that `shmtrace report` reads.
    /// See docs/fleet.md.
    Daemon(DaemonArgs),
    /// Run a built-in workload that exhausts a tiny private /dev/shm, and trace it.
    ///
    /// It needs no container: it makes a private mount namespace with a 1 MiB /dev/shm, runs a
    /// PyTorch-like DataLoader whose workers fail both ways real ones do (fallocate ENOSPC, and
    /// SIGBUS while writing a mapping), shows the trace and the diagnosis, and leaves nothing
    /// behind.
    Demo {
        #[command(flatten)]
        output: OutputArgs,
    },
    /// The demo's workload (runs inside the demo's private namespace).
    #[command(hide = true, name = "__demo-workload")]
    DemoWorkload,
}

/// What to trace.
#[derive(Args, Debug, Default, Clone)]
pub struct TargetArgs {
    /// Trace every process of these containers, by exact name: those running now, those
    /// started later (docker exec), and their children, following restarts. Docker, Podman,
    /// containerd and CRI-O are asked; with none answering, /proc is scanned. Repeat the flag
    /// or separate names with commas.
    #[arg(short, long, value_name = "NAME", value_delimiter = ',', conflicts_with_all = ["pid", "all"])]
    pub container: Vec<String>,

    /// Trace running processes (and their descendants, present and future).
    /// Repeat the flag or separate pids with commas.
    #[arg(short, long, value_name = "PID", value_delimiter = ',')]
    pub pid: Vec<u32>,

    /// Trace /dev/shm use by every process on the host, each labelled with its container.
    #[arg(short, long, conflicts_with = "pid")]
    pub all: bool,

    /// Like --container, by container id or a unique prefix of it.
    #[arg(long, value_name = "ID", value_delimiter = ',', conflicts_with_all = ["pid", "all"])]
    pub container_id: Vec<String>,

    /// Kubernetes: only the containers of this pod.
    #[arg(long, value_name = "POD")]
    pub pod: Option<String>,

    /// Kubernetes: only pods in this namespace.
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Wait for a container that is not running (or does not exist yet) to start.
    #[arg(long)]
    pub wait: bool,

    /// Ask the Docker (or Podman) daemon at this socket instead of the usual places
    /// (DOCKER_HOST, /var/run/docker.sock, /run/docker.sock, Podman's sockets).
    #[arg(long, value_name = "PATH")]
    pub docker_socket: Option<PathBuf>,

    /// Show only failures: failed calls, fatal signals, abnormal exits, OOM kills.
    /// Successful data-path calls (write, ftruncate, fallocate, close) are dropped in the
    /// kernel, which also makes tracing cheaper.
    #[arg(long)]
    pub failed: bool,

    /// Kernel ring buffer size, in bytes (suffixes K, M, G). A power of two. Raise it if events
    /// are reported lost. shmtrace's resident memory counts it twice (the kernel maps its pages
    /// twice), so it is kept small for a trace; the daemon's default is 16M.
    #[arg(long, value_name = "BYTES", default_value = "8M", value_parser = parse_size)]
    pub buffer_size: u32,

    /// Read the kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux.
    #[arg(
        long,
        value_name = "FILE",
        hide = true,
        default_value = "/sys/kernel/btf/vmlinux"
    )]
    pub kernel_btf: PathBuf,

    /// Where events come from: eBPF probes in the kernel (root, or CAP_BPF and CAP_PERFMON),
    /// or ptrace with seccomp filters (no privilege: a command and its children, or your own
    /// processes with --pid). `auto` uses the probes where they load, else ptrace, and says
    /// so. See docs/unprivileged.md for what each sees.
    #[arg(long, value_enum, value_name = "SOURCE", default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,

    /// The command to run and trace, with its arguments, after `--`.
    /// shmtrace exits with the command's exit status. SIGINT, SIGTERM or SIGHUP sent to
    /// shmtrace alone (docker stop, a CI timeout) is passed on to the command; the trace waits
    /// up to 5 s for it to exit, then ends with its result.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// How to show what happened.
#[derive(Args, Debug, Default, Clone)]
pub struct OutputArgs {
    /// Write one JSON object per line (schema: docs/json.md) instead of text.
    #[arg(long)]
    pub json: bool,

    /// Write the output to FILE instead of the terminal. Without it, output goes to stdout;
    /// when a command is traced it goes to stderr, like strace, so that the command's own
    /// output stays separate.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// When to use colour.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,

    /// Show every event: also POSIX semaphores (/dev/shm/sem.*, a page each) and processes
    /// that touched no /dev/shm object, failed nothing and started none that did (a shell's
    /// sleep, a compiler Python runs to find a library). Without it, each of the two is one
    /// line of the summary. JSON output always has every event.
    #[arg(long)]
    pub show_all: bool,

    /// Also print shmtrace's own diagnostics.
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// The trace file to write. With --max-size or --on-failure, files are numbered:
    /// FILE.000000.shmtrace, FILE.000001.shmtrace, ...
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,

    /// Compress the file (zstd). Crash safety is kept: each flush is a complete frame.
    #[arg(long)]
    pub compress: bool,

    /// Start a new file when this one would grow past SIZE (suffixes K, M, G).
    #[arg(long, value_name = "SIZE", value_parser = shmtrace_core::units::parse)]
    pub max_size: Option<u64>,

    /// With --max-size: keep only the newest N files.
    #[arg(long, value_name = "N", requires = "max_size")]
    pub keep: Option<u32>,

    /// Flight recorder: keep the last --window seconds in memory, and write a file only when
    /// something fails (ENOSPC, SIGBUS, a worker's death), with the seconds before it and
    /// --tail seconds after. Recording goes on; later failures write later files.
    #[arg(long, conflicts_with = "max_size")]
    pub on_failure: bool,

    /// With --on-failure: seconds of history kept in memory.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 30.0,
        requires = "on_failure"
    )]
    pub window: f64,

    /// With --on-failure: seconds recorded after the failure.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 5.0,
        requires = "on_failure"
    )]
    pub tail: f64,

    /// Write diagnoses and the summary as JSON lines.
    #[arg(long)]
    pub json: bool,

    /// When to use colour.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,

    /// Also print shmtrace's own diagnostics.
    #[arg(short, long)]
    pub verbose: bool,

    #[command(flatten)]
    pub target: TargetArgs,
}

/// `shmtrace size`.
#[derive(Args, Debug)]
pub struct SizeArgs {
    #[command(flatten)]
    pub size: SizeOptions,

    /// Write the result as one JSON object.
    #[arg(long)]
    pub json: bool,

    /// Write the result to FILE instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Log what shmtrace does (probes, containers found) to stderr.
    #[arg(short, long)]
    pub verbose: bool,

    #[command(flatten)]
    pub target: TargetArgs,
}

/// What `size` and `report --size` share.
#[derive(Args, Debug, Default, Clone)]
pub struct SizeOptions {
    /// Fail (exit status 3) when the peak plus headroom, rounded as advised, is bigger than
    /// SIZE: 512m, 1g, 1Gi, 67108864. Then the exit status is the verdict: 0 fits, 3 does not
    /// fit, 4 fits but the traced command failed (its status is printed), 5 not measured:
    /// processes ran out of /dev/shm, so the peak is only what fitted.
    #[arg(long, value_name = "SIZE", value_parser = parse_budget)]
    pub budget: Option<u64>,
}

/// `shmtrace check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Exit with status 3 when /dev/shm is smaller than SIZE (512m, 2g, 2Gi), or when the
    /// memory limit leaves it less than SIZE, or when it cannot be written.
    #[arg(long, value_name = "SIZE", value_parser = parse_budget)]
    pub min: Option<u64>,

    /// Write the facts as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// Serve /metrics (Prometheus text format) and /healthz at this address. Use
    /// 0.0.0.0:9184 to be scraped from other machines.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9184")]
    pub listen: std::net::SocketAddr,

    /// Keep a flight recording of each incident (ENOSPC, SIGBUS, a worker's death) in DIR,
    /// one file per incident: the --window seconds before it and --tail seconds after.
    /// `shmtrace report FILE` reads them.
    #[arg(long, value_name = "DIR")]
    pub record_dir: Option<PathBuf>,

    /// Most bytes the recordings in --record-dir may take; the oldest are deleted first.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = shmtrace_core::units::parse)]
    pub record_quota: u64,

    /// Seconds of history kept in memory for a recording.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    pub window: f64,

    /// Seconds recorded after an incident.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub tail: f64,

    /// How long the series of a container that is gone stay (suffix s, m or h): long enough
    /// for Prometheus to scrape its last values and for alerts on it to fire.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = parse_duration)]
    pub retain: std::time::Duration,

    /// How often the runtimes are asked which containers run, and /dev/shm use is measured.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub interval: std::time::Duration,

    /// How long the analysis keeps a process after it exits (suffix s, m or h): a diagnosis
    /// that follows a death (a trainer's, after its DataLoader worker's) needs it. Then it is
    /// forgotten, so that memory stays bounded over weeks.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub forget_after: std::time::Duration,

    /// Ask the Docker (or Podman) daemon at this socket instead of the usual places.
    #[arg(long, value_name = "PATH")]
    pub docker_socket: Option<PathBuf>,

    /// Ask the CRI runtime (containerd, CRI-O) at this socket too. Repeat for several.
    #[arg(long, value_name = "PATH")]
    pub cri_socket: Vec<PathBuf>,

    /// Kernel ring buffer size, in bytes (suffixes K, M, G). A power of two.
    #[arg(long, value_name = "BYTES", default_value = "16M", value_parser = parse_size)]
    pub buffer_size: u32,

    /// Read the kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux.
    #[arg(
        long,
        value_name = "FILE",
        hide = true,
        default_value = "/sys/kernel/btf/vmlinux"
    )]
    pub kernel_btf: PathBuf,

    /// Also print shmtrace's own diagnostics.
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A trace file (or the first file of a rotated set).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Write diagnoses and the summary as JSON lines.
    #[arg(long)]
    pub json: bool,

    /// Write a copy of the trace that is safe to attach publicly: host names, container ids,
    /// image names, command lines and paths outside /dev/shm become stable pseudonyms.
    /// Needs -o.
    #[arg(long, requires = "output")]
    pub redact: bool,

    /// Where to write: the report (default: stdout), or with --redact the redacted trace.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Also write a self-contained HTML page: /dev/shm use over time against its size, a lane
    /// per process with each /dev/shm object it held, failures and deaths marked, and the
    /// diagnosis. It has no script and fetches nothing, so it can be attached to a bug report
    /// (docs/reports.md).
    #[arg(long, value_name = "FILE", conflicts_with = "redact")]
    pub html: Option<PathBuf>,

    /// Also write the trace in Chrome's trace event format (JSON), for Perfetto or
    /// chrome://tracing: processes, holds of /dev/shm objects as slices, failures and deaths as
    /// instants, /dev/shm use as counters.
    #[arg(long, value_name = "FILE", conflicts_with = "redact")]
    pub perfetto: Option<PathBuf>,

    /// With --html or --perfetto: draw POSIX semaphores (/dev/shm/sem.*, a page each) too;
    /// without it their holds are counted, not drawn.
    #[arg(long)]
    pub show_all: bool,

    /// When to use colour.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,

    /// Print what `shmtrace size` prints for this trace (peak, advised size) instead of the
    /// summary; diagnoses go to stderr.
    #[arg(long, conflicts_with_all = ["redact", "html", "perfetto"])]
    pub size: bool,

    /// With --size: fail (exit status 3) when the peak plus headroom does not fit SIZE.
    #[arg(long, value_name = "SIZE", requires = "size", value_parser = parse_budget)]
    pub budget: Option<u64>,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// A trace file (or the first file of a rotated set).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Only these processes. Repeat or separate with commas.
    #[arg(short, long, value_name = "PID", value_delimiter = ',')]
    pub pid: Vec<u32>,

    /// Only processes in these roles.
    #[arg(long, value_name = "ROLE", value_delimiter = ',', value_parser = parse_role)]
    pub role: Vec<RoleKind>,

    /// Only these events: syscall names (fallocate, openat, ...), signal, fork, exec, exit,
    /// rename, oom_kill.
    #[arg(long, value_name = "EVENT", value_delimiter = ',')]
    pub event: Vec<String>,

    /// Only events in these containers (by name), or `host`.
    #[arg(short, long, value_name = "NAME", value_delimiter = ',')]
    pub container: Vec<String>,

    /// Only failures: failed calls, fatal signals, abnormal exits, OOM kills.
    #[arg(long)]
    pub failed: bool,

    /// Only events from this time on: seconds after the trace started (`12.5`), or a time
    /// (`2026-11-29T16:51:37Z`).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,

    /// Only events before this time (same forms as --since).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// `--backend`.
#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The probes where they load, else ptrace.
    #[default]
    Auto,
    /// eBPF probes in the kernel.
    Ebpf,
    /// ptrace with seccomp filters, unprivileged.
    Ptrace,
}

#[derive(ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ColorWhen {
    /// On a terminal, unless NO_COLOR is set.
    #[default]
    Auto,
    Always,
    Never,
}

impl ColorWhen {
    /// Whether to colour output going to a destination that is (or is not) a terminal.
    pub fn enabled(self, terminal: bool) -> bool {
        match self {
            ColorWhen::Always => true,
            ColorWhen::Never => false,
            ColorWhen::Auto => {
                terminal
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::env::var("TERM").map_or(true, |t| t != "dumb")
            }
        }
    }
}

/// `16M`, `512K`, `4096`.
fn parse_size(text: &str) -> Result<u32, String> {
    let bytes = shmtrace_core::units::parse(text)?;
    u32::try_from(bytes).map_err(|_| format!("{text} is too large (at most 2G)"))
}

/// A size in docker's (`512m`) or Kubernetes' (`512Mi`) terms.
fn parse_budget(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let docker_like = trimmed
        .strip_suffix("iB")
        .or_else(|| trimmed.strip_suffix('i'))
        .or_else(|| trimmed.strip_suffix('B'))
        .unwrap_or(trimmed);
    shmtrace_core::units::parse(docker_like)
        .map_err(|_| format!("{text:?} is not a size like 512m, 1g or 1Gi"))
}

/// `90`, `90s`, `15m`, `2h`, `0.5s`.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last() {
        Some((i, 's')) => (&text[..i], 1.0),
        Some((i, 'm')) => (&text[..i], 60.0),
        Some((i, 'h')) => (&text[..i], 3600.0),
        _ => (text, 1.0),
    };
    number
        .parse::<f64>()
        .ok()
        .and_then(|n| std::time::Duration::try_from_secs_f64(n * unit).ok())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{text:?} is not a duration like 30s, 15m or 2h"))
}

fn parse_role(text: &str) -> Result<RoleKind, String> {
    Ok(match text {
        "trainer" => RoleKind::Trainer,
        "worker" | "dataloader_worker" => RoleKind::DataloaderWorker,
        "pin" | "pin_memory" => RoleKind::PinMemory,
        "shm_manager" => RoleKind::ShmManager,
        "nccl" => RoleKind::Nccl,
        "multiprocessing" | "python_multiprocessing" => RoleKind::PythonMultiprocessing,
        "other" => RoleKind::Other,
        _ => {
            return Err(format!(
                "{text:?} is not a role: trainer, worker, pin, shm_manager, nccl, \
                 multiprocessing, other"
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_misspelt_subcommand_is_named() {
        assert_eq!(similar_subcommand("reprot").as_deref(), Some("report"));
        assert_eq!(similar_subcommand("szie").as_deref(), Some("size"));
        assert_eq!(similar_subcommand("python"), None);
        assert_eq!(similar_subcommand("--reprot"), None);
        assert!(Cli::try_parse_from(["shmtrace", "reprot", "t.shmtrace"]).is_err());
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("8G").is_err());
        assert_eq!(shmtrace_core::units::parse("8G"), Ok(8 << 30));
    }

    #[test]
    fn takes_a_command_after_the_separator() {
        let cli =
            Cli::try_parse_from(["shmtrace", "--failed", "--", "python", "-c", "pass"]).unwrap();
        assert!(cli.target.failed);
        assert_eq!(cli.target.command, ["python", "-c", "pass"]);
        let cli = Cli::try_parse_from(["shmtrace", "--pid", "1,2", "--pid", "3"]).unwrap();
        assert_eq!(cli.target.pid, [1, 2, 3]);
    }

    #[test]
    fn record_takes_target_options() {
        let cli = Cli::try_parse_from([
            "shmtrace",
            "record",
            "-o",
            "t.shmtrace",
            "--compress",
            "--",
            "python",
            "x.py",
        ])
        .unwrap();
        let Some(Command::Record(record)) = cli.command else {
            panic!("not record")
        };
        assert!(record.compress);
        assert_eq!(record.target.command, ["python", "x.py"]);
        assert!(Cli::try_parse_from(["shmtrace", "report", "t", "--redact"]).is_err());
        // Pictures are drawn from a trace, not from the act of redacting it.
        assert!(
            Cli::try_parse_from([
                "shmtrace", "report", "t", "--redact", "-o", "r", "--html", "r.html"
            ])
            .is_err()
        );
        let cli = Cli::try_parse_from([
            "shmtrace",
            "report",
            "t",
            "--html",
            "r.html",
            "--perfetto",
            "t.json",
        ])
        .unwrap();
        let Some(Command::Report(report)) = cli.command else {
            panic!("not report")
        };
        assert_eq!(report.html.as_deref(), Some(std::path::Path::new("r.html")));
        assert_eq!(
            report.perfetto.as_deref(),
            Some(std::path::Path::new("t.json"))
        );
    }
}
