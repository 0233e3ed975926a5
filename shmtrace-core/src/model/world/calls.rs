//! What each /dev/shm system call does to the model: open, size, map, unmap, unlink, close.
use shmtrace_common::open_family;
use std::sync::Arc;

use super::{DIRECTORIES, World};
use crate::{
    event::{Call, Event, InodeId, Syscall},
    model::{Annotation, Mapping, OpenFd, ShmObject, process::MAX_NAMES},
};

impl World {
    /// A directory on a /dev/shm opened (its descriptor kept, with its path, and its inode
    /// number) or closed.
    fn follow_directory(&mut self, event: &Event, call: &Call, path: Option<Arc<str>>) {
        if let (false, Some(file), Some(path)) = (call.failed(), call.file, &path)
            && path.starts_with('/')
            && call.syscall.opens_a_path()
        {
            if self.directories.len() >= DIRECTORIES {
                self.directories.clear();
            }
            self.directories
                .insert((event.mntns, file.inode.ino), path.clone());
        }
        let Some(process) = self.processes.get_mut(&event.pid) else {
            return;
        };
        match (call.syscall, call.fd, call.failed()) {
            (open_family!(), Some(fd), false) => match path.filter(|p| p.starts_with('/')) {
                Some(path) if process.dir_fds.len() < MAX_NAMES => {
                    process.dir_fds.insert(fd, path);
                }
                _ => drop(process.dir_fds.remove(&fd)),
            },
            (Syscall::Close, Some(fd), _) => drop(process.dir_fds.remove(&fd)),
            _ => {}
        }
    }

    /// The whole path of a call's name that is relative to a directory descriptor on a
    /// /dev/shm (`openat(dirfd, "sub/f")`): by the directory's inode number, when it was
    /// opened by a whole path in this trace (a descriptor moved with an untraced `fcntl`, as
    /// GNU's `find`, `du` and `rm -r` do, still names it); else by the descriptor this process
    /// opened. A directory neither names, other than the file system's root (inode 1: Linux
    /// numbers each tmpfs's inodes from 1 since 5.9), was opened before the trace began: its
    /// names are shown as `/dev/shm/…/NAME`, not as if they were in /dev/shm itself.
    pub fn resolve_relative(&self, pid: u32, mntns: u32, call: &Call) -> Option<String> {
        let path = call.path.as_deref()?;
        if !call.relative_to_shm || path.starts_with('/') || !has_dirfd(call.syscall) {
            return None;
        }
        let dirfd = call.args[0] as i32;
        let by_inode = call
            .dir_ino
            .and_then(|ino| self.directories.get(&(mntns, ino)));
        let by_fd = || self.processes.get(&pid)?.dir_fds.get(&dirfd);
        match (by_inode.or_else(by_fd), call.dir_ino) {
            (Some(dir), _) => Some(format!("{}/{path}", dir.trim_end_matches('/'))),
            (None, Some(ino)) if ino != TMPFS_ROOT_INO => {
                Some(format!("/dev/shm/{UNKNOWN_DIR}/{path}"))
            }
            (None, _) => None,
        }
    }

    /// Mount namespace `mntns` is gone: its directories' numbers may name others later.
    pub(super) fn forget_directories(&mut self, mntns: u32) {
        self.directories.retain(|(m, _), _| *m != mntns);
    }

    pub(super) fn apply_call(&mut self, event: &Event, call: &Call, note: &mut Annotation) {
        // A device node, FIFO or socket is no /dev/shm object (`FileRef::is_special`).
        if call.file.is_some_and(|file| file.is_special()) {
            note.irrelevant = true;
            return;
        }
        // A directory (/dev/shm itself, whose descriptor `ls` or a runtime closes) is no
        // object: kept as one, each container's would stay in the model for good.
        if call
            .file
            .is_some_and(|file| file.mode & libc::S_IFMT == libc::S_IFDIR)
        {
            note.object_path = call.display_path().map(Arc::from);
            self.follow_directory(event, call, note.object_path.clone());
            return;
        }
        let ok = !call.failed();
        match call.syscall {
            open_family!() => {
                let path = call.display_path();
                let shared: Option<Arc<str>> = path.as_deref().map(Arc::from);
                note.object_path = shared.clone();
                if let Some(path) = path.as_deref() {
                    if ok {
                        // The name is back (made again): a removal of it is over, in this
                        // namespace and in those sharing its /dev/shm.
                        let dev = call.file.map(|f| f.inode.dev);
                        self.removals.retain(|(on, r)| {
                            !(&*r.path == path
                                && (r.remover_mntns == event.mntns || Some(*on) == dev))
                        });
                        if let Some(dev) = dev
                            && path.starts_with("/dev/shm/")
                        {
                            self.learn_shm_dev(event.mntns, dev);
                        }
                    } else if let Some(removal) = self.removal_met(event, call) {
                        self.confirm_removal(event.mntns, &removal, note);
                        note.name_removed = Some(removal.1);
                    }
                }
                if let (true, Some(file), Some(fd), Some(path), Some(shared)) =
                    (ok, call.file, call.fd, path, shared)
                {
                    let flags = call.args[2];
                    if self.is_stale(file.inode, flags, event.mntns) {
                        self.retire(file.inode, note);
                    }
                    // Opened by its name, so it is alive: not an object freed before and
                    // brought back by a passed descriptor, but a new one with the same
                    // number (a restarted container's fresh /dev/shm numbers from 1 again).
                    self.recently_freed.remove(&file.inode);
                    let created = flags & libc::O_CREAT as u64 != 0
                        && (flags & libc::O_EXCL as u64 != 0
                            || !self.objects.contains_key(&file.inode));
                    let is_new = !self.objects.contains_key(&file.inode);
                    if is_new {
                        self.totals.objects_created += u64::from(created);
                    }
                    let object = self.object_entry(file.inode, event.mntns, event.ts_ns);
                    object.path = Some(shared);
                    object.linked = true;
                    object.fds += 1;
                    if created && is_new {
                        object.creator = Some(event.pid);
                    }
                    self.names.insert((event.mntns, path.clone()), file.inode);
                    self.update_size(file.inode, file.size, file.allocated);
                    let process = self.processes.get_mut(&event.pid).expect("ensured");
                    if process.opened.len() < MAX_NAMES && !process.opened.contains(&path) {
                        process.opened.push(path);
                        // Inline, as `process` still borrows the map; `changed` trims the log.
                        self.version += 1;
                        self.change_log.push_back(event.pid);
                    }
                    let previous = process.fds.insert(
                        fd,
                        OpenFd {
                            inode: file.inode,
                            cloexec: flags & libc::O_CLOEXEC as u64 != 0,
                        },
                    );
                    // A descriptor number reused without a close we saw (or one a /proc
                    // snapshot already showed): the old reference is gone.
                    if let Some(previous) = previous {
                        self.release(vec![previous.inode], Vec::new(), note);
                    }
                }
            }
            Syscall::Ftruncate
            | Syscall::Fallocate
            | Syscall::Write
            | Syscall::Mmap
            | Syscall::Close => {
                let Some(file) = call.file else { return };
                let inode = file.inode;
                // Looked for only when the object has no name yet: copying its name for
                // every call was a tenth of the model's time.
                let named = self.objects.get(&inode).is_some_and(|o| o.path.is_some());
                let path = if named {
                    None
                } else {
                    self.name_for_fd(event.pid, call.fd, inode)
                        .or_else(|| self.recently_freed.get(&inode).cloned())
                };
                let is_new = !self.objects.contains_key(&inode);
                let object = self.object_entry(inode, event.mntns, event.ts_ns);
                if object.path.is_none() {
                    object.path = path;
                }
                if is_new {
                    // First seen through a descriptor: one passed from another process, whose
                    // name is normally gone already (PyTorch unlinks before passing it).
                    object.linked = false;
                }
                let request = match call.syscall {
                    Syscall::Ftruncate => call.args[1],
                    Syscall::Fallocate => call.args[2].saturating_add(call.args[3]),
                    _ => 0,
                };
                object.peak_request = object.peak_request.max(request);
                note.object_path = Some(object.shared_name());
                self.update_size(inode, file.size, file.allocated);
                if call.syscall != Syscall::Close
                    && let Some(fd) = call.fd
                {
                    self.learn_fd(event.pid, fd, inode, note);
                }
                match call.syscall {
                    Syscall::Mmap if ok => {
                        let process = self.processes.get_mut(&event.pid).expect("ensured");
                        let start = call.ret as u64;
                        let len = call.args[1];
                        let changes = process.unmap(start, len);
                        process.map(Mapping {
                            start,
                            len,
                            inode,
                            offset: call.args[5],
                        });
                        self.adjust_mappings(changes, note);
                        let object = self.object_entry(inode, event.mntns, event.ts_ns);
                        object.mappings += 1;
                        object.uncounted_writes = true;
                    }
                    // close releases the descriptor even when it reports an error, except EBADF.
                    // What it releases is what the descriptor holds now: the probes read the
                    // file at entry, and another thread may have closed and reused the number
                    // in between (the record's file is then already released).
                    Syscall::Close if call.errno() != Some(libc::EBADF) => {
                        let process = self.processes.get_mut(&event.pid).expect("ensured");
                        if let Some(removed) = call.fd.and_then(|fd| process.fds.remove(&fd)) {
                            self.release(vec![removed.inode], Vec::new(), note);
                        }
                    }
                    _ => {}
                }
            }
            Syscall::Munmap => {
                let process = self.processes.get_mut(&event.pid).expect("ensured");
                let changes = if ok {
                    process.unmap(call.args[0], call.args[1])
                } else {
                    Vec::new()
                };
                match changes.first() {
                    Some((inode, _)) => {
                        note.object_path = self.objects.get(inode).map(ShmObject::shared_name)
                    }
                    None => note.irrelevant = true,
                }
                self.adjust_mappings(changes, note);
            }
            Syscall::Unlink | Syscall::Unlinkat => {
                let Some(path) = call.display_path() else {
                    return;
                };
                note.object_path = Some(path.as_str().into());
                // Its own name, removed under it by another: its clean-up fails for that.
                note.name_removed = self.removal_met(event, call).map(|(_, r)| r);
                if ok {
                    match self.names.remove(&(event.mntns, path.clone())) {
                        Some(inode) => {
                            self.note_removal(event, inode);
                            self.unlink_shared_name(event.mntns, &path, inode);
                            self.unlink_object(inode, note);
                        }
                        None => self.unlink_elsewhere(event, &path, note),
                    }
                }
            }
            Syscall::MemfdCreate
            | Syscall::Recvmsg
            | Syscall::Shmget
            | Syscall::Shmat
            | Syscall::Shmdt
            | Syscall::Shmctl => {}
            // A look at the free space changes nothing; the record names what was asked about.
            Syscall::Statfs => note.object_path = call.display_path().map(Arc::from),
            Syscall::Fstatfs => {
                note.object_path = call
                    .file
                    .and_then(|file| self.name_for_fd(event.pid, call.fd, file.inode))
            }
        }
    }

    /// A call came through descriptor `fd` of `inode`: if the model did not know it holds
    /// that, it does now. The trace sees a descriptor opened, but not one moved with dup2 (dd
    /// opens its output as 3 and writes through 1), inherited from before the trace, or
    /// received in a message before its first call; without this the process held nothing
    /// through it, and its role's peak missed what it wrote (issue 25). It holds the object
    /// until it closes the descriptor or exits, as one it opened.
    fn learn_fd(&mut self, pid: u32, fd: i32, inode: InodeId, note: &mut Annotation) {
        let Some(process) = self.processes.get_mut(&pid) else {
            return;
        };
        if process.fds.get(&fd).is_some_and(|open| open.inode == inode) {
            return;
        }
        // dup2 and dup3 without O_CLOEXEC clear the flag; a guess either way for the others.
        let previous = process.fds.insert(
            fd,
            OpenFd {
                inode,
                cloexec: false,
            },
        );
        if let Some(object) = self.objects.get_mut(&inode) {
            object.fds += 1;
        }
        // The number held another object: it was closed or replaced without a call we saw.
        if let Some(previous) = previous {
            self.release(vec![previous.inode], Vec::new(), note);
        }
    }

    /// The name a descriptor was opened under, when the object has none yet.
    pub(super) fn name_for_fd(
        &self,
        pid: u32,
        fd: Option<i32>,
        inode: InodeId,
    ) -> Option<Arc<str>> {
        if let Some(object) = self.objects.get(&inode)
            && object.path.is_some()
        {
            return object.path.clone();
        }
        let process = self.processes.get(&pid)?;
        let open = process.fds.get(&fd?)?;
        self.objects.get(&open.inode)?.path.clone()
    }
}

#[cfg(test)]
#[path = "calls_tests.rs"]
mod tests;

/// Inode number of a tmpfs's root directory.
const TMPFS_ROOT_INO: u64 = 1;

/// Stands for the directories of a path shmtrace does not know.
const UNKNOWN_DIR: &str = "…";

/// Whether the call's first argument is the directory descriptor its path is relative to.
fn has_dirfd(syscall: Syscall) -> bool {
    syscall.dirfd_arg() == Some(0)
}
