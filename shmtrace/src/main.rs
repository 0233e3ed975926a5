//! The `shmtrace` command; everything it does is in the library (`lib.rs`).
use std::process::ExitCode;

use clap::Parser;
use shmtrace::cli::Cli;

fn main() -> ExitCode {
    match shmtrace::run(Cli::parse()) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("shmtrace: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
