//! What the tracer does at a call's entry and at its exit: decide whether the call concerns
//! /dev/shm (by its path, or by what its descriptor is), await its result when it does, and
//! make the record the probes make of it.
//!
//! The rules are the probes' (`shmtrace-ebpf/src/probes`): an open, unlink or statfs counts
//! when its path is under /dev/shm (absolute, or relative to a directory on a /dev/shm file
//! system); a call on a descriptor when the descriptor's file is on one; `close` is reported
//! at its entry, as succeeding; `recvmsg` only when it dropped the descriptors sent to it; an
//! open elsewhere only when it fails for want of descriptors, which is watched for once a
//! process has used descriptors near its limit.
//!
//! Each call whose exit is awaited stops the program twice (its entry, then its exit), so a
//! call whose outcome is certain at its entry is reported there, as succeeding, with the file
//! as the call leaves it: an `ftruncate` that grows a /dev/shm file (see `certain_growth`),
//! and a `munmap` of one whole mapping. Every other call's exit is awaited, failures included.
use shmtrace_common::{FileRef, Syscall, flags, open_family, statfs_args};

use super::{
    arch, filter,
    inject::{self, Injected},
    memory::Mem,
    pending::{Pending, What},
    records::Call,
    tracer::{Mode, Tracer, fd_writable, file_of, stat_fd},
};
use shmtrace_core::clock::boot_ns;

const AT_FDCWD: i32 = -100;
const MAP_ANONYMOUS: u64 = 0x20;
const PR_SET_NAME: u64 = 15;
const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;
const MSG_CTRUNC: u32 = 0x8;
/// Offsets in `struct user_msghdr` (64-bit): `msg_control`, `msg_controllen`, `msg_flags`.
const MSGHDR_CONTROL: u64 = 32;
const MSGHDR_CONTROLLEN: u64 = 40;
const MSGHDR_FLAGS: u64 = 48;
const SOL_SOCKET: i32 = 1;
const SCM_RIGHTS: i32 = 1;
/// Descriptors received in one message that are looked at.
const MAX_RECEIVED: usize = 253;
/// Within this many of its descriptor limit, a process's opens elsewhere are watched for
/// EMFILE.
const FD_LIMIT_MARGIN: u64 = 64;
/// Instructions a process's filter chain may reach before its descriptors are no longer
/// armed (the kernel's limit is 32768, with 4 more per filter).
const CHAIN_BUDGET: usize = 24_000;

/// What a path names.
enum PathIs {
    Shm {
        flags: u16,
        path: Vec<u8>,
    },
    /// /dev/shm itself.
    Directory(Vec<u8>),
    Elsewhere(Vec<u8>),
    Unread,
}

impl Tracer {
    /// A call's entry (a seccomp stop, or any call's entry stop when every call stops).
    pub(super) fn call_entry(&mut self, tid: i32, nr: i64, args: [u64; 6]) {
        let pending = self.judge(tid, nr, args);
        if let Some(thread) = self.threads.get_mut(&tid) {
            thread.pending = pending;
        }
    }

    fn judge(&mut self, tid: i32, nr: i64, args: [u64; 6]) -> Option<Pending> {
        let nr = nr as libc::c_long;
        let call = |what, flags, args, fd, file, path| Pending {
            what,
            flags,
            args,
            fd,
            file,
            path,
        };
        if nr == libc::SYS_openat || Some(nr) == arch::SYS_OPEN || nr == libc::SYS_openat2 {
            let (syscall, dfd, path_ptr, mut args) = if nr == libc::SYS_openat {
                (Syscall::Openat, args[0] as i32, args[1], args)
            } else if nr == libc::SYS_openat2 {
                (
                    Syscall::Openat2,
                    args[0] as i32,
                    args[1],
                    self.open_how(tid, args),
                )
            } else {
                let at_cwd = AT_FDCWD as i64 as u64;
                (
                    Syscall::Open,
                    AT_FDCWD,
                    args[0],
                    [at_cwd, args[0], args[1], args[2], 0, 0],
                )
            };
            args[0] = args[0] as i32 as i64 as u64;
            return match self.path(tid, dfd, path_ptr) {
                PathIs::Shm { flags, path } => {
                    Some(call(What::Report(syscall), flags, args, -1, None, path))
                }
                PathIs::Elsewhere(path) if self.near_fd_limit(tid) => Some(call(
                    What::FdLimitOnly(syscall),
                    flags::FD_LIMIT_ONLY,
                    args,
                    -1,
                    None,
                    path,
                )),
                _ => None,
            };
        }
        if nr == libc::SYS_unlinkat || Some(nr) == arch::SYS_UNLINK {
            let (syscall, dfd, path_ptr) = if nr == libc::SYS_unlinkat {
                (Syscall::Unlinkat, args[0] as i32, args[1])
            } else {
                (Syscall::Unlink, AT_FDCWD, args[0])
            };
            return match self.path(tid, dfd, path_ptr) {
                PathIs::Shm { flags, path } => {
                    Some(call(What::Report(syscall), flags, args, -1, None, path))
                }
                _ => None,
            };
        }
        if nr == libc::SYS_statfs {
            // "/dev/shm" itself is what such programs ask about.
            return match self.path(tid, AT_FDCWD, args[0]) {
                PathIs::Shm { flags, path } => Some(call(
                    What::Report(Syscall::Statfs),
                    flags,
                    args,
                    -1,
                    None,
                    path,
                )),
                PathIs::Directory(path) => {
                    Some(call(What::Report(Syscall::Statfs), 0, args, -1, None, path))
                }
                _ => None,
            };
        }
        if nr == libc::SYS_memfd_create {
            let name = self.string(tid, args[0]).unwrap_or_default();
            return Some(call(
                What::Report(Syscall::MemfdCreate),
                0,
                args,
                -1,
                None,
                name,
            ));
        }
        let sysv = [
            (libc::SYS_shmget, Syscall::Shmget),
            (libc::SYS_shmat, Syscall::Shmat),
            (libc::SYS_shmdt, Syscall::Shmdt),
            (libc::SYS_shmctl, Syscall::Shmctl),
        ];
        if let Some((_, syscall)) = sysv.iter().find(|(n, _)| *n == nr) {
            let fd = if *syscall == Syscall::Shmat || *syscall == Syscall::Shmctl {
                args[0] as i32
            } else {
                -1
            };
            return Some(call(What::Report(*syscall), 0, args, fd, None, Vec::new()));
        }
        if nr == libc::SYS_recvmsg {
            let controllen: u64 = self
                .mem(tid)
                .read_value(args[1] + MSGHDR_CONTROLLEN)
                .unwrap_or(0);
            return (controllen > 0).then(|| {
                call(
                    What::Receive,
                    flags::FD_LIMIT_ONLY,
                    args,
                    args[0] as i32,
                    None,
                    Vec::new(),
                )
            });
        }
        if nr == libc::SYS_prctl {
            if args[0] == PR_SET_NAME {
                self.renamed(tid, args[1]);
            }
            return None;
        }
        if nr == libc::SYS_prlimit64 || Some(nr) == arch::SYS_SETRLIMIT {
            // A limit may change: asked again when next needed.
            for process in self.processes.values_mut() {
                process.nofile = None;
                process.fsize = None;
            }
            return None;
        }
        if nr == libc::SYS_ptrace {
            self.nested_tracer(tid, args);
            return None;
        }
        if nr == libc::SYS_munmap {
            let (start, len) = (args[0], args[1]);
            let (overlaps, whole) = self.process_of(tid).map_or((false, false), |p| {
                let overlaps = p
                    .mappings
                    .iter()
                    .any(|&(m_start, m_len)| start < m_start + m_len && m_start < start + len);
                (overlaps, unmaps_one_whole(&p.mappings, start, len))
            });
            if whole {
                // One whole mapping, page-aligned: the call cannot fail (short of a split of a
                // neighbour the kernel merged it with, at the process's map count limit), so
                // it is reported at its entry, as succeeding, and its exit is not awaited.
                if let Some(process) = self.process_of(tid) {
                    process.mappings = unmap(&process.mappings, start, len);
                }
                let record = Call {
                    syscall: Syscall::Munmap,
                    flags: 0,
                    fd: -1,
                    ret: 0,
                    args,
                    file: None,
                };
                self.emit_call(tid, &record, None);
                return None;
            }
            return overlaps
                .then(|| call(What::Report(Syscall::Munmap), 0, args, -1, None, Vec::new()));
        }
        // The calls on a descriptor.
        let (fd, syscall) = if nr == libc::SYS_mmap {
            if args[3] & MAP_ANONYMOUS != 0 {
                return None;
            }
            (args[4] as i32, Some(Syscall::Mmap))
        } else if nr == libc::SYS_fcntl {
            if args[1] != F_DUPFD && args[1] != F_DUPFD_CLOEXEC {
                return None;
            }
            (args[0] as i32, None)
        } else if filter::descriptor_calls().any(|call| call == nr) {
            let syscall = match nr {
                libc::SYS_write => Some(Syscall::Write),
                libc::SYS_ftruncate => Some(Syscall::Ftruncate),
                libc::SYS_fallocate => Some(Syscall::Fallocate),
                libc::SYS_close => Some(Syscall::Close),
                libc::SYS_fstatfs => Some(Syscall::Fstatfs),
                _ => None,
            };
            (args[0] as i32, syscall)
        } else {
            return None;
        };
        // Every call stops when every call is traced: only the armed numbers are looked at.
        if self.mode == Mode::EverySyscall
            && !self.process_of(tid).is_some_and(|p| p.armed.contains(&fd))
        {
            return None;
        }
        if syscall == Some(Syscall::Ftruncate)
            && let Some(record) = self.certain_growth(tid, fd, args)
        {
            self.emit_call(tid, &record, None);
            return None;
        }
        let file = self.shm_file(tid, fd)?;
        let Some(syscall) = syscall else {
            // dup, dup2, dup3, fcntl(F_DUPFD): the copy is watched once it exists.
            return Some(call(What::Duplicate, 0, args, fd, None, Vec::new()));
        };
        if syscall == Syscall::Close {
            // Reported at its entry, as succeeding, as the probes do: the descriptor is
            // released whatever the call returns, and its file is known only now.
            let record = Call {
                syscall,
                flags: 0,
                fd,
                ret: 0,
                args,
                file: Some(file),
            };
            self.emit_call(tid, &record, None);
            return None;
        }
        Some(call(
            What::Report(syscall),
            0,
            args,
            fd,
            Some(file),
            Vec::new(),
        ))
    }

    /// A call's exit, for the one awaited.
    pub(super) fn call_exit(&mut self, tid: i32, ret: i64, is_error: bool) {
        let Some(pending) = self
            .threads
            .get_mut(&tid)
            .and_then(|thread| thread.pending.take())
        else {
            return;
        };
        // Interrupted by a signal, to be made again: judged again when it is.
        if is_error && (-ret == 512 || -ret == 513 || -ret == 514 || -ret == 516) {
            return;
        }
        let ok = !is_error;
        match pending.what {
            What::Duplicate => {
                if ok {
                    self.arm(tid, ret as i32);
                }
            }
            What::FdLimitOnly(syscall) => {
                if ret == -(libc::EMFILE as i64) || ret == -(libc::ENFILE as i64) {
                    self.finish(tid, syscall, pending, ret, -1, None);
                } else if ok {
                    self.saw_fd(tid, ret as i32);
                }
            }
            What::Receive => self.received(tid, pending, ret, ok),
            What::Report(syscall) => self.reported(tid, syscall, pending, ret, ok),
        }
    }

    fn reported(&mut self, tid: i32, syscall: Syscall, mut pending: Pending, ret: i64, ok: bool) {
        let mut fd = pending.fd;
        let mut file = pending.file;
        // Filters are added after the record is out: the thread may end while one is.
        let mut arm = None;
        let mut arm_munmap = false;
        match syscall {
            open_family!() | Syscall::MemfdCreate if ok => {
                fd = ret as i32;
                self.saw_fd(tid, fd);
                file = file_of(tid, fd);
                if syscall != Syscall::MemfdCreate {
                    if let Some(opened) = file {
                        // A /dev/shm path on a file system not met yet (another mount
                        // namespace's): its descriptors are recognised from now on.
                        self.shm_devs.insert(opened.dev);
                    }
                    arm = Some(fd);
                }
            }
            Syscall::Write | Syscall::Ftruncate | Syscall::Fallocate | Syscall::Fstatfs => {
                // Sizes as the call left them; the entry's when the descriptor is gone.
                file = file_of(tid, fd).or(file);
                if ret == -(libc::ENOSPC as i64)
                    && let Some(process) = self.process_of(tid)
                {
                    process.failed_own = true;
                }
            }
            Syscall::Mmap if ok => {
                let len = pending.args[1];
                if let Some(process) = self.process_of(tid) {
                    process.mappings.push((ret as u64, len));
                }
                arm_munmap = true;
            }
            Syscall::Munmap if ok => {
                let (start, len) = (pending.args[0], pending.args[1]);
                if let Some(process) = self.process_of(tid) {
                    process.mappings = unmap(&process.mappings, start, len);
                }
            }
            _ => {}
        }
        if matches!(syscall, Syscall::Statfs | Syscall::Fstatfs) && ret == 0 {
            // The answer, in the record's last four arguments: the head of struct statfs.
            if let Ok(head) = self.mem(tid).read_value::<[u64; 5]>(pending.args[1]) {
                pending.args[statfs_args::BLOCK_SIZE] = head[1];
                pending.args[statfs_args::BLOCKS] = head[2];
                pending.args[statfs_args::AVAILABLE] = head[4];
                pending.args[statfs_args::MAGIC] = head[0];
            }
            if let Some(process) = self.process_of(tid) {
                process.looked = true;
            }
        }
        if syscall == Syscall::Statfs {
            // Only whether the path was relative to a /dev/shm directory is the record's.
            pending.flags &= flags::RELATIVE_TO_SHM;
        }
        self.finish(tid, syscall, pending, ret, fd, file);
        if let Some(fd) = arm {
            self.arm(tid, fd);
        }
        if arm_munmap {
            self.arm_munmap(tid);
        }
    }

    /// A `recvmsg` that could carry descriptors: those on /dev/shm are watched from now on,
    /// and one that dropped them (`MSG_CTRUNC`: out of descriptors) is reported.
    fn received(&mut self, tid: i32, mut pending: Pending, ret: i64, ok: bool) {
        if !ok {
            return;
        }
        let msg = pending.args[1];
        for fd in received_descriptors(self.mem(tid), msg) {
            self.saw_fd(tid, fd);
            if self.shm_file(tid, fd).is_some() {
                self.arm(tid, fd);
            }
        }
        let msg_flags: u32 = self.mem(tid).read_value(msg + MSGHDR_FLAGS).unwrap_or(0);
        if msg_flags & MSG_CTRUNC != 0 {
            // Out of descriptors: its opens elsewhere are watched for EMFILE from now on.
            if let Some(process) = self.process_of(tid) {
                process.highest_fd = i32::MAX;
            }
            pending.args[3] = u64::from(msg_flags);
            let fd = pending.fd;
            self.finish(tid, Syscall::Recvmsg, pending, ret, fd, None);
        }
    }

    /// Emits the record of a finished call.
    fn finish(
        &mut self,
        tid: i32,
        syscall: Syscall,
        pending: Pending,
        ret: i64,
        fd: i32,
        file: Option<FileRef>,
    ) {
        let record = Call {
            syscall,
            flags: pending.flags,
            fd,
            ret,
            args: pending.args,
            file,
        };
        let path = syscall.path_arg().map(|_| pending.path.as_slice());
        self.emit_call(tid, &record, path);
    }

    fn emit_call(&mut self, tid: i32, call: &Call, path: Option<&[u8]>) {
        let who = self.who(tid);
        let ts = boot_ns().unwrap_or(0);
        let record = match path {
            Some(path) => call.record_with_path(path, &who, ts),
            None => call.record(&who, ts),
        };
        // A failure, or a report made only because of one, is wanted now.
        let urgent = call.ret < 0 || call.flags & flags::FD_LIMIT_ONLY != 0;
        self.sink.record(record, urgent);
    }

    /// An `ftruncate` of /dev/shm descriptor `fd` that cannot fail, with the file as it
    /// leaves it, to report at the call's entry without awaiting its exit (a stop less):
    /// one that grows the file (tmpfs allocates nothing for it, so a full /dev/shm does not
    /// make it fail, and the pages held stay what they are), within the process's
    /// `RLIMIT_FSIZE`, through a descriptor open for writing, of a file neither append-only
    /// nor immutable. (A /dev/shm file opened by its name cannot be sealed.) `None` for any
    /// other: its exit is awaited, as before.
    fn certain_growth(&mut self, tid: i32, fd: i32, args: [u64; 6]) -> Option<Call> {
        const FIXED: u64 = (libc::STATX_ATTR_APPEND | libc::STATX_ATTR_IMMUTABLE) as u64;
        let length = args[1];
        self.saw_fd(tid, fd);
        let (file, attributes) = stat_fd(tid, fd)?;
        let grows = i64::try_from(length).is_ok_and(|length| length >= file.size);
        if !self.shm_devs.contains(&file.dev)
            || !grows
            || attributes & FIXED != 0
            || length > self.fsize_limit(tid)
            || !fd_writable(tid, fd)
        {
            return None;
        }
        Some(Call {
            syscall: Syscall::Ftruncate,
            flags: 0,
            fd,
            ret: 0,
            args,
            file: Some(FileRef {
                size: length as i64,
                ..file
            }),
        })
    }

    /// `RLIMIT_FSIZE`'s soft limit of `tid`'s process, asked once (until a limit changes).
    fn fsize_limit(&mut self, tid: i32) -> u64 {
        if let Some(limit) = self.process_of(tid).and_then(|p| p.fsize) {
            return limit;
        }
        let limit = soft_limit(tid, libc::RLIMIT_FSIZE).unwrap_or(0);
        if let Some(process) = self.process_of(tid) {
            process.fsize = Some(limit);
        }
        limit
    }

    /// The file behind `fd` of `tid`, when it is a regular file on a /dev/shm file system.
    fn shm_file(&mut self, tid: i32, fd: i32) -> Option<FileRef> {
        self.saw_fd(tid, fd);
        file_of(tid, fd).filter(|file| self.shm_devs.contains(&file.dev))
    }

    /// Reads a path argument and says what it names.
    fn path(&mut self, tid: i32, dfd: i32, ptr: u64) -> PathIs {
        let Some(path) = self.string(tid, ptr) else {
            return PathIs::Unread;
        };
        if path.first() == Some(&b'/') {
            return match path.as_slice() {
                b"/dev/shm" | b"/dev/shm/" => PathIs::Directory(path),
                p if p.starts_with(b"/dev/shm/") => PathIs::Shm { flags: 0, path },
                _ => PathIs::Elsewhere(path),
            };
        }
        let dir = if dfd == AT_FDCWD {
            format!("/proc/{tid}/cwd")
        } else {
            format!("/proc/{tid}/fd/{dfd}")
        };
        let on_shm = std::fs::metadata(dir).is_ok_and(|meta| {
            use std::os::unix::fs::MetadataExt;
            self.shm_devs
                .contains(&crate::kernel_ids::kernel_dev_from_stat(meta.dev()))
        });
        if on_shm {
            PathIs::Shm {
                flags: flags::RELATIVE_TO_SHM,
                path,
            }
        } else {
            PathIs::Elsewhere(path)
        }
    }

    /// A string argument, up to a record's path length (cut short beyond: the record says
    /// so); `None`, counted, when it cannot be read.
    fn string(&mut self, tid: i32, ptr: u64) -> Option<Vec<u8>> {
        match self.mem(tid).read_c_string(ptr, shmtrace_common::PATH_LEN) {
            Ok((bytes, _)) => Some(bytes),
            Err(_) if ptr == 0 => None,
            Err(_) => {
                self.counts.path_reads += 1;
                self.sink.lost(shmtrace_common::Loss::PathRead);
                None
            }
        }
    }

    /// openat2's arguments as the probes stash them: `[dfd, path, flags, mode, resolve,
    /// size]`, the middle three from its `struct open_how`.
    fn open_how(&mut self, tid: i32, args: [u64; 6]) -> [u64; 6] {
        let how: [u64; 3] = self.mem(tid).read_value(args[2]).unwrap_or_default();
        [args[0], args[1], how[0], how[1], how[2], args[3]]
    }

    /// `prctl(PR_SET_NAME, name)`: the thread's new name, reported as the probes report a
    /// rename (the header still has the old one).
    fn renamed(&mut self, tid: i32, ptr: u64) {
        let mut comm = [0u8; shmtrace_common::COMM_LEN];
        if let Ok((name, _)) = self.mem(tid).read_c_string(ptr, comm.len() - 1) {
            comm[..name.len()].copy_from_slice(&name);
        } else {
            return;
        }
        let who = self.who(tid);
        let ts = boot_ns().unwrap_or(0);
        self.sink
            .record(super::records::rename(&who, comm, ts), false);
        if let Some(thread) = self.threads.get_mut(&tid) {
            thread.comm = comm;
        }
    }

    /// A traced process wants to trace: it cannot, since it is traced, and its call fails
    /// with EPERM; say why, once per process.
    fn nested_tracer(&mut self, tid: i32, args: [u64; 6]) {
        const PTRACE_TRACEME: u64 = 0;
        const PTRACE_ATTACH: u64 = 16;
        const PTRACE_SEIZE: u64 = 0x4206;
        let target = match args[0] {
            PTRACE_TRACEME => "its parent".to_owned(),
            PTRACE_ATTACH | PTRACE_SEIZE => format!("process {}", args[1] as i32),
            _ => return,
        };
        let who = self.who(tid);
        let comm = shmtrace_core::event::escape::c_string(&who.comm);
        self.sink.notice(format!(
            "process {} ({comm}) asked to be traced by {target} (ptrace): a process that \
             shmtrace traces with ptrace cannot have another tracer, so its call fails with \
             EPERM; to debug it, trace with the eBPF probes (as root) or run it without \
             shmtrace",
            who.tgid
        ));
    }

    /// Whether `tid`'s process has used descriptors near its limit, so that its opens
    /// elsewhere are watched for EMFILE.
    fn near_fd_limit(&mut self, tid: i32) -> bool {
        let Some(process) = self.process_of(tid) else {
            return false;
        };
        if process.highest_fd < 0 {
            return false;
        }
        let limit = match process.nofile {
            Some(limit) => limit,
            None => {
                let limit = nofile_limit(tid);
                if let Some(process) = self.process_of(tid) {
                    process.nofile = Some(limit);
                }
                limit
            }
        };
        let highest = self
            .process_of(tid)
            .map_or(0, |p| p.highest_fd.max(0) as u64);
        highest + FD_LIMIT_MARGIN >= limit
    }

    fn saw_fd(&mut self, tid: i32, fd: i32) {
        if let Some(process) = self.process_of(tid) {
            process.highest_fd = process.highest_fd.max(fd);
        }
    }

    /// Makes `fd`'s calls stop its process (a filter of its own), once per number.
    fn arm(&mut self, tid: i32, fd: i32) {
        let mode = self.mode;
        let Some(process) = self.process_of(tid) else {
            return;
        };
        if fd < 0 || process.armed.contains(&fd) {
            return;
        }
        if mode == Mode::EverySyscall {
            process.armed.insert(fd);
            return;
        }
        let program = filter::descriptor(fd);
        let cost = program.len() + filter::FILTER_OVERHEAD;
        if process.chain + cost > CHAIN_BUDGET {
            self.counts.unwatched += 1;
            return;
        }
        match self.inject(tid, &program) {
            Some(true) => {
                if let Some(process) = self.process_of(tid) {
                    process.armed.insert(fd);
                    process.chain += cost;
                }
            }
            Some(false) => self.counts.unwatched += 1,
            None => {}
        }
    }

    /// Makes the process's `munmap`s stop it, once.
    fn arm_munmap(&mut self, tid: i32) {
        if self.process_of(tid).is_none_or(|p| p.munmap_armed) {
            return;
        }
        if self.mode == Mode::EverySyscall {
            if let Some(process) = self.process_of(tid) {
                process.munmap_armed = true;
            }
            return;
        }
        let program = filter::munmap();
        let cost = program.len() + filter::FILTER_OVERHEAD;
        if self.inject(tid, &program) == Some(true)
            && let Some(process) = self.process_of(tid)
        {
            process.munmap_armed = true;
            process.chain += cost;
        }
    }

    /// Adds `program` to the filters of `tid`'s process: `Some(true)` when it was,
    /// `Some(false)` when it could not be, `None` when the thread ended meanwhile (its end is
    /// handled as if waited for in the main loop).
    fn inject(&mut self, tid: i32, program: &filter::Program) -> Option<bool> {
        let tgid = self.threads.get(&tid).map_or(tid, |t| t.tgid);
        let mut mem = self
            .processes
            .get_mut(&tgid)
            .map(|p| std::mem::take(&mut p.mem));
        let outcome = inject::add_filter(tid, program, mem.get_or_insert_with(|| Mem::new(tgid)));
        if let (Some(process), Some(mem)) = (self.processes.get_mut(&tgid), mem) {
            process.mem = mem;
        }
        match outcome {
            Injected::Returned(0) => Some(true),
            Injected::Returned(ret) => {
                log::debug!("adding a filter to thread {tid} failed: errno {}", -ret);
                Some(false)
            }
            Injected::NotHere(error) => {
                log::debug!("cannot add a filter to thread {tid}: {error}");
                Some(false)
            }
            Injected::Ended(status) => {
                self.ended(tid, status);
                None
            }
        }
    }
}

/// The descriptors an `SCM_RIGHTS` message of `msg` (a `struct user_msghdr`, as the call left
/// it) carried.
fn received_descriptors(mem: &mut Mem, msg: u64) -> Vec<i32> {
    let Ok(control) = mem.read_value::<[u64; 2]>(msg + MSGHDR_CONTROL) else {
        return Vec::new();
    };
    let (start, len) = (control[0], control[1].min(64 << 10));
    let mut buf = vec![0u8; len as usize];
    if mem.read(start, &mut buf).is_err() {
        return Vec::new();
    }
    let mut fds = Vec::new();
    let mut at = 0usize;
    while at + 16 <= buf.len() {
        let cmsg_len = u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes")) as usize;
        let level = i32::from_le_bytes(buf[at + 8..at + 12].try_into().expect("4 bytes"));
        let kind = i32::from_le_bytes(buf[at + 12..at + 16].try_into().expect("4 bytes"));
        if cmsg_len < 16 || at + cmsg_len > buf.len() {
            break;
        }
        if level == SOL_SOCKET && kind == SCM_RIGHTS {
            fds.extend(
                buf[at + 16..at + cmsg_len]
                    .chunks_exact(4)
                    .take(MAX_RECEIVED)
                    .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes"))),
            );
        }
        // The next message starts at the next 8-byte boundary (`CMSG_ALIGN`).
        at += (cmsg_len + 7) & !7;
    }
    fds
}

/// `RLIMIT_NOFILE`'s soft limit of process `pid` (the largest number when unreadable).
fn nofile_limit(pid: i32) -> u64 {
    soft_limit(pid, libc::RLIMIT_NOFILE).unwrap_or(u64::MAX / 2)
}

/// The soft limit `resource` of process `pid` (`RLIM_INFINITY` is `u64::MAX`).
fn soft_limit(pid: i32, resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit reads into a local; no new limit is set.
    let done = unsafe { libc::prlimit(pid, resource, std::ptr::null(), &mut limit) };
    (done == 0).then_some(limit.rlim_cur)
}

/// Whether unmapping `[start, start + len)` removes exactly one whole mapping of `mappings`
/// (page-aligned, the same pages): such a call cannot fail.
fn unmaps_one_whole(mappings: &[(u64, u64)], start: u64, len: u64) -> bool {
    let page = page_size();
    let pages = |len: u64| len.div_ceil(page);
    start.is_multiple_of(page)
        && len > 0
        && mappings
            .iter()
            .any(|&(m_start, m_len)| m_start == start && pages(m_len) == pages(len))
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096)
}

/// `mappings` less the range `[start, start + len)`.
fn unmap(mappings: &[(u64, u64)], start: u64, len: u64) -> Vec<(u64, u64)> {
    let end = start.saturating_add(len);
    let mut kept = Vec::new();
    for &(m_start, m_len) in mappings {
        let m_end = m_start + m_len;
        if m_end <= start || end <= m_start {
            kept.push((m_start, m_len));
            continue;
        }
        if m_start < start {
            kept.push((m_start, start - m_start));
        }
        if end < m_end {
            kept.push((end, m_end - end));
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmapping_trims_and_splits() {
        let maps = [(0x1000, 0x3000), (0x10000, 0x1000)];
        assert_eq!(
            unmap(&maps, 0x2000, 0x1000),
            [(0x1000, 0x1000), (0x3000, 0x1000), (0x10000, 0x1000)]
        );
        assert_eq!(unmap(&maps, 0, 0x100000), []);
        assert_eq!(unmap(&maps, 0x5000, 0x1000), maps);
    }

    #[test]
    fn only_a_whole_mapping_is_unmapped_for_certain() {
        let page = page_size();
        let maps = [(0x10 * page, 3 * page - 100), (0x40 * page, page)];
        // The same pages, the length as mapped or rounded up.
        assert!(unmaps_one_whole(&maps, 0x10 * page, 3 * page - 100));
        assert!(unmaps_one_whole(&maps, 0x10 * page, 3 * page));
        assert!(unmaps_one_whole(&maps, 0x40 * page, 1));
        // Part of one, more than one, unaligned, empty, or none known.
        assert!(!unmaps_one_whole(&maps, 0x10 * page, page));
        assert!(!unmaps_one_whole(&maps, 0x11 * page, 2 * page));
        assert!(!unmaps_one_whole(&maps, 0x10 * page, 0x31 * page));
        assert!(!unmaps_one_whole(&maps, 0x10 * page + 1, 3 * page));
        assert!(!unmaps_one_whole(&maps, 0x10 * page, 0));
        assert!(!unmaps_one_whole(&[], 0x10 * page, page));
    }

    #[test]
    fn reads_descriptors_passed_in_a_message() {
        // A msghdr whose control buffer holds one SCM_RIGHTS message of two descriptors.
        let mut control = Vec::new();
        control.extend(24u64.to_le_bytes());
        control.extend(SOL_SOCKET.to_le_bytes());
        control.extend(SCM_RIGHTS.to_le_bytes());
        control.extend(7i32.to_le_bytes());
        control.extend(9i32.to_le_bytes());
        let mut msghdr = [0u64; 7];
        msghdr[4] = control.as_ptr() as u64;
        msghdr[5] = control.len() as u64;
        let mut mem = Mem::new(std::process::id() as i32);
        assert_eq!(
            received_descriptors(&mut mem, msghdr.as_ptr() as u64),
            [7, 9]
        );
        msghdr[5] = 8;
        assert!(received_descriptors(&mut mem, msghdr.as_ptr() as u64).is_empty());
    }
}
