//! Loading, configuring and attaching the programs, and the maps userspace writes to.
use std::path::PathBuf;

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        RawTracePoint, TracePoint, raw_trace_point::RawTracePointLink, trace_point::TracePointLink,
    },
};
use shmtrace_common::{
    Config, Loss, TallyKey,
    targets::{MAPPED, TRACKED},
};
use shmtrace_core::event::LostCounts;

use crate::kernel_ids;

use super::{
    BpfError, EBPF_OBJECT, KERNEL_BTF, attaching, detach,
    followed::FollowedBitmap,
    hooks::{self, Hook},
    map_error, offsets, preflight,
    supers::ShmSupers,
};

/// `BPF_NOEXIST`: insert only if absent.
const BPF_NOEXIST: u64 = 1;

/// Slots of the `HOLD_OUTSIDE` map: holding now (shmtrace's namespace, or 0), and shmtrace's
/// namespace, for the probes to start holding themselves when a container stops.
const HOLD_NOW: u32 = 0;
const HOLD_OWN: u32 = 1;

/// What to trace; fixed for the life of a [`Tracer`].
#[derive(Clone, Debug)]
pub struct TracerOptions {
    /// Every process's /dev/shm calls (`--all`).
    pub all: bool,
    /// Match processes by container (mount namespace or cgroup) as well as by pid.
    pub match_containers: bool,
    /// Drop successful data-path calls in the kernel (`--failed`).
    pub failed_only: bool,
    /// Ring buffer size in bytes: a power of two, at least a page.
    pub ring_buffer_bytes: u32,
    /// The kernel's BTF.
    pub btf_path: PathBuf,
}

impl Default for TracerOptions {
    fn default() -> Self {
        TracerOptions {
            all: false,
            match_containers: false,
            failed_only: false,
            ring_buffer_bytes: 16 << 20,
            btf_path: PathBuf::from(KERNEL_BTF),
        }
    }
}

/// The loaded programs and their maps. Dropping it detaches and unloads them.
pub struct Tracer {
    /// Attachments, owned here so that `Drop` can detach them all at once.
    links: Vec<Link>,
    // Field order is drop order: maps go before the programs they belong to.
    events: Option<RingBuf<MapData>>,
    targets: HashMap<MapData, u32, u32>,
    followed: FollowedBitmap,
    target_mntns: HashMap<MapData, u32, u32>,
    target_cgroups: HashMap<MapData, u64, u32>,
    hold_outside: Array<MapData, u32>,
    /// shmtrace's own mount namespace (0 if unknown: nothing is held then).
    own_mntns: u32,
    supers: ShmSupers,
    lost: PerCpuArray<MapData, u64>,
    tallies: HashMap<MapData, TallyKey, u64>,
    _ebpf: Ebpf,
}

impl Tracer {
    /// Checks the machine, loads the programs and attaches every one of them.
    pub fn load(options: &TracerOptions) -> Result<Tracer, BpfError> {
        preflight::check_privileges()?;
        preflight::check_kernel_version()?;
        keep_large_blocks_apart();
        let size = options.ring_buffer_bytes;
        if size < 4096 || !size.is_power_of_two() {
            return Err(BpfError::BadBufferSize(size));
        }
        // From before the kernel's BTF is read and the programs load: releases of earlier
        // runs already under way end meanwhile.
        let announcement = attaching::announce();
        // aya's loader reads and parses the kernel's BTF as it is made, for CO-RE relocations
        // and BTF-typed programs. The programs have neither (they read kernel structs at
        // offsets resolved below), so that parse is dropped at once; made first, it is never
        // held beside our own read of the same file.
        let mut loader = EbpfLoader::new();
        loader.btf(None);
        let kernel_offsets = {
            let btf_bytes = offsets::read_btf(&options.btf_path)?;
            offsets::resolve(&offsets::parse_btf(&btf_bytes, &options.btf_path)?)?
        };
        let hooks = hooks::all();
        hooks::check_available(&hooks, preflight::tracefs()?)?;
        preflight::check_ring_buffer()?;

        let config = Config {
            all: options.all.into(),
            match_containers: options.match_containers.into(),
            failed_only: options.failed_only.into(),
            self_tgid: std::process::id(),
            wakeup_bytes: size / 4,
        };
        let mut ebpf = loader
            .override_global("CONFIG", &config, true)
            .override_global("OFFSETS", &kernel_offsets, true)
            .map_max_entries("EVENTS", size)
            .load(EBPF_OBJECT)
            .map_err(|error| BpfError::Load(Box::new(error)))?;
        let mut links = Vec::with_capacity(hooks.len());
        load_in_parallel(&mut ebpf, &hooks)?;
        for hook in &hooks {
            links.push(attach(&mut ebpf, hook)?);
        }
        drop(announcement);

        let mut hold_outside: Array<MapData, u32> =
            take_map(&mut ebpf, "HOLD_OUTSIDE", Array::try_from)?;
        let own_mntns = kernel_ids::mount_namespace(std::process::id()).unwrap_or(0);
        hold_outside
            .set(HOLD_OWN, own_mntns, 0)
            .map_err(|e| map_error("HOLD_OUTSIDE", e))?;
        release_start_up_memory();
        Ok(Tracer {
            links,
            events: Some(take_map(&mut ebpf, "EVENTS", RingBuf::try_from)?),
            targets: take_map(&mut ebpf, "TARGETS", HashMap::try_from)?,
            followed: FollowedBitmap::map(take_map(&mut ebpf, "FOLLOWED", Array::try_from)?)
                .map_err(|io_error| mmap_error("FOLLOWED", io_error))?,
            target_mntns: take_map(&mut ebpf, "TARGET_MNTNS", HashMap::try_from)?,
            target_cgroups: take_map(&mut ebpf, "TARGET_CGROUPS", HashMap::try_from)?,
            hold_outside,
            own_mntns,
            supers: ShmSupers::new(
                take_map(&mut ebpf, "SHM_SUPERS", Array::try_from)?,
                take_map(&mut ebpf, "SHM_ELSEWHERE", HashMap::try_from)?,
            )
            .map_err(|io_error| mmap_error("SHM_SUPERS", io_error))?,
            lost: take_map(&mut ebpf, "LOST", PerCpuArray::try_from)?,
            tallies: take_map(&mut ebpf, "TALLIES", HashMap::try_from)?,
            _ebpf: ebpf,
        })
    }

    /// The ring buffer, once: the reader owns it from then on.
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    /// Follows process `pid` (a thread-group id) and, through fork, its descendants. A process
    /// the probes follow already (a container's, met through its namespace) keeps its bits.
    ///
    /// Its `FOLLOWED` bit is set before the insertion, so the probes look it up from then on,
    /// and again after: had the process exited in between, the probes may have cleared the bit
    /// and the insertion left a slot for a dead pid, which must not look absent from `TARGETS`
    /// (a set bit only costs a lookup).
    pub fn add_target(&mut self, pid: u32) -> Result<(), BpfError> {
        self.add_target_with(pid, TRACKED)
    }

    /// As [`Tracer::add_target`], for a process that holds /dev/shm when shmtrace starts: it
    /// may have it mapped, so its `munmap`s and faults are its own (`targets::MAPPED`).
    pub fn add_holder(&mut self, pid: u32) -> Result<(), BpfError> {
        self.add_target_with(pid, TRACKED | MAPPED)
    }

    fn add_target_with(&mut self, pid: u32, bits: u32) -> Result<(), BpfError> {
        self.followed.set(pid);
        let inserted = match self.targets.insert(pid, bits, BPF_NOEXIST) {
            Err(aya::maps::MapError::SyscallError(error))
                if error.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                Ok(())
            }
            other => other.map_err(|e| map_error("TARGETS", e)),
        };
        self.followed.set(pid);
        inserted
    }

    /// Follows every process in mount namespace `inum` (a container whose first process is
    /// `first_pid`, when known: its exit makes the probes hold, see `live::hold`).
    pub fn add_mount_namespace(
        &mut self,
        inum: u32,
        first_pid: Option<u32>,
    ) -> Result<(), BpfError> {
        self.target_mntns
            .insert(inum, first_pid.unwrap_or(0), 0)
            .map_err(|e| map_error("TARGET_MNTNS", e))
    }

    /// Stops following mount namespace `inum` (a container that stopped: its number may be
    /// reused by an unrelated namespace). The probes may have removed it already, when the
    /// container's first process exited.
    pub fn remove_mount_namespace(&mut self, inum: u32) -> Result<(), BpfError> {
        already_gone_is_fine(self.target_mntns.remove(&inum), "TARGET_MNTNS")
    }

    /// While `on`, the probes report every process outside shmtrace's own mount namespace that
    /// nothing follows, flagged held (see `live::hold`).
    pub fn hold(&mut self, on: bool) -> Result<(), BpfError> {
        let own = if on { self.own_mntns } else { 0 };
        self.hold_outside
            .set(HOLD_NOW, own, 0)
            .map_err(|e| map_error("HOLD_OUTSIDE", e))
    }

    /// Follows every process in cgroup v2 `id` (a container on a cgroup v2 host).
    pub fn add_cgroup(&mut self, id: u64) -> Result<(), BpfError> {
        self.target_cgroups
            .insert(id, 1, 0)
            .map_err(|e| map_error("TARGET_CGROUPS", e))
    }

    /// Declares `dev` (kernel encoding) a /dev/shm file system, a `tmpfs` or not (a bind
    /// mount of a directory), so that the probes know it without judging it themselves, and
    /// descriptors opened before shmtrace started are traced.
    pub fn add_shm_dev(&mut self, dev: u32, tmpfs: bool) -> Result<(), BpfError> {
        self.supers.add(dev, tmpfs)
    }

    /// How many file systems the probes take for a /dev/shm now, whether declared here or
    /// judged by the probes (`ShmSupers::count`).
    pub fn shm_file_systems(&self) -> Result<usize, BpfError> {
        self.supers.count()
    }

    /// What the probes could not report so far, by reason: records dropped because the ring
    /// buffer was full, and reads that failed.
    pub fn lost(&self) -> Result<LostCounts, BpfError> {
        let mut counts = LostCounts::default();
        for loss in Loss::all() {
            let per_cpu = self
                .lost
                .get(&loss.index(), 0)
                .map_err(|e| map_error("LOST", e))?;
            counts.add(loss, per_cpu.iter().sum());
        }
        Ok(counts)
    }

    /// The failures and SIGBUS the probes counted so far, records or not (`tally`).
    pub fn tallies(&self) -> Result<Vec<(TallyKey, u64)>, BpfError> {
        self.tallies
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| map_error("TALLIES", e))
    }

    /// Drops the counts of a mount namespace whose container has ended, so that the number's
    /// next owner starts from zero and the map holds only the living.
    pub fn forget_tallies(&mut self, keys: &[TallyKey]) -> Result<(), BpfError> {
        for key in keys {
            already_gone_is_fine(self.tallies.remove(key), "TALLIES")?;
        }
        Ok(())
    }
}

/// A removal from map `name` whose key is not there (the probes removed it first) is done.
fn already_gone_is_fine(
    removed: Result<(), aya::maps::MapError>,
    name: &'static str,
) -> Result<(), BpfError> {
    match removed {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(error))
            if error.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            Ok(())
        }
        Err(error) => Err(map_error(name, error)),
    }
}

fn mmap_error(name: &'static str, io_error: std::io::Error) -> BpfError {
    map_error(
        name,
        aya::sys::SyscallError {
            call: "mmap",
            io_error,
        }
        .into(),
    )
}

fn take_map<T>(
    ebpf: &mut Ebpf,
    name: &'static str,
    convert: impl FnOnce(aya::maps::Map) -> Result<T, aya::maps::MapError>,
) -> Result<T, BpfError> {
    let map = ebpf.take_map(name).ok_or_else(|| BpfError::Map {
        name,
        source: Box::new(aya::maps::MapError::InvalidName {
            name: name.to_owned(),
        }),
    })?;
    convert(map).map_err(|e| map_error(name, e))
}

/// One attachment of a program to its hook; dropping it detaches the program.
enum Link {
    Tracepoint(#[allow(dead_code, reason = "held for its Drop")] TracePointLink),
    RawTracepoint(#[allow(dead_code, reason = "held for its Drop")] RawTracePointLink),
}

impl Drop for Tracer {
    /// Detaching a tracepoint waits for RCU grace periods (40 ms or so here, one tracepoint
    /// at a time), so a background process takes the last references and waits instead
    /// (`detach`). If it cannot start, the links are dropped together, which shares what can
    /// be shared of the waiting.
    fn drop(&mut self) {
        let links = std::mem::take(&mut self.links);
        if let Some(handover) = detach::in_background() {
            drop(links);
            drop(handover);
            return;
        }
        std::thread::scope(|scope| {
            for link in links {
                scope.spawn(move || drop(link));
            }
        });
    }
}

/// Loads every program a hook needs, spread over the CPUs: the verifier's work is most of
/// shmtrace's start-up, and programs are verified independently. Attaching stays in order.
fn load_in_parallel(ebpf: &mut Ebpf, hooks: &[Hook]) -> Result<(), BpfError> {
    let first_hook = |name: &str| hooks.iter().find(|hook| hook.program() == name);
    let mut programs: Vec<(&Hook, &mut aya::programs::Program)> = ebpf
        .programs_mut()
        .filter_map(|(name, program)| Some((first_hook(name)?, program)))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = programs.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = programs
            .chunks_mut(chunk)
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter_mut()
                        .try_for_each(|(hook, program)| load(hook, program))
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|worker| worker.join().expect("a loader thread panicked"))
    })
}

fn load(hook: &Hook, program: &mut aya::programs::Program) -> Result<(), BpfError> {
    let program_error = |source| BpfError::Program {
        program: hook.describe(),
        source: Box::new(source),
    };
    match hook {
        Hook::Tracepoint { .. } => {
            let program: &mut TracePoint = program.try_into().map_err(program_error)?;
            program.load().map_err(program_error)
        }
        Hook::RawTracepoint { .. } => {
            let program: &mut RawTracePoint = program.try_into().map_err(program_error)?;
            program.load().map_err(program_error)
        }
    }
}

fn attach(ebpf: &mut Ebpf, hook: &Hook) -> Result<Link, BpfError> {
    let program_error = |source| BpfError::Program {
        program: hook.describe(),
        source: Box::new(source),
    };
    let program = ebpf
        .program_mut(hook.program())
        .ok_or_else(|| BpfError::MissingHooks {
            missing: vec![format!("{} (not in the eBPF object)", hook.describe())],
        })?;
    // Loaded by `load_in_parallel`; the exit program is loaded once and attached to many.
    if program.fd().is_err() {
        load(hook, program)?;
    }
    match hook {
        Hook::Tracepoint { category, name, .. } => {
            let program: &mut TracePoint = program.try_into().map_err(program_error)?;
            let id = program.attach(category, name).map_err(program_error)?;
            Ok(Link::Tracepoint(
                program.take_link(id).map_err(program_error)?,
            ))
        }
        Hook::RawTracepoint { name, .. } => {
            let program: &mut RawTracePoint = program.try_into().map_err(program_error)?;
            let id = program.attach(name).map_err(program_error)?;
            Ok(Link::RawTracepoint(
                program.take_link(id).map_err(program_error)?,
            ))
        }
    }
}

/// Hands back to the kernel the heap start-up freed (the eBPF object's and the kernel BTF's
/// parses), before the ring buffer is mapped (its pages count twice), so that the two
/// never add up to the peak. glibc keeps it otherwise: freeing the BTF file's
/// buffer, too big for the heap, raises its thresholds so that nothing is returned until the
/// heap's free top passes twice that size. Measured: 5 MiB of a host-wide trace's 32 MiB.
fn release_start_up_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Large blocks (the ring reader's 1 MiB arenas, a model's tables after a burst) come from
/// their own mappings, handed back when freed. glibc's default threshold rises to the largest
/// block freed so far (the kernel BTF read, 5 MiB), after which they are carved from the
/// heap between small long-lived ones, and the holes they leave stay resident: measured, a
/// host-wide trace grew by 10 MiB over a 50,000-process fork storm while holding 1,200.
fn keep_large_blocks_apart() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters; it has no preconditions.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}
