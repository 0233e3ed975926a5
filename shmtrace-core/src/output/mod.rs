//! Showing events: to people (`human`), to programs (`json`), and the closing summary.
//!
//! What happened is decided elsewhere (`event`, `model`); this module only renders it.
pub mod diagnosis;
pub mod filter;
mod flag_names;
mod flat_struct;
mod flat_value;
pub mod group;
pub mod human;
pub mod hush;
pub mod json;
#[cfg(test)]
mod json_tests;
mod summary;
mod untraced_section;

use std::{
    io::{self, Write},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

pub use summary::{Remaining, Summary};

use crate::{
    clock::{Clock, Rfc3339Cache},
    diagnose::{Cause, Diagnosis, Role},
    event::{Event, LostCounts},
    model::{Annotation, ContainerInfo, World},
};

/// Where rendered events go and in which format.
pub struct Output {
    sink: Sink,
    clock: Clock,
    times: Rfc3339Cache,
    flag_names: flag_names::FlagNames,
    /// Also repeat notices on stderr (output goes to a file nobody is watching).
    notices_to_stderr: bool,
    /// Show where each event happened (containers are involved).
    show_places: bool,
    /// The reader of the output went away (`shmtrace ... | head -1`).
    reader_gone: Arc<AtomicBool>,
    /// What the text stream leaves out (`--show-all` shows it).
    hush: hush::Hush,
    /// Diagnoses waiting for others that tell the same story, to be shown as one block.
    pending: group::Pending,
    /// Lines the summary ends with (each container's /dev/shm at the end).
    closing: Vec<String>,
}

/// Treats a reader that went away (EPIPE) as the end of the output, as other command-line
/// tools do: later writes are dropped, and [`Output::reader_gone`] tells the caller to stop
/// and finish its files, rather than failing with "Broken pipe".
/// Any other error names where the output goes (`writing /proc/self/status: Invalid
/// argument`), once.
struct QuietPipe {
    inner: Box<dyn Write + Send>,
    gone: Arc<AtomicBool>,
    /// Where the output goes: a file's path, or `standard output`.
    name: Arc<str>,
}

impl QuietPipe {
    fn absorb<T>(&self, result: io::Result<T>, instead: T) -> io::Result<T> {
        match result {
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => {
                self.gone.store(true, Ordering::Relaxed);
                Ok(instead)
            }
            Err(error) => Err(io::Error::new(
                error.kind(),
                format!("writing {}: {error}", self.name),
            )),
            other => other,
        }
    }
}

impl Write for QuietPipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.gone.load(Ordering::Relaxed) {
            return Ok(buf.len());
        }
        let result = self.inner.write(buf);
        self.absorb(result, buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.gone.load(Ordering::Relaxed) {
            return Ok(());
        }
        let result = self.inner.flush();
        self.absorb(result, ())
    }
}

enum Sink {
    Human(human::HumanWriter<Box<dyn Write + Send>>),
    Json(json::JsonWriter<Box<dyn Write + Send>>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Text; `true` for colour.
    Human(bool),
    Json,
}

impl Output {
    pub fn new(
        out: Box<dyn Write + Send>,
        format: Format,
        clock: Clock,
        notices_to_stderr: bool,
    ) -> Output {
        Output::named(out, "the output", format, clock, notices_to_stderr)
    }

    /// [`Output::new`] for output going to `name` (a path, `standard output`), which errors
    /// name.
    pub fn named(
        out: Box<dyn Write + Send>,
        name: &str,
        format: Format,
        clock: Clock,
        notices_to_stderr: bool,
    ) -> Output {
        let reader_gone = Arc::new(AtomicBool::new(false));
        let out: Box<dyn Write + Send> = Box::new(QuietPipe {
            inner: out,
            gone: reader_gone.clone(),
            name: name.into(),
        });
        let sink = match format {
            Format::Human(color) => Sink::Human(human::HumanWriter::new(out, color)),
            Format::Json => Sink::Json(json::JsonWriter::new(out)),
        };
        Output {
            sink,
            clock,
            times: Rfc3339Cache::default(),
            flag_names: flag_names::FlagNames::default(),
            notices_to_stderr,
            show_places: false,
            reader_gone,
            hush: hush::Hush::default(),
            pending: group::Pending::default(),
            closing: Vec::new(),
        }
    }

    /// A line for the end of the summary, in text.
    pub fn closing_line(&mut self, line: String) {
        self.closing.push(line);
    }

    /// Shows every event, semaphores and processes that had nothing to do with /dev/shm too.
    pub fn show_all(&mut self) {
        self.hush = hush::Hush::off();
    }

    /// Whether the reader of the output went away: time to end, quietly.
    pub fn reader_gone(&self) -> bool {
        self.reader_gone.load(Ordering::Relaxed)
    }

    /// From now on, text lines say where (host or container) each event happened.
    pub fn show_places(&mut self) {
        self.show_places = true;
    }

    pub fn event(
        &mut self,
        event: &Event,
        note: &Annotation,
        role: &Role,
        place: &str,
        container: Option<&ContainerInfo>,
        world: &World,
    ) -> io::Result<()> {
        self.tick(event.ts_ns)?;
        match &mut self.sink {
            Sink::Human(w) => {
                let note = self.hush.visible(note);
                let Some(line) = human::format(event, &note, role, &self.clock) else {
                    return Ok(());
                };
                for (line, place) in self.hush.admit(event, &note, line, place, world) {
                    w.line(&line, self.show_places.then_some(place.as_str()))?;
                }
                Ok(())
            }
            Sink::Json(w) => {
                let ts = self.times.rfc3339(&self.clock, event.ts_ns);
                let floored = at_least_held(event, container, world);
                let container = floored.as_ref().or(container);
                match json::to_json(event, note, role, container, ts, &mut self.flag_names) {
                    Some(record) => w.event(&record),
                    None => Ok(()),
                }
            }
        }
    }

    /// The trace reached `now_ns`: a block of diagnoses nothing can join any more is shown.
    pub fn tick(&mut self, now_ns: u64) -> io::Result<()> {
        match self.pending.due(now_ns) {
            Some(block) => self.show_block(&block),
            None => Ok(()),
        }
    }

    /// A diagnosis: in JSON at once, each process its own; in text, held until the others
    /// that tell the same story have come ([`group`]), then shown with them as one block.
    pub fn diagnosis(&mut self, diagnosis: &Diagnosis) -> io::Result<()> {
        match &mut self.sink {
            Sink::Human(_) => {
                for block in self.pending.push(diagnosis.clone()) {
                    self.show_block(&block)?;
                }
                Ok(())
            }
            Sink::Json(w) => w.record(&diagnosis::json(diagnosis, &self.clock)),
        }
    }

    /// Shows the block of diagnoses waiting, if any: before anything that must come after it.
    fn flush_pending(&mut self) -> io::Result<()> {
        match self.pending.take() {
            Some(block) => self.show_block(&block),
            None => Ok(()),
        }
    }

    fn show_block(&mut self, block: &[Diagnosis]) -> io::Result<()> {
        let Sink::Human(w) = &mut self.sink else {
            return Ok(());
        };
        let block: Vec<&Diagnosis> = block.iter().collect();
        w.diagnosis(
            &diagnosis::block_text(&block),
            block[0].cause == Cause::ShmFull,
        )
    }

    /// Events were lost since the last report: say so, in the stream and on stderr.
    pub fn lost(&mut self, delta: &LostCounts, total: &LostCounts) -> io::Result<()> {
        self.flush_pending()?;
        let text = format!(
            "{} events lost or incomplete ({}; {} lost in all). If the ring buffer was full, use \
             a larger --buffer-size, or --failed to send less",
            delta.total(),
            delta.describe(),
            total.total()
        );
        match &mut self.sink {
            Sink::Human(w) => w.notice(&text)?,
            Sink::Json(w) => w.record(&serde_json::json!({
                "v": json::SCHEMA_VERSION,
                "event": "lost",
                "lost": delta.total(),
                "lost_total": total.total(),
                "lost_by_reason": delta.by_reason(),
            }))?,
        }
        if self.notices_to_stderr || matches!(self.sink, Sink::Json(_)) {
            eprintln!("shmtrace: {text}");
        }
        Ok(())
    }

    /// A remark about the trace itself, such as the traced command exiting: in the text
    /// stream, and on stderr when nobody watches the stream (JSON, or a file).
    pub fn notice(&mut self, text: &str) -> io::Result<()> {
        self.flush_pending()?;
        if let Sink::Human(w) = &mut self.sink {
            w.notice(text)?;
        }
        if self.notices_to_stderr || matches!(self.sink, Sink::Json(_)) {
            self.flush()?;
            eprintln!("shmtrace: {text}");
        }
        Ok(())
    }

    /// The closing summary; also on stderr when the output goes to a file.
    pub fn summary(&mut self, summary: &Summary) -> io::Result<()> {
        self.flush_pending()?;
        let mut lines = summary.lines();
        // After the totals, what the text stream left out.
        let left_out = self.hush.summary_lines();
        let at = lines.len().min(1);
        lines.splice(at..at, left_out);
        lines.extend(self.closing.iter().cloned());
        match &mut self.sink {
            Sink::Human(w) => {
                for line in &lines {
                    w.plain(line)?;
                }
            }
            Sink::Json(w) => w.record(&summary.json())?,
        }
        if self.notices_to_stderr {
            for line in &lines {
                eprintln!("{line}");
            }
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Sink::Human(w) => w.flush(),
            Sink::Json(w) => w.flush(),
        }
    }
}

/// For a call that found /dev/shm full, its container's use is at least what the traced
/// objects held on it, as the diagnosis says: the measurement may come after they were freed
/// (or never, when the container ended first), and read nothing.
fn at_least_held(
    event: &Event,
    container: Option<&ContainerInfo>,
    world: &World,
) -> Option<ContainerInfo> {
    let container = container?;
    let crate::event::Body::Call(call) = &event.body else {
        return None;
    };
    let dev = call.file?.inode.dev;
    if call.errno() != Some(libc::ENOSPC) || container.shm_dev != Some(dev) {
        return None;
    }
    let held = world.usage(dev).map_or(0, |u| u.allocated);
    let held = container.shm_size.map_or(held, |size| held.min(size));
    (held > container.shm_used.unwrap_or(0)).then(|| ContainerInfo {
        shm_used: Some(held),
        ..container.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Body, Call, FileRef, InodeId, Syscall};

    /// Issue 33: after a failure in a full /dev/shm, the failed call's `shm_used` said 0 (the
    /// measurement came after the files were freed) while its diagnosis said 100%.
    #[test]
    fn a_call_that_found_dev_shm_full_says_it_held_at_least_the_traced_pages() {
        const MIB: u64 = 1 << 20;
        let on = |syscall, ret, allocated| Event {
            ts_ns: 1,
            cpu: 0,
            pid: 7,
            tid: 7,
            comm: "dd".to_owned(),
            mntns: 1,
            cgroup_id: 1,
            container_match: false,
            body: Body::Call(Call {
                syscall,
                fd: Some(1),
                ret,
                args: [1, 0, MIB, 0, 0, 0],
                file: Some(FileRef {
                    inode: InodeId { dev: 70, ino: 3 },
                    mode: libc::S_IFREG | 0o644,
                    size: MIB as i64,
                    allocated,
                }),
                path: Some("/dev/shm/fill".to_owned()),
                path_truncated: false,
                relative_to_shm: false,
                dir_ino: None,
            }),
        };
        let mut world = World::new();
        world.apply(&on(Syscall::Openat, 1, 0));
        let full = on(Syscall::Write, -i64::from(libc::ENOSPC), MIB);
        world.apply(&full);
        let container = ContainerInfo {
            shm_dev: Some(70),
            shm_size: Some(MIB),
            shm_used: Some(0),
            ..ContainerInfo::default()
        };
        let floored = at_least_held(&full, Some(&container), &world).expect("raised");
        assert_eq!(floored.shm_used, Some(MIB));
        // Another file system's, or a call that did not find it full: as measured.
        let elsewhere = ContainerInfo {
            shm_dev: Some(71),
            ..container.clone()
        };
        assert!(at_least_held(&full, Some(&elsewhere), &world).is_none());
        assert!(
            at_least_held(
                &on(Syscall::Write, MIB as i64, MIB),
                Some(&container),
                &world
            )
            .is_none()
        );
    }
}
