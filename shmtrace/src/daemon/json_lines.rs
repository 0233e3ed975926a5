//! The pipeline's JSON lines on their way to stdout, each naming the container its record (or,
//! for a diagnosis, its process) was placed in by the daemon: never the container that has the
//! mount namespace number when the line goes out. A line whose record waits to be placed or
//! named (a container younger than one survey, whose events have not come yet) is held while
//! the fleet waits (`Fleet::take_settled`), at most three surveys or a few seconds; one that
//! goes out unnamed says why (`container_unnamed`).
use std::{
    collections::VecDeque,
    io::{self, Write},
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result};
use serde_json::Value;

use super::{
    fleet::{Fleet, Placed, Settled, WaitKey},
    whose::Found,
};

/// Most lines held; beyond, the oldest goes out as it is (a flood of failures from namespaces
/// no runtime claims must not grow memory).
const MAX_HELD: usize = 4096;

/// Where the pipeline's `Output` writes: the lines wait here until [`JsonLines::pass`].
#[derive(Clone, Default)]
pub struct Written(Arc<Mutex<Vec<u8>>>);

impl Write for Written {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Held {
    key: WaitKey,
    found: Found,
    ts_ns: u64,
    line: Value,
}

#[derive(Default)]
pub struct JsonLines {
    written: Written,
    held: VecDeque<Held>,
}

impl JsonLines {
    /// What the pipeline's output is to write into.
    pub fn sink(&self) -> Written {
        self.written.clone()
    }

    /// Writes to `out` what the pipeline wrote since the last call: the lines of a record
    /// the daemon placed as `record` (at `ts_ns`) named after it, a diagnosis after its
    /// process's container; holds those that wait.
    pub fn pass(
        &mut self,
        fleet: &mut Fleet,
        record: Option<(&Found, u64)>,
        out: &mut impl Write,
    ) -> Result<()> {
        let bytes = std::mem::take(&mut *self.written.0.lock().expect("not poisoned"));
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let Ok(value) = serde_json::from_slice::<Value>(line) else {
                write_line(out, line)?;
                continue;
            };
            let ts_ns = record.map_or(0, |(_, ts)| ts);
            // A diagnosis is of its process, which may not be the record's (a trainer's after
            // its worker's death).
            let found = match value["pid"].as_u64() {
                Some(pid) if value["event"] == "diagnosis" => fleet
                    .of_process(pid as u32)
                    .or_else(|| record.map(|(f, _)| f.clone())),
                _ => record.map(|(f, _)| f.clone()),
            };
            let Some(found) = found else {
                // The pipeline's own notices (losses), or a line of nobody's record.
                write_line(out, line)?;
                continue;
            };
            match fleet.resolve(&found, ts_ns) {
                Ok(placed) => write_named(out, value, &placed, Some(line))?,
                Err(key) => {
                    fleet.wait(key.clone(), ts_ns, None);
                    self.hold(
                        Held {
                            key,
                            found,
                            ts_ns,
                            line: value,
                        },
                        out,
                    )?;
                }
            }
        }
        Ok(())
    }

    fn hold(&mut self, held: Held, out: &mut impl Write) -> Result<()> {
        if self.held.len() >= MAX_HELD
            && let Some(oldest) = self.held.pop_front()
        {
            let mut line = oldest.line;
            line["container_unnamed"] = Value::String(format!(
                "more than {MAX_HELD} lines waited for their container"
            ));
            write_line(out, line.to_string().as_bytes())?;
        }
        self.held.push_back(held);
        Ok(())
    }

    /// Lets go the lines whose wait ended: each placed anew (a line is of its own time), or,
    /// where that still waits for nothing, where its key went.
    pub fn settled(
        &mut self,
        fleet: &mut Fleet,
        settled: Vec<(WaitKey, Settled)>,
        out: &mut impl Write,
    ) -> Result<()> {
        for (key, settlement) in settled {
            if !self.held.iter().any(|h| h.key == key) {
                continue;
            }
            let (mine, others): (Vec<Held>, Vec<Held>) =
                self.held.drain(..).partition(|h| h.key == key);
            self.held = others.into();
            for held in mine {
                match (fleet.resolve(&held.found, held.ts_ns), &settlement) {
                    (Ok(placed), _) => write_named(out, held.line, &placed, None)?,
                    (Err(_), Settled::Placed(placed)) => {
                        write_named(out, held.line, placed, None)?;
                    }
                    (Err(key), Settled::Moved(_)) => {
                        fleet.wait(key.clone(), held.ts_ns, None);
                        self.held.push_back(Held { key, ..held });
                    }
                }
            }
        }
        Ok(())
    }

    /// Lets every held line go as it is (the daemon is stopping).
    pub fn release_all(&mut self, out: &mut impl Write) -> Result<()> {
        for held in self.held.drain(..) {
            let mut line = held.line;
            line["container_unnamed"] =
                Value::String("the daemon stopped while it waited for the container".into());
            write_line(out, line.to_string().as_bytes())?;
        }
        Ok(())
    }

    /// Lines held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// Writes `line` naming the container `placed` says (as written, byte for byte, when it does
/// already: `as_written`).
fn write_named(
    out: &mut impl Write,
    mut line: Value,
    placed: &Placed,
    as_written: Option<&[u8]>,
) -> Result<()> {
    let info = placed.info();
    let note = match placed {
        Placed::Container { unnamed, .. } => unnamed.clone(),
        _ => None,
    };
    let same = match info {
        Some(info) => {
            line["container"]["id"].as_str() == Some(info.id.as_str())
                && line["container"]["name"].as_str() == Some(info.name.as_str())
        }
        None => line["container"].is_null(),
    };
    if same && note.is_none() {
        return match as_written {
            Some(bytes) => write_line(out, bytes),
            None => write_line(out, line.to_string().as_bytes()),
        };
    }
    match info {
        Some(info) => {
            line["container"] = serde_json::to_value(info).unwrap_or(Value::Null);
            if line.get("place").is_some() {
                line["place"] = Value::String(info.label());
            }
        }
        None => line["container"] = Value::Null,
    }
    if let Some(note) = note {
        line["container_unnamed"] = Value::String(note);
    }
    write_line(out, line.to_string().as_bytes())
}

fn write_line(out: &mut impl Write, line: &[u8]) -> Result<()> {
    out.write_all(line).context("writing output")?;
    out.write_all(b"\n").context("writing output")
}
