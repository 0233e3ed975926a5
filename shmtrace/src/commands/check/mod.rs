//! `shmtrace check`: what the /dev/shm this process sees can hold and what limit a workload
//! meets first, read in well under a second without tracing and without privileges, so that
//! it runs inside any container, in an entrypoint or a CI step.
//!
//! `shm` reads /dev/shm (statvfs, mountinfo), `platform` recognises the runtime and managed
//! platform and words the fix in its terms; the cgroup's memory limit comes from
//! `container::memory`, and the files on /dev/shm and their holders from `live::holders`, as
//! a diagnosis reads them.
mod platform;
mod shm;

use std::{io::Write, process::ExitCode, time::Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::{
    cli::CheckArgs,
    container::memory::{self, Memory},
    live::holders,
};
use platform::Platform;
use shm::{Kind, Shm};
use shmtrace_core::{
    clock::boot_ns,
    event::escape,
    model::HeldFile,
    units::{count, human},
};

/// `--min`: /dev/shm, or what the memory limit leaves of it, is smaller than asked.
const TOO_SMALL: u8 = 3;
/// Less free than this is full: not one page of a tensor fits.
const FULL: u64 = 4096;

/// Everything the check found.
#[derive(Serialize)]
pub struct Report {
    pub shm: Shm,
    /// `None` when no memory controller could be read.
    pub memory: Option<Memory>,
    /// Which limit a workload filling /dev/shm meets first, now.
    pub first_limit: FirstLimit,
    pub limits: Limits,
    /// The files on /dev/shm (named, or unlinked and still held) that hold memory, largest
    /// first, at most 32.
    pub files: Vec<File>,
    /// Regular files named in /dev/shm, empty ones included: each takes an inode.
    pub named_files: u64,
    /// Processes whose descriptors could not be read (another user's): what they hold is
    /// not among `files`' holders.
    pub unreadable_processes: u32,
    pub platform: Platform,
    /// How to give /dev/shm more room here, one way per entry.
    pub fixes: Vec<String>,
    /// With `--min`: the verdict.
    pub min: Option<MinVerdict>,
    pub elapsed_ms: u64,
}

/// What stops a workload that fills /dev/shm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FirstLimit {
    /// /dev/shm fills: ENOSPC (or SIGBUS through a mapping).
    ShmFull,
    /// The cgroup's memory limit: the OOM killer, before /dev/shm is full.
    MemoryLimit,
    /// Nothing can be written there at all (missing, read-only, not writable).
    Unusable,
}

#[derive(Serialize)]
pub struct Limits {
    /// `ulimit -n`: descriptors, which PyTorch's file_descriptor strategy spends one of per
    /// tensor in flight.
    pub open_files: Rlimit,
    /// `ulimit -l`: bytes of locked memory (pinned memory, RDMA, NCCL).
    pub locked_memory: Rlimit,
}

#[derive(Serialize)]
pub struct Rlimit {
    /// `None`: unlimited.
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

#[derive(Serialize)]
pub struct File {
    pub path: String,
    /// Still named in /dev/shm (else: unlinked, alive only through its holders).
    pub linked: bool,
    /// Pages held, in bytes.
    pub bytes: u64,
    pub size: u64,
    pub holders: Vec<FileHolder>,
    /// Named, and held by no process this one can see: left behind.
    pub leftover: bool,
}

#[derive(Serialize)]
pub struct FileHolder {
    pub pid: u32,
    pub comm: String,
    pub open: bool,
    pub mapped: bool,
}

#[derive(Serialize)]
pub struct MinVerdict {
    pub min_bytes: u64,
    /// What a workload can use: /dev/shm's size, or less when the memory limit leaves less.
    pub usable_bytes: u64,
    pub ok: bool,
    pub reason: String,
}

pub fn run(args: &CheckArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let report = gather(args.min, started);
    let text = if args.json {
        let mut text = serde_json::to_string(&report).context("writing the check as JSON")?;
        text.push('\n');
        text
    } else {
        render(&report)
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(match &report.min {
        Some(min) if !min.ok => ExitCode::from(TOO_SMALL),
        _ => ExitCode::SUCCESS,
    })
}

fn gather(min: Option<u64>, started: Instant) -> Report {
    let shm = shm::read();
    let memory = memory::read();
    let platform = platform::recognise(&platform::Clues::gather());
    let (files, unreadable_processes) = files(&shm);
    let named_files = named_files(&shm);
    let first_limit = first_limit(&shm, memory.as_ref());
    let size_word = min.map(docker_size).unwrap_or_else(|| "SIZE".to_owned());
    let mut fixes = Vec::new();
    if shm.kind == Kind::Missing {
        fixes.push(
            "give the container a /dev/shm: drop --ipc=none (Docker's and Podman's default \
             gives one of 64 MiB), or mount a tmpfs at /dev/shm; more room, as below"
                .to_owned(),
        );
    } else if shm.read_only {
        fixes.push(
            "mount /dev/shm read-write: drop :ro from its --tmpfs or -v, or readOnly: true from \
             its volumeMount in Kubernetes"
                .to_owned(),
        );
    } else if !shm.writable {
        fixes.push(
            "/dev/shm should be drwxrwxrwt (1777), as everywhere: mount its tmpfs with \
             mode=1777, or chmod 1777 /dev/shm as root"
                .to_owned(),
        );
    }
    fixes.extend(platform.shm_fixes(&size_word));
    if first_limit == FirstLimit::MemoryLimit {
        fixes.push(format!(
            "the memory limit is met before /dev/shm is full: raise it by as much as /dev/shm \
             should hold ({}), or lower /dev/shm to what it leaves",
            platform.memory_fix()
        ));
    }
    let min = min.map(|min_bytes| verdict(min_bytes, &shm, memory.as_ref()));
    Report {
        shm,
        memory,
        first_limit,
        limits: Limits {
            open_files: rlimit(nix::sys::resource::Resource::RLIMIT_NOFILE),
            locked_memory: rlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK),
        },
        files,
        named_files,
        unreadable_processes,
        platform,
        fixes,
        min,
        elapsed_ms: started.elapsed().as_millis() as u64,
    }
}

fn rlimit(resource: nix::sys::resource::Resource) -> Rlimit {
    let finite = |value: u64| (value != libc::RLIM_INFINITY).then_some(value);
    match nix::sys::resource::getrlimit(resource) {
        Ok((soft, hard)) => Rlimit {
            soft: finite(soft),
            hard: finite(hard),
        },
        Err(_) => Rlimit {
            soft: None,
            hard: None,
        },
    }
}

/// The files on /dev/shm with their holders, and how many processes could not be read.
fn files(shm: &Shm) -> (Vec<File>, u32) {
    let Some(dev) = shm.dev.filter(|_| shm.kind != Kind::Missing) else {
        return (Vec::new(), 0);
    };
    let found = holders::holders(&[std::process::id()], dev, boot_ns().unwrap_or(0));
    let files = found
        .map(|held| held.files.into_iter().map(file).collect())
        .unwrap_or_default();
    (files, unreadable_processes())
}

fn file(held: HeldFile) -> File {
    File {
        leftover: held.linked && held.holders.is_empty(),
        path: held.path,
        linked: held.linked,
        bytes: held.bytes,
        size: held.size,
        holders: held
            .holders
            .into_iter()
            .map(|h| FileHolder {
                pid: h.pid,
                comm: h.comm,
                open: h.open,
                mapped: h.mapped,
            })
            .collect(),
    }
}

/// Regular files named in /dev/shm.
fn named_files(shm: &Shm) -> u64 {
    if shm.kind == Kind::Missing {
        return 0;
    }
    std::fs::read_dir(shm::SHM).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
            .count() as u64
    })
}

/// Processes in /proc whose descriptors this one may not list.
fn unreadable_processes() -> u32 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.parse::<u32>().is_ok())
        })
        .filter(|entry| {
            std::fs::read_dir(entry.path().join("fd"))
                .is_err_and(|error| error.kind() == std::io::ErrorKind::PermissionDenied)
        })
        .count() as u32
}

fn first_limit(shm: &Shm, memory: Option<&Memory>) -> FirstLimit {
    if !shm.usable() {
        return FirstLimit::Unusable;
    }
    let shm_free = shm.free_bytes.unwrap_or(0);
    match memory.and_then(Memory::room_bytes) {
        Some(room) if room < shm_free => FirstLimit::MemoryLimit,
        _ => FirstLimit::ShmFull,
    }
}

fn verdict(min_bytes: u64, shm: &Shm, memory: Option<&Memory>) -> MinVerdict {
    let size = if shm.usable() {
        shm.size_bytes.unwrap_or(0)
    } else {
        0
    };
    // What the memory limit lets /dev/shm hold: its room now plus the /dev/shm pages it
    // already counts.
    let by_memory = memory.and_then(|m| Some(m.room_bytes()? + m.shmem_bytes.unwrap_or(0)));
    let usable = by_memory.map_or(size, |by_memory| size.min(by_memory));
    let ok = usable >= min_bytes;
    let reason = if !shm.usable() {
        format!("/dev/shm cannot be written ({})", unusable_reason(shm))
    } else if size < min_bytes {
        format!(
            "/dev/shm is {}, smaller than the {} asked",
            human(size),
            human(min_bytes)
        )
    } else if !ok {
        format!(
            "/dev/shm is {}, but the memory limit leaves room for only {} of it",
            human(size),
            human(usable)
        )
    } else {
        format!(
            "/dev/shm is {}, at least the {} asked{}",
            human(size),
            human(min_bytes),
            match by_memory {
                Some(by_memory) if by_memory < size =>
                    format!(" (the memory limit leaves {})", human(by_memory)),
                _ => String::new(),
            }
        )
    };
    MinVerdict {
        min_bytes,
        usable_bytes: usable,
        ok,
        reason,
    }
}

fn unusable_reason(shm: &Shm) -> &'static str {
    match shm.kind {
        Kind::Missing => "there is none: the container runs with --ipc=none or without a /dev",
        _ if shm.read_only => "it is mounted read-only",
        _ => "this user may not create files there",
    }
}

/// Bytes as docker's flags take them: `64m`, `1g`, exact otherwise.
fn docker_size(bytes: u64) -> String {
    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;
    if bytes >= G && bytes.is_multiple_of(G) {
        format!("{}g", bytes / G)
    } else if bytes.is_multiple_of(M) {
        format!("{}m", bytes / M)
    } else {
        format!("{}m", bytes.div_ceil(M))
    }
}

/// The report for people.
fn render(report: &Report) -> String {
    let mut out = String::new();
    let mut line = |label: &str, text: String| {
        out.push_str(&format!("{label:<13}{text}\n"));
    };
    let shm = &report.shm;
    line("platform", report.platform.describe());
    line("/dev/shm", describe_shm(shm));
    if let (Some(size), Some(used), Some(free)) = (shm.size_bytes, shm.used_bytes, shm.free_bytes)
        && shm.kind != Kind::Missing
    {
        let percent = (used * 100).checked_div(size).unwrap_or(0);
        line(
            "",
            format!(
                "{} in use ({percent}%), {} free; inodes: {} of {} free",
                human(used),
                human(free),
                shm.inodes_free.unwrap_or(0),
                shm.inodes.unwrap_or(0)
            ),
        );
        if let Some(options) = &shm.mount_options {
            line(
                "",
                format!(
                    "mounted {} ({})",
                    escape::text(options),
                    escape::text(shm.super_options.as_deref().unwrap_or(""))
                ),
            );
        }
    }
    match &report.memory {
        Some(memory) => {
            let cgroup = match memory.cgroup {
                memory::Version::V1 => "cgroup v1",
                memory::Version::V2 => "cgroup v2",
            };
            let limit = memory
                .limit_bytes
                .map_or("no limit".to_owned(), |l| format!("limit {}", human(l)));
            let used = memory
                .usage_bytes
                .map_or(String::new(), |u| format!(", {} in use", human(u)));
            let shmem = memory.shmem_bytes.map_or(String::new(), |s| {
                format!(" ({} of it tmpfs and shared memory)", human(s))
            });
            line("memory", format!("{cgroup}: {limit}{used}{shmem}"));
            if let Some(kills) = memory.oom_kills.filter(|k| *k > 0) {
                line(
                    "",
                    format!("the OOM killer has ended {} here", count(kills, "process")),
                );
            }
        }
        None => line("memory", "no memory controller could be read".to_owned()),
    }
    line("limit first", describe_first(report));
    let limit = |l: &Rlimit| l.soft.map_or("unlimited".to_owned(), |v| v.to_string());
    let bytes = |l: &Rlimit| l.soft.map_or("unlimited".to_owned(), human);
    line(
        "ulimit",
        format!(
            "open files (-n) {}, locked memory (-l) {}",
            limit(&report.limits.open_files),
            bytes(&report.limits.locked_memory)
        ),
    );
    if report.files.is_empty() {
        line("files", "none holds any memory".to_owned());
    } else {
        let total: u64 = report.files.iter().map(|f| f.bytes).sum();
        line(
            "files",
            format!(
                "{} hold {}:",
                count(report.files.len() as u64, "file"),
                human(total)
            ),
        );
        for file in &report.files {
            line(
                "",
                format!("  {:>10}  {}", human(file.bytes), describe_file(file)),
            );
        }
    }
    let listed = report.files.iter().filter(|f| f.linked).count() as u64;
    if report.named_files > listed {
        line(
            "",
            format!(
                "({} named in /dev/shm in all; {} more not listed)",
                count(report.named_files, "file"),
                report.named_files - listed
            ),
        );
    }
    if report.unreadable_processes > 0 {
        line(
            "",
            format!(
                "({} of other users could not be read: what they hold is not named)",
                count(report.unreadable_processes, "process")
            ),
        );
    }
    // Advice is a fix when something is wrong, else how to give /dev/shm more room.
    let wrong = report.first_limit != FirstLimit::ShmFull
        || report.shm.free_bytes.is_some_and(|free| free < FULL)
        || report.min.as_ref().is_some_and(|min| !min.ok);
    for (i, fix) in report.fixes.iter().enumerate() {
        let label = match (i, wrong) {
            (0, true) => "fix",
            (0, false) => "more room",
            _ => "",
        };
        line(label, fix.clone());
    }
    if let Some(min) = &report.min {
        line(
            "--min",
            format!(
                "{}: {}",
                if min.ok { "ok" } else { "TOO SMALL" },
                min.reason
            ),
        );
    }
    out
}

fn describe_shm(shm: &Shm) -> String {
    let size = shm.size_bytes.map(human).unwrap_or_default();
    let mut text = match shm.kind {
        Kind::Missing => "missing: nothing is at /dev/shm (--ipc=none?), so shm_open and \
                          PyTorch's DataLoader workers fail"
            .to_owned(),
        Kind::NotMounted => format!(
            "not mounted: a directory of the {} below it, {size}",
            shm.fs_type.as_deref().map(escape::text).unwrap_or_default()
        ),
        Kind::OtherFileSystem => format!(
            "{size} of {}, not a tmpfs",
            shm.fs_type.as_deref().map(escape::text).unwrap_or_default()
        ),
        Kind::Runtime => format!("{size} tmpfs, the container's own (made by its runtime)"),
        Kind::Tmpfs => format!(
            "{size} tmpfs (source {}): the host's own, or in a container one mounted there \
             (--ipc=host, a Kubernetes emptyDir, --tmpfs)",
            shm.source.as_deref().map(escape::text).unwrap_or_default()
        ),
    };
    if shm.read_only {
        text.push_str("; READ-ONLY");
    } else if shm.kind != Kind::Missing && !shm.writable {
        text.push_str("; this user may not create files there");
    }
    text
}

fn describe_first(report: &Report) -> String {
    let shm = &report.shm;
    match report.first_limit {
        FirstLimit::Unusable => format!("nothing can be written: {}", unusable_reason(shm)),
        FirstLimit::ShmFull => {
            let inodes = match shm.inodes_free {
                Some(free) if free < 1024 => format!(
                    "; only {} left: many small objects (semaphores) fail with ENOSPC before the \
                     bytes run out",
                    count(free, "inode")
                ),
                _ => String::new(),
            };
            match shm.free_bytes.unwrap_or(0) {
                free if free < FULL => format!(
                    "/dev/shm, which is FULL now: the next allocation there fails with ENOSPC \
                     (or SIGBUS through a mapping){inodes}"
                ),
                free => format!(
                    "/dev/shm: ENOSPC (or SIGBUS through a mapping) once {} more is \
                     written{inodes}",
                    human(free)
                ),
            }
        }
        FirstLimit::MemoryLimit => {
            let room = report
                .memory
                .as_ref()
                .and_then(Memory::room_bytes)
                .unwrap_or(0);
            format!(
                "the memory limit: the OOM killer ends the writer after {} more, before /dev/shm \
                 ({} free) is full",
                human(room),
                human(shm.free_bytes.unwrap_or(0))
            )
        }
    }
}

fn describe_file(file: &File) -> String {
    let mut text = file.path.clone();
    if !file.linked {
        text.push_str(" (unlinked)");
    }
    if file.leftover {
        text.push_str(&format!(
            ": nobody holds it, a leftover (rm {})",
            shell_quote(&file.path)
        ));
    } else if !file.holders.is_empty() {
        let holders: Vec<String> = file
            .holders
            .iter()
            .map(|h| {
                let how = match (h.open, h.mapped) {
                    (true, true) => "open, mapped",
                    (false, true) => "mapped",
                    _ => "open",
                };
                format!("{} {} ({how})", h.pid, h.comm)
            })
            .collect();
        text.push_str(&format!(": held by {}", holders.join(", ")));
    }
    text
}

/// Single-quoted for a shell, unless plain.
fn shell_quote(path: &str) -> String {
    if path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:@".contains(c))
    {
        path.to_owned()
    } else {
        format!("'{}'", path.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shm(kind: Kind, size: u64, free: u64) -> Shm {
        Shm {
            path: shm::SHM,
            kind,
            fs_type: Some("tmpfs".into()),
            source: Some("shm".into()),
            mount_options: Some("rw".into()),
            super_options: Some("rw,size=65536k".into()),
            dev: Some(1),
            size_bytes: Some(size),
            used_bytes: Some(size - free),
            free_bytes: Some(free),
            inodes: Some(100),
            inodes_free: Some(90),
            read_only: false,
            writable: true,
        }
    }

    fn memory(limit: Option<u64>, usage: u64, shmem: u64) -> Memory {
        Memory {
            cgroup: memory::Version::V2,
            path: "/".into(),
            limit_bytes: limit,
            usage_bytes: Some(usage),
            shmem_bytes: Some(shmem),
            reclaimable_bytes: Some(0),
            oom_kills: None,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_memory_limit_trips_first_when_it_leaves_less_than_shm_has_free() {
        let roomy = shm(Kind::Runtime, 512 * MIB, 512 * MIB);
        assert_eq!(first_limit(&roomy, None), FirstLimit::ShmFull);
        assert_eq!(
            first_limit(&roomy, Some(&memory(Some(256 * MIB), 10 * MIB, 0))),
            FirstLimit::MemoryLimit
        );
        assert_eq!(
            first_limit(&roomy, Some(&memory(Some(4096 * MIB), 10 * MIB, 0))),
            FirstLimit::ShmFull
        );
        assert_eq!(
            first_limit(&roomy, Some(&memory(None, 10 * MIB, 0))),
            FirstLimit::ShmFull
        );
        let gone = Shm {
            read_only: true,
            ..roomy
        };
        assert_eq!(first_limit(&gone, None), FirstLimit::Unusable);
    }

    #[test]
    fn min_compares_what_a_workload_can_use() {
        let small = shm(Kind::Runtime, 64 * MIB, 60 * MIB);
        let verdict_small = verdict(128 * MIB, &small, None);
        assert!(!verdict_small.ok);
        assert!(
            verdict_small
                .reason
                .contains("smaller than the 128.0 MiB asked")
        );
        assert!(verdict(64 * MIB, &small, None).ok);
        let big = shm(Kind::Runtime, 512 * MIB, 512 * MIB);
        let limited = verdict(400 * MIB, &big, Some(&memory(Some(256 * MIB), 16 * MIB, 0)));
        assert!(!limited.ok, "{}", limited.reason);
        assert_eq!(limited.usable_bytes, 240 * MIB);
        assert!(limited.reason.contains("memory limit"));
        let missing = Shm {
            kind: Kind::Missing,
            ..small
        };
        assert!(!verdict(1, &missing, None).ok);
    }

    #[test]
    fn sizes_and_paths_read_as_typed() {
        assert_eq!(docker_size(64 * MIB), "64m");
        assert_eq!(docker_size(2 << 30), "2g");
        assert_eq!(docker_size(1536 * MIB), "1536m");
        assert_eq!(docker_size(MIB + 1), "2m");
        assert_eq!(shell_quote("/dev/shm/psm_1"), "/dev/shm/psm_1");
        assert_eq!(shell_quote("/dev/shm/a b'c"), r"'/dev/shm/a b'\''c'");
    }
}
