//! cgroup v2 ids, as the probes' records carry them (`bpf_get_current_cgroup_id()`): which
//! container a record's cgroup is, even once the process that made the record is gone.
//!
//! A cgroup's id is the inode number of its directory in the cgroup2 tree, and the kernel never
//! hands an id out twice, so an id names one container for good. The tree is mounted at
//! `/sys/fs/cgroup` on a pure cgroup v2 host and at `/sys/fs/cgroup/unified` on a hybrid one,
//! where runc still puts each container's processes in a cgroup of their own (`/docker/<id>`).
//! Where a runtime does not, every process of every container reports the root's id, which
//! says nothing: [`CgroupTree::path_of`] gives `/` for it and the caller looks elsewhere.
//!
//! An id is turned into its path with `open_by_handle_at(2)` (a kernfs file handle is the id
//! itself), which needs `CAP_DAC_READ_SEARCH` and works while the cgroup exists: a runtime
//! removes a container's cgroup some time after its last process ended, which is later than
//! the daemon reads that process's records unless it is starved.
use std::{
    fs, io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
};

use super::{
    Runtime,
    cgroup::{PathClass, classify_path, is_full_id},
};

/// `FILEID_KERNFS` (`include/linux/exportfs.h`): a kernfs node's 64-bit id.
const FILEID_KERNFS: i32 = 0xfe;

/// What a cgroup id says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupOwner {
    /// A container's cgroup (or one nested in it).
    Container(super::cgroup::CgroupMatch),
    /// A cgroup of no container: the root, a system service, a user's session.
    NotAContainer,
    /// The cgroup no longer exists (or never did): the id cannot be looked up any more.
    Gone,
}

/// The cgroup2 tree of this host, open.
pub struct CgroupTree {
    root: PathBuf,
    dir: OwnedFd,
}

impl CgroupTree {
    /// The cgroup2 mount this process sees (`/proc/self/mountinfo`); `None` without one.
    pub fn open() -> Option<CgroupTree> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
        let root = cgroup2_mount(&mountinfo)?;
        CgroupTree::at(&root).ok()
    }

    /// The tree mounted at `root`.
    pub fn at(root: &Path) -> io::Result<CgroupTree> {
        let dir: OwnedFd = fs::File::open(root)?.into();
        Ok(CgroupTree {
            root: root.to_owned(),
            dir,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of cgroup `id` in the tree (`/docker/<id>`, `/` for the root).
    pub fn path_of(&self, id: u64) -> io::Result<Option<String>> {
        #[repr(C)]
        struct KernfsHandle {
            bytes: u32,
            kind: i32,
            id: u64,
        }
        let mut handle = KernfsHandle {
            bytes: 8,
            kind: FILEID_KERNFS,
            id,
        };
        // SAFETY: `handle` is a `struct file_handle` with its 8 bytes of `f_handle` in place,
        // alive for the call; the returned descriptor, if any, is ours to own.
        let fd = unsafe {
            libc::open_by_handle_at(
                self.dir.as_raw_fd(),
                (&raw mut handle).cast::<libc::file_handle>(),
                libc::O_PATH | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                Some(libc::ESTALE | libc::ENOENT) => Ok(None),
                _ => Err(error),
            };
        }
        // SAFETY: a descriptor the kernel just returned to us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let path = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        let relative = path.strip_prefix(&self.root).unwrap_or(&path);
        Ok(Some(format!("/{}", relative.to_string_lossy())))
    }

    /// Whose cgroup `id` is.
    pub fn owner_of(&self, id: u64) -> io::Result<CgroupOwner> {
        Ok(match self.path_of(id)? {
            None => CgroupOwner::Gone,
            Some(path) => match classify_path(&path) {
                PathClass::Container(found) => CgroupOwner::Container(found),
                PathClass::Conmon { .. } | PathClass::Host => CgroupOwner::NotAContainer,
            },
        })
    }

    /// The id of container `id`'s cgroup where `runtime` puts it by default (`docker/<id>`,
    /// `system.slice/docker-<id>.scope`, Podman's), found without its processes: a container
    /// that lived a few milliseconds has its cgroup until its runtime removes it.
    pub fn id_of_container(&self, runtime: Runtime, id: &str) -> Option<u64> {
        let layouts: &[&str] = match runtime {
            Runtime::Docker => &["docker/{}", "system.slice/docker-{}.scope"],
            Runtime::Podman => &[
                "machine.slice/libpod-{}.scope/container",
                "machine.slice/libpod-{}.scope",
                "libpod_parent/libpod-{}",
            ],
            // The kubelet's layouts hold the pod's uid, which the id does not say.
            Runtime::Containerd | Runtime::CriO | Runtime::Unknown => &[],
        };
        if !is_full_id(id) {
            return None;
        }
        layouts
            .iter()
            .find_map(|layout| fs::metadata(self.root.join(layout.replace("{}", id))).ok())
            .map(|m| m.ino())
    }

    /// The id of the cgroup process `pid` is in, from `/proc/PID/cgroup`; `None` for the
    /// root, which every process of a runtime that leaves cgroup2 alone is in.
    pub fn id_of(&self, pid: u32) -> Option<u64> {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let path = text.lines().find_map(|line| line.strip_prefix("0::"))?;
        let relative = path.trim_start_matches('/');
        if relative.is_empty() {
            return None;
        }
        fs::metadata(self.root.join(relative)).ok().map(|m| m.ino())
    }
}

/// Where the cgroup2 file system is mounted, from the text of `/proc/self/mountinfo`: the one
/// at `/sys/fs/cgroup` or below it, else the first.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    let mounts: Vec<&str> = mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            (after.split_whitespace().next()? == "cgroup2").then_some(())?;
            before.split_whitespace().nth(4)
        })
        .collect();
    let chosen = mounts
        .iter()
        .find(|m| m.starts_with("/sys/fs/cgroup"))
        .or_else(|| mounts.first())?;
    // mountinfo escapes blanks and backslashes as octal.
    Some(PathBuf::from(
        chosen
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_of_a_hybrid_and_of_a_pure_host() {
        let hybrid = "\
35 25 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
37 35 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure = "35 25 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate";
        assert_eq!(cgroup2_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(cgroup2_mount("36 35 0:31 / /proc rw - proc proc rw"), None);
    }
}
