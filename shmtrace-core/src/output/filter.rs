//! Which events and diagnoses to show (`--failed`, and `show`'s selections). The model always
//! sees everything; only the display is filtered.
use crate::{
    diagnose::{Diagnosis, Role, RoleKind},
    event::Event,
    model::Annotation,
};

#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only failures: failed calls, fatal signals, abnormal exits, OOM kills.
    pub failed_only: bool,
    /// Only these processes (empty: all).
    pub pids: Vec<u32>,
    /// Only these roles (empty: all).
    pub roles: Vec<RoleKind>,
    /// Only these event names (`fallocate`, `signal`, `exit`, ...; empty: all).
    pub events: Vec<String>,
    /// Only these places: `host`, or a container name (empty: all).
    pub places: Vec<String>,
    /// Only events at or after this time (`CLOCK_BOOTTIME` ns).
    pub since_ns: Option<u64>,
    /// Only events before this time.
    pub until_ns: Option<u64>,
}

impl Filter {
    pub fn failed_only() -> Filter {
        Filter {
            failed_only: true,
            ..Filter::default()
        }
    }

    pub fn keep(&self, event: &Event, note: &Annotation, role: &Role, place: &str) -> bool {
        (!self.failed_only || note.is_failure(event))
            && (self.pids.is_empty() || self.pids.contains(&event.pid))
            && (self.roles.is_empty() || self.roles.contains(&role.kind))
            && (self.events.is_empty() || self.events.iter().any(|e| e == event_name(event)))
            && (self.places.is_empty() || self.places.iter().any(|p| place_matches(p, place)))
            && self.in_window(event.ts_ns)
    }

    pub fn keep_diagnosis(&self, diagnosis: &Diagnosis) -> bool {
        (self.pids.is_empty() || self.pids.contains(&diagnosis.pid))
            && (self.roles.is_empty() || self.roles.contains(&diagnosis.role.kind))
            && (self.places.is_empty()
                || self
                    .places
                    .iter()
                    .any(|p| place_matches(p, &diagnosis.place)))
            && self.in_window(diagnosis.ts_ns)
    }

    fn in_window(&self, ts_ns: u64) -> bool {
        self.since_ns.is_none_or(|since| ts_ns >= since)
            && self.until_ns.is_none_or(|until| ts_ns < until)
    }
}

/// `trainer` selects the container `trainer`, and `ml/job-0/trainer` (Kubernetes) too.
fn place_matches(wanted: &str, place: &str) -> bool {
    place == wanted || place.rsplit('/').next() == Some(wanted)
}

/// The name an event has in JSON and in filters.
pub fn event_name(event: &Event) -> &'static str {
    use crate::event::Body;
    match &event.body {
        Body::Call(call) => call.syscall.name(),
        Body::Signal(_) => "signal",
        Body::Fork { .. } => "fork",
        Body::Exec(_) => "exec",
        Body::Exit(_) => "exit",
        Body::Rename { .. } => "rename",
        Body::Oom { .. } => "oom_kill",
    }
}
