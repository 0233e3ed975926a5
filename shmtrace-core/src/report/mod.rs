//! Pictures of a recorded trace: `report --html` (one self-contained page) and
//! `report --perfetto` (Chrome's trace event format, for Perfetto and chrome://tracing).
//!
//! `timeline` gathers what they show while the trace goes through the pipeline, as its
//! [`Observer`]; `html` renders the page, with `chart` (/dev/shm use over time) and `lanes` (a
//! lane per process); `perfetto` writes the JSON; `escape` makes traced names safe in HTML.
mod chart;
mod html;
mod lanes;
mod markup;
mod perfetto;
mod timeline;

#[cfg(test)]
mod tests;

use std::{
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::{Context, Result};

pub use timeline::Timeline;

use crate::{
    capacity::Capacity,
    clock::Clock,
    diagnose::{Diagnosis, Role, Roles},
    event::Event,
    model::{Annotation, ContainerInfo, World},
    pipeline::Observer,
    safe_open::{FileId, OpenOptions, Replacement},
};

/// What the page says about the trace as a whole.
#[derive(Clone, Debug)]
pub struct About {
    /// `trace of ... on HOST (Linux ...), recorded ...`.
    pub description: String,
    pub clock: Clock,
    pub tool_version: String,
}

/// Builds a [`Timeline`] and writes the requested pictures of it when the trace ends.
pub struct Pictures {
    timeline: Timeline,
    about: About,
    html: Option<Replacement>,
    perfetto: Option<Replacement>,
}

impl Pictures {
    /// Checks now that the files can be written, so a typo does not cost a whole replay; they
    /// are put in place, whole, when the trace ends (see `safe_open`), and never over
    /// one of `inputs`.
    pub fn new(
        about: About,
        html: Option<&Path>,
        perfetto: Option<&Path>,
        inputs: &[FileId],
    ) -> Result<Pictures> {
        let options = OpenOptions::new().not_over(inputs);
        let open = |path: Option<&Path>| {
            path.map(|path| Replacement::new(path, &options).context("cannot write the report"))
                .transpose()
        };
        Ok(Pictures {
            timeline: Timeline::new(),
            about,
            html: open(html)?,
            perfetto: open(perfetto)?,
        })
    }
}

impl Pictures {
    /// Draws everything, POSIX semaphores too (`--show-all`).
    pub fn show_all(mut self) -> Pictures {
        self.timeline = self.timeline.show_all();
        self
    }
}

impl Observer for Pictures {
    fn event(&mut self, event: &Event, note: &Annotation, _: &Role, place: &str, world: &World) {
        self.timeline.event(event, note, place, world);
    }

    fn seeded(&mut self, pid: u32, ts_ns: u64, world: &World) {
        self.timeline.seeded(pid, ts_ns, world);
    }

    fn capacity(&mut self, sample: &Capacity) {
        self.timeline.capacity(sample);
    }

    fn container(&mut self, info: &ContainerInfo) {
        self.timeline.container(info);
    }

    fn diagnosis(&mut self, diagnosis: &Diagnosis) {
        self.timeline.diagnosis(diagnosis);
    }

    fn finish(
        mut self: Box<Self>,
        world: &World,
        roles: &Roles,
        lost: u64,
        end_ns: u64,
    ) -> Result<Option<String>> {
        self.timeline.finish(world, roles, lost, end_ns);
        let mut wrote = Vec::new();
        if let Some(file) = self.html.take() {
            wrote.push(file.path().display().to_string());
            write(file, |out| html::write(out, &self.timeline, &self.about))?;
        }
        if let Some(file) = self.perfetto.take() {
            wrote.push(file.path().display().to_string());
            write(file, |out| {
                perfetto::write(out, &self.timeline, &self.about)
            })?;
        }
        Ok((!wrote.is_empty()).then(|| {
            format!(
                "wrote {}: {} processes drawn, {} /dev/shm holds, {} failures and deaths",
                wrote.join(" and "),
                self.timeline.lanes().len(),
                self.timeline.spans().len(),
                self.timeline.marks().len()
            )
        }))
    }
}

fn write(
    mut file: Replacement,
    render: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let context = format!("writing {}", file.path().display());
    let mut out = BufWriter::new(file.file());
    render(&mut out).context(context.clone())?;
    out.flush().context(context.clone())?;
    drop(out);
    // Its error names the file already.
    file.commit()?;
    Ok(())
}
