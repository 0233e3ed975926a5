//! Command-line interface. Every flag is documented here, where it is defined; `--help` is the
//! manual.
use std::{ffi::OsString, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Explain why programs in containers run out of shared memory.
///
/// shmtrace follows every /dev/shm object a process creates, sizes, maps and removes (and System
/// V shared memory), with eBPF probes in the kernel, and shows each failure as it happens:
/// fallocate or write returning ENOSPC, SIGBUS from touching a page of a full /dev/shm, a
/// DataLoader worker killed by a signal.
///
/// Examples:
///   sudo shmtrace -- python train.py        trace a command and its children
///   sudo shmtrace --pid 4242                trace a running process tree
///   sudo shmtrace --all --failed            every /dev/shm failure on the host
///   sudo shmtrace demo                      see it explain a real failure, no setup needed
#[derive(Parser, Debug)]
#[command(name = "shmtrace", version, verbatim_doc_comment)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub trace: TraceArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a built-in workload that exhausts a tiny private /dev/shm, and trace it.
    ///
    /// It needs no container: it makes a private mount namespace with a 1 MiB /dev/shm, runs a
    /// PyTorch-like DataLoader whose workers fail both ways real ones do (fallocate ENOSPC, and
    /// SIGBUS while writing a mapping), shows the trace, and leaves nothing behind.
    Demo {
        #[command(flatten)]
        output: OutputArgs,
    },
    /// The demo's workload (runs inside the demo's private namespace).
    #[command(hide = true, name = "__demo-workload")]
    DemoWorkload,
}

#[derive(Args, Debug, Default)]
pub struct TraceArgs {
    /// Trace running processes (and their descendants, present and future).
    /// Repeat the flag or separate pids with commas.
    #[arg(short, long, value_name = "PID", value_delimiter = ',')]
    pub pid: Vec<u32>,

    /// Trace /dev/shm use by every process on the host, each labelled with its container.
    #[arg(short, long, conflicts_with = "pid")]
    pub all: bool,

    /// Show only failures: failed calls, fatal signals, abnormal exits, OOM kills.
    /// Successful data-path calls (write, ftruncate, fallocate, close) are dropped in the
    /// kernel, which also makes tracing cheaper.
    #[arg(long)]
    pub failed: bool,

    /// Kernel ring buffer size, in bytes (suffixes K, M, G). A power of two. Raise it if events
    /// are reported lost.
    #[arg(long, value_name = "BYTES", default_value = "16M", value_parser = parse_size)]
    pub buffer_size: u32,

    #[command(flatten)]
    pub output: OutputArgs,

    /// Read the kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux.
    #[arg(
        long,
        value_name = "FILE",
        hide = true,
        default_value = "/sys/kernel/btf/vmlinux"
    )]
    pub kernel_btf: std::path::PathBuf,

    /// The command to run and trace, with its arguments, after `--`.
    /// shmtrace exits with the command's exit status.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug, Default, Clone)]
pub struct OutputArgs {
    /// Write one JSON object per line (schema: docs/json.md) instead of text.
    #[arg(long)]
    pub json: bool,

    /// Write the trace to FILE instead of the terminal. Without it, the trace goes to stdout;
    /// when a command is traced it goes to stderr, like strace, so that the command's own
    /// output stays separate.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// When to use colour.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,

    /// Also print shmtrace's own diagnostics and the probes' kernel-side log.
    #[arg(short, long)]
    pub verbose: bool,
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
    let text = text.trim();
    let (digits, multiplier) = match text.char_indices().last() {
        Some((i, 'K' | 'k')) => (&text[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&text[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 16M, 512K or 4096"))?;
    let bytes = value
        .checked_mul(multiplier)
        .filter(|b| *b <= u32::MAX as u64)
        .ok_or_else(|| format!("{text} is too large (at most 2G)"))?;
    Ok(bytes as u32)
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
    fn parses_sizes() {
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("8G").is_err());
    }

    #[test]
    fn takes_a_command_after_the_separator() {
        let cli =
            Cli::try_parse_from(["shmtrace", "--failed", "--", "python", "-c", "pass"]).unwrap();
        assert!(cli.trace.failed);
        assert_eq!(cli.trace.command, ["python", "-c", "pass"]);
        let cli = Cli::try_parse_from(["shmtrace", "--pid", "1,2", "--pid", "3"]).unwrap();
        assert_eq!(cli.trace.pid, [1, 2, 3]);
    }
}
