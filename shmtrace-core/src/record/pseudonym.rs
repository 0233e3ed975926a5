//! Stable pseudonyms for redacted traces.
//!
//! A pseudonym is HMAC-SHA256 of the original under a random key that exists only in this
//! process's memory and is never written: the same name gets the same pseudonym everywhere in
//! one redacted file (so processes and objects still line up), but no one holding the file can
//! confirm a guess ("is host-3fa9c2d1 build-server-7?") without the key.
//!
//! /dev/shm names keep their shape, because the shape is the diagnosis: `torch_4242_17` stays
//! `torch_4242_17`, `psm_3fa9c2d1` becomes `psm_` and eight other characters of the same
//! classes. Numbers, the words of the known programs' object names (`diagnose::known`) and
//! of other libraries' prefixes are kept; every other word is replaced letter for letter.
//! Process names and command-line words that name a program (the known programs', shells,
//! interpreters) or an option are kept too: they say what ran, not who ran it.
use std::{collections::HashMap, io};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::diagnose::known::{KNOWN, parallel_leader};

/// Fills `buf` from the kernel's random source.
pub fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: the kernel writes at most `rest.len()` bytes into `rest`.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        filled += n as usize;
    }
    Ok(())
}

/// What a name is; the same text in two roles gets two pseudonyms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Role {
    Host,
    ContainerId,
    ContainerName,
    Image,
    Path,
    Arg,
    Comm,
    Label,
    Text,
    ShmWord,
}

impl Role {
    fn tag(self) -> &'static [u8] {
        match self {
            Role::Host => b"host",
            Role::ContainerId => b"container-id",
            Role::ContainerName => b"container-name",
            Role::Image => b"image",
            Role::Path => b"path",
            Role::Arg => b"arg",
            Role::Comm => b"comm",
            Role::Label => b"label",
            Role::Text => b"text",
            Role::ShmWord => b"shm-word",
        }
    }
}

/// Words kept in /dev/shm names besides the known programs' own ([`known_object_word`]):
/// prefixes that other libraries put there, and words of their shape, which say who made an
/// object and identify no one.
const SHM_VOCABULARY: &[&str] = &[
    "pymp",
    "cuda",
    "cudnn",
    "ray",
    "arrow",
    "jax",
    "xla",
    "tf",
    "mkl",
    "kmp",
    "registered",
    "lib",
    "omp",
    "dask",
    "worker",
    "loader",
    "data",
    "queue",
    "lock",
    "tmp",
    "temp",
    "buffer",
    "buf",
    "pulse",
    "pulseshm",
    "mono",
    "jack",
    "wayland",
    "dbus",
    "memfd",
    "file",
    "fd",
    "mem",
    "pool",
    "cache",
    "seg",
    "ipc",
    "boost",
    "vllm",
    "nvidia",
    "hf",
    "datasets",
    "multiprocessing",
    "loky",
    "ompi",
    "gloo",
    "deleted",
];

/// Separators kept in /dev/shm names; any other non-alphanumeric character becomes `_`.
const SHM_SEPARATORS: &[char] = &['.', '_', '-', '+', '=', '@', ':', '/', ','];

/// Process names kept as they are besides the known programs' ([`KNOWN`]) and PyTorch's
/// thread names: interpreters, shells, tools and container runtimes' own processes, which say
/// what a process is and nothing about who runs it.
const GENERIC_COMMS: &[&str] = &[
    "torchrun",
    "sh",
    "bash",
    "dash",
    "zsh",
    "busybox",
    "dd",
    "cat",
    "cp",
    "tee",
    "env",
    "java",
    "node",
    "ruby",
    "perl",
    "R",
    "Rscript",
    "tini",
    "docker-init",
    "dumb-init",
    "runc",
    "conmon",
    "containerd-shim",
    "shmtrace",
    "sleep",
    "QueueFeederThr",
    "init",
];

pub struct Pseudonyms {
    key: [u8; 32],
    cache: HashMap<(Role, String), String>,
}

impl Pseudonyms {
    /// With a fresh random key.
    pub fn new() -> io::Result<Pseudonyms> {
        let mut key = [0u8; 32];
        fill_random(&mut key)?;
        Ok(Pseudonyms::with_key(key))
    }

    pub fn with_key(key: [u8; 32]) -> Pseudonyms {
        Pseudonyms {
            key,
            cache: HashMap::new(),
        }
    }

    fn mac(&self, role: Role, value: &str) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("any key length");
        mac.update(role.tag());
        mac.update(&[0]);
        mac.update(value.as_bytes());
        mac.finalize().into_bytes().into()
    }

    fn hex(&self, role: Role, value: &str, digits: usize) -> String {
        self.mac(role, value)
            .iter()
            .flat_map(|b| [b >> 4, b & 0xf])
            .take(digits)
            .map(|n| char::from_digit(n.into(), 16).expect("a nibble"))
            .collect()
    }

    fn cached(&mut self, role: Role, value: &str, make: impl FnOnce(&Self) -> String) -> String {
        if let Some(known) = self.cache.get(&(role, value.to_owned())) {
            return known.clone();
        }
        let made = make(self);
        self.cache.insert((role, value.to_owned()), made.clone());
        made
    }

    pub fn host(&mut self, value: &str) -> String {
        self.cached(Role::Host, value, |p| {
            format!("host-{}", p.hex(Role::Host, value, 8))
        })
    }

    /// Same length as the original, in hex (a 64-digit Docker id stays 64 hex digits).
    pub fn container_id(&mut self, value: &str) -> String {
        let len = value.len().clamp(12, 64);
        self.cached(Role::ContainerId, value, |p| {
            p.hex(Role::ContainerId, value, len)
        })
    }

    pub fn container_name(&mut self, value: &str) -> String {
        self.cached(Role::ContainerName, value, |p| {
            format!("container-{}", p.hex(Role::ContainerName, value, 8))
        })
    }

    pub fn image(&mut self, value: &str) -> String {
        self.cached(Role::Image, value, |p| {
            format!("image-{}", p.hex(Role::Image, value, 8))
        })
    }

    pub fn label(&mut self, value: &str) -> String {
        self.cached(Role::Label, value, |p| {
            format!("label-{}", p.hex(Role::Label, value, 8))
        })
    }

    /// Free text (notes, details): replaced whole.
    pub fn text(&mut self, value: &str) -> String {
        if value.is_empty() {
            return String::new();
        }
        self.cached(Role::Text, value, |p| {
            format!("redacted-{}", p.hex(Role::Text, value, 8))
        })
    }

    /// One command-line argument: kept when it names a program ([`is_program_name`]) or an
    /// option (`-m`, `--nproc-per-node`), or is a number; an option's value (`--store=...`)
    /// as a lone argument would be, a /dev/shm path as a path; else replaced by a short
    /// pseudonym, so that a whole command line fits the kernel record.
    pub fn arg(&mut self, value: &str) -> String {
        if is_program_name(value)
            || is_option_name(value)
            || is_number(value)
            || is_worker_title(value)
        {
            return value.to_owned();
        }
        if let Some((option, given)) = value.split_once('=')
            && is_option_name(option)
        {
            let given = if given.starts_with("/dev/shm") {
                self.path(given)
            } else {
                self.arg(given)
            };
            return format!("{option}={given}");
        }
        self.cached(Role::Arg, value, |p| {
            format!("arg-{}", p.hex(Role::Arg, value, 6))
        })
    }

    /// A path: /dev/shm paths keep their shape, others become `/redacted/<hex>`, followed by
    /// the file's name when it names a program (`/redacted/<hex>/raylet`).
    pub fn path(&mut self, value: &str) -> String {
        if let Some(name) = value.strip_prefix("/dev/shm/") {
            return format!("/dev/shm/{}", self.shm_name(name));
        }
        if value == "/dev/shm" {
            return value.to_owned();
        }
        self.cached(Role::Path, value, |p| {
            let hex = p.hex(Role::Path, value, 12);
            let program = value
                .rsplit_once('/')
                .map(|(_, name)| name)
                .filter(|name| !name.is_empty() && is_program_name(name));
            match (value.starts_with('/'), program) {
                (true, Some(program)) => format!("/redacted/{hex}/{program}"),
                (true, None) => format!("/redacted/{hex}"),
                (false, _) => format!("redacted-{hex}"),
            }
        })
    }

    /// A name inside /dev/shm (relative to it), shape kept, and a known program's prefix kept
    /// whole (`plasma` of Ray's `plasmaXXXXXX`, which has no separator after it).
    pub fn shm_name(&mut self, name: &str) -> String {
        let mut out = String::with_capacity(name.len());
        let known = KNOWN
            .iter()
            .flat_map(|known| known.objects)
            .filter(|prefix| name.starts_with(*prefix))
            .max_by_key(|prefix| prefix.len());
        if let Some(prefix) = known {
            out.push_str(prefix);
        }
        let mut rest = &name[known.map_or(0, |prefix| prefix.len())..];
        while let Some(c) = rest.chars().next() {
            if c.is_ascii_alphanumeric() {
                let end = rest
                    .find(|c: char| !c.is_ascii_alphanumeric())
                    .unwrap_or(rest.len());
                let word = &rest[..end];
                out.push_str(&self.shm_word(word));
                rest = &rest[end..];
            } else {
                out.push(if SHM_SEPARATORS.contains(&c) { c } else { '_' });
                rest = &rest[c.len_utf8()..];
            }
        }
        out
    }

    fn shm_word(&mut self, word: &str) -> String {
        let lower = word.to_ascii_lowercase();
        if word.bytes().all(|b| b.is_ascii_digit())
            || SHM_VOCABULARY.contains(&lower.as_str())
            || known_object_word(&lower)
        {
            return word.to_owned();
        }
        self.cached(Role::ShmWord, word, |p| {
            // A character of the same class for each: digits stay digits, case is kept.
            let mut stream = Vec::new();
            let mut round = 0u32;
            while stream.len() < word.len() {
                stream.extend(p.mac(Role::ShmWord, &format!("{round}:{word}")));
                round += 1;
            }
            word.bytes()
                .zip(stream)
                .map(|(c, r)| match c {
                    b'0'..=b'9' => (b'0' + r % 10) as char,
                    b'A'..=b'Z' => (b'A' + r % 26) as char,
                    _ => (b'a' + r % 26) as char,
                })
                .collect()
        })
    }

    /// A process name: those of programs kept (`python3`, `pt_data_worker`, `postgres`),
    /// others replaced by a name that fits the kernel's 15 characters.
    pub fn comm(&mut self, value: &str) -> String {
        if is_program_name(value) {
            return value.to_owned();
        }
        self.cached(Role::Comm, value, |p| {
            format!("proc-{}", p.hex(Role::Comm, value, 8))
        })
    }
}

/// Whether `name` (a process name, a command's first word) names a program rather than
/// anything of its user's: one of the known programs' ([`KNOWN`]), a generic one
/// ([`GENERIC_COMMS`]), a Python interpreter, or a PyTorch thread.
fn is_program_name(name: &str) -> bool {
    if GENERIC_COMMS.contains(&name) || name.is_empty() {
        return true;
    }
    if KNOWN.iter().any(|known| known.processes.contains(&name)) {
        return true;
    }
    let comm = name;
    if let Some(version) = comm.strip_prefix("python") {
        return version.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    }
    // PyTorch names its threads pt_main_thread, pt_data_worker, pt_autograd_0, ...
    comm.starts_with("pt_") && comm.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A title a known program gives a process of its own, which names nobody and tells the
/// diagnosis which query the process works for (`postgres: parallel worker for PID 34`).
fn is_worker_title(title: &str) -> bool {
    parallel_leader(title).is_some()
}

/// An option's name, with no value (`-m`, `--nproc-per-node`; not `--data=/home/alice`).
fn is_option_name(arg: &str) -> bool {
    let Some(name) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
        return false;
    };
    name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn is_number(arg: &str) -> bool {
    !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `word` (lower case) is a word of a known program's object names (`torch` of
/// `torch_`, `postgresql` of `PostgreSQL.`, `vader` and `segment` of `vader_segment.`).
fn known_object_word(word: &str) -> bool {
    KNOWN
        .iter()
        .flat_map(|known| known.objects)
        .flat_map(|prefix| prefix.split(|c: char| !c.is_ascii_alphanumeric()))
        .any(|known| known.eq_ignore_ascii_case(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_input_same_pseudonym_different_key_different_pseudonym() {
        let mut a = Pseudonyms::with_key([1; 32]);
        let mut b = Pseudonyms::with_key([2; 32]);
        assert_eq!(a.host("build-7"), a.host("build-7"));
        assert_ne!(a.host("build-7"), a.host("build-8"));
        assert_ne!(a.host("build-7"), b.host("build-7"));
        // Roles are kept apart.
        assert_ne!(a.text("x"), a.label("x")[6..]);
        let id = "0123456789abcdef".repeat(4);
        let pseudo = a.container_id(&id);
        assert_eq!(pseudo.len(), 64);
        assert_ne!(pseudo, id);
    }

    #[test]
    fn shm_names_keep_their_shape() {
        let mut p = Pseudonyms::with_key([3; 32]);
        assert_eq!(p.shm_name("torch_4242_17"), "torch_4242_17");
        assert_eq!(p.path("/dev/shm/torch_4242_17"), "/dev/shm/torch_4242_17");
        let psm = p.shm_name("psm_3fa9c2d1");
        assert!(psm.starts_with("psm_"));
        assert_eq!(psm.len(), "psm_3fa9c2d1".len());
        assert_ne!(psm, "psm_3fa9c2d1");
        let secret = p.shm_name("acme-customer.cache\x1b");
        assert!(!secret.contains("acme") && !secret.contains("customer"));
        assert!(secret.ends_with(".cache_"));
        // Same word, same pseudonym, wherever it appears.
        let a = p.shm_name("acme_1");
        assert_eq!(&a[..4], &secret[..4]);
    }

    /// A parallel worker's title says which query it works for, and names nobody: kept, so
    /// that a redacted trace counts the query's processes as the original does. A backend's
    /// title names its user and database: not kept.
    #[test]
    fn a_parallel_workers_title_is_kept_and_a_backends_is_not() {
        let mut p = Pseudonyms::with_key([6; 32]);
        let worker = "postgres: parallel worker for PID 32 ";
        assert_eq!(p.arg(worker), worker);
        let backend = "postgres: alice shop [local] SELECT";
        let redacted = p.arg(backend);
        assert!(
            !redacted.contains("alice") && !redacted.contains("shop"),
            "{redacted}"
        );
        // Not a known program's title, or no pid after it: not kept.
        for other in [
            "app: parallel worker for PID 32",
            "postgres: parallel worker for PID x",
        ] {
            assert_ne!(p.arg(other), other);
        }
    }

    /// Each known program is still recognised after redaction: by its objects, its process
    /// names, and its name in a command line; what names its user is not kept.
    #[test]
    fn known_programs_survive_redaction() {
        use crate::diagnose::known::{by_object, by_process};
        let mut p = Pseudonyms::with_key([5; 32]);
        for known in KNOWN {
            for prefix in known.objects {
                let path = format!("/dev/shm/{prefix}4242ab");
                let redacted = p.path(&path);
                assert_eq!(
                    by_object(&redacted).map(|k| k.program),
                    Some(known.program),
                    "{path} became {redacted}"
                );
            }
            for name in known.processes {
                assert_eq!(p.comm(name), *name);
                assert_eq!(p.arg(name), *name);
                assert_eq!(
                    by_process(&p.comm(name), None).map(|k| k.program),
                    Some(known.program)
                );
            }
        }
        // A command line keeps its program and options, not its user's files and values.
        assert_eq!(p.arg("python"), "python");
        assert_eq!(p.arg("python3.11"), "python3.11");
        assert_eq!(p.arg("-m"), "-m");
        assert_eq!(p.arg("--nproc-per-node"), "--nproc-per-node");
        assert_eq!(p.arg("4"), "4");
        for secret in ["train.py", "/home/alice/train.py", "alice"] {
            let redacted = p.arg(secret);
            assert!(
                redacted.starts_with("arg-") && !redacted.contains("alice"),
                "{secret}"
            );
        }
        // An option keeps its name, and its value what a lone argument would keep.
        let data = p.arg("--data=/home/alice");
        assert!(
            data.starts_with("--data=arg-") && !data.contains("alice"),
            "{data}"
        );
        assert_eq!(
            p.arg("--object_store_memory=209715200"),
            "--object_store_memory=209715200"
        );
        assert_eq!(
            p.arg("--plasma_directory=/dev/shm"),
            "--plasma_directory=/dev/shm"
        );
        // An executable keeps its program's name, not its directories.
        let raylet = p.path("/home/alice/venv/ray/core/src/ray/raylet/raylet");
        assert!(raylet.starts_with("/redacted/") && raylet.ends_with("/raylet"));
        assert!(!raylet.contains("alice") && !raylet.contains("venv"));
    }

    #[test]
    fn paths_outside_dev_shm_and_comms() {
        let mut p = Pseudonyms::with_key([4; 32]);
        let hidden = p.path("/home/alice/train.py");
        assert!(hidden.starts_with("/redacted/") && !hidden.contains("alice"));
        assert_eq!(p.comm("python3.11"), "python3.11");
        assert_eq!(p.comm("pt_data_worker"), "pt_data_worker");
        let secret = p.comm("acme_trainer");
        assert!(secret.starts_with("proc-") && secret.len() <= 15);
    }
}
