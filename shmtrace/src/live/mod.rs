//! Live tracing: the one wing that needs the kernel. It feeds the core's pipeline as a replay
//! does, only from the ring buffer instead of a file.
//!
//! `launch` starts a live trace (probes, target, session) for the commands that trace,
//! `bpf` loads and attaches the probes and reads their records, `target` says what to trace,
//! `session` runs the loop that hands records to the pipeline (from the probes or the ptrace
//! tracer, as `source` says), `signals` the signals it
//! answers and where they came from, `watch` follows containers as
//! they come and go, `hold` keeps records of processes not yet known to be a container's,
//! `proc_scan` reads /proc, `holders` finds who holds a full /dev/shm, `host_environment` answers the pipeline's questions about the running
//! machine, `demo` is the built-in demonstration.
pub mod bpf;
pub mod demo;
pub mod hold;
pub mod holders;
pub mod host_environment;
pub mod launch;
pub mod proc_scan;
pub mod progress;
pub mod session;
pub mod signals;
pub mod source;
pub mod target;
pub mod watch;
