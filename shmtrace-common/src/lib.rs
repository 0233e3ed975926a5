//! Types shared by the eBPF programs and the `shmtrace` CLI.
//!
//! Everything here is `#[repr(C)]` and made only of integers and byte arrays, so any bit pattern
//! the kernel hands over is a valid value. Enumerations travel as plain integers; userspace turns
//! them into Rust enums with `TryFrom`, never by transmuting.
#![cfg_attr(not(test), no_std)]

pub mod config;
pub mod dev;
pub mod event;
pub mod layout;
pub mod loss;
pub mod supers;
pub mod tally;
pub mod targets;

pub use config::{Config, EMBEDDED_FDS, KernelOffsets};
pub use dev::KernelDev;
pub use event::*;
pub use layout::LAYOUT_HASH;
pub use loss::Loss;
pub use tally::TallyKey;
