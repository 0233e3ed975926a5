//! Records the corpus (`tests/corpus/`), as root, with Docker:
//!
//! ```text
//! sudo cargo run -p shmtrace-tests --bin corpus -- list
//! sudo cargo run -p shmtrace-tests --bin corpus -- record NAME...    (or: record all)
//! ```
//!
//! Each entry runs a real program in a real container under `shmtrace record --container`,
//! and is kept only when the recording holds: what `record --json` said live is what the
//! file replays to, the program failed or succeeded as the recipe says, each diagnosis the
//! recipe names has its cause, and the size advised works when applied once (the program run
//! again with it, untraced). It then writes `NAME.shmtrace` and `NAME.yaml` (the verdicts, a
//! note of how it was made). `git diff tests/corpus` shows what changed.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use shmtrace_tests::{
    corpus::{self, Entry, Expectation, Verdict},
    docker::Container,
    pytorch, ray, read_json_lines,
    recording::Recorder,
    shared_shm::{RemovedNextDoor, SharedShm},
    sizing::{self, Job, MIB, PostgresQuery, Script, Started, workloads_mount},
    tempdir,
};

/// One entry: how to make it, and what its verdict must be.
struct Recipe {
    name: &'static str,
    about: &'static str,
    program: &'static str,
    /// The /dev/shm the program is recorded with (ignored by jobs that set none).
    shm_bytes: Option<u64>,
    job: fn() -> Box<dyn Job>,
    /// Whether the program succeeds in the recorded run.
    succeeds: bool,
    /// Causes the diagnoses must have, by `comm` or `role`: a recording whose verdict
    /// differs is refused, so re-recording never blesses a wrong answer.
    causes: &'static [(&'static str, &'static str)],
    /// For a cause other than size, the test that applies its remedy.
    remedy_checked: Option<&'static str>,
    /// The job again with a /dev/shm of this many files (`nr_inodes`), to apply a file-count
    /// advice.
    with_files: Option<fn(u64) -> Box<dyn Job>>,
    /// When the diagnosis can give no size and sends to `shmtrace size`: the roomy /dev/shm
    /// to measure the job on, whose advice is then applied.
    size_on: Option<u64>,
}

const PYTHON: &str = "/usr/bin/python3 -B";

fn recipes() -> Vec<Recipe> {
    vec![
        Recipe {
            name: "pytorch-file-descriptor-enospc",
            about: "a PyTorch DataLoader (2 workers, 8 MiB batches, prefetch 2, the default \
                    file_descriptor strategy) in a Docker container with --shm-size=8m: a \
                    worker's posix_fallocate of a batch fails with ENOSPC, the trainer exits 1",
            program: "PyTorch 2.15.0 from PyPI (tests/workloads/torch_dataloader.py)",
            shm_bytes: Some(8 * MIB),
            job: || {
                Box::new(dataloader(
                    "--workers 2 --batch-bytes 8M --prefetch 2 --batches 12 --step 0 --timeout 5",
                ))
            },
            succeeds: false,
            causes: &[("dataloader_worker", "shm_full"), ("trainer", "shm_full")],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "pytorch-file-system-enospc",
            about: "the same DataLoader with torch.multiprocessing's file_system strategy \
                    (batches by name, a torch_shm_manager per worker), --shm-size=8m: ENOSPC \
                    in a worker, the trainer exits 1",
            program: "PyTorch 2.15.0 from PyPI (tests/workloads/torch_dataloader.py --strategy file_system)",
            shm_bytes: Some(8 * MIB),
            job: || {
                Box::new(dataloader(
                    "--workers 2 --batch-bytes 8M --prefetch 2 --batches 12 --step 0 --timeout 5 --strategy file_system",
                ))
            },
            succeeds: false,
            causes: &[("dataloader_worker", "shm_full"), ("trainer", "shm_full")],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "postgres-parallel-hash-join-enospc",
            about: "PostgreSQL 15, a parallel hash join of 2 x 300k rows (work_mem=64MB, 4 \
                    workers per gather) in a container with --shm-size=8m: posix_fallocate of \
                    /dev/shm/PostgreSQL.N fails, the query fails",
            program: "PostgreSQL 15 from Debian (postgresql-15)",
            shm_bytes: Some(8 * MIB),
            job: || Box::new(hash_join()),
            succeeds: false,
            causes: &[("postgres", "shm_full")],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "ray-object-store-to-tmp",
            about: "Ray with a 200 MiB object store in Docker's default 64 MiB /dev/shm: no \
                    call fails, Ray looks at the free space and puts its store in /tmp",
            program: "Ray 2.60.0 from PyPI (tests/workloads/ray_object_store.py)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(ray::RayCluster { store: 200 * MIB }),
            succeeds: false,
            causes: &[("raylet", "shm_full")],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "shared-dev-shm-other-container",
            about: "two containers sharing one 64 MiB /dev/shm (--ipc=shareable, \
                    --ipc=container:): the holder keeps a 40 MiB file open, the traced writer's \
                    posix_fallocate of 40 MiB more fails with ENOSPC",
            program: "dd (busybox) and Python 3.11's os.posix_fallocate (Debian)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(SharedShm),
            succeeds: false,
            causes: &[("python3", "shm_full")],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "leftovers-of-a-killed-job",
            about: "a PyTorch DataLoader with the file_system strategy (2 workers, 1 MiB \
                    batches, prefetch 2) in an 8 MiB /dev/shm, killed with SIGKILL while its \
                    workers' queues are full (trainer, workers and their torch_shm_managers \
                    at once, as docker kill does): its batches stay in /dev/shm; the same job \
                    run again fails with ENOSPC although it fits alone",
            program: "PyTorch 2.15.0 from PyPI (tests/workloads/torch_dataloader.py --strategy \
                      file_system --hold-after 3)",
            shm_bytes: Some(8 * MIB),
            job: || Box::new(leftovers()),
            succeeds: false,
            causes: &[("dataloader_worker", "leftovers"), ("trainer", "leftovers")],
            remedy_checked: Some(
                "docker_causes::leftovers_of_killed_processes_are_named_and_the_size_is_not_blamed",
            ),
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "looked-at-dev-shm-then-stopped",
            about: "two services that look at /dev/shm's free space as they start (statvfs) \
                    and then serve, in Docker's default 64 MiB /dev/shm; one is stopped with \
                    SIGINT (as Ctrl-C does) and exits 130, the other with SIGTERM (as docker \
                    stop does) and exits 143: they were stopped, they decided nothing from \
                    what they saw",
            program: "Python 3.11's shutil.disk_usage (Debian; tests/workloads/look_then_serve.py)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(look_then_stop()),
            succeeds: false,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "no-dev-shm",
            about: "Python's multiprocessing.Lock() in a container started with --ipc=none (no \
                    /dev/shm): sem_open's open fails with ENOENT",
            program: "Python 3.11's multiprocessing (Debian)",
            shm_bytes: None,
            job: || Box::new(Fixed::new(&["--ipc=none"], MULTIPROCESSING_LOCK)),
            succeeds: false,
            causes: &[("python3", "no_shm")],
            remedy_checked: Some(
                "docker_causes::no_dev_shm_is_named_as_the_cause_and_its_fix_works",
            ),
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "read-only-dev-shm",
            about: "Python's multiprocessing.Lock() with /dev/shm mounted read-only (--tmpfs \
                    /dev/shm:ro): EROFS",
            program: "Python 3.11's multiprocessing (Debian)",
            shm_bytes: None,
            job: || {
                Box::new(Fixed::new(
                    &["--tmpfs", "/dev/shm:ro,size=1m"],
                    MULTIPROCESSING_LOCK,
                ))
            },
            succeeds: false,
            causes: &[("python3", "read_only")],
            remedy_checked: Some(
                "docker_causes::read_only_dev_shm_is_named_as_the_cause_and_its_fix_works",
            ),
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "healthy-chromium",
            about: "headless Chromium rendering a page to a PNG in a 1 MiB /dev/shm: it makes \
                    its shared memory with memfd_create and probes the kernel with an invalid \
                    memfd_create; it succeeds",
            program: "Chromium from Debian (chromium)",
            shm_bytes: Some(MIB),
            job: || Box::new(chromium()),
            succeeds: true,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "healthy-pytorch-training",
            about: "a PyTorch training loop (a tiny model, 3 epochs, 2 DataLoader workers) in a \
                    64 MiB /dev/shm: 48 batches through /dev/shm; it succeeds",
            program: "PyTorch 2.15.0 from PyPI (tests/workloads/torch_training.py)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(torch_script("torch_training.py --workers 2 --epochs 3")),
            succeeds: true,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "healthy-postgres-parallel-query",
            about: "PostgreSQL 15's parallel hash join of the failing entry, in a 256 MiB \
                    /dev/shm: dynamic shared memory in /dev/shm/PostgreSQL.N; it succeeds",
            program: "PostgreSQL 15 from Debian (postgresql-15)",
            shm_bytes: Some(256 * MIB),
            job: || Box::new(hash_join()),
            succeeds: true,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "mpi-job-in-a-small-dev-shm",
            about: "the Open MPI job of healthy-mpi-job in a 4 MiB /dev/shm: a rank looks at \
                    the free space, finds no room for its 4 MiB segment and exits 1 (\"target \
                    full\"), mpirun ends the others; no call fails, so no size is given, and \
                    shmtrace size on a roomy /dev/shm measures one that works",
            program: "Open MPI 4.1 and mpi4py from Debian (openmpi-bin, python3-mpi4py)",
            shm_bytes: Some(4 * MIB),
            job: || Box::new(mpi_ring(4, "--bytes 1M", "")),
            succeeds: false,
            causes: &[("python3", "shm_full"), ("mpirun", "shm_full")],
            remedy_checked: None,
            with_files: None,
            size_on: Some(256 * MIB),
        },
        Recipe {
            name: "mpi-job-without-its-transport",
            about: "the Open MPI job asked for UCX (--mca pml ucx), which finds no transport \
                    here: its ranks look at /dev/shm's free space, make their segments there \
                    all the same, and exit 1 for want of UCX; not a /dev/shm problem",
            program: "Open MPI 4.1 and mpi4py from Debian (openmpi-bin, python3-mpi4py)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(mpi_ring(4, "--bytes 1M", "--mca pml ucx")),
            succeeds: false,
            causes: &[("python3", "other")],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "mpi-ucx-job-in-a-small-dev-shm",
            about: "the Open MPI job over UCX (--mca pml ucx, its shared-memory transports) \
                    in an 8 MiB /dev/shm: each rank asks for huge pages first (shmget with \
                    SHM_HUGETLB: ENOMEM; mmap of its /dev/shm segment with MAP_HUGETLB: \
                    EINVAL) and takes ordinary pages at once; one rank's write of zeros over \
                    its 4 MiB segment fails with ENOSPC and it exits 1, mpirun ends the \
                    others with SIGTERM: none is blamed for its huge-page probes (a rank whose \
                    own write failed after the first's follows it)",
            program: "Open MPI 4.1, UCX 1.13 and mpi4py from Debian (openmpi-bin, libucx0, \
                      python3-mpi4py)",
            shm_bytes: Some(8 * MIB),
            job: || Box::new(mpi_ring(4, "--bytes 1M", UCX)),
            succeeds: false,
            causes: &[("python3", "shm_full"), ("mpirun", "shm_full")],
            remedy_checked: None,
            with_files: None,
            size_on: Some(256 * MIB),
        },
        Recipe {
            name: "healthy-mpi-ucx-job",
            about: "the Open MPI job over UCX in a 64 MiB /dev/shm: every rank's huge-page \
                    requests are refused (shmget SHM_HUGETLB ENOMEM, mmap MAP_HUGETLB EINVAL) \
                    and each falls back to ordinary pages at once; it succeeds",
            program: "Open MPI 4.1, UCX 1.13 and mpi4py from Debian (openmpi-bin, libucx0, \
                      python3-mpi4py)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(mpi_ring(4, "--bytes 1M", UCX)),
            succeeds: true,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "healthy-mpi-job",
            about: "an Open MPI job of 4 ranks (mpirun, shared-memory transport: its segments \
                    in /dev/shm) passing arrays around a ring and reducing them, in a 64 MiB \
                    /dev/shm; it succeeds",
            program: "Open MPI 4.1 and mpi4py from Debian (openmpi-bin, python3-mpi4py)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(mpi_ring(4, "--bytes 1M", "")),
            succeeds: true,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "pytorch-file-system-out-of-files",
            about: "a PyTorch DataLoader with the file_system strategy (4 workers, 64 KiB \
                    batches, prefetch 64) in a 256 MiB /dev/shm of 200 files (--tmpfs \
                    /dev/shm:size=256m,nr_inodes=200): its workers' creates fail with ENOSPC \
                    while nearly all the bytes are free",
            program: "PyTorch 2.15.0 from PyPI (tests/workloads/torch_dataloader.py --strategy file_system)",
            shm_bytes: Some(256 * MIB),
            job: || Box::new(many_files(200)),
            succeeds: false,
            causes: &[
                ("dataloader_worker", "inodes_full"),
                ("trainer", "inodes_full"),
            ],
            remedy_checked: None,
            with_files: Some(|files| Box::new(many_files(files))),
            size_on: None,
        },
        Recipe {
            name: "healthy-pytorch-file-system-enough-files",
            about: "the same DataLoader in a 256 MiB /dev/shm of 1000 files: it succeeds",
            program: "PyTorch 2.15.0 from PyPI (tests/workloads/torch_dataloader.py --strategy file_system)",
            shm_bytes: Some(256 * MIB),
            job: || Box::new(many_files(1000)),
            succeeds: true,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "shared-memory-name-removed",
            about: "Python's multiprocessing.shared_memory: an owner process holds an 8 MiB \
                    /dev/shm/job_buf mapped; another process of the job removes it with rm; a \
                    reader attaching by name 0.7 s later gets FileNotFoundError (ENOENT), exit 2",
            program: "Python 3.11's multiprocessing.shared_memory and rm (Debian, busybox)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(python("shared_name.py --wait 0.7 --remove-with-rm")),
            succeeds: false,
            causes: &[("python3", "name_removed")],
            remedy_checked: Some("healthy-shared-memory-name-kept: the same job without the rm"),
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "shared-memory-name-removed-by-another-container",
            about: "two containers sharing one /dev/shm (--ipc=shareable, --ipc=container:, as \
                    a pod's containers do): in the first, Python's \
                    multiprocessing.shared_memory owner holds an 8 MiB /dev/shm/job_buf \
                    mapped; a clean-up in the second removes it with rm; the first's reader \
                    then attaches by name and gets FileNotFoundError (ENOENT), exit 2. Both \
                    containers traced",
            program: "Python 3.11's multiprocessing.shared_memory and rm (Debian, busybox)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(RemovedNextDoor { host_wide: false }),
            succeeds: false,
            causes: &[("python3", "name_removed")],
            remedy_checked: Some("healthy-shared-memory-name-kept: the same job without the rm"),
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "healthy-shared-memory-name-kept",
            about: "the same job with nothing removing the name: the reader attaches; it \
                    succeeds",
            program: "Python 3.11's multiprocessing.shared_memory (Debian)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(python("shared_name.py --wait 0.7")),
            succeeds: true,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "writers-growing-files-by-write",
            about: "eight dd processes, started together, each writing a 4.25 MiB /dev/shm file \
                    in 64 KiB blocks (no size asked first) in an 8 MiB /dev/shm: each write that \
                    fails asks for 64 KiB while the job needs 34 MiB; the size advised counts \
                    the files' growth and works when applied, and shmtrace size on a roomy \
                    /dev/shm measures one that works",
            program: "dd (busybox) in sh, Debian's busybox-static",
            shm_bytes: Some(8 * MIB),
            job: || Box::new(eight_writers()),
            succeeds: false,
            causes: &[("dd", "shm_full")],
            remedy_checked: None,
            with_files: None,
            size_on: Some(256 * MIB),
        },
        Recipe {
            name: "healthy-writers-growing-files-by-write",
            about: "the same eight writers in a 64 MiB /dev/shm: they succeed",
            program: "dd (busybox) in sh, Debian's busybox-static",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(eight_writers()),
            succeeds: true,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "missing-directory-under-dev-shm",
            about: "Python creating /dev/shm/app/state when /dev/shm/app was never made: ENOENT \
                    on a host whose /dev/shm exists, exit 1",
            program: "Python 3.11 (Debian)",
            shm_bytes: Some(64 * MIB),
            job: || Box::new(Fixed::new(&[], MISSING_DIRECTORY)),
            succeeds: false,
            causes: &[("python3", "no_directory")],
            remedy_checked: Some(
                "healthy-directory-under-dev-shm: the same with the directory made",
            ),
            with_files: None,
            size_on: None,
        },
        Recipe {
            name: "healthy-directory-under-dev-shm",
            about: "the same program after mkdir /dev/shm/app: it succeeds",
            program: "Python 3.11 (Debian)",
            shm_bytes: Some(64 * MIB),
            job: || {
                Box::new(Fixed::new(
                    &[],
                    &format!("mkdir /dev/shm/app && {MISSING_DIRECTORY}"),
                ))
            },
            succeeds: true,
            causes: &[],
            remedy_checked: None,
            with_files: None,
            size_on: None,
        },
    ]
}

/// Open MPI's UCX point-to-point layer, made to take UCX's shared-memory transports: Open MPI
/// 4.1 otherwise keeps UCX for InfiniBand devices, which a container here has none of.
const UCX: &str = "--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any";

const MISSING_DIRECTORY: &str =
    "/usr/bin/python3 -B -c 'open(\"/dev/shm/app/state\", \"w\").write(\"ok\")'";

fn python(script_and_args: &str) -> Script {
    let mut flags = workloads_mount();
    flags.extend(["-w".to_owned(), "/w".to_owned()]);
    Script {
        what: script_and_args.to_owned(),
        flags,
        command: format!("{PYTHON} {script_and_args}"),
    }
}

/// Eight dd processes, each growing its own file by 64 KiB writes to 4.25 MiB; the shell
/// fails when one of them does.
///
/// Each writer's shell is started first and waits at a gate, then becomes dd: a shell starting
/// dd in the background on a loaded machine may start the last after the others have ended,
/// and then nothing in the trace tells it from a step run after the previous one, whose files
/// are leftovers (CI, stop 41).
fn eight_writers() -> Script {
    Script {
        what: "eight writers".to_owned(),
        flags: Vec::new(),
        command: "pids=; for i in 1 2 3 4 5 6 7 8; do (while [ ! -e /tmp/writers ]; do sleep \
                  0.01; done; exec dd if=/dev/zero of=/dev/shm/part$i bs=64k count=68 \
                  2>/dev/null) & pids=\"$pids $!\"; done; touch /tmp/writers; rc=0; for p in \
                  $pids; do wait $p || rc=1; done; rm -f /dev/shm/part*; exit $rc"
            .to_owned(),
    }
}

/// The file_system strategy's DataLoader making many small files, in a /dev/shm of `files`
/// files.
fn many_files(files: u64) -> Tmpfs {
    Tmpfs {
        files,
        script: dataloader(
            "--workers 4 --batch-bytes 64K --prefetch 64 --batches 300 --step 0.001 --timeout 30 \
             --strategy file_system",
        ),
    }
}

/// A script with a /dev/shm mounted as a tmpfs of the size asked for and `files` files
/// (`--tmpfs /dev/shm:size=...,nr_inodes=...`).
struct Tmpfs {
    files: u64,
    script: Script,
}

impl Job for Tmpfs {
    fn describe(&self) -> String {
        format!("{} with nr_inodes={}", self.script.describe(), self.files)
    }

    fn start(&self, shm_bytes: u64) -> Box<dyn Started> {
        let mut flags = vec![
            "--tmpfs".to_owned(),
            format!("/dev/shm:rw,size={shm_bytes},nr_inodes={}", self.files),
        ];
        flags.extend(self.script.flags.iter().cloned());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let script = format!(
            "while [ ! -e /work/go ]; do sleep 0.05; done; {}",
            self.script.command
        );
        Box::new(ScriptRun(Container::run("corpus", &flags, &script)))
    }
}

const MULTIPROCESSING_LOCK: &str =
    "/usr/bin/python3 -B -c 'import multiprocessing as mp; mp.Lock(); print(\"ok\")'";

fn dataloader(args: &str) -> Script {
    torch_script(&format!("torch_dataloader.py {args}"))
}

fn torch_script(script_and_args: &str) -> Script {
    let venv = pytorch::venv().display().to_string();
    let mut flags = workloads_mount();
    flags.extend(pytorch::docker_mounts());
    Script {
        what: script_and_args.to_owned(),
        flags,
        command: format!("cd /w && {venv}/bin/python -B {script_and_args}"),
    }
}

fn hash_join() -> PostgresQuery {
    PostgresQuery {
        what: "PostgreSQL 15, parallel hash join of 2 x 300k rows".to_owned(),
        settings: vec![
            "max_parallel_workers_per_gather=4".to_owned(),
            "work_mem=64MB".to_owned(),
        ],
        setup: "CREATE TABLE a AS SELECT g AS id, md5(g::text) AS pad FROM \
                generate_series(1, 300000) g; CREATE TABLE b AS SELECT * FROM a; \
                ANALYZE a; ANALYZE b;"
            .to_owned(),
        query: "SET enable_parallel_hash = on; SET parallel_leader_participation = on; \
                SELECT count(*) FROM a JOIN b USING (id);"
            .to_owned(),
    }
}

/// The file_system strategy's DataLoader killed with SIGKILL, every process of it at once, while
/// its workers' batches are queued in /dev/shm; then run again beside what it left.
fn leftovers() -> Script {
    let mut job = dataloader(
        "--workers 2 --batch-bytes 1M --prefetch 2 --batches 40 --step 0 --timeout 10 \
         --strategy file_system",
    );
    // docker kill: SIGKILL to every process of the container but its shell (pid 1).
    job.command = format!(
        "{0} --hold-after 3 --ready /tmp/held & while [ ! -e /tmp/held ]; do sleep 0.05; done; \
         for p in /proc/[0-9]*; do pid=${{p#/proc/}}; [ $pid != 1 ] && kill -9 $pid 2>/dev/null; \
         done; wait; {0}",
        job.command
    );
    job
}

/// Two services that look at /dev/shm's free space and serve, stopped by SIGINT and SIGTERM.
/// The job ends as the first did (130) when the second ended as stopped too (143), and with 1
/// otherwise... or 0 when the first was not stopped either, which the recorder refuses.
fn look_then_stop() -> Script {
    let mut flags = workloads_mount();
    flags.extend(["-w".to_owned(), "/w".to_owned()]);
    Script {
        what: "two services stopped after looking at /dev/shm".to_owned(),
        flags,
        command: format!(
            "{PYTHON} look_then_serve.py --ready /tmp/a & a=$!; {PYTHON} look_then_serve.py \
             --ready /tmp/b & b=$!; while [ ! -e /tmp/a ] || [ ! -e /tmp/b ]; do sleep 0.05; \
             done; kill -INT $a; kill -TERM $b; wait $a; ra=$?; wait $b; rb=$?; echo \
             \"stopped: $ra $rb\"; [ $rb = 143 ] && exit $ra"
        ),
    }
}

fn chromium() -> Script {
    let pages = tempdir();
    std::fs::write(
        pages.join("page.html"),
        "<html><body><h1>shmtrace</h1><p>a page rendered in a 1 MiB /dev/shm</p></body></html>",
    )
    .unwrap();
    Script {
        what: "headless Chromium".to_owned(),
        flags: vec![
            "-v".to_owned(),
            "/etc:/etc:ro".to_owned(),
            "-v".to_owned(),
            format!("{}:/page:ro", pages.display()),
            "-e".to_owned(),
            "HOME=/tmp".to_owned(),
        ],
        command: "cd /tmp && /usr/lib/chromium/chromium --headless --no-sandbox --disable-gpu \
                  --screenshot=/tmp/shot.png file:///page/page.html && test -s /tmp/shot.png"
            .to_owned(),
    }
}

/// How long an Open MPI job may take: a few seconds here, a minute on a loaded machine.
const MPIRUN_TIMEOUT_SECS: u32 = 90;

/// What a job prints when a timeout from outside ended it: `record` then runs it again.
const OUT_OF_TIME: &str = "shmtrace-test: the job ran out of time";

fn mpi_ring(ranks: u32, args: &str, mpirun: &str) -> Script {
    let mut flags = workloads_mount();
    flags.extend(
        [
            "/etc/alternatives",
            "/etc/openmpi",
            "/etc/passwd",
            "/etc/group",
        ]
        .iter()
        .flat_map(|dir| ["-v".to_owned(), format!("{dir}:{dir}:ro")]),
    );
    // Docker's seccomp profile refuses process_vm_readv: copy through the segments instead
    // of printing a warning for every message.
    flags.extend([
        "-e".to_owned(),
        "OMPI_MCA_btl_vader_single_copy_mechanism=none".to_owned(),
    ]);
    Script {
        what: "an Open MPI ring".to_owned(),
        flags,
        // Bounded twice. mpirun's own timeout ends a job whose ranks hang. After a rank
        // fails, mpirun itself sometimes hangs with no rank left, in PMIx_server_finalize
        // (2 runs of about 40 here, seen with gdb): that one only a timeout from outside
        // ends, and the job says so for `record` to run it again. (Busybox's timeout runs
        // mpirun in its own process: the tree is the same.)
        command: format!(
            "cd /w && timeout -k 5 {outer} mpirun --allow-run-as-root --oversubscribe --timeout \
             {inner} {mpirun} -np {ranks} {PYTHON} mpi_ring.py {args}; s=$?; [ $s = 143 ] || \
             [ $s = 137 ] && echo '{OUT_OF_TIME}' >&2; exit $s",
            inner = MPIRUN_TIMEOUT_SECS,
            outer = MPIRUN_TIMEOUT_SECS + 30,
        ),
    }
}

/// A script in a container with fixed flags that give /dev/shm no size (`--ipc=none`, a
/// read-only tmpfs): the size asked for is ignored.
struct Fixed(Script);

impl Fixed {
    fn new(flags: &[&str], command: &str) -> Fixed {
        Fixed(Script {
            what: command.to_owned(),
            flags: flags.iter().map(|s| (*s).to_owned()).collect(),
            command: command.to_owned(),
        })
    }
}

impl Job for Fixed {
    fn describe(&self) -> String {
        self.0.describe()
    }

    fn start(&self, _shm_bytes: u64) -> Box<dyn Started> {
        let script = format!(
            "while [ ! -e /work/go ]; do sleep 0.05; done; {}",
            self.0.command
        );
        let flags: Vec<&str> = self.0.flags.iter().map(String::as_str).collect();
        Box::new(ScriptRun(Container::run("corpus", &flags, &script)))
    }
}

struct ScriptRun(Container);

impl Started for ScriptRun {
    fn container(&self) -> &str {
        &self.0.name
    }

    fn go(&mut self) -> bool {
        self.0.signal("go");
        self.0.wait() == 0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let recipes = recipes();
    match args.first().map(String::as_str) {
        Some("list") => {
            for recipe in &recipes {
                println!("{}: {}", recipe.name, recipe.about);
            }
        }
        Some("record") if args.len() > 1 => {
            let wanted: Vec<&Recipe> = if args[1] == "all" {
                recipes.iter().collect()
            } else {
                args[1..]
                    .iter()
                    .map(|name| {
                        recipes
                            .iter()
                            .find(|r| r.name == name)
                            .unwrap_or_else(|| panic!("no entry {name}: see `corpus list`"))
                    })
                    .collect()
            };
            shmtrace_tests::require_root();
            for recipe in wanted {
                record(recipe, &corpus::dir());
            }
        }
        // As `record`, into a scratch directory: the end-to-end tests run the real programs
        // again, check the causes, and apply the advice, leaving the corpus as it is.
        Some("check") if args.len() > 1 => {
            shmtrace_tests::require_root();
            let scratch = tempdir();
            for name in &args[1..] {
                let recipe = recipes
                    .iter()
                    .find(|r| r.name == name)
                    .unwrap_or_else(|| panic!("no entry {name}: see `corpus list`"));
                record(recipe, &scratch);
            }
            let _ = std::fs::remove_dir_all(scratch);
        }
        _ => {
            eprintln!(
                "usage: corpus list | corpus record NAME... | corpus record all | corpus check \
                 NAME..."
            );
            std::process::exit(2);
        }
    }
}

/// Records one entry, checks it, and writes it into `dir`.
fn record(recipe: &Recipe, dir: &Path) {
    eprintln!("corpus: recording {}", recipe.name);
    let job = (recipe.job)();
    let shm = recipe.shm_bytes.unwrap_or(0);
    let mut run = recorded_run(job.as_ref(), shm);
    // Once more when a timeout ended the program (a hang of the program's own, not of the
    // trace): the recording of a run that never ended is no verdict.
    if run.logs.contains(OUT_OF_TIME) {
        eprintln!(
            "corpus: {}: {OUT_OF_TIME}; recording it again. Its log:\n{}",
            recipe.name, run.logs
        );
        let _ = std::fs::remove_dir_all(&run.work);
        run = recorded_run(job.as_ref(), shm);
    }
    let RecordedRun {
        work,
        trace,
        live,
        succeeded,
        status,
        stderr,
        logs,
    } = run;
    assert_eq!(status.code(), Some(130), "record: {stderr}");
    let live_verdicts = corpus::verdicts(&read_json_lines(&live));
    let replayed = corpus::replayed(&trace).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        live_verdicts, replayed,
        "{}: the replay differs from the live run",
        recipe.name
    );
    assert_eq!(
        succeeded,
        recipe.succeeds,
        "{}: the program {} ({stderr}); its container's log:\n{logs}",
        recipe.name,
        if succeeded { "succeeded" } else { "failed" }
    );
    check_causes(recipe, &replayed);
    let advised = replayed.iter().filter_map(|v| v.advised).max();
    let works_at = match (advised, recipe.succeeds) {
        (Some(size), _) => {
            eprintln!("corpus: {} applies the advice: {size} bytes", recipe.name);
            assert!(
                job.start(size).go(),
                "{}: the advised {size} bytes did not work",
                recipe.name
            );
            Some(size)
        }
        (None, true) => recipe.shm_bytes,
        (None, false) => None,
    };
    // No size given, and sent to `shmtrace size`: measure on a roomy /dev/shm, apply that.
    let works_at = match (works_at, recipe.size_on) {
        (None, Some(roomy)) => {
            let sized = sizing::size(job.as_ref(), roomy, &[]);
            assert!(
                sized.succeeded,
                "{}: failed on a roomy /dev/shm",
                recipe.name
            );
            let measured = sized.advised();
            eprintln!(
                "corpus: {} applies shmtrace size's {measured} bytes",
                recipe.name
            );
            assert!(
                job.start(measured).go(),
                "{}: shmtrace size's {measured} bytes did not work",
                recipe.name
            );
            Some(measured)
        }
        (works_at, _) => works_at,
    };
    let files = replayed.iter().filter_map(|v| v.files).max();
    if let Some(files) = files {
        let again = recipe.with_files.unwrap_or_else(|| {
            panic!(
                "{}: advises nr_inodes={files}, and the recipe cannot apply it",
                recipe.name
            )
        })(files);
        eprintln!(
            "corpus: {} applies the advice: nr_inodes={files}",
            recipe.name
        );
        assert!(
            again.start(shm).go(),
            "{}: the advised nr_inodes={files} did not work",
            recipe.name
        );
    }
    let expectation = Expectation {
        about: recipe
            .about
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        program: recipe
            .program
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        remake: format!(
            "sudo cargo run -p shmtrace-tests --bin corpus -- record {}",
            recipe.name
        ),
        recorded: recorded_on(),
        shm_bytes: recipe.shm_bytes,
        succeeded,
        works_at,
        files_work_at: files,
        remedy_checked: recipe.remedy_checked.map(str::to_owned),
        verdicts: replayed,
    };
    let yaml = serde_norway::to_string(&expectation).unwrap();
    let out_trace = Entry::trace(dir, recipe.name);
    std::fs::copy(&trace, &out_trace).unwrap();
    readable(&out_trace);
    let out_yaml = Entry::yaml(dir, recipe.name);
    std::fs::write(&out_yaml, yaml).unwrap();
    readable(&out_yaml);
    let _ = std::fs::remove_dir_all(&work);
    eprintln!(
        "corpus: wrote {} ({} bytes) and {}",
        out_trace.display(),
        std::fs::metadata(&out_trace).unwrap().len(),
        out_yaml.display()
    );
    for verdict in &expectation.verdicts {
        eprintln!("  {verdict}");
    }
}

/// One traced run of a job, as `record` reads it.
struct RecordedRun {
    /// The scratch directory of the two files below.
    work: PathBuf,
    trace: PathBuf,
    live: PathBuf,
    succeeded: bool,
    /// How `shmtrace record` ended, and what it printed.
    status: std::process::ExitStatus,
    stderr: String,
    /// The end of the container's log.
    logs: String,
}

fn recorded_run(job: &dyn Job, shm: u64) -> RecordedRun {
    let work = tempdir();
    let trace = work.join("trace.shmtrace");
    let live = work.join("live.jsonl");
    let mut started = job.start(shm);
    let recorder = Recorder::start(
        &[
            "--container",
            started.container(),
            "--compress",
            "--json",
            "-o",
            trace.to_str().unwrap(),
        ],
        &live,
        "shmtrace: tracing container",
    );
    let succeeded = started.go();
    // The last events are in the ring buffer; the recorder reads every 100 ms.
    std::thread::sleep(Duration::from_millis(500));
    let (status, stderr) = recorder.interrupt();
    let logs = Command::new("docker")
        .args(["logs", "--tail", "40", started.container()])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        })
        .unwrap_or_default();
    RecordedRun {
        work,
        trace,
        live,
        succeeded,
        status,
        stderr,
        logs,
    }
}

/// The recipe's causes, each found among the verdicts, and no verdict with a cause the recipe
/// does not name (a rank blamed for its huge-page probe, a stopped service for its look); no
/// diagnosis for a healthy run.
fn check_causes(recipe: &Recipe, verdicts: &[Verdict]) {
    for verdict in verdicts {
        assert!(
            recipe
                .causes
                .iter()
                .any(|(_, cause)| verdict.cause == *cause),
            "{}: {verdict} has a cause the recipe does not name: {verdicts:?}",
            recipe.name
        );
    }
    if recipe.succeeds {
        assert!(
            verdicts.is_empty(),
            "{}: a healthy run was diagnosed: {verdicts:?}",
            recipe.name
        );
    }
    for (who, cause) in recipe.causes {
        assert!(
            verdicts
                .iter()
                .any(|v| (v.comm == *who || v.role == *who) && v.cause == *cause),
            "{}: no {who} diagnosed {cause}: {verdicts:?}",
            recipe.name
        );
    }
}

/// `2026-12-03, Linux 6.18.0, shmtrace 0.1.0`.
fn recorded_on() -> String {
    let run = |program: &str, args: &[&str]| {
        let out = Command::new(program).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    format!(
        "{}, Linux {}, {}",
        run("date", &["-u", "+%Y-%m-%d"]),
        run("uname", &["-r"]),
        run(
            shmtrace_tests::shmtrace_bin().to_str().unwrap(),
            &["--version"]
        ),
    )
}

fn readable(path: &PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}
