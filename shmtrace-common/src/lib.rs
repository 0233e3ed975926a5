//! Types shared by the eBPF programs and the `shmtrace` CLI.
//!
//! Everything here is `#[repr(C)]` and made only of integers and byte arrays, so any bit pattern
//! the kernel hands over is a valid value. Enumerations travel as plain integers; userspace turns
//! them into Rust enums with `TryFrom`, never by transmuting.
#![no_std]

pub mod config;
pub mod event;

pub use config::{Config, KernelOffsets};
pub use event::*;
