//! The shmtrace binary's sources compiled as a library, so that the fuzz targets can reach the
//! parsers inside it (container runtimes' answers, /proc); the module list is main.rs's. The
//! analysis core is a library already (`shmtrace-core`). `cfg(fuzzing)`, set by `cargo fuzz`,
//! opens the entry points the targets call.
#![allow(dead_code, unused_imports, unused_macros, clippy::all)]

pub use shmtrace_core::{clock, diagnose, event, model, output, pipeline, record, report, size};

#[path = "../../shmtrace/src/cli.rs"]
mod cli;
#[path = "../../shmtrace/src/commands/mod.rs"]
mod commands;
#[path = "../../shmtrace/src/container/mod.rs"]
pub mod container;
#[path = "../../shmtrace/src/live/mod.rs"]
pub mod live;
