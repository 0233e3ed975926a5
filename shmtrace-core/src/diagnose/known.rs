//! Programs known to use /dev/shm: how to recognise each (the names of its objects, its
//! process names and titles), and the settings of its own that need less of it or none.
//!
//! To add one, add an entry to [`KNOWN`]; nothing else needs to change. Object prefixes are
//! matched against the base name of a /dev/shm path, process names against the 15-character
//! `comm` and the start of the process title (/proc/PID/cmdline, which some programs rewrite).

use super::base_name;

/// One program that uses /dev/shm.
#[derive(Debug)]
pub struct KnownUser {
    /// Its name, as its users know it.
    pub program: &'static str,
    /// Prefixes of the names of its /dev/shm objects.
    pub objects: &'static [&'static str],
    /// Its process names (`comm`, at most 15 characters) or the starts of its titles.
    pub processes: &'static [&'static str],
    /// When its processes say what they are in their title after this prefix (PostgreSQL's
    /// `postgres: parallel worker for PID 34`): the prefix.
    pub title_role_prefix: Option<&'static str>,
    /// Puts what the title says after the prefix in words, when it needs them.
    pub title_role_words: Option<fn(&str) -> Option<String>>,
    /// Its own ways to need less /dev/shm, or none, each naming the setting to change.
    pub alternatives: &'static [&'static str],
    /// How its objects left behind by a killed process are best avoided, when it has a way.
    pub leftovers: Option<&'static str>,
}

/// One entry per program: the same program is the same entry.
impl PartialEq for KnownUser {
    fn eq(&self, other: &KnownUser) -> bool {
        self.program == other.program
    }
}

impl Eq for KnownUser {}

pub const KNOWN: &[KnownUser] = &[
    KnownUser {
        program: "PostgreSQL",
        objects: &["PostgreSQL."],
        processes: &["postgres", "postmaster"],
        title_role_prefix: Some("postgres: "),
        title_role_words: Some(postgres_backend),
        alternatives: &[
            "PostgreSQL: dynamic_shared_memory_type = sysv (or mmap) in postgresql.conf keeps \
             parallel query's shared memory out of /dev/shm",
            "PostgreSQL: max_parallel_workers_per_gather = 0 (or fewer workers) makes no \
             dynamic shared memory per parallel query",
        ],
        leftovers: None,
    },
    KnownUser {
        program: "NCCL",
        objects: &["nccl-"],
        processes: &[],
        title_role_prefix: None,
        title_role_words: None,
        alternatives: &[
            "NCCL: NCCL_SHM_DISABLE=1 makes ranks on one host talk through sockets or P2P \
             instead of /dev/shm (slower)",
        ],
        leftovers: None,
    },
    KnownUser {
        program: "PyTorch",
        objects: &["torch_"],
        processes: &[
            "pt_data_worker",
            "pt_main_thread",
            "pt_multiprocess",
            "torch_shm_manag",
        ],
        title_role_prefix: None,
        title_role_words: None,
        alternatives: &[
            "PyTorch: fewer DataLoader workers (num_workers), a smaller batch_size, or a \
             lower prefetch_factor",
        ],
        leftovers: Some(
            "PyTorch: the default sharing strategy, torch.multiprocessing.set_sharing_strategy\
             ('file_descriptor'), unlinks each file at once, so a killed process leaves none \
             behind ('file_system' leaves them until torch_shm_manager runs)",
        ),
    },
    KnownUser {
        program: "Python multiprocessing",
        objects: &["psm_", "sem.", "pym-", "mp-"],
        processes: &[],
        title_role_prefix: None,
        title_role_words: None,
        alternatives: &[
            "Python multiprocessing: smaller or fewer shared_memory.SharedMemory blocks \
             (psm_*); its locks and queues (sem.*) need only a few pages, but a writable \
             /dev/shm",
        ],
        leftovers: Some(
            "Python multiprocessing: call unlink() on every SharedMemory block once done, \
             and let the resource tracker run (it removes psm_* files of dead processes)",
        ),
    },
    KnownUser {
        program: "Chromium/Electron",
        objects: &[
            ".org.chromium.",
            ".com.google.Chrome.",
            ".com.microsoft.Edge.",
        ],
        processes: &["chromium", "chrome", "electron", "headless_shell"],
        title_role_prefix: None,
        title_role_words: None,
        alternatives: &[
            "Chromium/Electron: --disable-dev-shm-usage puts its shared memory files in /tmp \
             instead of /dev/shm (Puppeteer: args: ['--disable-dev-shm-usage'])",
        ],
        leftovers: None,
    },
    KnownUser {
        program: "Triton Python backend",
        objects: &["triton_python_backend_shm_region_"],
        processes: &["tritonserver", "triton_python_b"],
        title_role_prefix: None,
        title_role_words: None,
        alternatives: &[
            "Triton: --backend-config=python,shm-default-byte-size=... and \
             shm-growth-byte-size=... (smaller regions; 64 MiB per model instance by default), \
             or fewer instances in instance_group",
        ],
        leftovers: None,
    },
    KnownUser {
        program: "Ray object store",
        objects: &["plasma"],
        processes: &["raylet", "plasma_store"],
        title_role_prefix: None,
        title_role_words: None,
        alternatives: &[
            "Ray: ray.init(object_store_memory=...) or ray start --object-store-memory=... \
             below the /dev/shm size (Ray falls back to /tmp, slower, when it does not fit)",
        ],
        leftovers: None,
    },
    KnownUser {
        program: "vLLM",
        objects: &[],
        processes: &["VLLM::EngineCor", "VLLM::Worker", "vllm"],
        title_role_prefix: None,
        title_role_words: None,
        alternatives: &[
            "vLLM: its documentation runs it with --ipc=host or a --shm-size of several GiB; \
             with tensor parallelism NCCL_SHM_DISABLE=1 moves NCCL off /dev/shm",
        ],
        leftovers: Some(
            "vLLM: segments of a killed engine stay in /dev/shm; restart the container or \
             remove them before the next start",
        ),
    },
    KnownUser {
        program: "joblib",
        objects: &["joblib_memmapping_folder_"],
        processes: &[],
        title_role_prefix: None,
        title_role_words: None,
        alternatives: &[
            "joblib: JOBLIB_TEMP_FOLDER=/tmp (or Parallel(temp_folder=...)) memory-maps large \
             arrays from disk instead, and max_nbytes=None turns memory-mapping off",
        ],
        leftovers: None,
    },
    KnownUser {
        program: "Open MPI/UCX",
        objects: &["vader_segment.", "sm_segment.", "ucx_shm_posix_", "psm2_"],
        processes: &["orted", "prted", "prterun", "mpirun"],
        title_role_prefix: None,
        title_role_words: None,
        alternatives: &[
            "Open MPI: --mca btl ^vader (^sm in Open MPI 5) stops using shared memory between \
             local ranks, or --mca btl_vader_backing_directory /tmp moves it to disk",
            "UCX: UCX_TLS=^shm (or UCX_POSIX_USE_PROC_LINK=n with --ipc=host) keeps UCX out of \
             /dev/shm",
        ],
        leftovers: None,
    },
];

/// How a PostgreSQL parallel worker titles itself after the program's title prefix, before
/// its leader's pid (in the leader's pid namespace): `postgres: parallel worker for PID 34`.
pub const PARALLEL_WORKER_FOR: &str = "parallel worker for PID ";

/// The leader's pid in a parallel worker's title, `None` for any other title.
pub fn parallel_leader(title: &str) -> Option<u32> {
    let (program, pid) = title.split_once(PARALLEL_WORKER_FOR)?;
    let known = KNOWN.iter().any(|k| k.title_role_prefix == Some(program));
    known.then(|| pid.trim_end().parse().ok()).flatten()
}

/// PostgreSQL titles a client's backend `USER DATABASE HOST COMMAND` (`postgres app [local]
/// SELECT`); its other processes name themselves (`parallel worker for PID 34`,
/// `checkpointer`).
fn postgres_backend(title: &str) -> Option<String> {
    let words: Vec<&str> = title.split_whitespace().collect();
    let [user, database, host, command @ ..] = words.as_slice() else {
        return None;
    };
    let from_client = host.starts_with('[') || host.contains('(') || host.contains('.');
    if !from_client {
        return None;
    }
    let running = if command.is_empty() {
        String::new()
    } else {
        format!(", running {}", command.join(" "))
    };
    Some(format!(
        "backend of user {user} on database {database} from {host}{running}"
    ))
}

/// The program whose objects are named like `path`.
pub fn by_object(path: &str) -> Option<&'static KnownUser> {
    let name = base_name(path);
    KNOWN
        .iter()
        .find(|k| k.objects.iter().any(|prefix| name.starts_with(prefix)))
}

/// The program a process is, by its name or title.
pub fn by_process(comm: &str, title: Option<&str>) -> Option<&'static KnownUser> {
    KNOWN.iter().find(|k| {
        k.processes
            .iter()
            .any(|name| comm == *name || title.is_some_and(|t| t.starts_with(name)))
    })
}

/// The part a process plays, from its title (`parallel worker for PID 34`), for programs that
/// say so there.
pub fn role_in_title(known: &KnownUser, title: &str) -> Option<String> {
    let role = title.strip_prefix(known.title_role_prefix?)?.trim();
    if role.is_empty() {
        return None;
    }
    known
        .title_role_words
        .and_then(|words| words(role))
        .or_else(|| Some(role.to_owned()))
}

/// Whether two alternatives name the same setting (`num_workers`, `NCCL_SHM_DISABLE`): so a
/// program's own advice does not repeat what the size advice already offers.
pub fn same_setting(a: &str, b: &str) -> bool {
    let settings = |text: &str| -> Vec<String> {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.contains('_') && w.len() >= 6)
            .map(str::to_owned)
            .collect()
    };
    let in_a = settings(a);
    settings(b).iter().any(|w| in_a.contains(w))
}

/// A POSIX semaphore (`sem_open`'s `/dev/shm/sem.NAME`): a page, never what fills /dev/shm
/// unless making it fails.
pub fn is_posix_semaphore(path: &str) -> bool {
    super::base_name(path).starts_with("sem.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_objects_by_their_names() {
        let program = |path| by_object(path).map(|k| k.program);
        assert_eq!(
            program("/dev/shm/PostgreSQL.1707204622"),
            Some("PostgreSQL")
        );
        assert_eq!(program("/dev/shm/nccl-Ab12Cd"), Some("NCCL"));
        assert_eq!(
            program("/dev/shm/torch_17387_2578467999_0"),
            Some("PyTorch")
        );
        assert_eq!(
            program("/dev/shm/sem.mp-x1y2"),
            Some("Python multiprocessing")
        );
        assert_eq!(
            program("/dev/shm/triton_python_backend_shm_region_3"),
            Some("Triton Python backend")
        );
        assert_eq!(
            program("/dev/shm/vader_segment.host.0"),
            Some("Open MPI/UCX")
        );
        assert_eq!(program("/dev/shm/mydata"), None);
    }

    #[test]
    fn recognises_processes_by_name_or_title() {
        let postgres = by_process("postgres", Some("postgres: parallel worker for PID 34"));
        assert_eq!(postgres.map(|k| k.program), Some("PostgreSQL"));
        assert_eq!(
            role_in_title(postgres.unwrap(), "postgres: parallel worker for PID 34"),
            Some("parallel worker for PID 34".to_owned())
        );
        assert_eq!(
            role_in_title(
                postgres.unwrap(),
                "/usr/lib/postgresql/15/bin/postgres -D /x"
            ),
            None
        );
        assert_eq!(
            role_in_title(postgres.unwrap(), "postgres: app shop [local] SELECT"),
            Some("backend of user app on database shop from [local], running SELECT".to_owned())
        );
        assert_eq!(
            role_in_title(postgres.unwrap(), "postgres: checkpointer"),
            Some("checkpointer".to_owned())
        );
        assert_eq!(
            by_process("pt_data_worker", None).map(|k| k.program),
            Some("PyTorch")
        );
        assert_eq!(by_process("bash", Some("bash -c true")), None);
    }

    #[test]
    fn every_entry_can_be_recognised_and_offers_an_alternative() {
        for known in KNOWN {
            assert!(
                !known.objects.is_empty() || !known.processes.is_empty(),
                "{} cannot be recognised",
                known.program
            );
            assert!(
                !known.alternatives.is_empty(),
                "{} offers nothing",
                known.program
            );
        }
    }
}
