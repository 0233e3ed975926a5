//! What a rotated file needs to read on its own: the processes alive when it starts, with their
//! /dev/shm descriptors and mappings, as the model knows them.
use super::user::{ProcessSnapshot, SnapshotFdRecord, SnapshotMappingRecord, UserRecord};
use crate::model::World;

/// A `Snapshot` record, stamped `ts_ns`, for every live process the model knows. Pass to
/// `TraceWriter::flush` as the carry-over: `&mut || world_snapshots(&world, now)`.
pub fn world_snapshots(world: &World, ts_ns: u64) -> Vec<(u64, UserRecord)> {
    let mut processes: Vec<_> = world.processes().filter(|p| p.alive()).collect();
    processes.sort_by_key(|p| p.pid);
    processes
        .into_iter()
        .map(|process| {
            let object = |inode| world.object(inode);
            let snapshot = ProcessSnapshot {
                pid: process.pid,
                ppid: process.parent,
                comm: process.comm.clone(),
                exe: process.exe.clone(),
                argv: process.argv.clone(),
                mntns: process.mntns,
                nspid: process.nspid,
                fds: process
                    .fds
                    .iter()
                    .map(|(fd, open)| {
                        let known = object(&open.inode);
                        SnapshotFdRecord {
                            fd: *fd,
                            dev: open.inode.dev,
                            ino: open.inode.ino,
                            path: known
                                .and_then(|o| o.path.as_deref())
                                .map(str::to_owned)
                                .unwrap_or_default(),
                            deleted: known.is_some_and(|o| !o.linked),
                            cloexec: open.cloexec,
                            size: known.map_or(0, |o| o.size),
                        }
                    })
                    .collect(),
                mappings: process
                    .mappings
                    .iter()
                    .map(|m| {
                        let known = object(&m.inode);
                        SnapshotMappingRecord {
                            start: m.start,
                            len: m.len,
                            offset: m.offset,
                            dev: m.inode.dev,
                            ino: m.inode.ino,
                            path: known
                                .and_then(|o| o.path.as_deref())
                                .map(str::to_owned)
                                .unwrap_or_default(),
                            deleted: known.is_some_and(|o| !o.linked),
                        }
                    })
                    .collect(),
            };
            (ts_ns, UserRecord::Snapshot(snapshot))
        })
        .collect()
}
