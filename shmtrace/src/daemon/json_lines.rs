//! The pipeline's JSON lines on their way to stdout. A line of a mount namespace that waits
//! for a survey (a container younger than one) is held until the survey says whose it is, as
//! the metrics wait (`Fleet`'s pending namespaces): then it names the container, or goes out
//! as it is once the fleet stops waiting.
use std::{
    collections::{HashSet, VecDeque},
    io::{self, Write},
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result};
use serde_json::Value;

use super::fleet::Fleet;
use crate::model::ContainerInfo;

/// Most lines held; beyond, the oldest goes out unnamed (a flood of failures from namespaces
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

#[derive(Default)]
pub struct JsonLines {
    written: Written,
    /// Lines of waiting namespaces, in the order written, with their namespace.
    held: VecDeque<(u32, Vec<u8>)>,
}

impl JsonLines {
    /// What the pipeline's output is to write into.
    pub fn sink(&self) -> Written {
        self.written.clone()
    }

    /// Writes to `out` every line the pipeline wrote whose namespace waits for nothing (and
    /// every held line whose namespace no longer waits, named by `container` if a survey
    /// found it); holds the others. `all` lets everything go (the daemon is stopping).
    pub fn pass(
        &mut self,
        fleet: &Fleet,
        container: impl Fn(u32) -> Option<ContainerInfo>,
        all: bool,
        out: &mut impl Write,
    ) -> Result<()> {
        let bytes = std::mem::take(&mut *self.written.0.lock().expect("not poisoned"));
        // Held lines first: they were written before the new ones.
        let mut still = VecDeque::new();
        for (mntns, line) in self.held.drain(..) {
            if all || !fleet.waiting(mntns) {
                match container(mntns) {
                    Some(info) => write_line(out, &named(&line, &info))?,
                    None => write_line(out, &line)?,
                }
            } else {
                still.push_back((mntns, line));
            }
        }
        self.held = still;
        let mut waiting: HashSet<u32> = self.held.iter().map(|(m, _)| *m).collect();
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            match held_for(line, fleet, &waiting) {
                Some(mntns) if !all => {
                    waiting.insert(mntns);
                    if self.held.len() >= MAX_HELD
                        && let Some((_, oldest)) = self.held.pop_front()
                    {
                        write_line(out, &oldest)?;
                    }
                    self.held.push_back((mntns, line.to_vec()));
                }
                // As written, byte for byte.
                _ => write_line(out, line)?,
            }
        }
        Ok(())
    }
}

/// The namespace a line waits for: one that names no container yet, of a namespace the fleet
/// waits for a survey of (or that has lines held already, which go first).
fn held_for(line: &[u8], fleet: &Fleet, waiting: &HashSet<u32>) -> Option<u32> {
    let line: Value = serde_json::from_slice(line).ok()?;
    if !line["container"].is_null() {
        return None;
    }
    // A diagnosis says its process, not its namespace.
    let mntns = match line["mntns"].as_u64() {
        Some(mntns) => mntns as u32,
        None => fleet.mntns_of(line["pid"].as_u64()? as u32)?,
    };
    (waiting.contains(&mntns) || fleet.waiting(mntns)).then_some(mntns)
}

/// A held line, with the container a survey found for its namespace.
fn named(line: &[u8], info: &ContainerInfo) -> Vec<u8> {
    let Ok(mut value) = serde_json::from_slice::<Value>(line) else {
        return line.to_vec();
    };
    if value.get("place").is_some() {
        value["place"] = Value::String(info.label());
    }
    value["container"] = serde_json::to_value(info).unwrap_or(Value::Null);
    value.to_string().into_bytes()
}

fn write_line(out: &mut impl Write, line: &[u8]) -> Result<()> {
    out.write_all(line).context("writing output")?;
    out.write_all(b"\n").context("writing output")
}
