//! From the tracer thread to the session: records, notices and the end, as the ring buffer
//! hands the probes' records over.
//!
//! Records are appended to a shared buffer that the session collects on its ticks; a record
//! that matters now (a failure, an exec, an exit, a fatal signal) wakes it at once, as an
//! urgent record of the probes does. Nothing is dropped: when the session falls behind by
//! [`MAX_PENDING`] records, the tracer waits for it, and with it the traced program.
use std::{
    io,
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use bytes::Bytes;
use shmtrace_common::Loss;
use tokio::sync::{Notify, watch};

use shmtrace_core::event::{ExitStatus, LostCounts};

/// Records waiting for the session before the tracer waits for it.
const MAX_PENDING: usize = 1 << 18;

/// How tracing ended.
#[derive(Clone, Debug)]
pub struct Ended {
    /// The traced command's status, when a command was started (and had run).
    pub command: Option<ExitStatus>,
    /// Why the tracer stopped early, if it did.
    pub error: Option<String>,
}

#[derive(Default)]
struct Inner {
    records: Vec<Bytes>,
    notices: Vec<String>,
    /// The command's status, as soon as it exits (others of its tree may still run).
    command: Option<ExitStatus>,
    ended: Option<Ended>,
    lost: LostCounts,
}

struct Shared {
    inner: Mutex<Inner>,
    wake: Notify,
    room: Condvar,
    /// The end, for whoever waits for it alone.
    ended: watch::Sender<Option<Ended>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panicking tracer thread leaves the data whole (plain pushes): go on with it.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A new feed: the tracer thread's end and the session's.
pub fn channel() -> (Sink, Feed) {
    let shared = Arc::new(Shared {
        inner: Mutex::default(),
        wake: Notify::new(),
        room: Condvar::new(),
        ended: watch::Sender::new(None),
    });
    (
        Sink {
            shared: shared.clone(),
        },
        Feed { shared },
    )
}

/// The tracer thread's end.
pub struct Sink {
    shared: Arc<Shared>,
}

impl Sink {
    /// Hands a record over; `urgent` wakes the session now.
    pub fn record(&self, record: Bytes, urgent: bool) {
        let mut inner = self.shared.lock();
        while inner.records.len() >= MAX_PENDING && inner.ended.is_none() {
            self.shared.wake.notify_one();
            inner = self
                .shared
                .room
                .wait(inner)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        inner.records.push(record);
        drop(inner);
        if urgent {
            self.shared.wake.notify_one();
        }
    }

    /// Something the user should read, shown where the session shows its notices.
    pub fn notice(&self, text: String) {
        self.shared.lock().notices.push(text);
        self.shared.wake.notify_one();
    }

    /// Something the tracer could not see or read.
    pub fn lost(&self, kind: Loss) {
        self.shared.lock().lost.add(kind, 1);
    }

    /// The command exited (its records are already handed over).
    pub fn command_exited(&self, status: ExitStatus) {
        self.shared.lock().command = Some(status);
        self.shared.wake.notify_one();
    }

    /// Tracing is over: every traced process is gone, or it failed.
    pub fn end(&self, error: Option<String>) {
        let mut inner = self.shared.lock();
        let command = inner.command;
        let ended = Ended { command, error };
        inner.ended = Some(ended.clone());
        drop(inner);
        self.shared.ended.send_replace(Some(ended));
        self.shared.room.notify_all();
        self.shared.wake.notify_one();
    }
}

impl Drop for Sink {
    /// A tracer thread that ends without saying so (a panic) still ends the trace.
    fn drop(&mut self) {
        if self.shared.lock().ended.is_none() {
            self.end(Some("the ptrace tracer stopped unexpectedly".to_owned()));
        }
    }
}

/// The session's end.
pub struct Feed {
    shared: Arc<Shared>,
}

impl Feed {
    /// Waits until something is there (records, a notice, the end), then appends the records
    /// waiting to `out`.
    pub async fn read(&mut self, out: &mut Vec<Bytes>) -> io::Result<()> {
        loop {
            let woken = self.shared.wake.notified();
            {
                let inner = self.shared.lock();
                if !inner.records.is_empty()
                    || !inner.notices.is_empty()
                    || inner.ended.is_some()
                    || inner.command.is_some()
                {
                    break;
                }
            }
            woken.await;
        }
        self.drain(out);
        Ok(())
    }

    /// Appends the records waiting to `out`, without waiting; never more to come at once.
    pub fn drain(&mut self, out: &mut Vec<Bytes>) -> bool {
        let mut inner = self.shared.lock();
        out.append(&mut inner.records);
        drop(inner);
        self.shared.room.notify_all();
        false
    }

    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.shared.lock().notices)
    }

    /// The command's status once it exited, though others of its tree may still run.
    pub fn command_status(&self) -> Option<ExitStatus> {
        self.shared.lock().command
    }

    /// How tracing ended, once it has.
    pub fn ended(&self) -> Option<Ended> {
        self.shared.lock().ended.clone()
    }

    /// What was lost so far.
    pub fn lost(&self) -> LostCounts {
        self.shared.lock().lost.clone()
    }

    /// Waits for the end, apart from the records.
    pub fn ended_future(&self) -> impl Future<Output = Ended> + Send + 'static {
        let mut ended = self.shared.ended.subscribe();
        async move {
            match ended.wait_for(Option::is_some).await {
                Ok(ended) => ended.clone().expect("waited for"),
                Err(_) => Ended {
                    command: None,
                    error: Some("the ptrace tracer went away".to_owned()),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_notices_and_the_end_reach_the_session() {
        let (sink, mut feed) = channel();
        let tracer = std::thread::spawn(move || {
            sink.record(Bytes::from_static(b"a"), false);
            sink.record(Bytes::from_static(b"b"), true);
            sink.notice("hello".to_owned());
            sink.command_exited(ExitStatus::Code(3));
            sink.end(None);
        });
        let mut out = Vec::new();
        while feed.ended().is_none() {
            feed.read(&mut out).await.unwrap();
        }
        feed.drain(&mut out);
        tracer.join().unwrap();
        assert_eq!(out, [Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        assert_eq!(feed.take_notices(), ["hello"]);
        let ended = feed.ended().unwrap();
        assert_eq!(ended.command, Some(ExitStatus::Code(3)));
        assert!(ended.error.is_none());
    }

    #[test]
    fn a_tracer_that_vanishes_ends_the_trace() {
        let (sink, feed) = channel();
        drop(sink);
        assert!(
            feed.ended()
                .unwrap()
                .error
                .unwrap()
                .contains("unexpectedly")
        );
    }
}
