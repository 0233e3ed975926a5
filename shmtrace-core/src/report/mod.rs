//! Pictures of a recorded trace: `report --html` (one self-contained page) and
//! `report --perfetto` (Chrome's trace event format, for Perfetto and chrome://tracing).
//!
//! `timeline` gathers what they show while the trace goes through the pipeline, as its
//! [`Observer`]; `html` renders the page, with `chart` (/dev/shm use over time) and `lanes` (a
//! lane per process); `perfetto` writes the JSON; `escape` makes traced names safe in HTML.
mod chart;
mod escape;
mod html;
mod lanes;
mod perfetto;
mod timeline;

#[cfg(test)]
mod tests;

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

pub use timeline::Timeline;

use crate::{
    clock::Clock,
    diagnose::{Capacity, Diagnosis, Role, Roles},
    event::Event,
    model::{Annotation, ContainerInfo, World},
    pipeline::Observer,
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
    html: Option<PathBuf>,
    perfetto: Option<PathBuf>,
}

impl Pictures {
    /// Checks now that the files can be written, so a typo does not cost a whole replay.
    pub fn new(about: About, html: Option<&Path>, perfetto: Option<&Path>) -> Result<Pictures> {
        for path in html.iter().chain(perfetto.iter()) {
            File::create(path)
                .with_context(|| format!("cannot write the report to {}", path.display()))?;
        }
        Ok(Pictures {
            timeline: Timeline::new(),
            about,
            html: html.map(Path::to_owned),
            perfetto: perfetto.map(Path::to_owned),
        })
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
        if let Some(path) = &self.html {
            write(path, |out| html::write(out, &self.timeline, &self.about))?;
            wrote.push(path.display().to_string());
        }
        if let Some(path) = &self.perfetto {
            write(path, |out| {
                perfetto::write(out, &self.timeline, &self.about)
            })?;
            wrote.push(path.display().to_string());
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

fn write(path: &Path, render: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<()> {
    let context = || format!("writing {}", path.display());
    let file = File::create(path).with_context(context)?;
    let mut out = BufWriter::new(file);
    render(&mut out).with_context(context)?;
    out.flush().with_context(context)?;
    Ok(())
}
