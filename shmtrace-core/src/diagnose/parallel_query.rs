//! The processes of a PostgreSQL parallel query: its leader and every worker it launched.
//!
//! A parallel hash join's processes each grow their own segment, so a failure asks for as
//! many more segments as the query has processes. Those that share the failing one's objects
//! at the moment it fails (`peers_of`) are only some of them: a worker not yet attached, or
//! one that already failed and exited, is missed, and the advice came out too small (18 MiB
//! for a query that needed 24.5 MiB). A worker says whose it is in its title
//! (`postgres: parallel worker for PID 34`, the leader's pid in its container), alive or not.

use super::known;
use crate::model::{Process, World};

/// A worker that ended this long before the failure belonged to an earlier query of the same
/// leader.
const EARLIER_QUERY_NS: u64 = 1_000_000_000;

/// How many processes the parallel query of `pid` (its leader or one of its workers) had
/// around `ts_ns`, the leader included when it is known; 1 when `pid` is in no parallel
/// query.
pub fn processes(pid: u32, ts_ns: u64, world: &World) -> u32 {
    let Some(process) = world.process(pid) else {
        return 1;
    };
    let leader = leader_of(process).or(process.nspid).unwrap_or(pid);
    let of_this_query = |p: &&Process| {
        p.mntns == process.mntns && p.exit_ns.is_none_or(|end| end + EARLIER_QUERY_NS >= ts_ns)
    };
    let workers = world
        .processes()
        .filter(of_this_query)
        .filter(|p| leader_of(p) == Some(leader))
        .count() as u32;
    if workers == 0 {
        return 1;
    }
    let leader_known = world
        .processes()
        .filter(of_this_query)
        .any(|p| p.nspid.unwrap_or(p.pid) == leader && leader_of(p).is_none());
    workers + u32::from(leader_known)
}

/// The leader's pid in a worker's title, `None` for any other process.
fn leader_of(process: &Process) -> Option<u32> {
    known::parallel_leader(process.title.as_deref()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{Body, Event, Exit, ExitStatus},
        model::ProcSnapshot,
    };

    const MNTNS: u32 = 4026532200;
    const SECOND: u64 = 1_000_000_000;

    /// A postgres process seen at `ts_ns` (pid `pid`, `nspid` in its container), which then
    /// rewrote its command line to `title`.
    fn postgres(world: &mut World, pid: u32, nspid: u32, title: &str, ts_ns: u64) {
        let mut snapshot = ProcSnapshot {
            pid,
            ppid: Some(100),
            comm: "postgres".to_owned(),
            exe: None,
            argv: vec!["/usr/lib/postgresql/15/bin/postgres".to_owned()],
            mntns: MNTNS,
            nspid: Some(nspid),
            fds: Vec::new(),
            mappings: Vec::new(),
        };
        world.seed(&snapshot, ts_ns);
        snapshot.argv = vec![title.to_owned()];
        world.seed(&snapshot, ts_ns);
    }

    fn exit(world: &mut World, pid: u32, ts_ns: u64) {
        world.apply(&Event {
            ts_ns,
            cpu: 0,
            pid,
            tid: pid,
            comm: "postgres".to_owned(),
            mntns: MNTNS,
            cgroup_id: 1,
            container_match: false,
            body: Body::Exit(Exit::from(ExitStatus::Code(1))),
        });
    }

    #[test]
    fn a_query_is_its_leader_and_every_worker_alive_or_just_ended() {
        let mut world = World::new();
        let t = 100 * SECOND;
        postgres(&mut world, 2001, 32, "postgres: app app [local] SELECT", t);
        // A worker of an earlier query of the same leader, ended long before.
        postgres(
            &mut world,
            2002,
            33,
            "postgres: parallel worker for PID 32",
            t,
        );
        exit(&mut world, 2002, t + SECOND);
        let failed_at = t + 10 * SECOND;
        // This query's workers: one failed and ended just before, three still run.
        for (pid, nspid) in [(2010, 40), (2011, 41), (2012, 42), (2013, 43)] {
            postgres(
                &mut world,
                pid,
                nspid,
                "postgres: parallel worker for PID 32 ",
                failed_at - SECOND / 2,
            );
        }
        exit(&mut world, 2010, failed_at - SECOND / 10);
        // Another leader's worker in the same container is another query.
        postgres(
            &mut world,
            2020,
            50,
            "postgres: parallel worker for PID 45",
            failed_at,
        );

        assert_eq!(
            processes(2011, failed_at, &world),
            5,
            "4 workers + the leader"
        );
        assert_eq!(processes(2001, failed_at, &world), 5, "asked of the leader");
        assert_eq!(
            processes(2020, failed_at, &world),
            1,
            "its leader is not known"
        );
        // A backend with no parallel workers is a query of its own.
        postgres(
            &mut world,
            2030,
            60,
            "postgres: app app [local] INSERT",
            failed_at,
        );
        assert_eq!(processes(2030, failed_at, &world), 1);
    }
}
