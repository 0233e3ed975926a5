//! What the programs attach to. Each program is named after its attach point.
use std::path::Path;

use btf_rs::Btf;
use shmtrace_common::Syscall;

use super::{BpfError, offsets};

/// One program's attach point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hook {
    /// A tracefs tracepoint, `events/<category>/<name>`.
    Tracepoint {
        category: &'static str,
        name: String,
    },
    /// A BTF tracepoint (`tp_btf/<name>`), typed arguments straight from the kernel.
    BtfTracepoint { name: &'static str },
}

impl Hook {
    /// The program's name in the eBPF object.
    pub fn program(&self) -> &str {
        match self {
            Hook::Tracepoint { name, .. } => name,
            Hook::BtfTracepoint { name } => name,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Hook::Tracepoint { category, name } => format!("tracepoint {category}/{name}"),
            Hook::BtfTracepoint { name } => format!("BTF tracepoint {name}"),
        }
    }
}

/// Every hook, in attach order: process lifecycle first, so no fork is missed while the
/// syscall probes attach.
pub fn all() -> Vec<Hook> {
    let mut hooks: Vec<Hook> = [
        "sched_process_fork",
        "sched_process_exec",
        "sched_process_exit",
        "task_rename",
        "signal_generate",
    ]
    .into_iter()
    .map(|name| Hook::BtfTracepoint { name })
    .collect();
    hooks.push(Hook::Tracepoint {
        category: "oom",
        name: "mark_victim".to_owned(),
    });
    for call in Syscall::ALL {
        for phase in ["enter", "exit"] {
            hooks.push(Hook::Tracepoint {
                category: "syscalls",
                name: format!("sys_{phase}_{}", call.name()),
            });
        }
    }
    hooks
}

/// Names every hook this kernel does not have.
pub fn check_available(hooks: &[Hook], tracefs: &Path, btf: &Btf) -> Result<(), BpfError> {
    let missing: Vec<String> = hooks
        .iter()
        .filter(|hook| match hook {
            Hook::Tracepoint { category, name } => {
                !tracefs.join("events").join(category).join(name).is_dir()
            }
            Hook::BtfTracepoint { name } => !offsets::has_btf_tracepoint(btf, name),
        })
        .map(Hook::describe)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(BpfError::MissingHooks { missing })
    }
}
