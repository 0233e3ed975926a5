//! What the pipeline hands the tap besides raw records: the flight recorder's triggers and
//! the capacity samples it measured.
use crate::{
    capacity::Capacity,
    diagnose::{Role, RoleKind},
    event::{Body, Event, Exit},
    model::Annotation,
    record::{self, Trigger, TriggerReason, UserRecord},
};

pub(super) fn capacity_record(sample: &Capacity, pid: Option<u32>) -> UserRecord {
    UserRecord::Capacity(record::CapacitySample {
        pid,
        container: None,
        capacity: sample.into(),
    })
}

/// What makes the flight recorder write its window: ENOSPC, a SIGBUS fault, a worker's death.
pub(super) fn trigger(event: &Event, note: &Annotation, role: &Role) -> Option<Trigger> {
    let (reason, detail) = match &event.body {
        Body::Call(call) if call.errno() == Some(libc::ENOSPC) => (
            TriggerReason::Enospc,
            format!(
                "{} on {} returned ENOSPC",
                call.syscall.name(),
                note.object_path.as_deref().unwrap_or("?")
            ),
        ),
        Body::Signal(signal) if signal.signo == libc::SIGBUS && signal.addr != 0 => (
            TriggerReason::Sigbus,
            format!(
                "SIGBUS at {:#x}{}",
                signal.addr,
                note.fault
                    .as_ref()
                    .map(|f| format!(" in {}", f.path))
                    .unwrap_or_default()
            ),
        ),
        Body::Exit(Exit { status, .. })
            if !status.success()
                && (role.kind == RoleKind::DataloaderWorker
                    || matches!(status, crate::event::ExitStatus::Signal { .. })) =>
        {
            (
                TriggerReason::WorkerDeath,
                format!("pid {} ({}) {}", event.pid, event.comm, status.describe()),
            )
        }
        _ => return None,
    };
    let pid = match &event.body {
        Body::Signal(signal) => signal.target_pid,
        _ => event.pid,
    };
    Some(Trigger {
        reason,
        pid: Some(pid),
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ExitStatus;

    /// Issue 33: incidents said `ended: Signal { signo: 15, core_dumped: false }`, and the
    /// daemon's JSON `worker death` where docs/json.md says `worker_death`.
    #[test]
    fn a_death_is_told_in_words() {
        let event = Event {
            ts_ns: 1,
            cpu: 0,
            pid: 42,
            tid: 42,
            comm: "pt_data_worker".to_owned(),
            mntns: 1,
            cgroup_id: 1,
            container_match: false,
            body: Body::Exit(
                ExitStatus::Signal {
                    signo: libc::SIGBUS,
                    core_dumped: false,
                }
                .into(),
            ),
        };
        let role = Role {
            kind: RoleKind::DataloaderWorker,
            worker_index: Some(0),
            trainer: Some(1),
        };
        let trigger = trigger(&event, &Annotation::default(), &role).unwrap();
        assert_eq!(trigger.detail, "pid 42 (pt_data_worker) killed by SIGBUS");
        assert_eq!(trigger.reason.key(), "worker_death");
        assert_eq!(
            trigger.reason.as_str(),
            "worker death",
            "the trace format's word"
        );
    }
}
