//! The short account printed when tracing stops.
use serde_json::{Value, json};

use super::{json::SCHEMA_VERSION, size::human};
use crate::{
    bpf::LostCounts,
    model::{ObjectState, World},
};

/// Totals of a trace, taken from the model when tracing stops.
#[derive(Clone, Debug)]
pub struct Summary {
    pub seconds: f64,
    pub events: u64,
    pub failed_calls: u64,
    pub lost: LostCounts,
    pub processes: u64,
    pub deaths_by_signal: u64,
    pub objects_created: u64,
    pub objects_freed: u64,
    pub peak_bytes: u64,
    /// Objects still present: (name, bytes held, still named in /dev/shm).
    pub remaining: Vec<(String, u64, bool)>,
}

impl Summary {
    pub fn from_world(world: &World, lost: LostCounts, seconds: f64) -> Summary {
        let totals = world.totals();
        let mut remaining: Vec<(String, u64, bool)> = world
            .live_objects()
            .map(|o| {
                (
                    o.display_name(),
                    o.allocated,
                    o.state() == ObjectState::Linked,
                )
            })
            .collect();
        remaining.sort();
        Summary {
            seconds,
            events: totals.events,
            failed_calls: totals.failed_calls,
            lost,
            processes: totals.processes_seen,
            deaths_by_signal: totals.deaths_by_signal,
            objects_created: totals.objects_created,
            objects_freed: totals.objects_freed,
            peak_bytes: totals.peak_live_bytes,
            remaining,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "shmtrace: {} events in {:.1}s from {} processes: {} failed calls, {} killed by \
             signals, {} lost",
            self.events,
            self.seconds,
            self.processes,
            self.failed_calls,
            self.deaths_by_signal,
            self.lost.total()
        )];
        lines.push(format!(
            "shmtrace: /dev/shm objects: {} created, {} freed, peak {} held at once",
            self.objects_created,
            self.objects_freed,
            human(self.peak_bytes)
        ));
        for (name, bytes, linked) in self.remaining.iter().take(10) {
            let state = if *linked {
                "still in /dev/shm"
            } else {
                "unlinked, still held open or mapped"
            };
            lines.push(format!("shmtrace:   {name} ({}, {state})", human(*bytes)));
        }
        if self.remaining.len() > 10 {
            lines.push(format!(
                "shmtrace:   ... and {} more",
                self.remaining.len() - 10
            ));
        }
        lines
    }

    pub fn json(&self) -> Value {
        json!({
            "v": SCHEMA_VERSION,
            "event": "summary",
            "seconds": self.seconds,
            "events": self.events,
            "failed_calls": self.failed_calls,
            "lost": self.lost.total(),
            "processes": self.processes,
            "deaths_by_signal": self.deaths_by_signal,
            "objects_created": self.objects_created,
            "objects_freed": self.objects_freed,
            "peak_bytes": self.peak_bytes,
            "remaining": self.remaining.iter().map(|(name, bytes, linked)| json!({
                "path": name, "bytes": bytes, "linked": linked,
            })).collect::<Vec<_>>(),
        })
    }
}
