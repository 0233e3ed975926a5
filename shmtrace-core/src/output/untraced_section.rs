//! The part of a diagnosis that names what others hold of the /dev/shm that failed, and who
//! shares it: lines for people, an object for programs.
use serde_json::{Value, json};

use crate::{
    diagnose::{OtherHolder, Others},
    units::{count, human},
};

/// `(label, text)` lines, as [`super::diagnosis::lines`] takes them.
pub fn lines(o: &Others) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if o.count > 0 {
        out.push((
            "others",
            format!(
                "{} of it held by {} that no traced process made or holds:",
                human(o.bytes),
                count(o.count as u64, "file")
            ),
        ));
        for file in &o.files {
            let state = if file.linked { "" } else { ", unlinked" };
            let who = if file.holders.is_empty() {
                "held by no process (left behind)".to_owned()
            } else {
                file.holders
                    .iter()
                    .map(holder)
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            out.push((
                "",
                format!("{} ({}{state}), {who}", file.path, human(file.bytes)),
            ));
        }
        if o.count > o.files.len() {
            out.push(("", format!("... and {} more", o.count - o.files.len())));
        }
    }
    if o.shared_by.len() > 1 {
        let sharers: Vec<String> = o
            .shared_by
            .iter()
            .map(|s| format!("{} (/dev/shm {})", s.container, s.ipc))
            .collect();
        out.push((
            "shared",
            format!(
                "one /dev/shm for containers {}: their use adds up",
                sharers.join(", ")
            ),
        ));
    }
    out
}

fn holder(h: &OtherHolder) -> String {
    let how = match (h.open, h.mapped) {
        (true, true) => "open and mapped",
        (false, true) => "mapped",
        _ => "open",
    };
    let place = if h.in_container {
        format!("in container {}", h.place)
    } else if h.place == "host" {
        "on the host".to_owned()
    } else {
        format!("in {}", h.place)
    };
    format!("{how} by pid {} {} {place}", h.pid, h.comm)
}

pub fn json(o: &Others) -> Value {
    json!({
        "bytes": o.bytes,
        "count": o.count,
        "files": o.files.iter().map(|f| json!({
            "path": f.path,
            "linked": f.linked,
            "bytes": f.bytes,
            "size": f.size,
            "holders": f.holders.iter().map(|h| json!({
                "pid": h.pid,
                "comm": h.comm,
                "place": h.place,
                "container": h.in_container.then_some(&h.place),
                "open": h.open,
                "mapped": h.mapped,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "shared_by": o.shared_by.iter().map(|s| json!({
            "container": s.container,
            "ipc": s.ipc,
        })).collect::<Vec<_>>(),
        "owner": o.owner,
    })
}
