//! What live tracing, recording and the demo share: load the probes (or, where they cannot
//! load, start the ptrace tracer), start or find the target, run a session until it ends.
use std::{
    collections::HashSet,
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    cli::{BackendChoice, TargetArgs},
    container::{Container, Query, Resolver},
    live::{
        bpf::{EventReader, Tracer, TracerOptions},
        hold::Hold,
        proc_scan,
        session::{Ending, Outcome, Session},
        signals::Signals,
        source::Backend,
        target::{self, RunningCommand},
        watch::{self, Watch},
    },
    ptrace,
};
use shmtrace_core::{
    clock::boot_ns, event::escape, model::ContainerInfo, pipeline::Pipeline,
    record::TargetDescription,
};

/// What a live trace follows.
pub enum What {
    Command(Vec<OsString>),
    Pids(Vec<u32>),
    /// Containers, looked up through their runtimes.
    Containers {
        queries: Vec<Query>,
        wait: bool,
        docker_socket: Option<PathBuf>,
    },
    All {
        docker_socket: Option<PathBuf>,
    },
}

impl What {
    /// From the target options; checks that given pids exist.
    pub fn from_args(args: &TargetArgs) -> Result<What> {
        let containers = !args.container.is_empty() || !args.container_id.is_empty();
        if !args.command.is_empty() {
            if !args.pid.is_empty() || args.all || containers {
                bail!("give either a command after --, or --pid, --container or --all, not both");
            }
            Ok(What::Command(args.command.clone()))
        } else if containers {
            let narrow = |query: Query| Query {
                pod: args.pod.clone(),
                namespace: args.namespace.clone(),
                ..query
            };
            let queries = args
                .container
                .iter()
                .map(|name| narrow(Query::name(name)))
                .chain(args.container_id.iter().map(|id| narrow(Query::id(id))))
                .collect();
            Ok(What::Containers {
                queries,
                wait: args.wait,
                docker_socket: args.docker_socket.clone(),
            })
        } else if args.pod.is_some() || args.namespace.is_some() || args.wait {
            bail!("--pod, --namespace and --wait go with --container NAME")
        } else if args.all {
            Ok(What::All {
                docker_socket: args.docker_socket.clone(),
            })
        } else if !args.pid.is_empty() {
            target::check_pids(&args.pid)?;
            Ok(What::Pids(args.pid.clone()))
        } else {
            bail!(
                "nothing to trace: give --container NAME, a command after --, --pid PID, or \
                 --all (or try `shmtrace demo`; see shmtrace --help)"
            )
        }
    }

    pub fn is_command(&self) -> bool {
        matches!(self, What::Command(_))
    }

    /// For a trace file's header.
    pub fn describe(&self, failed_only: bool) -> TargetDescription {
        TargetDescription {
            command: match self {
                What::Command(argv) => Some(
                    argv.iter()
                        .map(|a| escape::bytes(a.as_encoded_bytes()))
                        .collect(),
                ),
                _ => None,
            },
            pids: match self {
                What::Pids(pids) => pids.clone(),
                _ => Vec::new(),
            },
            host_wide: matches!(self, What::All { .. }),
            failed_only,
            containers: Vec::new(),
        }
    }
}

/// How to trace: the probes' options, and which source to use.
#[derive(Clone, Debug)]
pub struct Options {
    pub tracer: TracerOptions,
    pub backend: BackendChoice,
}

impl Options {
    /// The probes, with their defaults (the demo's: it needs root anyway).
    pub fn probes() -> Options {
        Options {
            tracer: TracerOptions::default(),
            backend: BackendChoice::Ebpf,
        }
    }
}

pub fn options(what: &What, args: &TargetArgs) -> Options {
    Options {
        tracer: TracerOptions {
            all: matches!(what, What::All { .. }),
            match_containers: matches!(what, What::Containers { .. }),
            failed_only: args.failed,
            ring_buffer_bytes: args.buffer_size,
            btf_path: args.kernel_btf.clone(),
        },
        backend: args.backend,
    }
}

/// What the pipeline is made for, once the target is found.
pub struct Launched<'a> {
    /// The containers asked for (a trace file's header lists them).
    pub containers: &'a [ContainerInfo],
    pub backend: Backend,
}

/// Loads the probes (or starts the ptrace tracer), starts or attaches to the target, and
/// traces until it ends. `make_pipeline` is called once the containers asked for are found.
pub fn run(
    what: What,
    options: &Options,
    make_pipeline: impl FnOnce(&Launched<'_>) -> Result<Pipeline>,
) -> Result<Outcome> {
    let ptrace_can = matches!(what, What::Command(_) | What::Pids(_));
    let tracer = match options.backend {
        BackendChoice::Ptrace if ptrace_can => None,
        BackendChoice::Ptrace => bail!(
            "--backend ptrace traces a command or your own processes (--pid); --container and \
             --all need the eBPF probes, as root or with CAP_BPF and CAP_PERFMON"
        ),
        BackendChoice::Ebpf => Some(Tracer::load(&options.tracer)?),
        BackendChoice::Auto if !ptrace_can => Some(Tracer::load(&options.tracer)?),
        BackendChoice::Auto => match Tracer::load(&options.tracer) {
            Ok(tracer) => Some(tracer),
            Err(error) => {
                eprintln!(
                    "shmtrace: no eBPF here ({error}); tracing with ptrace instead, which does \
                     not see {} (docs/unprivileged.md)",
                    ptrace::BLIND_SPOTS
                );
                None
            }
        },
    };
    match tracer {
        Some(tracer) => run_probes(tracer, what, options, make_pipeline),
        None => run_ptrace(what, make_pipeline),
    }
}

/// Traces a command, or running processes of this user, with ptrace, unprivileged.
fn run_ptrace(
    what: What,
    make_pipeline: impl FnOnce(&Launched<'_>) -> Result<Pipeline>,
) -> Result<Outcome> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let signals = {
        let _inside = runtime.enter();
        Signals::install()?
    };
    let (traced, roots) = match &what {
        What::Command(argv) => (ptrace::trace_command(argv)?, Vec::new()),
        What::Pids(roots) => {
            let pids: Vec<u32> = roots
                .iter()
                .flat_map(|root| proc_scan::process_tree(*root))
                .collect();
            (ptrace::trace_pids(&pids)?, roots.clone())
        }
        _ => bail!("with ptrace, shmtrace traces a command or your own processes (--pid)"),
    };
    let mut pipeline = make_pipeline(&Launched {
        containers: &[],
        backend: Backend::Ptrace,
    })?;
    let ending = if roots.is_empty() {
        Ending::Command(RunningCommand::of_child(traced.pid))
    } else {
        // What they already hold, named, as with the probes.
        let now = boot_ns()?;
        for pid in &traced.attached {
            if let Some(snapshot) = proc_scan::snapshot(*pid) {
                pipeline.seed(&snapshot, now)?;
            }
        }
        eprintln!(
            "shmtrace: tracing {} processes (pid {} and descendants) with ptrace; Ctrl-C to stop",
            traced.attached.len(),
            roots
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ending::Pids(traced.attached.iter().copied().collect())
    };
    let session = Session::ptrace(traced.feed, pipeline).with_signals(signals);
    let outcome = runtime.block_on(session.run(ending));
    runtime.shutdown_background();
    outcome
}

/// Traces with the probes.
fn run_probes(
    mut tracer: Tracer,
    what: What,
    options: &Options,
    make_pipeline: impl FnOnce(&Launched<'_>) -> Result<Pipeline>,
) -> Result<Outcome> {
    let options = &options.tracer;
    let shm_devs = target::register_shm_devs(&mut tracer, options.all)?;
    let holders = match options.all {
        true => target::register_shm_holders(&mut tracer, &shm_devs)?,
        false => Vec::new(),
    };

    // Fork the command before any thread exists (the async runtime starts below).
    let paused = match &what {
        What::Command(argv) => {
            let paused = target::spawn_paused(argv)?;
            tracer.add_target(paused.pid())?;
            Some(paused)
        }
        _ => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Before anything says "tracing": a signal from then on must end the trace cleanly.
    let mut signals = {
        let _inside = runtime.enter();
        Signals::install()?
    };
    // With --wait, the probes hold what unknown namespaces do while the containers are waited
    // for, and the ring is read meanwhile: their first processes' records are kept.
    let mut early = None;
    let found = match &what {
        What::Containers {
            queries,
            wait,
            docker_socket,
        } => {
            let resolver = resolver(docker_socket.as_deref());
            let finding = find_containers(&resolver, queries, *wait);
            let containers = if *wait {
                tracer.hold(true)?;
                let mut reader = {
                    let _inside = runtime.enter();
                    EventReader::new(tracer.take_events().context("the ring buffer was taken")?)
                        .context("watching the ring buffer")?
                };
                let mut hold = Hold::default();
                let containers =
                    runtime.block_on(holding(finding, &mut reader, &mut hold, &mut signals))?;
                early = Some((reader, hold));
                containers
            } else {
                runtime.block_on(async {
                    tokio::select! {
                        found = finding => found.map(Some),
                        _ = signals.stop() => Ok(None),
                    }
                })?
            };
            let Some(containers) = containers else {
                eprintln!("shmtrace: interrupted before the container ran; nothing was traced");
                return Ok(Outcome {
                    command_status: None,
                    interrupted: true,
                });
            };
            Some((resolver, containers))
        }
        _ => None,
    };
    let infos: Vec<ContainerInfo> = found
        .iter()
        .flat_map(|(_, containers)| containers.iter().map(Container::info))
        .collect();
    let mut pipeline = make_pipeline(&Launched {
        containers: &infos,
        backend: Backend::Ebpf,
    })?;
    // What the processes that hold /dev/shm already hold, named, as for --pid below.
    let now = boot_ns()?;
    for pid in holders {
        if let Some(snapshot) = proc_scan::snapshot(pid) {
            pipeline.seed(&snapshot, now)?;
        }
    }
    let mut pids = Vec::new();
    if let What::Pids(roots) = &what {
        for pid in target::register_pids(&mut tracer, roots)? {
            if let Some(snapshot) = proc_scan::snapshot(pid) {
                pipeline.seed(&snapshot, now)?;
            }
            pids.push(pid);
        }
    }
    let watch = match (&what, found) {
        (What::Containers { .. }, Some((resolver, containers))) => {
            for container in &containers {
                watch::register(container, &mut tracer, &mut pipeline)?;
                watch::follow_processes(container, &mut tracer)?;
                watch::seed_running(container, &mut pipeline)?;
                if let Some((_, hold)) = &mut early {
                    watch::release_held(container, hold, &mut pipeline)?;
                }
            }
            tracer.hold(false)?;
            eprintln!(
                "shmtrace: tracing {}; Ctrl-C to stop",
                containers
                    .iter()
                    .map(|c| format!(
                        "container {} ({})",
                        c.display_name(),
                        crate::container::id_label(c.runtime, &c.id)
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for container in &containers {
                eprintln!("{}", watch::shm_state(container, ""));
            }
            let mut watch = Watch::containers(resolver, containers);
            runtime.block_on(watch.name_sharers(&mut pipeline))?;
            Some(watch)
        }
        (What::All { docker_socket }, _) => Some(Watch::host(resolver(docker_socket.as_deref()))),
        _ => None,
    };
    let ending = match (what, paused) {
        (What::Command(_), Some(paused)) => Ending::Command(paused.start()?),
        (What::Pids(roots), _) => {
            eprintln!(
                "shmtrace: tracing {} processes (pid {} and descendants); Ctrl-C to stop",
                pids.len(),
                roots
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Ending::Pids(pids.into_iter().collect::<HashSet<u32>>())
        }
        (What::All { .. }, _) => {
            eprintln!(
                "shmtrace: tracing /dev/shm use of every process on the host; Ctrl-C to stop"
            );
            Ending::Interrupt
        }
        _ => Ending::Interrupt,
    };
    let mut session = Session::new(tracer, pipeline).with_signals(signals);
    if let Some((reader, hold)) = early {
        session = session.with_reader(reader, hold);
    }
    if let Some(watch) = watch {
        session = session.with_watch(watch);
    }
    let outcome = runtime.block_on(session.run(ending));
    // The thread waiting for a command that outlived the trace's end (STOP_GRACE) would hold
    // the runtime's drop, and shmtrace's exit, until that command exits.
    runtime.shutdown_background();
    outcome
}

fn resolver(docker_socket: Option<&Path>) -> Resolver {
    match docker_socket {
        Some(socket) => Resolver::new().docker_socket(socket),
        None => Resolver::new(),
    }
}

/// Looks every container up (waiting for them with `--wait`), saying which runtimes did not
/// answer and when the /proc scan stood in for them.
async fn find_containers(
    resolver: &Resolver,
    queries: &[Query],
    wait: bool,
) -> Result<Vec<Container>> {
    let mut found = Vec::new();
    for query in queries {
        let resolution = if wait {
            let what = query.name.as_deref().or(query.id.as_deref()).unwrap_or("?");
            eprintln!(
                "shmtrace: waiting for container {} to run",
                escape::text(what)
            );
            resolver.wait_until_running(query, WAIT_FOREVER).await?
        } else {
            resolver.resolve(query).await?
        };
        for problem in &resolution.problems {
            eprintln!("shmtrace: warning: {problem}");
        }
        if resolution.fallback {
            eprintln!(
                "shmtrace: no container runtime answered for it; found container {} by \
                 scanning /proc/*/cgroup",
                resolution.container.display_name()
            );
        }
        found.push(resolution.container);
    }
    Ok(found)
}

/// Runs `finding` while reading the ring into `hold`, so that the ring does not fill up with
/// what the probes hold meanwhile. `None` when a signal ended the wait.
async fn holding<T>(
    finding: impl Future<Output = Result<T>>,
    reader: &mut EventReader,
    hold: &mut Hold,
    signals: &mut Signals,
) -> Result<Option<T>> {
    let mut finding = std::pin::pin!(finding);
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            found = &mut finding => return found.map(Some),
            _ = signals.stop() => return Ok(None),
            read = reader.read(&mut batch) => read.context("reading the ring buffer")?,
            _ = ticker.tick() => {
                // What is left waits for the next read or tick.
                let _ = reader.drain(&mut batch);
            }
        }
        hold.keep(&mut batch, Instant::now());
    }
}

/// `--wait` waits until Ctrl-C.
const WAIT_FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
