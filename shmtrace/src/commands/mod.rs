//! One module per subcommand; what the live ones (trace, record, demo) share is
//! `crate::live::launch`.
pub mod demo;
pub mod record;
pub mod replay;
pub mod trace;

use std::{
    fs::File,
    io::{self, IsTerminal},
    path::Path,
};

use anyhow::{Context, Result};

use crate::{
    cli::{ColorWhen, OutputArgs},
    clock::Clock,
    output::{Format, Output},
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
    let (writer, terminal, to_file): (Box<dyn io::Write + Send>, bool, bool) = match path {
        Some(path) => {
            let text = path.to_string_lossy();
            let is_stdio = text.starts_with("/dev/std") || text.starts_with("/dev/fd/");
            // `-o /dev/stdout` must not truncate the file the shell redirected stdout to.
            let file = File::options()
                .write(true)
                .create(true)
                .truncate(!is_stdio)
                .open(path)
                .with_context(|| format!("cannot write the output to {}", path.display()))?;
            let terminal = file.is_terminal();
            (Box::new(io::BufWriter::new(file)), terminal, !is_stdio)
        }
        // Buffered: the session flushes after each batch of records, so a burst costs a few
        // writes, not one per line.
        None if default == DefaultStream::Stderr => (
            Box::new(io::BufWriter::new(io::stderr())),
            io::stderr().is_terminal(),
            false,
        ),
        None => (
            Box::new(io::BufWriter::new(io::stdout())),
            io::stdout().is_terminal(),
            false,
        ),
    };
    let format = if json {
        Format::Json
    } else {
        Format::Human(color.enabled(terminal))
    };
    Ok(Output::new(writer, format, clock, to_file))
}

pub fn open_output_args(args: &OutputArgs, default: DefaultStream, clock: Clock) -> Result<Output> {
    open_output(
        args.output.as_deref(),
        args.json,
        args.color,
        default,
        clock,
    )
}

pub fn init_logging(verbose: bool) {
    let level = if verbose { "debug" } else { "warn" };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_target(false)
        .try_init();
}
