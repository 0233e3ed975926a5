//! Tests across the record module: real kernel-shaped records, real files, a real child
//! process killed with SIGKILL, and a bounded fuzz run.
mod bad_files;
mod crash;
mod flight;
mod full_disk;
mod fuzz;
mod redaction;
mod round_trip;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use shmtrace_common::{
    self as common, EventKind, ExecEvent, ExitEvent, ForkEvent, Header, PathEvent, RenameEvent,
    SignalEvent, Syscall, SyscallEvent, flags,
};

use super::{
    Entry, ProcessSnapshot, Record, TargetDescription, TraceHeader, TraceReader, UserRecord,
};
use crate::{
    event::InodeId,
    model::{ProcSnapshot, SnapshotFd},
};

/// A directory under the system temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let mut random = [0u8; 8];
        super::pseudonym::fill_random(&mut random).unwrap();
        let dir = std::env::temp_dir().join(format!(
            "shmtrace-{name}-{}-{}",
            std::process::id(),
            u64::from_le_bytes(random)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn bytes_of<T>(value: &T) -> Vec<u8> {
    // SAFETY: the shmtrace-common structs are repr(C) integers and byte arrays.
    unsafe { std::slice::from_raw_parts(value as *const T as *const u8, size_of::<T>()) }.to_vec()
}

pub fn comm(name: &str) -> [u8; common::COMM_LEN] {
    let mut out = [0u8; common::COMM_LEN];
    out[..name.len()].copy_from_slice(name.as_bytes());
    out
}

pub fn path_field(path: &[u8]) -> [u8; common::PATH_LEN] {
    let mut out = [0u8; common::PATH_LEN];
    out[..path.len()].copy_from_slice(path);
    out
}

pub fn header(kind: EventKind, ts_ns: u64, pid: u32, name: &str) -> Header {
    Header {
        kind: kind as u16,
        flags: 0,
        cpu: 1,
        ts_ns,
        pid,
        tid: pid,
        mntns: 4026532400,
        _pad: 0,
        cgroup_id: 1,
        comm: comm(name),
    }
}

pub fn openat(ts_ns: u64, pid: u32, path: &str, fd: i32, ino: u64) -> Vec<u8> {
    bytes_of(&PathEvent {
        call: SyscallEvent {
            header: Header {
                flags: flags::FILE,
                ..header(EventKind::Path, ts_ns, pid, "pt_data_worker")
            },
            syscall: Syscall::Openat as u16,
            _pad: 0,
            fd,
            ret: fd as i64,
            args: [
                (-100i64) as u64,
                0x7ffd_0000,
                (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) as u64,
                0o600,
                0,
                0,
            ],
            file: common::FileRef {
                dev: 26,
                mode: 0o100600,
                ino,
                size: 0,
                blocks: 0,
            },
        },
        path: path_field(path.as_bytes()),
    })
}

pub fn fallocate_enospc(ts_ns: u64, pid: u32, fd: i32, ino: u64) -> Vec<u8> {
    bytes_of(&SyscallEvent {
        header: Header {
            flags: flags::FILE,
            ..header(EventKind::Syscall, ts_ns, pid, "pt_data_worker")
        },
        syscall: Syscall::Fallocate as u16,
        _pad: 0,
        fd,
        ret: -(libc::ENOSPC as i64),
        args: [fd as u64, 0, 0, 96 << 20, 0, 0],
        file: common::FileRef {
            dev: 26,
            mode: 0o100600,
            ino,
            size: 0,
            blocks: 8,
        },
    })
}

pub fn exec(ts_ns: u64, pid: u32, filename: &str, argv: &[&str]) -> Vec<u8> {
    let mut args = [0u8; common::ARGS_LEN];
    let mut len = 0;
    for arg in argv {
        args[len..len + arg.len()].copy_from_slice(arg.as_bytes());
        len += arg.len() + 1;
    }
    bytes_of(&ExecEvent {
        header: header(EventKind::Exec, ts_ns, pid, "python3"),
        args_len: len as u32,
        _pad: 0,
        filename: path_field(filename.as_bytes()),
        args,
    })
}

pub fn fork(ts_ns: u64, pid: u32, child_pid: u32) -> Vec<u8> {
    bytes_of(&ForkEvent {
        header: header(EventKind::Fork, ts_ns, pid, "python3"),
        child_pid,
        _pad: 0,
    })
}

pub fn rename(ts_ns: u64, pid: u32, new: &str) -> Vec<u8> {
    bytes_of(&RenameEvent {
        header: header(EventKind::Rename, ts_ns, pid, "python3"),
        target_pid: pid,
        target_tid: pid,
        new_comm: comm(new),
    })
}

pub fn sigbus(ts_ns: u64, pid: u32) -> Vec<u8> {
    bytes_of(&SignalEvent {
        header: header(EventKind::Signal, ts_ns, pid, "pt_data_worker"),
        signo: libc::SIGBUS,
        code: 2,
        errno: 0,
        result: 0,
        addr: 0x7f00_0000_1000,
        target_pid: pid,
        target_tid: pid,
        target_comm: comm("pt_data_worker"),
    })
}

pub fn exit(ts_ns: u64, pid: u32, raw: i32) -> Vec<u8> {
    bytes_of(&ExitEvent {
        header: header(EventKind::Exit, ts_ns, pid, "pt_data_worker"),
        exit_code: raw,
        _pad: 0,
    })
}

/// A DataLoader's life in kernel records: exec, fork of a worker that renames itself, an
/// object created, a failing fallocate, SIGBUS, and the worker's death.
pub fn dataloader_records(t0: u64) -> Vec<Vec<u8>> {
    vec![
        exec(
            t0,
            4242,
            "/usr/bin/python3",
            &["python3", "train.py", "--workers", "4"],
        ),
        fork(t0 + 1_000, 4242, 4243),
        rename(t0 + 2_000, 4243, "pt_data_worker"),
        openat(t0 + 3_000, 4243, "/dev/shm/torch_4243_1", 11, 77),
        fallocate_enospc(t0 + 4_000, 4243, 11, 77),
        sigbus(t0 + 5_000, 4243),
        exit(t0 + 6_000, 4243, libc::SIGBUS),
    ]
}

pub fn snapshot(pid: u32) -> UserRecord {
    UserRecord::Snapshot(ProcessSnapshot::from(&ProcSnapshot {
        pid,
        ppid: Some(1),
        comm: "python3".into(),
        exe: Some("/usr/bin/python3.11".into()),
        argv: vec!["python3".into(), "train.py".into()],
        mntns: 4026532400,
        nspid: Some(7),
        fds: vec![SnapshotFd {
            fd: 5,
            inode: InodeId { dev: 26, ino: 5 },
            path: "/dev/shm/torch_4242_0".into(),
            deleted: false,
            cloexec: true,
            size: 4096,
        }],
        mappings: Vec::new(),
    }))
}

pub fn test_header() -> TraceHeader {
    TraceHeader::for_this_host(TargetDescription {
        command: Some(vec!["python3".into(), "train.py".into()]),
        ..TargetDescription::default()
    })
}

/// Everything in a file: its records and the error that ended it, if any.
pub fn read_all(path: &Path) -> (Vec<Entry>, Option<super::ReadError>) {
    let reader = match TraceReader::open(path) {
        Ok(reader) => reader,
        Err(error) => return (Vec::new(), Some(error)),
    };
    read_entries(reader)
}

pub fn read_entries(
    entries: impl Iterator<Item = Result<Entry, super::ReadError>>,
) -> (Vec<Entry>, Option<super::ReadError>) {
    let mut good = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => good.push(entry),
            Err(error) => return (good, Some(error)),
        }
    }
    (good, None)
}

pub fn kernel(entry: &Entry) -> &Bytes {
    match &entry.record {
        Record::Kernel(bytes) => bytes,
        other => panic!("expected a kernel record, got {other:?}"),
    }
}
