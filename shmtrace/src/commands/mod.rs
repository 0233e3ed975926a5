//! One module per subcommand; what the live ones (trace, record, demo) share is
//! `crate::live::launch`.
pub mod check;
pub mod demo;
pub mod record;
pub mod replay;
pub mod size;
pub mod trace;

#[cfg(test)]
mod escape_tests;

use std::{
    io::{self, IsTerminal},
    path::Path,
};

use anyhow::{Context, Result};

use crate::cli::{ColorWhen, OutputArgs};
use shmtrace_core::{
    clock::Clock,
    output::{Format, Output},
    safe_open::{self, FileId, OpenOptions},
};

/// Where output goes when no file is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultStream {
    Stdout,
    /// A traced command owns stdout: keep out of its way, like strace.
    Stderr,
}

/// Opens the output: a file, or a standard stream.
pub fn open_output(
    path: Option<&Path>,
    json: bool,
    color: ColorWhen,
    default: DefaultStream,
    clock: Clock,
) -> Result<Output> {
    open_output_not_over(path, json, color, default, clock, &[])
}

/// Bytes of output gathered before a write: a replay writes lines at hundreds of MB/s, and
/// with the default 8 KiB every twentieth line was a system call.
const OUTPUT_BUFFER: usize = 64 * 1024;

/// [`open_output`], refusing to write over any of `inputs` (the trace being read).
pub fn open_output_not_over(
    path: Option<&Path>,
    json: bool,
    color: ColorWhen,
    default: DefaultStream,
    clock: Clock,
    inputs: &[FileId],
) -> Result<Output> {
    let name = match path {
        Some(path) => path.display().to_string(),
        None if default == DefaultStream::Stderr => "standard error".to_owned(),
        None => "standard output".to_owned(),
    };
    let (writer, terminal, to_file): (Box<dyn io::Write + Send>, bool, bool) = match path {
        Some(path) => {
            // `-o /dev/stdout` writes to what the shell opened, without truncating it.
            let file = safe_open::create(path, &OpenOptions::new().not_over(inputs))
                .context("cannot write the output (-o)")?;
            let terminal = file.is_terminal();
            (
                Box::new(io::BufWriter::with_capacity(OUTPUT_BUFFER, file)),
                terminal,
                !safe_open::is_stdio(path),
            )
        }
        // Buffered: the session flushes after each batch of records, so a burst costs a few
        // writes, not one per line.
        None if default == DefaultStream::Stderr => (
            Box::new(io::BufWriter::new(io::stderr())),
            io::stderr().is_terminal(),
            false,
        ),
        None => (
            Box::new(io::BufWriter::with_capacity(OUTPUT_BUFFER, io::stdout())),
            io::stdout().is_terminal(),
            false,
        ),
    };
    let format = if json {
        Format::Json
    } else {
        Format::Human(color.enabled(terminal))
    };
    Ok(Output::named(writer, &name, format, clock, to_file))
}

pub fn open_output_args(args: &OutputArgs, default: DefaultStream, clock: Clock) -> Result<Output> {
    let mut output = open_output(
        args.output.as_deref(),
        args.json,
        args.color,
        default,
        clock,
    )?;
    if args.show_all {
        output.show_all();
    }
    Ok(output)
}

pub fn init_logging(verbose: bool) {
    let level = if verbose { "debug" } else { "warn" };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_target(false)
        .try_init();
}
