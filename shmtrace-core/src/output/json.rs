//! JSON lines: one object per event, schema version [`SCHEMA_VERSION`], documented in
//! `docs/json.md`. Fields every event carries are always present (`null` when they do not
//! apply); the rest appear only when they mean something.
use std::{
    borrow::Cow,
    io::{self, Write},
};

use serde::Serialize;
use shmtrace_common::open_family;

use super::{
    flag_names::{FlagKind, FlagNames},
    flat_struct,
    flat_value::{verbatim, verbatim_option},
};
#[cfg(doc)]
use crate::clock::Clock;
use crate::{
    diagnose::{Role, RoleKind},
    event::{
        Body, Call, Event, Exit, ExitStatus, Syscall,
        names::{self, errno_name},
    },
    model::Annotation,
    model::ContainerInfo,
};

/// Bumped when a field changes meaning or disappears; adding fields does not bump it.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Serialize, Debug)]
pub struct JsonEvent<'a> {
    /// Schema version.
    pub v: u32,
    /// RFC 3339, UTC, nanoseconds.
    #[serde(serialize_with = "verbatim")]
    pub ts: &'a str,
    pub pid: u32,
    pub tid: u32,
    pub comm: &'a str,
    /// The syscall name, or `signal`, `fork`, `exec`, `exit`, `rename`, `oom_kill`.
    #[serde(serialize_with = "verbatim")]
    pub event: &'static str,
    /// Borrowed from the model's annotation when it has the name (most events).
    pub path: Option<Cow<'a, str>>,
    pub fd: Option<i32>,
    pub size: Option<u64>,
    pub offset: Option<u64>,
    pub ret: Option<i64>,
    pub errno: Option<String>,
    pub signal: Option<String>,
    pub code: Option<String>,
    pub addr: Option<ShortText>,
    /// Whether the event shows the program hurt: a failed call, a fault, an OOM kill, a death
    /// nobody asked for. Expected errors and deaths another process caused are not.
    pub failure: bool,
    /// Why a failed call is part of the program's normal work (`a feature probe`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<&'static str>,
    /// For a death by a signal another process sent on purpose: the sender (0 for a
    /// termination request, SIGTERM, SIGINT or SIGHUP, from a sender not traced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killed_by_pid: Option<u32>,

    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "verbatim_option"
    )]
    pub flags: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<ShortText>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "verbatim_option"
    )]
    pub prot: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_size: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_bytes: Option<u64>,
    /// What a `statfs` or `fstatfs` found free (its `size` is the file system's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev: Option<ShortText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shmid: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_tid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child_pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub core_dumped: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_death: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub argv: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_comm: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub victim_pid: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub freed: Vec<&'a str>,
    pub mntns: u32,
    pub cgroup_id: u64,
    /// `trainer`, `dataloader_worker`, `pin_memory`, `shm_manager`, `nccl`,
    /// `python_multiprocessing` or `other`.
    pub role: RoleKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trainer_pid: Option<u32>,
    /// The container the acting process runs in; `null` on the host (or when not known).
    pub container: Option<&'a ContainerInfo>,
}

/// A short text made in place, without allocating or `fmt`: an address, a mode or a device,
/// in nearly every line of a replay (hundreds of thousands a second).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ShortText {
    bytes: [u8; 24],
    len: u8,
}

impl ShortText {
    fn new() -> ShortText {
        ShortText {
            bytes: [0; 24],
            len: 0,
        }
    }

    /// Appends ASCII; the callers' longest text is 22 bytes (`0x` and 16 hex digits).
    fn push(&mut self, text: &[u8]) {
        assert!(text.is_ascii(), "a short text is ASCII");
        let at = usize::from(self.len);
        self.bytes[at..at + text.len()].copy_from_slice(text);
        self.len += text.len() as u8;
    }

    /// `value` in base 8 or 16, in lower case, without leading zeros.
    fn push_digits(&mut self, mut value: u64, radix_bits: u32) {
        let mut digits = [0u8; 22];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b"0123456789abcdef"[(value & ((1 << radix_bits) - 1)) as usize];
            value >>= radix_bits;
            if value == 0 {
                break;
            }
        }
        self.push(&digits[at..]);
    }

    pub fn as_str(&self) -> &str {
        let text = &self.bytes[..usize::from(self.len)];
        // SAFETY: `push` appends ASCII only, and ASCII is UTF-8. Checking it again cost 1% of
        // a replay.
        unsafe { std::str::from_utf8_unchecked(text) }
    }
}

impl std::fmt::Debug for ShortText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

impl Serialize for ShortText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        verbatim(self.as_str(), serializer)
    }
}

/// `0x7f...`, as `{:#x}` writes it.
fn hex(addr: u64) -> ShortText {
    let mut text = ShortText::new();
    text.push(b"0x");
    text.push_digits(addr, 4);
    text
}

/// `0600`: octal, with one leading zero.
fn octal_mode(mode: u64) -> ShortText {
    let mut text = ShortText::new();
    text.push(b"0");
    text.push_digits(mode, 3);
    text
}

/// `0:27`, as [`crate::event::InodeId::dev_string`] writes it.
fn dev(inode: &crate::event::InodeId) -> ShortText {
    let dev = shmtrace_common::KernelDev(inode.dev);
    let mut text = ShortText::new();
    text.push(itoa::Buffer::new().format(dev.major()).as_bytes());
    text.push(b":");
    text.push(itoa::Buffer::new().format(dev.minor()).as_bytes());
    text
}

/// Builds the JSON view of one event, at `ts` ([`Clock::rfc3339`] of its time); `None` for
/// events not worth a record.
pub fn to_json<'a>(
    event: &'a Event,
    note: &'a Annotation,
    role: &Role,
    container: Option<&'a ContainerInfo>,
    ts: &'a str,
    flag_names: &'a mut FlagNames,
) -> Option<JsonEvent<'a>> {
    if note.irrelevant {
        return None;
    }
    let mut out = JsonEvent {
        v: SCHEMA_VERSION,
        ts,
        pid: event.pid,
        tid: event.tid,
        comm: &event.comm,
        event: "",
        path: None,
        fd: None,
        size: None,
        offset: None,
        ret: None,
        errno: None,
        signal: None,
        code: None,
        addr: None,
        failure: note.is_failure(event),
        expected: None,
        killed_by_pid: note.killed_by,
        flags: None,
        mode: None,
        prot: None,
        object_size: None,
        object_bytes: None,
        free: None,
        inode: None,
        dev: None,
        key: None,
        shmid: None,
        target_pid: None,
        target_tid: None,
        child_pid: None,
        exit_code: None,
        core_dumped: None,
        shm_death: None,
        filename: None,
        argv: None,
        new_comm: None,
        victim_pid: None,
        freed: note.freed.iter().map(String::as_str).collect(),
        mntns: event.mntns,
        cgroup_id: event.cgroup_id,
        role: role.kind,
        worker_index: role.worker_index,
        trainer_pid: role.trainer,
        container,
    };
    match &event.body {
        Body::Call(call) => fill_call(&mut out, call, note, flag_names),
        Body::Signal(signal) => {
            out.event = "signal";
            out.pid = signal.target_pid;
            out.tid = signal.target_tid;
            out.comm = &signal.target_comm;
            out.signal = Some(names::signal_name(signal.signo));
            out.code = Some(names::si_code_name(signal.signo, signal.code));
            if signal.addr != 0 {
                out.addr = Some(hex(signal.addr));
            }
            if let Some(site) = &note.fault {
                out.path = Some(Cow::Borrowed(&site.path));
                out.offset = Some(site.file_offset);
                out.inode = Some(site.inode.ino);
                out.dev = Some(dev(&site.inode));
                out.object_size = Some(site.file_size);
            }
            if signal.target_pid != event.pid {
                out.target_pid = Some(event.pid); // the sender, when it is someone else
            }
        }
        Body::Fork { child_pid } => {
            out.event = "fork";
            out.child_pid = Some(*child_pid);
        }
        Body::Exec(exec) => {
            out.event = "exec";
            out.filename = Some(&exec.filename);
            out.argv = Some(&exec.argv);
        }
        Body::Exit(Exit { status, shm_death }) => {
            out.event = "exit";
            out.shm_death = Some(*shm_death);
            match status {
                ExitStatus::Code(code) => out.exit_code = Some(*code),
                ExitStatus::Signal { signo, core_dumped } => {
                    out.signal = Some(names::signal_name(*signo));
                    out.core_dumped = Some(*core_dumped);
                }
            }
        }
        Body::Rename { pid, tid, comm } => {
            out.event = "rename";
            out.target_pid = Some(*pid);
            out.target_tid = Some(*tid);
            out.new_comm = Some(comm);
        }
        Body::Oom { victim_pid } => {
            out.event = "oom_kill";
            out.victim_pid = Some(*victim_pid);
        }
    }
    Some(out)
}

fn fill_call<'a>(
    out: &mut JsonEvent<'a>,
    call: &'a Call,
    note: &'a Annotation,
    flag_names: &'a mut FlagNames,
) {
    let a = &call.args;
    out.event = call.syscall.name();
    out.fd = call.fd;
    out.ret = Some(call.ret);
    out.errno = call.errno().map(errno_name);
    out.expected = note.expected_error(call);
    out.path = match &note.object_path {
        Some(path) => Some(Cow::Borrowed(path)),
        None => call.display_path().map(Cow::Owned),
    };
    if let Some(file) = call.file {
        out.object_size = Some(file.size);
        out.object_bytes = Some(file.allocated);
        out.inode = Some(file.inode.ino);
        out.dev = Some(dev(&file.inode));
    }
    // The flags' names this call shows, made first, then borrowed.
    let flags: &[(FlagKind, u64)] = match call.syscall {
        open if open.opens_a_path() => &[(FlagKind::Open, a[2])],
        Syscall::Fallocate => &[(FlagKind::Fallocate, a[1])],
        Syscall::Mmap => &[(FlagKind::Prot, a[2]), (FlagKind::Map, a[3])],
        Syscall::Shmget => &[(FlagKind::Shmget, a[2])],
        Syscall::Recvmsg => &[(FlagKind::Msg, a[3])],
        Syscall::Shmctl => &[(FlagKind::Shmctl, a[1])],
        _ => &[],
    };
    flag_names.make_room();
    for &(kind, value) in flags {
        flag_names.learn(kind, value);
    }
    let flag_names: &'a FlagNames = flag_names;
    let name = |kind, value| Some(Cow::Borrowed(flag_names.get(kind, value)));
    match call.syscall {
        open_family!() => {
            out.flags = name(FlagKind::Open, a[2]);
            out.mode = Some(octal_mode(a[3]));
        }
        Syscall::Ftruncate => out.size = Some(a[1]),
        Syscall::Fallocate => {
            out.flags = name(FlagKind::Fallocate, a[1]);
            out.offset = Some(a[2]);
            out.size = Some(a[3]);
        }
        Syscall::Write => out.size = Some(a[2]),
        Syscall::Mmap => {
            out.size = Some(a[1]);
            out.prot = Some(flag_names.get(FlagKind::Prot, a[2]));
            out.flags = name(FlagKind::Map, a[3]);
            out.offset = Some(a[5]);
            if !call.failed() {
                out.addr = Some(hex(call.ret as u64));
            }
        }
        Syscall::Munmap => {
            out.addr = Some(hex(a[0]));
            out.size = Some(a[1]);
        }
        Syscall::Close | Syscall::Unlink => {}
        Syscall::Unlinkat => out.flags = Some(Cow::Owned(format!("{:#x}", a[2]))),
        Syscall::MemfdCreate => out.flags = Some(Cow::Owned(format!("{:#x}", a[1]))),
        Syscall::Shmget => {
            out.key = Some(format!("{:#x}", a[0] as i32 as u32));
            out.size = Some(a[1]);
            out.flags = name(FlagKind::Shmget, a[2]);
            if !call.failed() {
                out.shmid = Some(call.ret);
            }
        }
        Syscall::Shmat => {
            out.shmid = Some(a[0] as i32 as i64);
            if !call.failed() {
                out.addr = Some(hex(call.ret as u64));
            }
        }
        Syscall::Shmdt => out.addr = Some(hex(a[0])),
        Syscall::Recvmsg => out.flags = name(FlagKind::Msg, a[3]),
        Syscall::Shmctl => {
            out.shmid = Some(a[0] as i32 as i64);
            out.flags = name(FlagKind::Shmctl, a[1]);
        }
        Syscall::Statfs | Syscall::Fstatfs => {
            if let Some(seen) = call.space_seen() {
                out.size = Some(seen.size);
                out.free = Some(seen.free);
            }
        }
    }
}

/// Writes one JSON object per line.
pub struct JsonWriter<W: Write> {
    out: W,
    /// A line is serialised here, then written at once: serde writes a record in dozens of
    /// small pieces, each a dynamic call through the output's layers, which cost more than the
    /// serialising (a third of replay's time, by profile).
    line: Vec<u8>,
}

impl<W: Write> JsonWriter<W> {
    pub fn new(out: W) -> JsonWriter<W> {
        JsonWriter {
            out,
            line: Vec::with_capacity(1024),
        }
    }

    pub fn record<T: Serialize>(&mut self, record: &T) -> io::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, record)?;
        self.line.push(b'\n');
        self.out.write_all(&self.line)
    }

    /// An event's line: what [`JsonWriter::record`] writes, without escaping the keys.
    pub fn event(&mut self, event: &JsonEvent<'_>) -> io::Result<()> {
        self.line.clear();
        flat_struct::write(&mut self.line, event)?;
        self.line.push(b'\n');
        self.out.write_all(&self.line)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::InodeId;

    #[test]
    fn short_texts_read_as_fmt_writes_them() {
        for value in [
            0,
            1,
            7,
            8,
            0o600,
            0xf,
            0x10,
            0x7fbb_bebd_6000,
            u64::MAX - 1,
            u64::MAX,
        ] {
            assert_eq!(hex(value).as_str(), format!("{value:#x}"));
            assert_eq!(octal_mode(value).as_str(), format!("0{value:o}"));
        }
        for raw in [0, 27, (1 << 20) | 5, u32::MAX] {
            let inode = InodeId { dev: raw, ino: 1 };
            assert_eq!(dev(&inode).as_str(), inode.dev_string());
        }
    }
}
