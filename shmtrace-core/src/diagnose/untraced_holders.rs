//! Space of a full /dev/shm held by what shmtrace does not trace: another container that
//! shares it (Docker's `--ipc=container:NAME`, `--ipc=shareable`, `--ipc=host`, a pod's
//! shared /dev/shm), a sidecar, a process on the host. Named file by file with who holds each,
//! so that the user can choose between a bigger /dev/shm and less use by the others.
use super::Diagnoser;
use crate::{
    event::InodeId,
    model::{ContainerInfo, HeldFile, World},
};

/// Files on the /dev/shm that failed, held by others, most memory first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Others {
    /// Pages they hold, all together.
    pub bytes: u64,
    /// How many files hold them; the first [`MAX_FILES`] are in `files`.
    pub count: usize,
    pub files: Vec<OtherFile>,
    /// Containers known to use this /dev/shm, with how (`private (shareable)`, `shared with
    /// container holder`, `the host's (--ipc=host)`): it is one /dev/shm for all of them.
    pub shared_by: Vec<Sharer>,
    /// The container whose /dev/shm it is, when the one that failed only joined it: its size
    /// is set there.
    pub owner: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherFile {
    pub path: String,
    pub linked: bool,
    /// Pages it holds (not its size).
    pub bytes: u64,
    pub size: u64,
    pub holders: Vec<OtherHolder>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherHolder {
    pub pid: u32,
    pub comm: String,
    /// Its container (`holder`, `ns/pod/sidecar`), `host`, or a mount namespace.
    pub place: String,
    /// `place` names a container.
    pub in_container: bool,
    pub open: bool,
    pub mapped: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sharer {
    pub container: String,
    pub ipc: String,
}

/// How `ipc` words begin for a container that joins another's /dev/shm.
pub(super) const JOINS: &str = "shared with container ";

/// Most files named; the rest are counted.
pub const MAX_FILES: usize = 10;

impl Diagnoser {
    /// The files on `dev` with pages, as last read from the machine, that the trace does not
    /// account for: no traced process made, opened or mapped them.
    pub(super) fn others_on(&self, dev: u32, world: &World) -> Vec<HeldFile> {
        let Some(sample) = self.holders.get(&dev) else {
            return Vec::new();
        };
        sample
            .files
            .iter()
            .filter(|f| f.bytes > 0)
            .filter(|f| world.object(&InodeId { dev, ino: f.ino }).is_none())
            // The sample may be older than this failure (one a second): an unlinked file
            // whose every holder has since ended went with them (the demo's first run's
            // batches, when its second run failed).
            .filter(|f| {
                f.linked
                    || !f
                        .holders
                        .iter()
                        .all(|h| world.process(h.pid).is_some_and(|p| !p.alive()))
            })
            .cloned()
            .collect()
    }

    /// The known container whose /dev/shm one with these `ipc` words joined (Docker
    /// reports the id the name stood for, which `ipc` shortens).
    pub(super) fn joined(&self, ipc: &str) -> Option<&ContainerInfo> {
        let joined = ipc.strip_prefix(JOINS).filter(|j| !j.is_empty())?;
        self.containers
            .values()
            .find(|c| c.id.starts_with(joined) || c.name == joined)
    }

    /// A container's `ipc` words for people (escaped), the container it joins named.
    fn ipc_words(&self, ipc: &str) -> String {
        match self.joined(ipc) {
            Some(owner) => format!("{JOINS}{}", owner.label()),
            None => crate::event::escape::text(ipc),
        }
    }

    /// What a diagnosis says of the others on `dev`: their files and who holds them, and the
    /// containers that share it. `None` when nothing else holds any of it.
    pub(super) fn others(
        &self,
        dev: u32,
        files: &[HeldFile],
        container: Option<&ContainerInfo>,
    ) -> Option<Others> {
        let mut shared_by: Vec<Sharer> = self
            .containers
            .values()
            .filter(|c| c.shm_dev == Some(dev))
            .map(|c| Sharer {
                container: c.label(),
                ipc: self.ipc_words(&c.ipc),
            })
            .collect();
        shared_by.sort_by(|a, b| a.container.cmp(&b.container));
        shared_by.dedup();
        if files.is_empty() && shared_by.len() < 2 {
            return None;
        }
        // Docker: the container started with `--ipc=shareable` (or private) owns it, and
        // those started with `--ipc=container:` join it.
        let joined = container.is_some_and(|c| c.ipc.starts_with(JOINS));
        let owner = joined
            .then(|| {
                shared_by
                    .iter()
                    .find(|s| s.ipc.starts_with("private"))
                    .map(|s| s.container.clone())
            })
            .flatten();
        let bytes = files.iter().map(|f| f.bytes).sum();
        let named = files
            .iter()
            .take(MAX_FILES)
            .map(|f| OtherFile {
                path: f.path.clone(),
                linked: f.linked,
                bytes: f.bytes,
                size: f.size,
                holders: f
                    .holders
                    .iter()
                    .map(|h| OtherHolder {
                        pid: h.pid,
                        comm: h.comm.clone(),
                        place: self.place(h.mntns),
                        in_container: self.containers.contains_key(&h.mntns),
                        open: h.open,
                        mapped: h.mapped,
                    })
                    .collect(),
            })
            .collect();
        Some(Others {
            bytes,
            count: files.len(),
            files: named,
            shared_by,
            owner,
        })
    }
}
