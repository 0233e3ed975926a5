//! `report --perfetto`: the timeline in Chrome's trace event format (JSON), which Perfetto
//! (ui.perfetto.dev, offline too) and chrome://tracing open.
//!
//! - Each drawn process is a process (`pid`), named `worker 1 · pid 4242 (pt_data_worker)`
//!   and sorted like the HTML lanes.
//! - Each hold of a /dev/shm object is an async slice (`b`/`e`, category `shm`): holds overlap
//!   freely, which complete (`X`) events on one thread may not.
//! - Failures and deaths are instant events (`i`) on the process, category `enospc`,
//!   `sigbus`, `error`, `oom`, `killed` or `exited`; diagnoses are global instant events.
//! - Each /dev/shm file system is a pseudo-process (pid 1000000000 and up, above any real pid)
//!   with counter tracks (`C`): bytes held by traced objects, bytes in use as measured, size.
//!
//! Times are microseconds after the first record.
use std::io;

use serde_json::{Value, json};

use super::{About, chart::dev_string, timeline::Timeline};
use crate::{output::diagnosis, units::human};

/// Pids of the /dev/shm pseudo-processes start here; Linux pids stay below 2^22.
pub const DEVICE_PID_BASE: u64 = 1_000_000_000;

pub fn write(out: &mut dyn io::Write, timeline: &Timeline, about: &About) -> io::Result<()> {
    serde_json::to_writer(&mut *out, &document(timeline, about))?;
    out.write_all(b"\n")
}

pub fn document(timeline: &Timeline, about: &About) -> Value {
    let (start, end) = timeline.range();
    let us = |ts_ns: u64| ts_ns.saturating_sub(start) as f64 / 1000.0;
    let mut events = Vec::new();

    for (index, lane) in timeline.lanes().iter().enumerate() {
        let name = if lane.comm.is_empty() {
            lane.title()
        } else {
            format!("{} ({})", lane.title(), lane.comm)
        };
        events.push(
            json!({"ph": "M", "name": "process_name", "pid": lane.pid, "tid": lane.pid,
            "args": {"name": name}}),
        );
        events.push(
            json!({"ph": "M", "name": "process_sort_index", "pid": lane.pid,
            "tid": lane.pid, "args": {"sort_index": index}}),
        );
        events.push(
            json!({"ph": "M", "name": "thread_name", "pid": lane.pid, "tid": lane.pid,
            "args": {"name": lane.comm}}),
        );
        if !lane.place.is_empty() {
            events.push(json!({"ph": "M", "name": "process_labels", "pid": lane.pid,
                "tid": lane.pid, "args": {"labels": lane.place}}));
        }
    }

    for (id, span) in timeline.spans().iter().enumerate() {
        let args = json!({
            "object": span.name,
            "bytes": span.bytes,
            "size": human(span.bytes),
            "still_held_at_end": span.end_ns.is_none(),
        });
        events.push(json!({"ph": "b", "cat": "shm", "id": id, "name": span.name,
            "pid": span.pid, "tid": span.pid, "ts": us(span.start_ns), "args": args}));
        events.push(json!({"ph": "e", "cat": "shm", "id": id, "name": span.name,
            "pid": span.pid, "tid": span.pid, "ts": us(span.end_ns.unwrap_or(end))}));
    }

    for mark in timeline.marks() {
        events.push(
            json!({"ph": "i", "s": "t", "cat": mark.kind.class(), "name": mark.short,
            "pid": mark.pid, "tid": mark.pid, "ts": us(mark.ts_ns),
            "args": {"detail": mark.detail}}),
        );
    }

    for d in timeline.diagnoses() {
        let lines = diagnosis::text(d);
        events.push(json!({"ph": "i", "s": "g", "cat": "diagnosis",
            "name": format!("diagnosis: {}", lines.get(1).map(String::as_str).unwrap_or("")),
            "pid": d.pid, "tid": d.pid, "ts": us(d.ts_ns),
            "args": {"text": lines[1..].join("\n")}}));
    }

    for (index, (dev, device)) in timeline.devices().enumerate() {
        let pid = DEVICE_PID_BASE + index as u64;
        let label = device.label.as_deref().unwrap_or("unknown");
        events.push(
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": pid,
            "args": {"name": format!("/dev/shm of {label} (device {})", dev_string(dev))}}),
        );
        events.push(
            json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid,
            "args": {"sort_index": -1 - index as i64}}),
        );
        for (ts, bytes) in &device.demand {
            events.push(
                json!({"ph": "C", "name": "held by traced objects", "pid": pid,
                "tid": pid, "ts": us(*ts), "args": {"bytes": bytes}}),
            );
        }
        for sample in &device.samples {
            events.push(
                json!({"ph": "C", "name": "in use (statfs)", "pid": pid, "tid": pid,
                "ts": us(sample.ts_ns), "args": {"bytes": sample.used}}),
            );
            events.push(json!({"ph": "C", "name": "size", "pid": pid, "tid": pid,
                "ts": us(sample.ts_ns), "args": {"bytes": sample.size}}));
        }
    }

    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "trace": about.description,
            "start": about.clock.rfc3339(start),
            "generator": format!("shmtrace {}", about.tool_version),
        },
    })
}
