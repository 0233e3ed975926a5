//! What shmtrace knows about the traced world, built from events: processes with their
//! descriptors and mappings, and /dev/shm objects through their life (created, sized, mapped,
//! unlinked but still held, freed).
//!
//! The model is fed only events and `/proc` snapshots taken by the caller, never reads the
//! machine itself, so a recorded trace replays into the same state.
mod annotation;
mod container_info;
mod holders;
mod object;
mod process;
mod snapshot;
mod usage;
mod world;

pub use annotation::{Annotation, FaultSite, Removal};
pub use container_info::{ContainerInfo, StartedBy, container_label, short_id};
pub use holders::{HeldFile, Holder, ShmHolders};
pub use object::{ObjectState, ShmObject};
pub use process::{Mapping, OpenFd, Process};
pub use snapshot::{ProcSnapshot, SnapshotFd, SnapshotMapping};
pub use usage::{ShmUsage, Totals};
pub use world::{Evictions, QUIET_LINGER_NS, Retention, World};

/// A map keyed by pids, inodes or namespaces, looked up a dozen times for every event:
/// foldhash rather than SipHash, whose cost was a fifth of replay's time (issue 12). Seeded at
/// random per process, like std's.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// A set, as [`FastMap`].
pub type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;
