//! The fallback when no runtime answers: find containers from `/proc/*/cgroup` alone.
//!
//! Processes are grouped by the container id in their cgroup path (see `cgroup`). A
//! container's main process is its oldest process whose parent is outside the container (the
//! init that the runtime's shim started; `exec`'d processes share that parent but are younger).
//! Pause processes of Kubernetes sandboxes are recognised by name and skipped. Names, images
//! and labels are unknown here: only ids, runtimes, pod uids and what /proc shows.
use std::collections::{BTreeMap, HashMap};

use super::{
    Container, FoundBy, IpcMode, State,
    cgroup::{self, CgroupMatch, PathClass},
    shm::ShmInfo,
};

/// One process, as much as the scan needs.
#[derive(Clone, Debug)]
pub struct ProcRow {
    pub pid: u32,
    pub ppid: u32,
    /// Start time in clock ticks since boot (field 22 of `/proc/PID/stat`).
    pub start: u64,
    pub comm: String,
    pub class: PathClass,
}

/// Reads every process's cgroup and stat.
pub fn read_proc() -> Vec<ProcRow> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.filter_map(Result::ok)
        .filter_map(|process| {
            let stat = process.stat().ok()?;
            let text = std::fs::read_to_string(format!("/proc/{}/cgroup", stat.pid)).ok()?;
            Some(ProcRow {
                pid: stat.pid as u32,
                ppid: stat.ppid as u32,
                start: stat.starttime,
                comm: stat.comm,
                class: cgroup::parse_proc_cgroup(&text),
            })
        })
        .collect()
}

/// The running containers among `rows`, sandboxes (pause) excluded, without /proc facts
/// (the caller enriches them).
pub fn containers(rows: &[ProcRow]) -> Vec<Container> {
    let mut by_id: BTreeMap<&str, Vec<(&ProcRow, &CgroupMatch)>> = BTreeMap::new();
    for row in rows {
        if let PathClass::Container(found) = &row.class {
            by_id.entry(&found.id).or_default().push((row, found));
        }
    }
    let mut found: Vec<Container> = by_id
        .into_values()
        .filter_map(|members| {
            let pids: Vec<u32> = members.iter().map(|(row, _)| row.pid).collect();
            let (init, cgroup) = members
                .iter()
                .filter(|(row, _)| !pids.contains(&row.ppid))
                .min_by_key(|(row, _)| (row.start, row.pid))?;
            let mut container = to_container(init.pid, cgroup);
            if init.comm == "pause" {
                container.labels.insert(SANDBOX_MARK.into(), "true".into());
            }
            Some(container)
        })
        .collect();
    link_pods(&mut found);
    found.retain(|c| !c.labels.contains_key(SANDBOX_MARK));
    found
}

/// Marks a pause container while pods are linked; never seen outside this file.
const SANDBOX_MARK: &str = "shmtrace.scan/sandbox";

/// Containers of one pod share its sandbox's /dev/shm: point them at the pause container.
fn link_pods(found: &mut [Container]) {
    let sandboxes: HashMap<String, String> = found
        .iter()
        .filter(|c| c.labels.contains_key(SANDBOX_MARK))
        .filter_map(|c| Some((c.pod_uid.clone()?, c.id.clone())))
        .collect();
    for container in found.iter_mut() {
        if let Some(sandbox) = container.pod_uid.as_ref().and_then(|u| sandboxes.get(u)) {
            container.sandbox_id = Some(sandbox.clone());
            container.ipc = IpcMode::PodSandbox {
                sandbox_id: sandbox.clone(),
            };
        }
    }
}

fn to_container(pid: u32, cgroup: &CgroupMatch) -> Container {
    Container {
        runtime: cgroup.runtime,
        found_by: FoundBy::CgroupScan,
        id: cgroup.id.clone(),
        name: String::new(),
        image: None,
        pod: None,
        namespace: None,
        pod_uid: cgroup.pod_uid.clone(),
        sandbox_id: None,
        labels: BTreeMap::new(),
        pid: Some(pid),
        mntns: None,
        cgroup_id: None,
        shm: ShmInfo::default(),
        ipc: IpcMode::Unknown,
        state: State::Running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::Runtime;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const P: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
    const UID: &str = "0b4fbdc4_3d0c_4c3c_9b4a_5f1e4c1d2a3b";

    fn row(pid: u32, ppid: u32, start: u64, comm: &str, cgroup: &str) -> ProcRow {
        ProcRow {
            pid,
            ppid,
            start,
            comm: comm.into(),
            class: cgroup::parse_proc_cgroup(cgroup),
        }
    }

    #[test]
    fn finds_the_init_of_each_container_and_skips_pause() {
        let pod = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID}.slice"
        );
        let rows = vec![
            row(1, 0, 1, "systemd", "0::/init.scope"),
            row(
                100,
                1,
                10,
                "containerd-shim",
                "0::/system.slice/containerd.service",
            ),
            // Docker container A: init 200, a child, and a `docker exec` (same parent as init).
            row(
                200,
                100,
                20,
                "python",
                &format!("0::/system.slice/docker-{A}.scope"),
            ),
            row(
                201,
                200,
                21,
                "pt_data_worker",
                &format!("0::/system.slice/docker-{A}.scope"),
            ),
            row(
                250,
                100,
                50,
                "sh",
                &format!("0::/system.slice/docker-{A}.scope"),
            ),
            // A pod: pause sandbox P and container B.
            row(
                300,
                100,
                30,
                "pause",
                &format!("{pod}/cri-containerd-{P}.scope"),
            ),
            row(
                310,
                100,
                31,
                "trainer",
                &format!("{pod}/cri-containerd-{B}.scope"),
            ),
            // conmon is not a container.
            row(
                400,
                1,
                40,
                "conmon",
                &format!("0::/machine.slice/libpod-conmon-{A}.scope"),
            ),
        ];
        let found = containers(&rows);
        assert_eq!(found.len(), 2, "{found:#?}");
        let a = found.iter().find(|c| c.id == A).unwrap();
        assert_eq!((a.runtime, a.pid), (Runtime::Docker, Some(200)));
        assert_eq!(a.found_by, FoundBy::CgroupScan);
        let b = found.iter().find(|c| c.id == B).unwrap();
        assert_eq!((b.runtime, b.pid), (Runtime::Containerd, Some(310)));
        assert_eq!(
            b.pod_uid.as_deref(),
            Some("0b4fbdc4-3d0c-4c3c-9b4a-5f1e4c1d2a3b")
        );
        assert_eq!(
            b.ipc,
            IpcMode::PodSandbox {
                sandbox_id: P.into()
            }
        );
        assert!(b.labels.is_empty());
    }
}
