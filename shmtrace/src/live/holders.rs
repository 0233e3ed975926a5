//! Who holds a full /dev/shm, read from the machine at the failure: every file on it with the
//! processes that have it open (/proc/PID/fd) or mapped (/proc/PID/maps, sized through
//! /proc/PID/map_files), whoever they are, and the named files nobody holds. The others who
//! share one /dev/shm (another container, a sidecar) are not traced, so only /proc knows them.
use std::{collections::HashMap, fs, os::unix::fs::MetadataExt};

use crate::{
    container::list_shm_files,
    kernel_ids::{kernel_dev, kernel_dev_from_stat, mount_namespace},
};
use shmtrace_core::{
    event::escape,
    model::{HeldFile, Holder, ShmHolders},
};

/// Most files kept, largest first, and most holders named per file: a diagnosis names ten.
const MAX_FILES: usize = 32;
const MAX_HOLDERS: usize = 8;
const DELETED: &str = " (deleted)";

/// What holds /dev/shm file system `dev`, its named files seen from the first of `pids` whose
/// /dev/shm it is. `None` when no file on it holds anything.
pub fn holders(pids: &[u32], dev: u32, ts_ns: u64) -> Option<ShmHolders> {
    let mut files: HashMap<u64, HeldFile> = HashMap::new();
    if let Some(named) = pids.iter().find_map(|pid| {
        list_shm_files(*pid)
            .ok()
            .filter(|(found, _)| *found == dev)
            .map(|(_, named)| named)
    }) {
        for file in named {
            let name = escape::bytes(file.name.as_encoded_bytes());
            files.insert(
                file.ino,
                HeldFile {
                    ino: file.ino,
                    path: format!("/dev/shm/{name}"),
                    linked: true,
                    bytes: file.bytes,
                    size: file.size,
                    holders: Vec::new(),
                },
            );
        }
    }
    let Ok(procs) = fs::read_dir("/proc") else {
        return None;
    };
    for entry in procs.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        read_process(pid, dev, &mut files);
    }
    let mut files: Vec<HeldFile> = files.into_values().filter(|f| f.bytes > 0).collect();
    if files.is_empty() {
        return None;
    }
    files.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.path.cmp(&b.path)));
    files.truncate(MAX_FILES);
    for file in &mut files {
        file.holders.sort_by_key(|h| h.pid);
        file.holders.truncate(MAX_HOLDERS);
    }
    Some(ShmHolders { dev, ts_ns, files })
}

/// Adds what `pid` holds on `dev`, by descriptor and by mapping.
fn read_process(pid: u32, dev: u32, files: &mut HashMap<u64, HeldFile>) {
    let mut held: Vec<(u64, bool)> = Vec::new();
    if let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.filter_map(Result::ok) {
            // Through the magic link: the inode itself, even when unlinked.
            let Ok(meta) = fs::metadata(fd.path()) else {
                continue;
            };
            if kernel_dev_from_stat(meta.dev()) != dev || !meta.file_type().is_file() {
                continue;
            }
            note_file(files, &fd.path(), &meta);
            held.push((meta.ino(), false));
        }
    }
    if let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) {
        for line in maps.lines() {
            let mut fields = line.split_ascii_whitespace();
            let (Some(range), Some(device), Some(inode)) =
                (fields.next(), fields.nth(2), fields.next())
            else {
                continue;
            };
            if parse_majmin(device) != Some(dev) {
                continue;
            }
            let Ok(ino) = inode.parse::<u64>() else {
                continue;
            };
            let link = std::path::PathBuf::from(format!("/proc/{pid}/map_files/{range}"));
            if let Ok(meta) = fs::metadata(&link) {
                note_file(files, &link, &meta);
            }
            held.push((ino, true));
        }
    }
    if held.is_empty() {
        return;
    }
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| escape::text(c.trim_end_matches('\n')))
        .unwrap_or_default();
    let mntns = mount_namespace(pid).unwrap_or(0);
    for (ino, mapped) in held {
        let Some(file) = files.get_mut(&ino) else {
            continue;
        };
        match file.holders.iter_mut().find(|h| h.pid == pid) {
            Some(h) => {
                h.open |= !mapped;
                h.mapped |= mapped;
            }
            None => file.holders.push(Holder {
                pid,
                comm: comm.clone(),
                mntns,
                open: !mapped,
                mapped,
            }),
        }
    }
}

/// Records a file met through a /proc link, unless it is known already (its name from the
/// directory is the one to keep).
fn note_file(files: &mut HashMap<u64, HeldFile>, link: &std::path::Path, meta: &fs::Metadata) {
    files.entry(meta.ino()).or_insert_with(|| {
        let target = fs::read_link(link)
            .map(|t| escape::bytes(t.as_os_str().as_encoded_bytes()))
            .unwrap_or_default();
        let (path, linked) = match target.strip_suffix(DELETED) {
            Some(path) => (path.to_owned(), false),
            None => (target, true),
        };
        HeldFile {
            ino: meta.ino(),
            path,
            linked,
            bytes: meta.blocks().saturating_mul(512),
            size: meta.size(),
            holders: Vec::new(),
        }
    });
}

/// `00:1a` (hex, as /proc/PID/maps writes it) to a kernel `dev_t`.
fn parse_majmin(text: &str) -> Option<u32> {
    let (major, minor) = text.split_once(':')?;
    Some(kernel_dev(
        u64::from_str_radix(major, 16).ok()?,
        u64::from_str_radix(minor, 16).ok()?,
    ))
}
