//! Raw ring buffer records to [`Event`]s.
//!
//! Records come from the kernel and are treated as untrusted: every length is checked, and the
//! kind and syscall numbers go through `TryFrom`, so a malformed record is an error, never
//! undefined behaviour.
use shmtrace_common::{
    self as common, EventKind, ExecEvent, ExitEvent, ForkEvent, Header, OomEvent, PathEvent,
    RenameEvent, SignalEvent, Syscall, SyscallEvent, flags,
};
use zerocopy::FromBytes;

use super::{Body, Call, Event, Exec, Exit, ExitStatus, FileRef, InodeId, Signal, escape};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {len} bytes is shorter than the {need} bytes of a {what}")]
    Short {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error("unknown event kind {0}")]
    UnknownKind(u16),
    #[error("unknown syscall number {0}")]
    UnknownSyscall(u16),
}

fn read<T: FromBytes>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    T::read_from_prefix(bytes)
        .map(|(value, _rest)| value)
        .map_err(|_| DecodeError::Short {
            what,
            len: bytes.len(),
            need: size_of::<T>(),
        })
}

/// The timestamp of a record, without decoding the rest of it.
pub fn timestamp(bytes: &[u8]) -> Option<u64> {
    read::<Header>(bytes, "header").ok().map(|h| h.ts_ns)
}

/// Decodes one record.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    let header: Header = read(bytes, "header")?;
    let kind = EventKind::try_from(header.kind).map_err(DecodeError::UnknownKind)?;
    let body = match kind {
        EventKind::Syscall => {
            let raw: SyscallEvent = read(bytes, "syscall event")?;
            Body::Call(call(&raw, None)?)
        }
        EventKind::Path => {
            let raw: PathEvent = read(bytes, "path event")?;
            Body::Call(call(&raw.call, Some(&raw.path))?)
        }
        EventKind::Signal => {
            let raw: SignalEvent = read(bytes, "signal event")?;
            Body::Signal(Signal {
                signo: raw.signo,
                code: raw.code,
                errno: raw.errno,
                result: raw.result,
                addr: raw.addr,
                target_pid: raw.target_pid,
                target_tid: raw.target_tid,
                target_comm: escape::c_string(&raw.target_comm),
                target_maps_shm: raw.header.flags & flags::TARGET_MAPS_SHM != 0,
            })
        }
        EventKind::Fork => {
            let raw: ForkEvent = read(bytes, "fork event")?;
            Body::Fork {
                child_pid: raw.child_pid,
            }
        }
        EventKind::Exec => {
            let raw: ExecEvent = read(bytes, "exec event")?;
            let len = (raw.args_len as usize).min(raw.args.len());
            Body::Exec(Exec {
                filename: escape::c_string(&raw.filename),
                argv: split_args(&raw.args[..len]),
                argv_truncated: header.flags & flags::ARGS_TRUNCATED != 0,
            })
        }
        EventKind::Exit => {
            let raw: ExitEvent = read(bytes, "exit event")?;
            Body::Exit(Exit {
                status: ExitStatus::from_raw(raw.exit_code),
                shm_death: raw.header.flags & flags::SHM_DEATH != 0,
            })
        }
        EventKind::Rename => {
            let raw: RenameEvent = read(bytes, "rename event")?;
            Body::Rename {
                pid: raw.target_pid,
                tid: raw.target_tid,
                comm: escape::c_string(&raw.new_comm),
            }
        }
        EventKind::Oom => {
            let raw: OomEvent = read(bytes, "OOM event")?;
            Body::Oom {
                victim_pid: raw.victim_pid,
            }
        }
    };
    Ok(Event {
        ts_ns: header.ts_ns,
        cpu: header.cpu,
        pid: header.pid,
        tid: header.tid,
        comm: escape::c_string(&header.comm),
        mntns: header.mntns,
        cgroup_id: header.cgroup_id,
        container_match: header.flags & flags::CONTAINER_MATCH != 0,
        body,
    })
}

fn call(raw: &SyscallEvent, path: Option<&[u8; common::PATH_LEN]>) -> Result<Call, DecodeError> {
    let syscall = Syscall::try_from(raw.syscall).map_err(DecodeError::UnknownSyscall)?;
    let header_flags = raw.header.flags;
    let file = (header_flags & flags::FILE != 0).then(|| FileRef {
        inode: InodeId {
            dev: raw.file.dev,
            ino: raw.file.ino,
        },
        mode: raw.file.mode,
        size: raw.file.size,
        allocated: raw.file.blocks.saturating_mul(512),
    });
    Ok(Call {
        syscall,
        fd: (raw.fd >= 0).then_some(raw.fd),
        ret: raw.ret,
        args: raw.args,
        file,
        path: path.map(|p| escape::c_string(p)),
        path_truncated: header_flags & flags::PATH_TRUNCATED != 0,
        relative_to_shm: header_flags & flags::RELATIVE_TO_SHM != 0,
        dir_ino: (header_flags & flags::DIR_INODE != 0).then_some(raw.args[common::DIR_INODE_ARG]),
    })
}

/// `argv` as the kernel lays it out: NUL-separated, possibly cut short.
fn split_args(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes.split(|b| *b == 0).map(escape::bytes).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: EventKind) -> Header {
        let mut comm = [0u8; 16];
        comm[..14].copy_from_slice(b"pt_data_worker");
        Header {
            kind: kind as u16,
            flags: 0,
            cpu: 1,
            ts_ns: 42,
            pid: 100,
            tid: 101,
            mntns: 4026531841,
            _pad: 0,
            cgroup_id: 1,
            comm,
        }
    }

    fn bytes_of<T: zerocopy::IntoBytes + zerocopy::Immutable>(value: &T) -> Vec<u8> {
        value.as_bytes().to_vec()
    }

    #[test]
    fn decodes_a_failed_fallocate() {
        let raw = SyscallEvent {
            header: Header {
                flags: flags::FILE,
                ..header(EventKind::Syscall)
            },
            syscall: Syscall::Fallocate as u16,
            _pad: 0,
            fd: 11,
            ret: -28,
            args: [11, 0, 0, 100663296, 0, 0],
            file: common::FileRef {
                dev: 26,
                mode: 0o100600,
                ino: 7,
                size: 100663296,
                blocks: 8,
            },
        };
        let event = decode(&bytes_of(&raw)).unwrap();
        assert_eq!(event.pid, 100);
        assert_eq!(event.comm, "pt_data_worker");
        let Body::Call(call) = event.body else {
            panic!("not a call")
        };
        assert_eq!(call.syscall, Syscall::Fallocate);
        assert_eq!(call.errno(), Some(28));
        assert_eq!(call.fd, Some(11));
        let file = call.file.unwrap();
        assert_eq!(file.inode, InodeId { dev: 26, ino: 7 });
        assert_eq!(file.allocated, 4096);
    }

    #[test]
    fn rejects_short_records_and_unknown_values() {
        let raw = SyscallEvent {
            header: header(EventKind::Syscall),
            ..Default::default()
        };
        let mut bytes = bytes_of(&raw);
        assert!(matches!(
            decode(&bytes[..20]),
            Err(DecodeError::Short { what: "header", .. })
        ));
        assert!(matches!(
            decode(&bytes[..60]),
            Err(DecodeError::Short {
                what: "syscall event",
                ..
            })
        ));
        // syscall 0 is not a Syscall
        assert_eq!(decode(&bytes), Err(DecodeError::UnknownSyscall(0)));
        bytes[0] = 99;
        assert_eq!(decode(&bytes), Err(DecodeError::UnknownKind(99)));
    }

    #[test]
    fn escapes_hostile_paths_and_splits_argv() {
        let mut path = [0u8; common::PATH_LEN];
        let hostile = b"/dev/shm/\x1b[31mevil\nname\xff";
        path[..hostile.len()].copy_from_slice(hostile);
        let raw = PathEvent {
            call: SyscallEvent {
                header: header(EventKind::Path),
                syscall: Syscall::Openat as u16,
                ret: 3,
                ..Default::default()
            },
            path,
        };
        let Body::Call(call) = decode(&bytes_of(&raw)).unwrap().body else {
            panic!()
        };
        assert_eq!(call.path.unwrap(), "/dev/shm/\\x1b[31mevil\\nname\\xff");

        let mut args = [0u8; common::ARGS_LEN];
        let argv = b"python3\0train.py\0--workers\x004\0";
        args[..argv.len()].copy_from_slice(argv);
        let raw = ExecEvent {
            header: header(EventKind::Exec),
            args_len: argv.len() as u32,
            _pad: 0,
            filename: path,
            args,
        };
        let Body::Exec(exec) = decode(&bytes_of(&raw)).unwrap().body else {
            panic!()
        };
        assert_eq!(exec.argv, ["python3", "train.py", "--workers", "4"]);
    }
}
