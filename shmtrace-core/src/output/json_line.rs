//! Writes a [`JsonEvent`] as one JSON line by hand, byte for byte what `serde_json` writes
//! for it, because replay prints hundreds of thousands of them: `serde_json` escapes every
//! key, checks every optional field through generic calls, and was a third of replay's time
//! (issue 12). The derive on [`JsonEvent`] stays the reference: the tests below compare the
//! two on every kind of field, so a field added there and not here fails them.
use std::io;

use super::json::JsonEvent;

/// `,"name":`, made at compile time: one copy per key rather than three.
macro_rules! key {
    ($name:literal) => {
        concat!(",\"", $name, "\":").as_bytes()
    };
}

/// Appends `event` and a newline to `line`.
pub fn write_event(line: &mut Vec<u8>, event: &JsonEvent<'_>) -> io::Result<()> {
    let mut w = Line { out: line };
    w.out.extend_from_slice(b"{\"v\":");
    w.int(event.v);
    w.raw(key!("ts"));
    w.string(event.ts);
    w.raw(key!("pid"));
    w.int(event.pid);
    w.raw(key!("tid"));
    w.int(event.tid);
    w.raw(key!("comm"));
    w.string(event.comm);
    w.raw(key!("event"));
    w.string(event.event);
    w.raw(key!("path"));
    w.opt_string(event.path.as_deref());
    w.raw(key!("fd"));
    w.opt_int(event.fd);
    w.raw(key!("size"));
    w.opt_int(event.size);
    w.raw(key!("offset"));
    w.opt_int(event.offset);
    w.raw(key!("ret"));
    w.opt_int(event.ret);
    w.raw(key!("errno"));
    w.opt_string(event.errno.as_deref());
    w.raw(key!("signal"));
    w.opt_string(event.signal.as_deref());
    w.raw(key!("code"));
    w.opt_string(event.code.as_deref());
    w.raw(key!("addr"));
    w.opt_string(event.addr.as_deref());
    w.raw(key!("failure"));
    w.bool(event.failure);
    w.some_string(key!("expected"), event.expected);
    w.some_int(key!("killed_by_pid"), event.killed_by_pid);
    w.some_string(key!("flags"), event.flags.as_deref());
    w.some_string(key!("mode"), event.mode.as_deref());
    w.some_string(key!("prot"), event.prot.as_deref());
    w.some_int(key!("object_size"), event.object_size);
    w.some_int(key!("object_bytes"), event.object_bytes);
    w.some_int(key!("inode"), event.inode);
    w.some_string(key!("dev"), event.dev.as_deref());
    w.some_string(key!("key"), event.key.as_deref());
    w.some_int(key!("shmid"), event.shmid);
    w.some_int(key!("target_pid"), event.target_pid);
    w.some_int(key!("target_tid"), event.target_tid);
    w.some_int(key!("child_pid"), event.child_pid);
    w.some_int(key!("exit_code"), event.exit_code);
    if let Some(core_dumped) = event.core_dumped {
        w.raw(key!("core_dumped"));
        w.bool(core_dumped);
    }
    w.some_string(key!("filename"), event.filename);
    if let Some(argv) = event.argv {
        w.raw(key!("argv"));
        w.strings(argv.iter().map(String::as_str));
    }
    w.some_string(key!("new_comm"), event.new_comm);
    w.some_int(key!("victim_pid"), event.victim_pid);
    if !event.freed.is_empty() {
        w.raw(key!("freed"));
        w.strings(event.freed.iter().copied());
    }
    w.raw(key!("mntns"));
    w.int(event.mntns);
    w.raw(key!("cgroup_id"));
    w.int(event.cgroup_id);
    w.raw(key!("role"));
    // A unit enum: serde writes its (snake_case) name as a string.
    serde_json::to_writer(&mut *w.out, &event.role)?;
    w.some_int(key!("worker_index"), event.worker_index);
    w.some_int(key!("trainer_pid"), event.trainer_pid);
    w.raw(key!("container"));
    // Rare (an event in a container) and nested: left to serde.
    serde_json::to_writer(&mut *w.out, &event.container)?;
    w.out.extend_from_slice(b"}\n");
    Ok(())
}

struct Line<'a> {
    out: &'a mut Vec<u8>,
}

impl Line<'_> {
    /// A key from [`key!`] (every key but the first, which the caller writes with the brace).
    fn raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    fn int(&mut self, value: impl itoa::Integer) {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    fn opt_int(&mut self, value: Option<impl itoa::Integer>) {
        match value {
            Some(value) => self.int(value),
            None => self.out.extend_from_slice(b"null"),
        }
    }

    /// A field that is left out when `None`.
    fn some_int(&mut self, key: &[u8], value: Option<impl itoa::Integer>) {
        if let Some(value) = value {
            self.raw(key);
            self.int(value);
        }
    }

    fn bool(&mut self, value: bool) {
        self.out
            .extend_from_slice(if value { b"true" } else { b"false" });
    }

    /// A JSON string. Most need no escape and are copied as they are; the others are
    /// escaped by `serde_json` itself, so that both ways agree on every character.
    fn string(&mut self, text: &str) {
        // A fold without an early exit, which the compiler turns into vector instructions.
        let needs_escape = text.bytes().fold(false, |found, b| {
            found | (b < 0x20) | (b == b'"') | (b == b'\\')
        });
        if !needs_escape {
            self.out.push(b'"');
            self.out.extend_from_slice(text.as_bytes());
            self.out.push(b'"');
        } else {
            // Writing into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *self.out, text);
        }
    }

    fn opt_string(&mut self, text: Option<&str>) {
        match text {
            Some(text) => self.string(text),
            None => self.out.extend_from_slice(b"null"),
        }
    }

    /// A field that is left out when `None`.
    fn some_string(&mut self, key: &[u8], text: Option<&str>) {
        if let Some(text) = text {
            self.raw(key);
            self.string(text);
        }
    }

    fn strings<'s>(&mut self, items: impl Iterator<Item = &'s str>) {
        self.out.push(b'[');
        for (i, item) in items.enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.string(item);
        }
        self.out.push(b']');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{diagnose::RoleKind, model::ContainerInfo};

    fn bare(ts: &str) -> JsonEvent<'_> {
        JsonEvent {
            v: 1,
            ts,
            pid: 1,
            tid: 2,
            comm: "python3",
            event: "close",
            path: None,
            fd: None,
            size: None,
            offset: None,
            ret: None,
            errno: None,
            signal: None,
            code: None,
            addr: None,
            failure: false,
            expected: None,
            killed_by_pid: None,
            flags: None,
            mode: None,
            prot: None,
            object_size: None,
            object_bytes: None,
            inode: None,
            dev: None,
            key: None,
            shmid: None,
            target_pid: None,
            target_tid: None,
            child_pid: None,
            exit_code: None,
            core_dumped: None,
            filename: None,
            argv: None,
            new_comm: None,
            victim_pid: None,
            freed: Vec::new(),
            mntns: 0,
            cgroup_id: 0,
            role: RoleKind::Other,
            worker_index: None,
            trainer_pid: None,
            container: None,
        }
    }

    fn same_as_serde(event: &JsonEvent<'_>) {
        let mut ours = Vec::new();
        write_event(&mut ours, event).unwrap();
        let mut theirs = serde_json::to_vec(event).unwrap();
        theirs.push(b'\n');
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&theirs)
        );
    }

    #[test]
    fn an_event_with_only_the_fields_every_event_has_reads_as_serde_writes_it() {
        same_as_serde(&bare("2026-11-29T16:51:37.000000001Z"));
    }

    /// Every field set, with strings that need escaping and numbers at their limits: a field
    /// added to `JsonEvent` and not to `write_event` shows up here.
    #[test]
    fn every_field_and_every_escape_reads_as_serde_writes_it() {
        let hostile = "q\"b\\s\u{1}\u{1f}\n\t\r\u{8}\u{c}\u{7f}\u{80}\u{2028}é\u{202e}😀";
        let argv = vec![
            "python".to_owned(),
            hostile.to_owned(),
            String::new(),
            "-c".to_owned(),
        ];
        let container = ContainerInfo {
            runtime: "docker".into(),
            id: "0123456789ab".into(),
            name: hostile.into(),
            image: Some("pytorch:2.4".into()),
            shm_size: Some(64 << 20),
            ..ContainerInfo::default()
        };
        let roles = [
            RoleKind::Trainer,
            RoleKind::DataloaderWorker,
            RoleKind::PinMemory,
            RoleKind::ShmManager,
            RoleKind::Nccl,
            RoleKind::PythonMultiprocessing,
            RoleKind::TorchMultiprocessing,
            RoleKind::Other,
        ];
        for role in roles {
            let event = JsonEvent {
                v: u32::MAX,
                pid: u32::MAX,
                tid: 0,
                comm: hostile,
                event: "signal",
                path: Some(format!("/dev/shm/{hostile}").into()),
                fd: Some(i32::MIN),
                size: Some(u64::MAX),
                offset: Some(0),
                ret: Some(i64::MIN),
                errno: Some("ENOSPC".into()),
                signal: Some("SIGBUS".into()),
                code: Some("BUS_ADRERR".into()),
                addr: Some("0x7f00".into()),
                failure: true,
                expected: Some("a feature probe"),
                killed_by_pid: Some(7),
                flags: Some("O_RDWR|O_CREAT".into()),
                mode: Some("0600".into()),
                prot: Some("PROT_READ".into()),
                object_size: Some(i64::MIN),
                object_bytes: Some(4096),
                inode: Some(u64::MAX),
                dev: Some("0:27".into()),
                key: Some("0x1".into()),
                shmid: Some(-1),
                target_pid: Some(3),
                target_tid: Some(4),
                child_pid: Some(5),
                exit_code: Some(-128),
                core_dumped: Some(true),
                filename: Some(hostile),
                argv: Some(&argv),
                new_comm: Some(hostile),
                victim_pid: Some(6),
                freed: vec!["/dev/shm/a", hostile, ""],
                mntns: 4026531840,
                cgroup_id: u64::MAX,
                role,
                worker_index: Some(0),
                trainer_pid: Some(9),
                container: Some(&container),
                ..bare(hostile)
            };
            same_as_serde(&event);
        }
        let mut not_dumped = bare("t");
        not_dumped.core_dumped = Some(false);
        not_dumped.argv = Some(&[]);
        not_dumped.path = Some("".into());
        same_as_serde(&not_dumped);
    }
}
