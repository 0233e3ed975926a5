//! Containers' cgroups as the runtimes make them (inotify on the cgroup2 tree): a runtime makes
//! a container's cgroup before its first process runs, and removes it only after its last
//! ended, so a cgroup seen as it is made names the container of every record that carries its
//! id, even one read after the container is gone.
//!
//! Only the directories where runtimes put containers are watched (`docker`, `system.slice`,
//! `machine.slice`, `libpod_parent`, and the kubelet's `kubepods` tree down to its pods), not
//! the whole tree: a host's cgroups run to thousands.
use std::{
    collections::HashMap,
    io,
    os::{
        fd::{AsFd, AsRawFd, RawFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::{Interest, unix::AsyncFd};

use super::cgroup::{CgroupMatch, PathClass, classify_path};

/// Directories below the cgroup2 root where runtimes make containers' cgroups.
const PARENTS: [&str; 6] = [
    "docker",
    "system.slice",
    "machine.slice",
    "libpod_parent",
    "kubepods",
    "kubepods.slice",
];
/// Most directories watched: the parents, and the kubelet's QoS and pod directories.
const MAX_WATCHES: usize = 4096;

/// The inotify instance, for the async runtime (which wants the raw descriptor).
struct Watcher(Inotify);

impl AsRawFd for Watcher {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

pub struct CgroupWatch {
    root: PathBuf,
    inotify: AsyncFd<Watcher>,
    /// Each watch's directory, relative to the root (`docker`, `kubepods/burstable/pod…`).
    dirs: HashMap<WatchDescriptor, PathBuf>,
}

impl CgroupWatch {
    /// Watches the cgroup2 tree mounted at `root`, and returns the containers' cgroups there
    /// already.
    pub fn start(root: &Path) -> io::Result<(CgroupWatch, Vec<(u64, CgroupMatch)>)> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let mut watch = CgroupWatch {
            root: root.to_owned(),
            // SAFETY: the `Watcher` owns the inotify descriptor, and the AsyncFd owns the
            // `Watcher`, so the descriptor stays open and unchanged for the AsyncFd's life.
            inotify: unsafe {
                AsyncFd::register_with_interest(Watcher(inotify), Interest::READABLE)
            }
            .map_err(|error| error.into_parts().1)?,
            dirs: HashMap::new(),
        };
        let mut found = Vec::new();
        watch.add(Path::new(""), &mut found);
        Ok((watch, found))
    }

    /// The containers' cgroups made since the last call, with their ids.
    pub async fn next(&mut self) -> io::Result<Vec<(u64, CgroupMatch)>> {
        loop {
            let mut guard = self.inotify.readable().await?;
            let events = match guard.get_inner().0.read_events() {
                Ok(events) => events,
                Err(nix::errno::Errno::EAGAIN) => {
                    guard.clear_ready();
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            let mut found = Vec::new();
            for event in events {
                if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                    self.dirs.remove(&event.wd);
                    continue;
                }
                let (Some(dir), Some(name)) = (self.dirs.get(&event.wd), &event.name) else {
                    continue;
                };
                if event
                    .mask
                    .contains(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_ISDIR)
                {
                    let relative = dir.join(name);
                    self.add(&relative, &mut found);
                }
            }
            if !found.is_empty() {
                return Ok(found);
            }
        }
    }

    /// A directory of the tree (relative to the root) seen: a container's cgroup goes to
    /// `found`; a directory where containers' cgroups are made (or their pods') is watched,
    /// with what it holds already.
    fn add(&mut self, relative: &Path, found: &mut Vec<(u64, CgroupMatch)>) {
        let path = format!("/{}", relative.display());
        if let PathClass::Container(matched) = classify_path(&path) {
            if let Ok(meta) = std::fs::metadata(self.root.join(relative)) {
                found.push((meta.ino(), matched));
            }
            return;
        }
        if !is_parent(relative) || self.dirs.len() >= MAX_WATCHES {
            return;
        }
        let absolute = self.root.join(relative);
        let Ok(wd) = self.inotify.get_ref().0.add_watch(
            &absolute,
            AddWatchFlags::IN_CREATE | AddWatchFlags::IN_ONLYDIR,
        ) else {
            return;
        };
        self.dirs.insert(wd, relative.to_owned());
        // What it holds already (made before the watch, or between the event and it).
        let Ok(entries) = std::fs::read_dir(&absolute) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                self.add(&relative.join(entry.file_name()), found);
            }
        }
    }
}

/// Whether containers' cgroups (or their pods') are made in this directory: the root, a
/// runtime's parent, or the kubelet's tree below `kubepods` (QoS classes, then pods).
fn is_parent(relative: &Path) -> bool {
    let depth = relative.iter().count();
    let Some(first) = relative.iter().next().map(|p| p.to_string_lossy()) else {
        return true;
    };
    match PARENTS.iter().find(|p| **p == first) {
        Some(parent) if parent.starts_with("kubepods") => depth <= 3,
        Some(_) => depth == 1,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_directories_where_runtimes_make_containers_are_watched() {
        for watched in [
            "",
            "docker",
            "system.slice",
            "kubepods",
            "kubepods/burstable",
            "kubepods/burstable/pod1234",
            "kubepods.slice/kubepods-besteffort.slice",
        ] {
            assert!(is_parent(Path::new(watched)), "{watched}");
        }
        for not in [
            "user.slice",
            "system.slice/sshd.service",
            "docker/x/y",
            "kubepods/burstable/pod1234/more/deep",
        ] {
            assert!(!is_parent(Path::new(not)), "{not}");
        }
    }
}
