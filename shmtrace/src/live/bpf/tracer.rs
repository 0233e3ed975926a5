//! Loading, configuring and attaching the programs, and the maps userspace writes to.
use std::path::PathBuf;

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, TracePoint, tp_btf::BtfTracePointLink, trace_point::TracePointLink},
};
use aya_log::EbpfLogger;
use shmtrace_common::{Config, EventKind};
use shmtrace_core::event::LostCounts;

use super::{
    BpfError, EBPF_OBJECT, KERNEL_BTF,
    hooks::{self, Hook},
    offsets, preflight,
};

/// Forwards the probes' `aya-log` messages to the `log` crate.
pub type KernelLog = EbpfLogger<&'static dyn log::Log>;

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
    // Field order is drop order: maps and logger go before the programs they belong to.
    events: Option<RingBuf<MapData>>,
    logger: Option<KernelLog>,
    targets: HashMap<MapData, u32, u32>,
    target_mntns: HashMap<MapData, u32, u32>,
    target_cgroups: HashMap<MapData, u64, u32>,
    shm_devs: HashMap<MapData, u32, u32>,
    lost: PerCpuArray<MapData, u64>,
    _ebpf: Ebpf,
}

impl Tracer {
    /// Checks the machine, loads the programs and attaches every one of them.
    pub fn load(options: &TracerOptions) -> Result<Tracer, BpfError> {
        preflight::check_privileges()?;
        let size = options.ring_buffer_bytes;
        if size < 4096 || !size.is_power_of_two() {
            return Err(BpfError::BadBufferSize(size));
        }
        let btf_bytes = offsets::read_btf(&options.btf_path)?;
        let kernel_btf = offsets::parse_btf(&btf_bytes, &options.btf_path)?;
        let kernel_offsets = offsets::resolve(&kernel_btf)?;
        let tracefs = preflight::tracefs()?;
        let hooks = hooks::all();
        hooks::check_available(&hooks, tracefs, &kernel_btf)?;
        preflight::check_ring_buffer()?;

        let config = Config {
            all: options.all.into(),
            match_containers: options.match_containers.into(),
            failed_only: options.failed_only.into(),
            self_tgid: std::process::id(),
            wakeup_bytes: size / 4,
        };
        let aya_btf = aya::Btf::parse(&btf_bytes, aya::Endianness::default()).map_err(|error| {
            BpfError::BadBtf {
                path: options.btf_path.clone(),
                reason: error.to_string(),
            }
        })?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&aya_btf))
            .override_global("CONFIG", &config, true)
            .override_global("OFFSETS", &kernel_offsets, true)
            .map_max_entries("EVENTS", size)
            .load(EBPF_OBJECT)
            .map_err(|error| BpfError::Load(Box::new(error)))?;
        let logger = EbpfLogger::init(&mut ebpf).ok();
        let mut links = Vec::with_capacity(hooks.len());
        for hook in &hooks {
            links.push(attach(&mut ebpf, hook, &aya_btf)?);
        }

        Ok(Tracer {
            links,
            events: Some(take_map(&mut ebpf, "EVENTS", RingBuf::try_from)?),
            logger,
            targets: take_map(&mut ebpf, "TARGETS", HashMap::try_from)?,
            target_mntns: take_map(&mut ebpf, "TARGET_MNTNS", HashMap::try_from)?,
            target_cgroups: take_map(&mut ebpf, "TARGET_CGROUPS", HashMap::try_from)?,
            shm_devs: take_map(&mut ebpf, "SHM_DEVS", HashMap::try_from)?,
            lost: take_map(&mut ebpf, "LOST", PerCpuArray::try_from)?,
            _ebpf: ebpf,
        })
    }

    /// The ring buffer, once: the reader owns it from then on.
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    /// The kernel log forwarder, once.
    pub fn take_logger(&mut self) -> Option<KernelLog> {
        self.logger.take()
    }

    /// Follows process `pid` (a thread-group id) and, through fork, its descendants.
    pub fn add_target(&mut self, pid: u32) -> Result<(), BpfError> {
        self.targets
            .insert(pid, 1, 0)
            .map_err(|e| map_error("TARGETS", e))
    }

    /// Follows every process in mount namespace `inum` (a container).
    pub fn add_mount_namespace(&mut self, inum: u32) -> Result<(), BpfError> {
        self.target_mntns
            .insert(inum, 1, 0)
            .map_err(|e| map_error("TARGET_MNTNS", e))
    }

    /// Stops following mount namespace `inum` (a container that stopped: its number may be
    /// reused by an unrelated namespace).
    pub fn remove_mount_namespace(&mut self, inum: u32) -> Result<(), BpfError> {
        match self.target_mntns.remove(&inum) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_error("TARGET_MNTNS", e)),
        }
    }

    /// Follows every process in cgroup v2 `id` (a container on a cgroup v2 host).
    pub fn add_cgroup(&mut self, id: u64) -> Result<(), BpfError> {
        self.target_cgroups
            .insert(id, 1, 0)
            .map_err(|e| map_error("TARGET_CGROUPS", e))
    }

    /// Declares `dev` (kernel encoding) a /dev/shm file system, so that descriptors on it are
    /// traced even when they were opened before shmtrace started.
    pub fn add_shm_dev(&mut self, dev: u32) -> Result<(), BpfError> {
        self.shm_devs
            .insert(dev, 1, 0)
            .map_err(|e| map_error("SHM_DEVS", e))
    }

    /// Records dropped in the kernel because the ring buffer was full, so far.
    pub fn lost(&self) -> Result<LostCounts, BpfError> {
        let mut counts = LostCounts::default();
        for kind in EventKind::ALL {
            let per_cpu = self
                .lost
                .get(&(kind as u32), 0)
                .map_err(|e| map_error("LOST", e))?;
            counts.add(kind, per_cpu.iter().sum());
        }
        Ok(counts)
    }
}

fn map_error(name: &'static str, source: aya::maps::MapError) -> BpfError {
    BpfError::Map {
        name,
        source: Box::new(source),
    }
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
    BtfTracepoint(#[allow(dead_code, reason = "held for its Drop")] BtfTracePointLink),
}

impl Drop for Tracer {
    /// Detaching a tracepoint waits for an RCU grace period (about 70 ms here); done one after
    /// the other, 40 of them make exiting take seconds. Detached together, they share grace
    /// periods.
    fn drop(&mut self) {
        let links = std::mem::take(&mut self.links);
        std::thread::scope(|scope| {
            for link in links {
                scope.spawn(move || drop(link));
            }
        });
    }
}

fn attach(ebpf: &mut Ebpf, hook: &Hook, btf: &aya::Btf) -> Result<Link, BpfError> {
    let program_error = |source| BpfError::Program {
        program: hook.describe(),
        source: Box::new(source),
    };
    let program = ebpf
        .program_mut(hook.program())
        .ok_or_else(|| BpfError::MissingHooks {
            missing: vec![format!("{} (not in the eBPF object)", hook.describe())],
        })?;
    match hook {
        Hook::Tracepoint { category, name } => {
            let program: &mut TracePoint = program.try_into().map_err(program_error)?;
            program.load().map_err(program_error)?;
            let id = program.attach(category, name).map_err(program_error)?;
            Ok(Link::Tracepoint(
                program.take_link(id).map_err(program_error)?,
            ))
        }
        Hook::BtfTracepoint { name } => {
            let program: &mut BtfTracePoint = program.try_into().map_err(program_error)?;
            program.load(name, btf).map_err(program_error)?;
            let id = program.attach().map_err(program_error)?;
            Ok(Link::BtfTracepoint(
                program.take_link(id).map_err(program_error)?,
            ))
        }
    }
}
