//! shmtrace's analysis core: everything that does not need the kernel, a container runtime or
//! an async runtime, so that `report`, `show` and the tests of the logic run anywhere.
//!
//! The stages: `event` decodes raw records -> `model` keeps processes and /dev/shm objects ->
//! `diagnose` finds roles, failures and advice -> `output` renders them (text, JSON, summary).
//! `record` is a tap that writes trace files and reads them back, `report` an observer that
//! draws a recorded trace (HTML, Perfetto). `pipeline` runs every record through those steps,
//! whether it comes from the live probes or from a file. `capacity`, `clock`, `units` and
//! `safe_open` (how every output file is opened) are leaves all of them use. See
//! docs/architecture.md.
pub mod capacity;
pub mod clock;
pub mod diagnose;
pub mod event;
pub mod model;
pub mod output;
pub mod pipeline;
pub mod record;
pub mod report;
pub mod safe_open;
pub mod sizing;
pub mod units;
