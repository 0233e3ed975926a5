//! The records the probes write, written from what a ptrace stop shows: the same
//! `shmtrace-common` structs, so that decoding, the model, the diagnosis, the output and trace
//! files are those of the eBPF source.
//!
//! What a stop cannot show is filled as the probes' own records fill what they cannot read:
//! `cpu` is 0 (which CPU ran the call is not known to the tracer), and `cgroup_id` is that of
//! the traced process's cgroup v2 directory, or 1, as the probes write on hosts without one.
use bytes::Bytes;
use shmtrace_common::{
    ARGS_LEN, COMM_LEN, EventKind, ExecEvent, ExitEvent, FileRef, ForkEvent, Header, OomEvent,
    PATH_LEN, PathEvent, RenameEvent, SignalEvent, Syscall, SyscallEvent, flags,
};
use zerocopy::{Immutable, IntoBytes};

/// Who a record is about: a thread of a traced process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Who {
    pub tgid: u32,
    pub tid: u32,
    pub mntns: u32,
    pub cgroup_id: u64,
    /// The thread's name, NUL-padded, as the kernel keeps it.
    pub comm: [u8; COMM_LEN],
}

fn header(kind: EventKind, flags: u16, who: &Who, ts_ns: u64) -> Header {
    Header {
        kind: kind as u16,
        flags,
        cpu: 0,
        ts_ns,
        pid: who.tgid,
        tid: who.tid,
        mntns: who.mntns,
        _pad: 0,
        cgroup_id: who.cgroup_id,
        comm: who.comm,
    }
}

fn bytes_of<T: IntoBytes + Immutable>(value: &T) -> Bytes {
    Bytes::copy_from_slice(value.as_bytes())
}

/// A finished call on a descriptor, or a System V call.
pub struct Call {
    pub syscall: Syscall,
    pub flags: u16,
    pub fd: i32,
    pub ret: i64,
    pub args: [u64; 6],
    pub file: Option<FileRef>,
}

impl Call {
    fn event(&self, kind: EventKind, who: &Who, ts_ns: u64) -> SyscallEvent {
        let file_flag = if self.file.is_some() { flags::FILE } else { 0 };
        SyscallEvent {
            header: header(kind, self.flags | file_flag, who, ts_ns),
            syscall: self.syscall as u16,
            _pad: 0,
            fd: self.fd,
            ret: self.ret,
            args: self.args,
            file: self.file.unwrap_or_default(),
        }
    }

    pub fn record(&self, who: &Who, ts_ns: u64) -> Bytes {
        bytes_of(&self.event(EventKind::Syscall, who, ts_ns))
    }

    /// The record of a call that names a path (or, for `memfd_create`, a name).
    pub fn record_with_path(&self, path: &[u8], who: &Who, ts_ns: u64) -> Bytes {
        let mut event = PathEvent {
            call: self.event(EventKind::Path, who, ts_ns),
            path: [0; PATH_LEN],
        };
        // NUL-terminated unless cut short: the last byte stays NUL, or the flag says so.
        let kept = path.len().min(PATH_LEN - 1);
        event.path[..kept].copy_from_slice(&path[..kept]);
        if path.len() > kept {
            event.call.header.flags |= flags::PATH_TRUNCATED;
        }
        bytes_of(&event)
    }
}

/// A signal for `target`, sent by `sender` (the target itself for a fault).
pub struct Signal {
    pub signo: i32,
    pub code: i32,
    pub errno: i32,
    pub addr: u64,
    pub target_maps_shm: bool,
}

impl Signal {
    pub fn record(&self, sender: &Who, target: &Who, ts_ns: u64) -> Bytes {
        let flags = if self.target_maps_shm {
            flags::TARGET_MAPS_SHM
        } else {
            0
        };
        bytes_of(&SignalEvent {
            header: header(EventKind::Signal, flags, sender, ts_ns),
            signo: self.signo,
            code: self.code,
            errno: self.errno,
            result: 0,
            addr: self.addr,
            target_pid: target.tgid,
            target_tid: target.tid,
            target_comm: target.comm,
        })
    }
}

pub fn fork(parent: &Who, child_pid: u32, ts_ns: u64) -> Bytes {
    bytes_of(&ForkEvent {
        header: header(EventKind::Fork, 0, parent, ts_ns),
        child_pid,
        _pad: 0,
    })
}

/// `filename` and `argv` (NUL-separated, as the kernel lays it out) of a new program.
pub fn exec(who: &Who, filename: &[u8], argv: &[u8], ts_ns: u64) -> Bytes {
    let mut flags = 0;
    let mut event = ExecEvent {
        header: header(EventKind::Exec, 0, who, ts_ns),
        args_len: 0,
        _pad: 0,
        filename: [0; PATH_LEN],
        args: [0; ARGS_LEN],
    };
    let name = filename.len().min(PATH_LEN - 1);
    event.filename[..name].copy_from_slice(&filename[..name]);
    if filename.len() > name {
        flags |= flags::PATH_TRUNCATED;
    }
    let args = argv.len().min(ARGS_LEN);
    event.args[..args].copy_from_slice(&argv[..args]);
    event.args_len = args as u32;
    if argv.len() > args {
        flags |= flags::ARGS_TRUNCATED;
    }
    event.header.flags = flags;
    bytes_of(&event)
}

/// The process ended; `status` is encoded like a wait status.
pub fn exit(who: &Who, status: i32, shm_death: bool, ts_ns: u64) -> Bytes {
    let flags = if shm_death { flags::SHM_DEATH } else { 0 };
    bytes_of(&ExitEvent {
        header: header(EventKind::Exit, flags, who, ts_ns),
        exit_code: status,
        _pad: 0,
    })
}

pub fn rename(who: &Who, comm: [u8; COMM_LEN], ts_ns: u64) -> Bytes {
    bytes_of(&RenameEvent {
        header: header(EventKind::Rename, 0, who, ts_ns),
        target_pid: who.tgid,
        target_tid: who.tid,
        new_comm: comm,
    })
}

/// The OOM killer ended `victim`, as the cgroup's own count of its kills says.
pub fn oom(victim: &Who, ts_ns: u64) -> Bytes {
    bytes_of(&OomEvent {
        header: header(EventKind::Oom, 0, victim, ts_ns),
        victim_pid: victim.tgid,
        _pad: 0,
    })
}

#[cfg(test)]
mod tests {
    use shmtrace_core::event::{Body, decode};

    use super::*;

    fn who() -> Who {
        let mut comm = [0u8; COMM_LEN];
        comm[..14].copy_from_slice(b"pt_data_worker");
        Who {
            tgid: 40,
            tid: 41,
            mntns: 7,
            cgroup_id: 1,
            comm,
        }
    }

    /// What these records say is what the core reads back from them.
    #[test]
    fn the_core_decodes_them() {
        let call = Call {
            syscall: Syscall::Fallocate,
            flags: 0,
            fd: 11,
            ret: -28,
            args: [11, 0, 0, 1 << 20, 0, 0],
            file: Some(FileRef {
                dev: 26,
                mode: 0o100600,
                ino: 9,
                size: 1 << 20,
                blocks: 8,
            }),
        };
        let event = decode(&call.record(&who(), 5)).unwrap();
        assert_eq!((event.pid, event.tid, event.ts_ns), (40, 41, 5));
        assert_eq!(event.comm, "pt_data_worker");
        let Body::Call(decoded) = event.body else {
            panic!("not a call")
        };
        assert_eq!(decoded.errno(), Some(28));
        assert_eq!(decoded.file.unwrap().allocated, 4096);

        let open = Call {
            syscall: Syscall::Openat,
            file: None,
            ret: 3,
            fd: 3,
            ..call
        };
        let long = vec![b'a'; 400];
        let event = decode(&open.record_with_path(&long, &who(), 6)).unwrap();
        let Body::Call(decoded) = event.body else {
            panic!("not a call")
        };
        assert!(decoded.path_truncated);
        assert_eq!(decoded.path.unwrap().len(), PATH_LEN - 1);

        let event = decode(&exec(
            &who(),
            b"/usr/bin/python3",
            b"python3\0-c\0pass\0",
            7,
        ))
        .unwrap();
        let Body::Exec(exec) = event.body else {
            panic!("not an exec")
        };
        assert_eq!(exec.argv, ["python3", "-c", "pass"]);
        let event = decode(&exit(&who(), 7, true, 8)).unwrap();
        let Body::Exit(exit) = event.body else {
            panic!("not an exit")
        };
        assert!(exit.shm_death);
        assert_eq!(
            exit.status,
            shmtrace_core::event::ExitStatus::Signal {
                signo: 7,
                core_dumped: false
            }
        );
        let signal = Signal {
            signo: 7,
            code: 2,
            errno: 0,
            addr: 0x7000,
            target_maps_shm: true,
        };
        let event = decode(&signal.record(&who(), &who(), 9)).unwrap();
        let Body::Signal(decoded) = event.body else {
            panic!("not a signal")
        };
        assert!(decoded.target_maps_shm);
        assert_eq!(decoded.addr, 0x7000);
    }
}
