//! Programs that decide from /dev/shm's free space, with no call failing: they ask (`statvfs`,
//! `fstatvfs`), then refuse to start (vLLM) or put their shared memory somewhere slower (Ray's
//! object store falls back to /tmp). What each traced process saw is kept here. A known
//! program's own rule says what it needed; for any other process, an unsuccessful exit after
//! a look, with no failure of its own, is blamed on what it saw.
use super::{
    Diagnoser, base_name,
    failure::{Cause, Failure, FailureKind},
};
use crate::{
    event::{Call, Event, ExitStatus, SpaceSeen},
    model::{Process, World},
    units::human,
};

/// One look at a /dev/shm's free space.
#[derive(Clone, Debug)]
pub(super) struct Look {
    ts_ns: u64,
    pid: u32,
    comm: String,
    path: Option<String>,
    seen: SpaceSeen,
}

/// Ray's raylet as its command line says: its object store of `--object_store_memory` bytes,
/// kept in `--plasma_directory`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RayStore {
    pub memory: u64,
    pub directory: String,
}

/// Ray's rule, from its sources (`determine_plasma_store_config` in `services.py`,
/// `store_runner.cc`): the driver puts the store in /dev/shm only when /dev/shm has at least
/// the store's size free, else in /tmp; and the raylet shrinks a store bigger than 90% of its
/// directory's free space to that. So /dev/shm needs the store / 0.9 free.
const RAY_FREE_SHARE_PERCENT: u64 = 90;
/// The largest store Ray's driver puts outside /dev/shm on its own (`services.py`).
const RAY_SLOW_STORAGE_THRESHOLD: u64 = 10_000_000_000;
/// More memory than any machine has (1 PiB): a store claimed larger is a made-up figure.
const MAX_PLAUSIBLE_STORE: u64 = 1 << 50;

impl RayStore {
    /// From a raylet's whole command line (its arguments are long: the store's come after the
    /// first kilobyte, beyond what an exec record holds).
    pub fn from_command_line(words: &[&str]) -> Option<RayStore> {
        let value = |flag: &str| {
            words
                .iter()
                .find_map(|w| w.strip_prefix(flag)?.strip_prefix('='))
        };
        Some(RayStore {
            memory: value("--object_store_memory")?.parse().ok()?,
            directory: value("--plasma_directory")?.to_owned(),
        })
    }

    /// The free space Ray needs on /dev/shm for this store to stay there, whole.
    pub fn free_needed(&self) -> u64 {
        // Wide, and capped, never below the store: the figure comes from a command line anyone
        // can write.
        let needed = (u128::from(self.memory) * 100).div_ceil(u128::from(RAY_FREE_SHARE_PERCENT));
        u64::try_from(needed).unwrap_or(u64::MAX)
    }

    /// Whether a raylet could really have this store, by Ray's own checks: the driver refuses
    /// to put a store of more than 10 GB outside /dev/shm (`REQUIRE_SHM_SIZE_THRESHOLD`; a
    /// user who forces it decided so, /dev/shm's size did not), and no machine has more memory
    /// than [`MAX_PLAUSIBLE_STORE`]. A command line that claims more is not advice's basis.
    pub fn plausible(&self) -> bool {
        self.memory <= MAX_PLAUSIBLE_STORE
            && (self.in_dev_shm() || self.memory <= RAY_SLOW_STORAGE_THRESHOLD)
    }

    /// The store of a process that is Ray's raylet, from its command line: its title when
    /// the whole line was read from /proc, else its exec's arguments.
    pub fn of(process: &Process) -> Option<RayStore> {
        if base_name(process.exe.as_deref()?) != "raylet" {
            return None;
        }
        let title: Vec<&str> = process
            .title
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        RayStore::from_command_line(&title).or_else(|| {
            let argv: Vec<&str> = process.argv.iter().map(String::as_str).collect();
            RayStore::from_command_line(&argv)
        })
    }

    /// Why [`RayStore::free_needed`] is what it is, in words a user can check.
    pub fn rule_text(&self) -> String {
        format!(
            "Ray keeps its {} store in /dev/shm whole only when it is at most \
             {RAY_FREE_SHARE_PERCENT}% of the free space: {} free",
            human(self.memory),
            human(self.free_needed())
        )
    }

    pub fn in_dev_shm(&self) -> bool {
        self.directory == "/dev/shm" || self.directory.starts_with("/dev/shm/")
    }
}

/// How soon after a look a program that ends has decided from it.
const DECIDED_WITHIN_NS: u64 = 10_000_000_000;
/// Free space that a program may refuse to start with: below a GiB (vLLM wants several), or
/// below a quarter of the file system.
const SMALL_FREE: u64 = 1 << 30;

/// The statuses a program exits with when a handler of SIGHUP, SIGINT (Ctrl-C) or SIGTERM
/// (docker stop, a runtime's stop) ends it, 128 + the signal's number, as shells report such a
/// death: stopped, not quitting. The probes report no signal that a handler catches, so the
/// status is what tells.
const STOPPED_STATUSES: [i32; 3] = [128 + libc::SIGHUP, 128 + libc::SIGINT, 128 + libc::SIGTERM];

/// Whether a program's decisions need its whole command line, when an exec record holds only
/// the start of it: the pipeline then reads it from /proc (and records it).
pub fn needs_whole_command_line(filename: &str) -> bool {
    base_name(filename) == "raylet"
}

impl Diagnoser {
    /// Takes in a look at a /dev/shm's free space: the process's latest, and its place's.
    pub(super) fn learn_space(&mut self, event: &Event, call: &Call, path: Option<&str>) {
        let Some(seen) = call.space_seen() else {
            return;
        };
        let look = Look {
            ts_ns: event.ts_ns,
            pid: event.pid,
            comm: event.comm.clone(),
            path: path.map(str::to_owned),
            seen,
        };
        // Going ahead showed that what it saw before did not stop it; a later look that
        // finds /dev/shm nearly full may (an Open MPI rank makes its first segment, then
        // looks again before the next and finds no room).
        if seen.free < seen.size / 4 {
            self.went_ahead.remove(&event.pid);
        }
        self.looks_by_place.insert(event.mntns, look.clone());
        self.looks.insert(event.pid, look);
    }

    /// A process that looked at /dev/shm's free space and then ended unsuccessfully, with no
    /// failure of its own: what it saw is the likely reason. What it needed is not in any call.
    /// Only when it ended on its own (an exit status, not one of a stop, no termination request
    /// reached it), soon after looking, and what it saw was small: a look is no decision to
    /// quit.
    pub(super) fn refused_after_look(
        &self,
        event: &Event,
        status: ExitStatus,
        ending: &str,
    ) -> Option<Failure> {
        let look = self.looks.get(&event.pid)?;
        let on_its_own = matches!(status, ExitStatus::Code(code)
                if code != 0 && !STOPPED_STATUSES.contains(&code))
            && !self.interrupted.contains(&event.pid)
            && !self.went_ahead.contains(&event.pid);
        let soon = event.ts_ns.saturating_sub(look.ts_ns) <= DECIDED_WITHIN_NS;
        let small = look.seen.free < SMALL_FREE || look.seen.free < look.seen.size / 4;
        if !(on_its_own && soon && small) {
            return None;
        }
        Some(self.space_failure(
            event.ts_ns,
            event.pid,
            look,
            format!("{ending} with no call failing, after looking at /dev/shm's free space"),
            None,
        ))
    }

    /// Ray's raylet, at its end or at the end of tracing: whether its object store went
    /// elsewhere or was shrunk for want of /dev/shm, judged by Ray's own rule against the
    /// latest look at /dev/shm in its place (the driver's, or the raylet's own).
    pub(super) fn ray_decision(&self, pid: u32, ts_ns: u64, world: &World) -> Option<Failure> {
        let process = world.process(pid)?;
        let store = RayStore::of(process).filter(RayStore::plausible)?;
        let look = self.looks_by_place.get(&process.mntns)?;
        let needed = store.free_needed();
        // In /dev/shm, the raylet shrinks a store above 90% of the free space. Elsewhere, the
        // driver chose so when /dev/shm had less free than the store; with more, the user did
        // (`_plasma_directory`), and /dev/shm's size is not the reason.
        let short = if store.in_dev_shm() {
            look.seen.free < needed
        } else {
            look.seen.free < store.memory
        };
        if !short {
            return None;
        }
        let decided = if store.in_dev_shm() {
            format!(
                "Ray's raylet shrank its {} object store to 90% of /dev/shm's free space",
                human(store.memory)
            )
        } else {
            format!(
                "Ray's {} object store went to {} instead of /dev/shm (slower)",
                human(store.memory),
                store.directory
            )
        };
        let used = look.seen.size.saturating_sub(look.seen.free);
        let basis = format!(
            "{}, + {} already used when it looked",
            store.rule_text(),
            human(used)
        );
        let need = used.saturating_add(needed);
        Some(self.space_failure(ts_ns, pid, look, decided, Some((need, basis))))
    }

    fn space_failure(
        &self,
        ts_ns: u64,
        pid: u32,
        look: &Look,
        decided: String,
        need: Option<(u64, String)>,
    ) -> Failure {
        let (need, need_basis) = need.unzip();
        Failure {
            ts_ns,
            pid,
            tid: pid,
            comm: look.comm.clone(),
            cause: Cause::ShmFull,
            kind: FailureKind::SpaceCheck {
                decided,
                path: look.path.clone(),
                looked_by: look.pid,
                size: look.seen.size,
                free: look.seen.free,
                need,
                need_basis,
            },
            dev: None,
            usage: None,
            capacity: None,
            workers_allocating: 0,
            unmet: 0,
            held: 0,
            peers: 0,
            leftovers: Vec::new(),
            others: Vec::new(),
            removal: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RayStore;

    #[test]
    fn a_hostile_store_size_is_no_basis_and_its_arithmetic_never_shrinks() {
        let store = |memory: u64, directory: &str| RayStore {
            memory,
            directory: directory.into(),
        };
        let forged = store(u64::MAX, "/tmp/ray");
        assert!(forged.free_needed() >= forged.memory);
        assert!(!forged.plausible());
        assert!(!store(u64::MAX, "/dev/shm").plausible());
        assert!(!store(11_000_000_000, "/tmp/ray").plausible());
        assert!(store(11_000_000_000, "/dev/shm").plausible());
        assert!(store(200 << 20, "/tmp/ray").plausible());
    }

    #[test]
    fn a_raylet_command_line_gives_its_store() {
        let words = [
            "/venv/ray/core/src/ray/raylet/raylet",
            "--node_manager_port=0",
            "--object_store_memory=209715200",
            "--plasma_directory=/tmp/ray",
        ];
        let store = RayStore::from_command_line(&words).expect("a store");
        assert_eq!(store.memory, 209_715_200);
        assert_eq!(store.directory, "/tmp/ray");
        // 200 MiB / 0.9, rounded up: what Ray's own advice (x 1.1) falls short of.
        assert_eq!(store.free_needed(), 233_016_889);
        assert!(!store.in_dev_shm());
        assert_eq!(RayStore::from_command_line(&words[..3]), None);
        let hostile = RayStore {
            memory: u64::MAX,
            directory: "/dev/shm".into(),
        };
        // Capped, never below the store (saturating the product first gave a 90th of it).
        assert_eq!(hostile.free_needed(), u64::MAX);
    }
}
