//! Decoded events built in code as the probes would send them, for the model's unit tests.
use crate::event::{Body, Call, Event, FileRef, InodeId, Syscall};

pub const MNTNS: u32 = 4026531841;
pub const DEV: u32 = 47;
pub const SECOND: u64 = 1_000_000_000;

pub fn event(ts_ns: u64, pid: u32, body: Body) -> Event {
    Event {
        ts_ns,
        cpu: 0,
        pid,
        tid: pid,
        comm: "worker".to_owned(),
        mntns: MNTNS,
        cgroup_id: 1,
        container_match: false,
        body,
    }
}

pub fn call(syscall: Syscall, ino: u64, path: Option<&str>, args: [u64; 6]) -> Body {
    Body::Call(Call {
        syscall,
        fd: Some(3),
        ret: 3,
        args,
        file: Some(FileRef {
            inode: InodeId { dev: DEV, ino },
            mode: libc::S_IFREG | 0o600,
            size: 4096,
            allocated: 4096,
        }),
        path: path.map(str::to_owned),
        path_truncated: false,
        relative_to_shm: false,
        dir_ino: None,
    })
}
