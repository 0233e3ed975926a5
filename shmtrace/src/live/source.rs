//! Where a live trace's records come from: the probes' ring buffer, or the ptrace tracer
//! (`crate::ptrace`) when eBPF programs may not be loaded. The session reads either the same
//! way, and everything after it is the same.
use std::{future::Future, pin::Pin};

use anyhow::{Context, Result, bail};
use bytes::Bytes;

use crate::{
    live::{
        bpf::{EventReader, Tracer},
        target::RunningCommand,
    },
    ptrace::Feed,
};
use shmtrace_core::event::{ExitStatus, LostCounts};

/// Which source a live trace uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Ebpf,
    Ptrace,
}

impl Backend {
    /// As a trace file's header names it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ebpf => "ebpf",
            Backend::Ptrace => "ptrace",
        }
    }
}

pub enum Source {
    Probes(Box<Probes>),
    Ptrace(Feed),
}

/// The probes' loader and its ring buffer's reader.
pub struct Probes {
    pub tracer: Tracer,
    /// Made inside the async runtime, at the session's start, unless given.
    pub reader: Option<EventReader>,
}

/// The traced command's end, as a future the session waits on.
pub type CommandEnd = Pin<Box<dyn Future<Output = Result<ExitStatus>> + Send>>;

impl Source {
    /// Readies reading (the ring buffer's reader needs the async runtime).
    pub fn open(&mut self) -> Result<()> {
        if let Source::Probes(probes) = self
            && probes.reader.is_none()
        {
            let ring = probes
                .tracer
                .take_events()
                .context("the ring buffer was already taken")?;
            probes.reader = Some(EventReader::new(ring).context("watching the ring buffer")?);
        }
        Ok(())
    }

    /// Waits until records are there, then appends them to `out`.
    pub async fn read(&mut self, out: &mut Vec<Bytes>) -> Result<()> {
        match self {
            Source::Probes(probes) => probes
                .reader
                .as_mut()
                .context("the source was not opened")?
                .read(out)
                .await
                .context("reading the ring buffer"),
            Source::Ptrace(feed) => feed.read(out).await.context("reading the ptrace tracer"),
        }
    }

    /// Appends the records there now to `out`, without waiting; `true` when more may remain.
    pub fn drain(&mut self, out: &mut Vec<Bytes>) -> bool {
        match self {
            Source::Probes(probes) => probes.reader.as_mut().is_some_and(|r| r.drain(out)),
            Source::Ptrace(feed) => feed.drain(out),
        }
    }

    /// What was lost so far, in all.
    pub fn lost(&self) -> Result<LostCounts> {
        match self {
            Source::Probes(probes) => Ok(probes.tracer.lost()?),
            Source::Ptrace(feed) => Ok(feed.lost()),
        }
    }

    /// What the source has to say (the ptrace tracer's notices).
    pub fn notices(&mut self) -> Vec<String> {
        match self {
            Source::Probes(_) => Vec::new(),
            Source::Ptrace(feed) => feed.take_notices(),
        }
    }

    /// The probes' loader, to follow containers with.
    pub fn tracer(&mut self) -> Option<&mut Tracer> {
        match self {
            Source::Probes(probes) => Some(&mut probes.tracer),
            Source::Ptrace(_) => None,
        }
    }

    /// The traced command's end. The probes' session waits for the command itself; under
    /// ptrace the tracer reaps it, and the trace ends once every process of its tree has
    /// ended (one left running would have its traced calls fail once shmtrace is gone).
    pub fn command_end(&mut self, command: &RunningCommand) -> CommandEnd {
        match self {
            Source::Probes(_) => {
                let waiter = command.clone();
                Box::pin(async move {
                    tokio::task::spawn_blocking(move || waiter.wait())
                        .await
                        .context("waiting for the traced command")?
                })
            }
            Source::Ptrace(feed) => {
                let ended = feed.ended_future();
                Box::pin(async move {
                    let ended = ended.await;
                    match (ended.command, ended.error) {
                        (Some(status), None) => Ok(status),
                        (_, Some(error)) => bail!("{error}"),
                        (None, None) => bail!("the traced command's end was not seen"),
                    }
                })
            }
        }
    }

    /// What happens to a command still running when the trace ends without it.
    pub fn left_running(&self) -> &'static str {
        match self {
            Source::Probes(_) => "it keeps running, untraced",
            Source::Ptrace(_) => {
                "it is killed with shmtrace: under ptrace it cannot go on untraced, its traced \
                 calls would fail"
            }
        }
    }
}
