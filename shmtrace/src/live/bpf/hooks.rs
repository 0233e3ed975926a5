//! What the programs attach to. Each entry program is named after its tracepoint; one exit
//! program, `sys_exit`, serves the `sys_exit_*` tracepoints of the calls traced at both ends.
//! The calls traced at their exit only have no entry program, and an exit program of their own
//! named after its tracepoint; the one traced at its entry only (`close`) has no exit program.
use std::path::Path;

use shmtrace_common::Syscall;

use super::{BpfError, arch::KernelArch};

/// One program's attach point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hook {
    /// A tracefs tracepoint, `events/<category>/<name>`, and the program attached to it.
    Tracepoint {
        program: String,
        category: &'static str,
        name: String,
    },
    /// A raw tracepoint (`raw_tp/<name>`): the tracepoint's own arguments, without tracefs'
    /// copy into a record. Its tracefs entry, `events/<category>/<name>`, says it exists.
    RawTracepoint {
        category: &'static str,
        name: &'static str,
    },
}

impl Hook {
    /// The program's name in the eBPF object.
    pub fn program(&self) -> &str {
        match self {
            Hook::Tracepoint { program, .. } => program,
            Hook::RawTracepoint { name, .. } => name,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Hook::Tracepoint { category, name, .. } => format!("tracepoint {category}/{name}"),
            Hook::RawTracepoint { category, name } => format!("raw tracepoint {category}/{name}"),
        }
    }
}

/// The program attached to the `sys_exit_*` tracepoint of every call traced at both ends.
pub const EXIT_PROGRAM: &str = "sys_exit";

/// The calls that make a file system, whose exits end what the probes know of device numbers
/// (`shmtrace_common::supers`): each has a program of its own, named after the tracepoint.
pub const MOUNT_CALLS: [&str; 2] = ["mount", "fsconfig"];

/// Every hook of this machine's architecture, in attach order.
pub fn all() -> Vec<Hook> {
    for_arch(KernelArch::HOST)
}

/// Every hook on `arch`, in attach order: process lifecycle first, so no fork is missed while
/// the syscall probes attach. A traced call the architecture lacks has no hook there; its
/// program stays in the object, unloaded.
pub fn for_arch(arch: KernelArch) -> Vec<Hook> {
    let mut hooks: Vec<Hook> = [
        ("sched", "sched_process_fork"),
        ("sched", "sched_process_exec"),
        ("sched", "sched_process_exit"),
        ("task", "task_rename"),
        ("signal", "signal_generate"),
    ]
    .into_iter()
    .map(|(category, name)| Hook::RawTracepoint { category, name })
    .collect();
    hooks.push(Hook::Tracepoint {
        program: "mark_victim".to_owned(),
        category: "oom",
        name: "mark_victim".to_owned(),
    });
    for call in MOUNT_CALLS {
        let exit = format!("sys_exit_{call}");
        hooks.push(Hook::Tracepoint {
            program: exit.clone(),
            category: "syscalls",
            name: exit,
        });
    }
    for call in Syscall::ALL.into_iter().filter(|call| arch.has(*call)) {
        let exit = format!("sys_exit_{}", call.name());
        if call.traced_at_exit_only() {
            hooks.push(Hook::Tracepoint {
                program: exit.clone(),
                category: "syscalls",
                name: exit,
            });
            continue;
        }
        let enter = format!("sys_enter_{}", call.name());
        hooks.push(Hook::Tracepoint {
            program: enter.clone(),
            category: "syscalls",
            name: enter,
        });
        if call.traced_at_entry_only() {
            continue;
        }
        hooks.push(Hook::Tracepoint {
            program: EXIT_PROGRAM.to_owned(),
            category: "syscalls",
            name: exit,
        });
    }
    hooks
}

/// Names every hook this kernel does not have.
pub fn check_available(hooks: &[Hook], tracefs: &Path) -> Result<(), BpfError> {
    let missing: Vec<String> = hooks
        .iter()
        .filter(|hook| {
            let (category, name) = match hook {
                Hook::Tracepoint { category, name, .. } => (*category, name.as_str()),
                Hook::RawTracepoint { category, name } => (*category, *name),
            };
            !tracefs.join("events").join(category).join(name).is_dir()
        })
        .map(Hook::describe)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(BpfError::MissingHooks { missing })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

    use super::*;
    use crate::live::bpf::EBPF_OBJECT;

    /// Every program in the committed object, as (name, ELF section).
    fn programs_in_object() -> BTreeSet<(String, String)> {
        let file = object::File::parse(EBPF_OBJECT).expect("the committed object is ELF");
        file.symbols()
            .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.is_global())
            .filter_map(|symbol| {
                let section = file.section_by_index(symbol.section_index()?).ok()?;
                let section = section.name().ok()?.to_owned();
                let name = symbol.name().ok()?.to_owned();
                (section == "tracepoint" || section.starts_with("raw_tp/"))
                    .then_some((name, section))
            })
            .collect()
    }

    /// Runs without root or a kernel: the loader's hook lists of every architecture and the
    /// object agree, program by program, on names, program types and attach points.
    #[test]
    fn every_program_in_the_object_has_its_hook_and_back() {
        let in_object = programs_in_object();
        let mut wanted = BTreeSet::new();
        for arch in KernelArch::ALL {
            let hooks = for_arch(arch);
            for hook in &hooks {
                let section = match hook {
                    Hook::Tracepoint { .. } => "tracepoint".to_owned(),
                    Hook::RawTracepoint { name, .. } => format!("raw_tp/{name}"),
                };
                wanted.insert((hook.program().to_owned(), section));
            }
            check_attach_points(arch, &hooks);
        }
        let missing: Vec<_> = wanted.difference(&in_object).collect();
        let unused: Vec<_> = in_object.difference(&wanted).collect();
        assert!(
            missing.is_empty(),
            "hooks whose program is not in the object (or has another type): {missing:?}"
        );
        assert!(
            unused.is_empty(),
            "programs in the object that no hook attaches on any architecture: {unused:?}"
        );
    }

    /// Attach points: each entry program to its own call's tracepoint, the shared exit program
    /// to the exit of every call traced at both ends, an exit-only call's program to its own
    /// exit, nothing to an entry-only call's exit, nothing for a call the architecture lacks,
    /// and no tracepoint twice.
    fn check_attach_points(arch: KernelArch, hooks: &[Hook]) {
        let mut attach_points = BTreeSet::new();
        for hook in hooks {
            if let Hook::Tracepoint {
                program,
                category,
                name,
            } = hook
            {
                assert!(
                    attach_points.insert((*category, name.clone())),
                    "{name} twice on {arch:?}"
                );
                let exit_only = Syscall::ALL.iter().any(|call| {
                    call.traced_at_exit_only() && *name == format!("sys_exit_{}", call.name())
                }) || MOUNT_CALLS
                    .iter()
                    .any(|call| *name == format!("sys_exit_{call}"));
                if name.starts_with("sys_exit_") && !exit_only {
                    assert_eq!(program, EXIT_PROGRAM, "{name}");
                } else {
                    assert_eq!(
                        program, name,
                        "entry and exit-only programs are named after their tracepoint"
                    );
                }
            }
        }
        let calls: Vec<Syscall> = Syscall::ALL
            .into_iter()
            .filter(|call| arch.has(*call))
            .collect();
        for call in Syscall::ALL {
            for phase in ["enter", "exit"] {
                let name = format!("sys_{phase}_{}", call.name());
                let wanted = arch.has(call)
                    && match phase {
                        "enter" => !call.traced_at_exit_only(),
                        _ => !call.traced_at_entry_only(),
                    };
                assert_eq!(
                    attach_points.contains(&("syscalls", name.clone())),
                    wanted,
                    "{name} on {arch:?}"
                );
            }
        }
        let exit_only = calls.iter().filter(|c| c.traced_at_exit_only()).count();
        let entry_only = calls.iter().filter(|c| c.traced_at_entry_only()).count();
        // The open family (`open` on x86-64 only), the five calls on a descriptor, `statfs`
        // and `fstatfs`; `close`.
        let opens = if arch.has(Syscall::Open) { 3 } else { 2 };
        assert_eq!((exit_only, entry_only), (opens + 7, 1), "{arch:?}");
        // And `oom/mark_victim`.
        assert_eq!(
            attach_points.len(),
            2 * calls.len() - exit_only - entry_only + MOUNT_CALLS.len() + 1,
            "{arch:?}"
        );
    }

    #[test]
    fn arm64_has_no_unlink_or_open_hook() {
        let names: Vec<String> = for_arch(KernelArch::Aarch64)
            .iter()
            .map(|hook| hook.describe())
            .collect();
        for (old, phase) in [("unlink", "enter"), ("open", "exit")] {
            assert!(
                !names
                    .iter()
                    .any(|n| n.ends_with(&format!("/sys_{phase}_{old}")))
            );
            assert!(
                names
                    .iter()
                    .any(|n| n.ends_with(&format!("/sys_{phase}_{old}at")))
            );
        }
        // On x86-64, `unlink` has an entry and an exit hook, `open` an exit hook.
        assert_eq!(for_arch(KernelArch::X86_64).len(), names.len() + 3);
    }
}
