//! The `shmtrace` command; everything it does is in the library (`lib.rs`).
use std::process::ExitCode;

use shmtrace::cli;

fn main() -> ExitCode {
    match shmtrace::run(cli::parse()) {
        Ok(code) => code,
        // The reader of the output went away (`| head -1`): end quietly, with the status of
        // a tool killed by SIGPIPE, as other command-line tools do.
        Err(error) if broken_pipe(&error) => ExitCode::from(128 + libc::SIGPIPE as u8),
        Err(error) => {
            eprintln!("shmtrace: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
