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
                format!("pid {} ({}) ended: {status:?}", event.pid, event.comm),
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
