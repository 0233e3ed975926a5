//! What shmtrace knows about the traced world, built from events: processes with their
//! descriptors and mappings, and /dev/shm objects through their life (created, sized, mapped,
//! unlinked but still held, freed).
//!
//! The model is fed only events and `/proc` snapshots taken by the caller, never reads the
//! machine itself, so a recorded trace replays into the same state.
mod container_info;
mod object;
mod process;
mod world;

pub use container_info::{ContainerInfo, StartedBy, container_label, short_id};
pub use object::{ObjectState, ShmObject};
pub use process::{Mapping, OpenFd, Process};
pub use world::{Annotation, ProcSnapshot, ShmUsage, SnapshotFd, SnapshotMapping, World};
