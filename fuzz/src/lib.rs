//! shmtrace's sources compiled as a library, so that the fuzz targets can reach the parsers
//! inside it; the module list is main.rs's. `cfg(fuzzing)` (set by `cargo fuzz`) opens the
//! entry points the targets call (`fuzzing` modules next to each parser).
#![allow(dead_code, unused_imports, unused_macros, clippy::all)]

#[path = "../../shmtrace/src/bpf/mod.rs"]
mod bpf;
#[path = "../../shmtrace/src/cli.rs"]
mod cli;
#[path = "../../shmtrace/src/commands/mod.rs"]
mod commands;
#[path = "../../shmtrace/src/container/mod.rs"]
pub mod container;
#[path = "../../shmtrace/src/demo.rs"]
mod demo;
#[path = "../../shmtrace/src/diagnose/mod.rs"]
mod diagnose;
#[path = "../../shmtrace/src/event/mod.rs"]
pub mod event;
#[path = "../../shmtrace/src/model/mod.rs"]
mod model;
#[path = "../../shmtrace/src/output/mod.rs"]
mod output;
#[path = "../../shmtrace/src/pipeline.rs"]
mod pipeline;
#[path = "../../shmtrace/src/proc_scan.rs"]
pub mod proc_scan;
#[path = "../../shmtrace/src/record/mod.rs"]
pub mod record;
#[path = "../../shmtrace/src/report/mod.rs"]
mod report;
#[path = "../../shmtrace/src/session.rs"]
mod session;
#[path = "../../shmtrace/src/target/mod.rs"]
mod target;
#[path = "../../shmtrace/src/watch.rs"]
mod watch;
