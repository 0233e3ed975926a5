//! The signals a live trace answers, and where each came from.
//!
//! A signal that ends the trace while a command runs must reach the command as it would
//! without shmtrace: `docker stop` (shmtrace as a container's PID 1), a CI timeout or a
//! supervisor signals shmtrace alone, and if shmtrace kept it the command would run on and the
//! trace never end. Ctrl-C and a closed terminal, though, signal the terminal's whole
//! foreground process group, which the command is in (it is not moved out of it, so that it can
//! read the terminal and Ctrl-Z stops it with shmtrace): sending the signal again would deliver
//! it twice. The kernel says which is which in the signal's `si_code` (`SI_KERNEL` for the
//! terminal's), which tokio's signal streams do not carry; a second handler, run before
//! tokio's, keeps it.
use std::sync::{
    OnceLock,
    atomic::{AtomicI32, Ordering},
};

use anyhow::{Context, Result};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The signals that end a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Interrupt,
    Terminate,
    Hangup,
}

impl Stop {
    pub fn signo(self) -> i32 {
        match self {
            Stop::Interrupt => libc::SIGINT,
            Stop::Terminate => libc::SIGTERM,
            Stop::Hangup => libc::SIGHUP,
        }
    }

    fn index(self) -> usize {
        match self {
            Stop::Interrupt => 0,
            Stop::Terminate => 1,
            Stop::Hangup => 2,
        }
    }

    const ALL: [Stop; 3] = [Stop::Interrupt, Stop::Terminate, Stop::Hangup];

    /// Whether the last delivery of this signal came from the terminal (Ctrl-C, a hang-up),
    /// which signals the traced command too.
    pub fn from_terminal(self) -> bool {
        LAST_CODE[self.index()].load(Ordering::SeqCst) == libc::SI_KERNEL
    }
}

/// The `si_code` of the last delivery of each [`Stop`] signal; written by the signal handler
/// (an atomic store is async-signal-safe).
static LAST_CODE: [AtomicI32; 3] = [AtomicI32::new(0), AtomicI32::new(0), AtomicI32::new(0)];

/// Registers the handlers that keep [`LAST_CODE`], once per process.
fn record_origins() -> Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            for stop in Stop::ALL {
                let slot = &LAST_CODE[stop.index()];
                // SAFETY: the action only stores to an atomic, which is async-signal-safe, and
                // never panics. Registered before tokio's own action for the signal, it runs
                // first, so the code is there when tokio's stream wakes the session.
                unsafe {
                    signal_hook_registry::register_sigaction(stop.signo(), move |info| {
                        slot.store(info.si_code, Ordering::SeqCst);
                    })
                }
                .map_err(|e| format!("installing a handler for signal {}: {e}", stop.signo()))?;
            }
            Ok(())
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The signals a live trace answers. Installed before the trace says it is tracing, so that a
/// signal sent from then on is always handled.
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
    /// A closed terminal ends the trace like Ctrl-C: files finished, summary printed.
    hangup: Signal,
    /// SIGUSR1 asks the flight recorder for a file now, as a failure would.
    dump: Signal,
}

impl Signals {
    /// Must be called inside the runtime (`Runtime::enter`).
    pub fn install() -> Result<Signals> {
        record_origins()?;
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).context("installing a SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing a SIGTERM handler")?,
            hangup: signal(SignalKind::hangup()).context("installing a SIGHUP handler")?,
            dump: signal(SignalKind::user_defined1()).context("installing a SIGUSR1 handler")?,
        })
    }

    /// Waits for a signal that ends the trace (before tracing starts: while waiting for a
    /// container).
    pub async fn stop(&mut self) -> Stop {
        tokio::select! {
            _ = self.interrupt.recv() => Stop::Interrupt,
            _ = self.terminate.recv() => Stop::Terminate,
            _ = self.hangup.recv() => Stop::Hangup,
        }
    }

    /// Waits for any signal a running trace answers.
    pub async fn next(&mut self) -> Received {
        tokio::select! {
            _ = self.interrupt.recv() => Received::Stop(Stop::Interrupt),
            _ = self.terminate.recv() => Received::Stop(Stop::Terminate),
            _ = self.hangup.recv() => Received::Stop(Stop::Hangup),
            _ = self.dump.recv() => Received::Dump,
        }
    }
}

/// A signal a running trace answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    Stop(Stop),
    /// SIGUSR1.
    Dump,
}
