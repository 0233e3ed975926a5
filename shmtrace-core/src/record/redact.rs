//! `shmtrace report FILE --redact -o shareable.shmtrace`: a copy of a trace that is safe to
//! attach to a public bug report.
//!
//! Replaced by pseudonyms (see `pseudonym`): host names, container ids, names, images, labels
//! and cgroup paths; the words of command lines (exec arguments, snapshot argv) other than
//! program names, options and numbers; executables and every other path outside /dev/shm;
//! process names other than programs' (`python3`, `pt_data_worker`, `postgres`); the names in
//! a container's description (whose /dev/shm it shares, its compose project), not its words;
//! free text. /dev/shm names keep their shape. Numbers (pids, sizes, addresses, times, inode
//! numbers) are kept: they are what the diagnosis is made of. What shmtrace itself wrote, and
//! the names of programs, are no one's: redaction keeps them, and so the diagnosis.
//!
//! Kernel records are rewritten in place: decoded with the `shmtrace-common` layouts, their
//! string fields replaced (and zero-filled to the end, so no stale bytes of the ring buffer
//! survive after a terminator), padding zeroed, lengths kept valid. A kernel record that does
//! not decode cannot be checked and is dropped, and counted; so are userspace records of
//! unknown types. The output header has the `redacted` flag.
use std::{collections::BTreeMap, io, mem::offset_of, path::Path};

use shmtrace_common::{
    ARGS_LEN, COMM_LEN, EventKind, ExecEvent, ExitEvent, ForkEvent, Header, OomEvent, PATH_LEN,
    PathEvent, RenameEvent, SignalEvent, SyscallEvent, flags,
};
use zerocopy::FromBytes;

use super::{
    header::{ContainerDescription, EXTRA_IPC, EXTRA_STARTED_BY, TraceHeader, random_id},
    pseudonym::Pseudonyms,
    reader::ReadError,
    set::TraceSet,
    user::{ProcessSnapshot, Record, UserRecord},
    writer::{TraceWriter, WriteError, WriteStats, WriterOptions, no_carry},
};
use crate::{event::escape, model::StartedBy};

#[derive(Debug, Default)]
pub struct RedactStats {
    /// Records written to the redacted copy.
    pub records: u64,
    /// Kernel records that did not decode, so could not be checked, and were left out.
    pub kernel_dropped: u64,
    /// Userspace records left out (none today: every known type is redacted).
    pub user_dropped: u64,
    /// Where the input went bad, if it did: the copy holds everything before it.
    pub input_error: Option<ReadError>,
    /// The input lacks the end mark of a finished recording; so does the copy.
    pub input_cut_short: bool,
    pub written: WriteStats,
}

#[derive(Debug, thiserror::Error)]
pub enum RedactError {
    #[error("cannot read the trace to redact: {0}")]
    Open(#[source] ReadError),
    #[error("writing the redacted copy: {0}")]
    Write(#[from] WriteError),
    #[error("no random key for the pseudonyms ({0}); redaction needs getrandom(2)")]
    Random(#[source] io::Error),
    #[error("the redacted copy must go to another file than the trace it is made from")]
    SamePath,
}

/// Redacts the trace (or rotated set) at `input` into the single file `output`.
pub fn redact_file(
    input: &Path,
    output: &Path,
    options: WriterOptions,
) -> Result<RedactStats, RedactError> {
    let same = match (input.canonicalize(), output.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => input == output,
    };
    if same {
        return Err(RedactError::SamePath);
    }
    let set = TraceSet::open(input).map_err(RedactError::Open)?;
    // The path check above misses a hard link of the input; its inode does not.
    let options = WriterOptions {
        not_over: set.file_ids().to_vec(),
        ..options
    };
    redact(set, output, options)
}

/// Redacts the records of `set` into `output`.
pub fn redact(
    mut set: TraceSet,
    output: &Path,
    mut options: WriterOptions,
) -> Result<RedactStats, RedactError> {
    let header = &set.header().clone();
    let mut redactor = Redactor::new().map_err(RedactError::Random)?;
    options.rotation = None;
    let mut writer = TraceWriter::create(output, redactor.header(header), options)?;
    let mut stats = RedactStats::default();
    for entry in set.by_ref() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                stats.input_error = Some(error);
                break;
            }
        };
        match &entry.record {
            Record::Kernel(bytes) => match redactor.kernel(bytes) {
                Some(clean) => {
                    writer.write_frame(super::format::FrameKind::Kernel, entry.ts_ns, &clean)?
                }
                None => {
                    stats.kernel_dropped += 1;
                    continue;
                }
            },
            Record::User(user) => match redactor.user(user) {
                Some(clean) => writer.write_user(entry.ts_ns, &clean)?,
                None => {
                    stats.user_dropped += 1;
                    continue;
                }
            },
        }
        stats.records += 1;
        if writer.buffered_bytes() >= 1 << 20 {
            writer.flush(&mut no_carry)?;
        }
    }
    // A copy of a recording that was cut short is no more complete than it.
    stats.input_cut_short = stats.input_error.is_none() && !set.closed();
    stats.written = if stats.input_cut_short || stats.input_error.is_some() {
        writer.finish_cut_short(&mut no_carry)?
    } else {
        writer.finish(&mut no_carry)?
    };
    Ok(stats)
}

/// Rewrites headers and records with one set of pseudonyms.
pub struct Redactor {
    names: Pseudonyms,
}

impl Redactor {
    /// With a fresh random key, used for one output file and then forgotten.
    pub fn new() -> io::Result<Redactor> {
        Ok(Redactor {
            names: Pseudonyms::new()?,
        })
    }

    pub fn header(&mut self, header: &TraceHeader) -> TraceHeader {
        let mut out = header.clone();
        out.redacted = true;
        out.hostname = header.hostname.as_deref().map(|h| self.names.host(h));
        out.recording_id = random_id();
        out.target.command = header
            .target
            .command
            .as_ref()
            .map(|argv| argv.iter().map(|a| self.names.arg(a)).collect());
        out.target.containers = header
            .target
            .containers
            .iter()
            .map(|c| self.container(c))
            .collect();
        if let Some(flight) = out.flight.as_mut() {
            let known = ["ENOSPC", "SIGBUS", "worker death", "manual", "other"];
            if !known.contains(&flight.reason.as_str()) {
                flight.reason = self.names.text(&flight.reason);
            }
        }
        out
    }

    pub fn container(&mut self, c: &ContainerDescription) -> ContainerDescription {
        let names = &mut self.names;
        ContainerDescription {
            id: names.container_id(&c.id),
            name: c.name.as_deref().map(|n| names.container_name(n)),
            runtime: c.runtime.clone(),
            image: c.image.as_deref().map(|i| names.image(i)),
            hostname: c.hostname.as_deref().map(|h| names.host(h)),
            pid: c.pid,
            mntns: c.mntns,
            cgroup_id: c.cgroup_id,
            cgroup_path: c.cgroup_path.as_deref().map(|p| names.path(p)),
            shm: c.shm,
            labels: c
                .labels
                .iter()
                .map(|(k, v)| (label_key(names, k), names.label(v)))
                .collect(),
            extra: c
                .extra
                .iter()
                .map(|(k, v)| (k.clone(), redact_extra(names, k, v)))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    /// The redacted form of a userspace record, or `None` to leave it out.
    pub fn user(&mut self, record: &UserRecord) -> Option<UserRecord> {
        let names = &mut self.names;
        Some(match record {
            UserRecord::Snapshot(s) => UserRecord::Snapshot(ProcessSnapshot {
                pid: s.pid,
                ppid: s.ppid,
                comm: names.comm(&s.comm),
                exe: s.exe.as_deref().map(|e| names.path(e)),
                argv: s.argv.iter().map(|a| names.arg(a)).collect(),
                mntns: s.mntns,
                nspid: s.nspid,
                fds: s
                    .fds
                    .iter()
                    .map(|f| {
                        let mut f = f.clone();
                        f.path = names.path(&f.path);
                        f
                    })
                    .collect(),
                mappings: s
                    .mappings
                    .iter()
                    .map(|m| {
                        let mut m = m.clone();
                        m.path = names.path(&m.path);
                        m
                    })
                    .collect(),
            }),
            UserRecord::Container(c) => UserRecord::Container(Box::new(self.container(c))),
            UserRecord::Capacity(sample) => {
                let mut sample = sample.clone();
                sample.container = sample.container.as_deref().map(|c| names.container_id(c));
                UserRecord::Capacity(sample)
            }
            UserRecord::Holders(sample) => {
                let mut sample = sample.clone();
                for file in &mut sample.files {
                    file.path = names.path(&file.path);
                    for holder in &mut file.holders {
                        holder.comm = names.comm(&holder.comm);
                    }
                }
                UserRecord::Holders(sample)
            }
            UserRecord::Lost(lost) => UserRecord::Lost(lost.clone()),
            UserRecord::ContainerEnd { mntns } => UserRecord::ContainerEnd { mntns: *mntns },
            UserRecord::WriterLoss(loss) => {
                let mut loss = loss.clone();
                loss.reason = names.text(&loss.reason);
                UserRecord::WriterLoss(loss)
            }
            UserRecord::Trigger(trigger) => {
                let mut trigger = trigger.clone();
                trigger.detail = names.text(&trigger.detail);
                UserRecord::Trigger(trigger)
            }
            UserRecord::Note { text } => UserRecord::Note {
                text: names.text(text),
            },
            // Readers keep end marks to themselves; the copy gets its own.
            UserRecord::End | UserRecord::Unknown => return None,
        })
    }

    /// The redacted bytes of a kernel record, or `None` if it does not decode.
    pub fn kernel(&mut self, bytes: &[u8]) -> Option<Vec<u8>> {
        let (header, _) = Header::read_from_prefix(bytes).ok()?;
        let kind = EventKind::try_from(header.kind).ok()?;
        let size = match kind {
            EventKind::Syscall => size_of::<SyscallEvent>(),
            EventKind::Path => size_of::<PathEvent>(),
            EventKind::Signal => size_of::<SignalEvent>(),
            EventKind::Fork => size_of::<ForkEvent>(),
            EventKind::Exec => size_of::<ExecEvent>(),
            EventKind::Exit => size_of::<ExitEvent>(),
            EventKind::Rename => size_of::<RenameEvent>(),
            EventKind::Oom => size_of::<OomEvent>(),
        };
        // Bytes past the struct carry nothing the decoder reads, and maybe stale memory.
        let mut out = bytes.get(..size)?.to_vec();
        self.comm_field(&mut out, offset_of!(Header, comm));
        zero(&mut out, offset_of!(Header, _pad), 4);
        match kind {
            EventKind::Syscall => zero(&mut out, offset_of!(SyscallEvent, _pad), 2),
            EventKind::Path => {
                zero(
                    &mut out,
                    offset_of!(PathEvent, call) + offset_of!(SyscallEvent, _pad),
                    2,
                );
                let raw = PathEvent::read_from_prefix(bytes).ok()?.0;
                let path = escape::c_string(&raw.path);
                let relative = header.flags & flags::RELATIVE_TO_SHM != 0 && !path.starts_with('/');
                let clean = if relative {
                    self.names.shm_name(&path)
                } else {
                    self.names.path(&path)
                };
                put_str(&mut out, offset_of!(PathEvent, path), PATH_LEN, &clean);
            }
            EventKind::Signal => self.comm_field(&mut out, offset_of!(SignalEvent, target_comm)),
            EventKind::Fork => zero(&mut out, offset_of!(ForkEvent, _pad), 4),
            EventKind::Exec => {
                let raw = ExecEvent::read_from_prefix(bytes).ok()?.0;
                zero(&mut out, offset_of!(ExecEvent, _pad), 4);
                let filename = self.names.path(&escape::c_string(&raw.filename));
                put_str(
                    &mut out,
                    offset_of!(ExecEvent, filename),
                    PATH_LEN,
                    &filename,
                );
                let (args, complete) = self.exec_args(&raw);
                zero(&mut out, offset_of!(ExecEvent, args), ARGS_LEN);
                let at = offset_of!(ExecEvent, args);
                out[at..at + args.len()].copy_from_slice(&args);
                let at = offset_of!(ExecEvent, args_len);
                out[at..at + 4].copy_from_slice(&(args.len() as u32).to_le_bytes());
                if !complete {
                    let at = offset_of!(Header, flags);
                    let bits = header.flags | flags::ARGS_TRUNCATED;
                    out[at..at + 2].copy_from_slice(&bits.to_le_bytes());
                }
            }
            EventKind::Exit => zero(&mut out, offset_of!(ExitEvent, _pad), 4),
            EventKind::Rename => self.comm_field(&mut out, offset_of!(RenameEvent, new_comm)),
            EventKind::Oom => zero(&mut out, offset_of!(OomEvent, _pad), 4),
        }
        Some(out)
    }

    /// Pseudonymous arguments, NUL-separated as the kernel lays them out, as many as fit;
    /// `false` when some did not.
    fn exec_args(&mut self, raw: &ExecEvent) -> (Vec<u8>, bool) {
        let len = (raw.args_len as usize).min(ARGS_LEN);
        let used = &raw.args[..len];
        let used = used.strip_suffix(&[0]).unwrap_or(used);
        let mut out = Vec::with_capacity(ARGS_LEN);
        if used.is_empty() {
            return (out, true);
        }
        for arg in used.split(|b| *b == 0) {
            let arg = self.names.arg(&escape::bytes(arg));
            if out.len() + arg.len() + 1 > ARGS_LEN {
                return (out, false);
            }
            out.extend_from_slice(arg.as_bytes());
            out.push(0);
        }
        (out, true)
    }

    fn comm_field(&mut self, out: &mut [u8], at: usize) {
        let comm = escape::c_string(&out[at..at + COMM_LEN]);
        let clean = self.names.comm(&comm);
        put_str(out, at, COMM_LEN, &clean);
    }
}

/// Writes `value` into a fixed-size C string field: NUL-terminated, the rest zeroed.
fn put_str(out: &mut [u8], at: usize, len: usize, value: &str) {
    zero(out, at, len);
    let bytes = value.as_bytes();
    let n = bytes.len().min(len - 1);
    out[at..at + n].copy_from_slice(&bytes[..n]);
}

fn zero(out: &mut [u8], at: usize, len: usize) {
    out[at..at + len].fill(0);
}

/// Label keys of well-known namespaces say nothing about the user; others may.
fn label_key(names: &mut Pseudonyms, key: &str) -> String {
    const KNOWN: &[&str] = &[
        "com.docker.",
        "io.kubernetes.",
        "org.opencontainers.",
        "io.containerd.",
        "io.podman.",
        "io.cri-containerd.",
    ];
    if KNOWN.iter().any(|prefix| key.starts_with(prefix)) {
        key.to_owned()
    } else {
        names.label(key)
    }
}

/// A container field that travels in `extra`: whose /dev/shm it uses and what started it keep
/// their words and lose the names in them; any other, every string inside.
fn redact_extra(names: &mut Pseudonyms, key: &str, value: &ciborium::Value) -> ciborium::Value {
    match (key, value) {
        (EXTRA_IPC, ciborium::Value::Text(ipc)) => ciborium::Value::Text(redact_ipc(names, ipc)),
        (EXTRA_STARTED_BY, value) => match value.deserialized::<StartedBy>() {
            Ok(StartedBy::Compose { project, service }) => {
                ciborium::Value::serialized(&StartedBy::Compose {
                    project: names.label(&project),
                    service: names.label(&service),
                })
                .unwrap_or(ciborium::Value::Null)
            }
            Ok(_) => value.clone(),
            Err(_) => redact_value(names, value),
        },
        _ => redact_value(names, value),
    }
}

/// Whose /dev/shm a container uses, in shmtrace's words (`private`, `the host's (--ipc=host)`,
/// `shared with container db`): the words kept, a container's name or a sandbox's id
/// replaced. Anything else is replaced whole.
fn redact_ipc(names: &mut Pseudonyms, ipc: &str) -> String {
    const WORDS: &[&str] = &[
        "private",
        "shareable",
        "the",
        "host's",
        "ipc",
        "host",
        "none",
        "unknown",
    ];
    if let Some(other) = ipc.strip_prefix("shared with container ") {
        return format!("shared with container {}", names.container_name(other));
    }
    if let Some(sandbox) = ipc
        .strip_prefix("shared by the pod (sandbox ")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        return format!(
            "shared by the pod (sandbox {})",
            names.container_id(sandbox)
        );
    }
    let only_words = ipc
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '\''))
        .all(|word| word.is_empty() || WORDS.contains(&word));
    if only_words {
        ipc.to_owned()
    } else {
        names.text(ipc)
    }
}

/// Container fields this version has no name for: every string inside is replaced.
fn redact_value(names: &mut Pseudonyms, value: &ciborium::Value) -> ciborium::Value {
    use ciborium::Value;
    match value {
        Value::Text(text) => Value::Text(names.text(text)),
        Value::Bytes(_) => Value::Bytes(Vec::new()),
        Value::Array(items) => Value::Array(items.iter().map(|v| redact_value(names, v)).collect()),
        Value::Map(entries) => Value::Map(
            entries
                .iter()
                .map(|(k, v)| (redact_value(names, k), redact_value(names, v)))
                .collect(),
        ),
        Value::Tag(tag, inner) => Value::Tag(*tag, Box::new(redact_value(names, inner))),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// shmtrace's own words stay; the names in them go.
    #[test]
    fn a_containers_ipc_and_start_keep_their_words() {
        let mut names = Pseudonyms::with_key([6; 32]);
        for words in [
            "private",
            "private (shareable)",
            "the host's (--ipc=host)",
            "none (--ipc=none)",
        ] {
            assert_eq!(redact_ipc(&mut names, words), words);
        }
        let shared = redact_ipc(&mut names, "shared with container acme-db");
        assert!(
            shared.starts_with("shared with container container-"),
            "{shared}"
        );
        assert!(!shared.contains("acme"));
        let pod = redact_ipc(&mut names, "shared by the pod (sandbox 0123456789ab)");
        assert!(pod.starts_with("shared by the pod (sandbox ") && !pod.contains("0123456789ab"));
        assert!(redact_ipc(&mut names, "something about acme").starts_with("redacted-"));

        let compose = ciborium::Value::serialized(&StartedBy::Compose {
            project: "acme".into(),
            service: "trainer".into(),
        })
        .unwrap();
        let redacted: StartedBy = redact_extra(&mut names, EXTRA_STARTED_BY, &compose)
            .deserialized()
            .unwrap();
        let StartedBy::Compose { project, service } = redacted else {
            panic!("{redacted:?}");
        };
        assert!(project.starts_with("label-") && service.starts_with("label-"));
        let run = ciborium::Value::serialized(&StartedBy::DockerRun).unwrap();
        assert_eq!(redact_extra(&mut names, EXTRA_STARTED_BY, &run), run);
    }
}
