//! Writes a [`JsonEvent`] as one JSON line by hand, byte for byte what `serde_json` writes
//! for it, because replay prints hundreds of thousands of them: `serde_json` escapes every
//! key, checks every optional field through generic calls, and was a third of replay's time
//! (issue 12). The derive on [`JsonEvent`] stays the reference: the tests below compare the
//! two on every kind of field, so a field added there and not here fails them.
use std::io;

use super::json::JsonEvent;

/// Appends `event` and a newline to `line`.
pub fn write_event(line: &mut Vec<u8>, event: &JsonEvent<'_>) -> io::Result<()> {
    let mut w = Line { out: line };
    w.out.extend_from_slice(b"{\"v\":");
    w.int(event.v);
    w.key(b"ts");
    w.string(&event.ts);
    w.key(b"pid");
    w.int(event.pid);
    w.key(b"tid");
    w.int(event.tid);
    w.key(b"comm");
    w.string(event.comm);
    w.key(b"event");
    w.string(event.event);
    w.key(b"path");
    w.opt_string(event.path.as_deref());
    w.key(b"fd");
    w.opt_int(event.fd);
    w.key(b"size");
    w.opt_int(event.size);
    w.key(b"offset");
    w.opt_int(event.offset);
    w.key(b"ret");
    w.opt_int(event.ret);
    w.key(b"errno");
    w.opt_string(event.errno.as_deref());
    w.key(b"signal");
    w.opt_string(event.signal.as_deref());
    w.key(b"code");
    w.opt_string(event.code.as_deref());
    w.key(b"addr");
    w.opt_string(event.addr.as_deref());
    w.key(b"failure");
    w.bool(event.failure);
    w.some_string(b"expected", event.expected);
    w.some_int(b"killed_by_pid", event.killed_by_pid);
    w.some_string(b"flags", event.flags.as_deref());
    w.some_string(b"mode", event.mode.as_deref());
    w.some_string(b"prot", event.prot.as_deref());
    w.some_int(b"object_size", event.object_size);
    w.some_int(b"object_bytes", event.object_bytes);
    w.some_int(b"inode", event.inode);
    w.some_string(b"dev", event.dev.as_deref());
    w.some_string(b"key", event.key.as_deref());
    w.some_int(b"shmid", event.shmid);
    w.some_int(b"target_pid", event.target_pid);
    w.some_int(b"target_tid", event.target_tid);
    w.some_int(b"child_pid", event.child_pid);
    w.some_int(b"exit_code", event.exit_code);
    if let Some(core_dumped) = event.core_dumped {
        w.key(b"core_dumped");
        w.bool(core_dumped);
    }
    w.some_string(b"filename", event.filename);
    if let Some(argv) = event.argv {
        w.key(b"argv");
        w.strings(argv.iter().map(String::as_str));
    }
    w.some_string(b"new_comm", event.new_comm);
    w.some_int(b"victim_pid", event.victim_pid);
    if !event.freed.is_empty() {
        w.key(b"freed");
        w.strings(event.freed.iter().copied());
    }
    w.key(b"mntns");
    w.int(event.mntns);
    w.key(b"cgroup_id");
    w.int(event.cgroup_id);
    w.key(b"role");
    // A unit enum: serde writes its (snake_case) name as a string.
    serde_json::to_writer(&mut *w.out, &event.role)?;
    w.some_int(b"worker_index", event.worker_index);
    w.some_int(b"trainer_pid", event.trainer_pid);
    w.key(b"container");
    // Rare (an event in a container) and nested: left to serde.
    serde_json::to_writer(&mut *w.out, &event.container)?;
    w.out.extend_from_slice(b"}\n");
    Ok(())
}

struct Line<'a> {
    out: &'a mut Vec<u8>,
}

impl Line<'_> {
    /// `,"name":` (every key but the first, which the caller writes with the brace).
    fn key(&mut self, name: &[u8]) {
        self.out.extend_from_slice(b",\"");
        self.out.extend_from_slice(name);
        self.out.extend_from_slice(b"\":");
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
    fn some_int(&mut self, name: &[u8], value: Option<impl itoa::Integer>) {
        if let Some(value) = value {
            self.key(name);
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
        if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
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
    fn some_string(&mut self, name: &[u8], text: Option<&str>) {
        if let Some(text) = text {
            self.key(name);
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
