//! Which container a process belongs to, from its cgroup path (`/proc/PID/cgroup`).
//!
//! Every runtime puts a container's processes in a cgroup whose path holds the container id;
//! the layout depends on the runtime and on the cgroup driver (systemd or cgroupfs):
//!
//! | runtime, driver | path |
//! |---|---|
//! | Docker, cgroupfs | `/docker/<id>` |
//! | Docker, systemd | `/system.slice/docker-<id>.scope` |
//! | Podman, systemd | `/machine.slice/libpod-<id>.scope` (rootless: under `user@UID.service`), sometimes `.../libpod-<id>.scope/container` |
//! | Podman, cgroupfs | `/libpod_parent/libpod-<id>` |
//! | containerd (CRI), systemd | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope` |
//! | CRI-O, systemd | `.../kubepods-besteffort-pod<uid>.slice/crio-<id>.scope` |
//! | any CRI, cgroupfs | `/kubepods/burstable/pod<uid>/<id>` (CRI-O: `.../crio-<id>`) |
//! | conmon (Podman, CRI-O) | `libpod-conmon-<id>.scope`, `crio-conmon-<id>.scope`: a monitor, not the container |
//!
//! Guaranteed pods have no QoS segment (`/kubepods/pod<uid>/...`, `kubepods-pod<uid>.slice`).
//! In a systemd slice name the pod uid's dashes are underscores.
//!
//! The innermost match wins, so a container nested in another (Docker in Docker) is found as
//! itself.

use super::Runtime;

/// Kubernetes quality-of-service class, from the pod's cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// A container found in a cgroup path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMatch {
    pub runtime: Runtime,
    /// Full container id, 64 lowercase hex digits.
    pub id: String,
    /// Kubernetes pod uid (with dashes), when under kubepods.
    pub pod_uid: Option<String>,
    pub qos: Option<QosClass>,
    /// The cgroup path the match came from.
    pub path: String,
    /// The v1 controller list of the line it came from, or `None` for the v2 line.
    pub controllers: Option<String>,
}

/// What a single cgroup path says about the processes in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathClass {
    /// Inside a container.
    Container(CgroupMatch),
    /// A runtime's monitor process (conmon) for container `id`: on the host side, not in it.
    Conmon { runtime: Runtime, id: String },
    /// Not a container cgroup this module knows.
    Host,
}

/// Which container, if any, a process is in, from the text of its `/proc/PID/cgroup`.
///
/// cgroup v2 (`0::path`) is read first: on a pure v2 host it is the only line, and on a hybrid
/// host it names the container when the runtime uses v2. Otherwise the v1 hierarchies are
/// tried, those every runtime populates first (a process outside a controller's hierarchy
/// shows `/` there).
pub fn parse_proc_cgroup(text: &str) -> PathClass {
    let mut lines: Vec<(u8, Option<&str>, &str)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let _hierarchy_id = fields.next()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            let rank = if controllers.is_empty() {
                0
            } else {
                v1_rank(controllers)
            };
            let controllers = (!controllers.is_empty()).then_some(controllers);
            Some((rank, controllers, path))
        })
        .collect();
    lines.sort_by_key(|(rank, _, _)| *rank);
    let mut conmon = None;
    for (_, controllers, path) in lines {
        match classify_path(path) {
            PathClass::Container(mut found) => {
                found.controllers = controllers.map(str::to_owned);
                return PathClass::Container(found);
            }
            class @ PathClass::Conmon { .. } => {
                conmon.get_or_insert(class);
            }
            PathClass::Host => {}
        }
    }
    conmon.unwrap_or(PathClass::Host)
}

/// Preference among v1 hierarchies: those a runtime always joins come first.
fn v1_rank(controllers: &str) -> u8 {
    let has = |name: &str| controllers.split(',').any(|c| c == name);
    if has("memory") {
        1
    } else if has("pids") {
        2
    } else if has("cpu") || has("cpuacct") {
        3
    } else if has("name=systemd") {
        5
    } else {
        4
    }
}

/// What a single cgroup path says: the innermost container segment, or a conmon scope.
pub fn classify_path(path: &str) -> PathClass {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut found = PathClass::Host;
    for (i, segment) in segments.iter().enumerate() {
        let previous = i.checked_sub(1).map(|p| segments[p]);
        if let Some(class) = classify_segment(segment, previous) {
            found = class;
        }
    }
    if let PathClass::Container(found) = &mut found {
        found.path = path.to_owned();
        let (pod_uid, qos) = kubepods(&segments);
        found.pod_uid = pod_uid;
        found.qos = qos;
    }
    found
}

/// One path segment: a container scope, a conmon scope, or nothing.
fn classify_segment(segment: &str, previous: Option<&str>) -> Option<PathClass> {
    // Conmon first: `libpod-conmon-<id>` would otherwise not match `libpod-<64hex>` anyway,
    // but being explicit keeps the intent visible.
    let unit = segment.strip_suffix(".scope").unwrap_or(segment);
    for (prefix, runtime) in [
        ("libpod-conmon-", Runtime::Podman),
        ("crio-conmon-", Runtime::CriO),
    ] {
        if let Some(id) = unit.strip_prefix(prefix).filter(|id| is_full_id(id)) {
            return Some(PathClass::Conmon {
                runtime,
                id: id.to_owned(),
            });
        }
    }
    for (prefix, runtime) in [
        ("docker-", Runtime::Docker),
        ("libpod-", Runtime::Podman),
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::CriO),
    ] {
        if let Some(id) = unit.strip_prefix(prefix).filter(|id| is_full_id(id)) {
            return Some(container(runtime, id));
        }
    }
    if is_full_id(segment) {
        let runtime = match previous {
            Some("docker") => Runtime::Docker,
            // kubepods cgroupfs layout: the parent is `pod<uid>`, and the runtime is not named.
            _ => Runtime::Unknown,
        };
        return Some(container(runtime, segment));
    }
    None
}

fn container(runtime: Runtime, id: &str) -> PathClass {
    PathClass::Container(CgroupMatch {
        runtime,
        id: id.to_owned(),
        pod_uid: None,
        qos: None,
        path: String::new(),
        controllers: None,
    })
}

/// The pod uid and QoS class from a path under kubepods, in either driver's spelling.
fn kubepods(segments: &[&str]) -> (Option<String>, Option<QosClass>) {
    let Some(start) = segments
        .iter()
        .position(|s| *s == "kubepods" || *s == "kubepods.slice")
    else {
        return (None, None);
    };
    let mut qos = QosClass::Guaranteed;
    for segment in &segments[start + 1..] {
        let unit = segment.strip_suffix(".slice").unwrap_or(segment);
        // systemd: `kubepods-burstable` then `kubepods-burstable-pod<uid>`; cgroupfs:
        // `burstable` then `pod<uid>`.
        let unit = unit.strip_prefix("kubepods-").unwrap_or(unit);
        let (class, rest) = if let Some(rest) = unit.strip_prefix("burstable") {
            (Some(QosClass::Burstable), rest)
        } else if let Some(rest) = unit.strip_prefix("besteffort") {
            (Some(QosClass::BestEffort), rest)
        } else {
            (None, unit)
        };
        if let Some(class) = class {
            qos = class;
        }
        let rest = rest.strip_prefix('-').unwrap_or(rest);
        if let Some(uid) = rest.strip_prefix("pod").filter(|u| !u.is_empty()) {
            return (Some(uid.replace('_', "-")), Some(qos));
        }
    }
    (None, Some(qos))
}

/// 64 lowercase hex digits: the id every runtime here gives a container.
pub fn is_full_id(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e1bd2c2d8e3b1a0f9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7";
    const ID2: &str = "9a8b7c6d5e4f3a2b1c0d9e8f73f4e1bd2c2d8e3b1a0f9c8d7e6f5a4b3c2d1e0f";
    const UID: &str = "0b4fbdc4-3d0c-4c3c-9b4a-5f1e4c1d2a3b";
    const UID_SYSTEMD: &str = "0b4fbdc4_3d0c_4c3c_9b4a_5f1e4c1d2a3b";

    fn container_of(text: &str) -> CgroupMatch {
        match parse_proc_cgroup(text) {
            PathClass::Container(found) => found,
            other => panic!("expected a container in {text:?}, got {other:?}"),
        }
    }

    /// Docker with the cgroupfs driver on a hybrid cgroup v1 host (this project's CI host):
    /// the container shows in every v1 hierarchy, and `0::/` on the v2 line.
    #[test]
    fn docker_cgroupfs_v1() {
        let text = format!(
            "12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n4:cpu,cpuacct:/docker/{ID}\n\
             1:name=systemd:/docker/{ID}\n0::/\n"
        );
        let found = container_of(&text);
        assert_eq!(found.runtime, Runtime::Docker);
        assert_eq!(found.id, ID);
        assert_eq!(found.controllers.as_deref(), Some("memory"));
        assert_eq!(found.pod_uid, None);
    }

    /// Captured verbatim on this project's CI host (Docker 20.10, cgroupfs driver, hybrid
    /// layout): the unified line names the container too.
    #[test]
    fn docker_cgroupfs_hybrid_as_captured() {
        let id = "44a3f502f315e7bd8820c3452b9dfcc1d02070bd47649bdae689cdec1908de7e";
        let text = format!(
            "9:name=systemd:/docker/{id}\n8:pids:/docker/{id}\n7:blkio:/docker/{id}\n\
             6:freezer:/docker/{id}\n5:devices:/docker/{id}\n4:memory:/docker/{id}\n\
             3:cpuset:/docker/{id}\n2:cpuacct:/docker/{id}\n1:cpu:/docker/{id}\n0::/docker/{id}\n"
        );
        let found = container_of(&text);
        assert_eq!((found.runtime, found.id.as_str()), (Runtime::Docker, id));
        assert_eq!(found.controllers, None, "the v2 line is read first");
    }

    #[test]
    fn docker_systemd_v2() {
        let found = container_of(&format!("0::/system.slice/docker-{ID}.scope\n"));
        assert_eq!(found.runtime, Runtime::Docker);
        assert_eq!(found.id, ID);
        assert_eq!(found.controllers, None);
        assert_eq!(found.path, format!("/system.slice/docker-{ID}.scope"));
    }

    #[test]
    fn docker_systemd_v1_only_in_some_hierarchies() {
        // A process moved by hand into one hierarchy only: the populated line wins.
        let text = format!("5:memory:/\n3:pids:/system.slice/docker-{ID}.scope\n0::/\n");
        assert_eq!(container_of(&text).controllers.as_deref(), Some("pids"));
    }

    #[test]
    fn containerd_kubepods_systemd_all_qos_classes() {
        for (slices, qos) in [
            (
                format!("kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice"),
                QosClass::Burstable,
            ),
            (
                format!("kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice"),
                QosClass::BestEffort,
            ),
            (
                format!("kubepods-pod{UID_SYSTEMD}.slice"),
                QosClass::Guaranteed,
            ),
        ] {
            let text = format!("0::/kubepods.slice/{slices}/cri-containerd-{ID}.scope\n");
            let found = container_of(&text);
            assert_eq!(found.runtime, Runtime::Containerd, "{text}");
            assert_eq!(found.id, ID);
            assert_eq!(found.pod_uid.as_deref(), Some(UID), "{text}");
            assert_eq!(found.qos, Some(qos), "{text}");
        }
    }

    #[test]
    fn crio_kubepods_systemd() {
        let text = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice/crio-{ID}.scope\n"
        );
        let found = container_of(&text);
        assert_eq!(found.runtime, Runtime::CriO);
        assert_eq!(found.qos, Some(QosClass::BestEffort));
        assert_eq!(found.pod_uid.as_deref(), Some(UID));
        // CRI-O on cgroup v2 may put the processes in a child cgroup of the scope.
        let nested = format!(
            "0::/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/crio-{ID}.scope/container\n"
        );
        let found = container_of(&nested);
        assert_eq!((found.runtime, found.id.as_str()), (Runtime::CriO, ID));
        assert_eq!(found.qos, Some(QosClass::Guaranteed));
    }

    #[test]
    fn kubepods_cgroupfs_all_qos_classes() {
        for (middle, qos) in [
            ("burstable/", QosClass::Burstable),
            ("besteffort/", QosClass::BestEffort),
            ("", QosClass::Guaranteed),
        ] {
            let text = format!(
                "11:memory:/kubepods/{middle}pod{UID}/{ID}\n1:name=systemd:/kubepods/{middle}pod{UID}/{ID}\n"
            );
            let found = container_of(&text);
            assert_eq!(found.runtime, Runtime::Unknown, "{text}");
            assert_eq!(found.id, ID);
            assert_eq!(found.pod_uid.as_deref(), Some(UID), "{text}");
            assert_eq!(found.qos, Some(qos), "{text}");
        }
    }

    #[test]
    fn crio_kubepods_cgroupfs() {
        let found = container_of(&format!("0::/kubepods/burstable/pod{UID}/crio-{ID}\n"));
        assert_eq!(found.runtime, Runtime::CriO);
        assert_eq!(found.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn the_pod_cgroup_itself_is_not_a_container() {
        assert_eq!(
            parse_proc_cgroup(&format!("0::/kubepods/burstable/pod{UID}\n")),
            PathClass::Host
        );
        assert_eq!(
            parse_proc_cgroup(&format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice\n"
            )),
            PathClass::Host
        );
    }

    #[test]
    fn podman_layouts() {
        for path in [
            format!("/machine.slice/libpod-{ID}.scope"),
            format!("/machine.slice/libpod-{ID}.scope/container"),
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
            format!("/libpod_parent/libpod-{ID}"),
        ] {
            let found = container_of(&format!("0::{path}\n"));
            assert_eq!(
                (found.runtime, found.id.as_str()),
                (Runtime::Podman, ID),
                "{path}"
            );
        }
        // Podman with cgroup v1 and the cgroupfs manager.
        let v1 = format!(
            "9:memory:/libpod_parent/libpod-{ID}\n1:name=systemd:/libpod_parent/libpod-{ID}\n"
        );
        assert_eq!(container_of(&v1).runtime, Runtime::Podman);
    }

    #[test]
    fn conmon_scopes_are_not_containers() {
        assert_eq!(
            parse_proc_cgroup(&format!("0::/machine.slice/libpod-conmon-{ID}.scope\n")),
            PathClass::Conmon {
                runtime: Runtime::Podman,
                id: ID.into()
            }
        );
        assert_eq!(
            parse_proc_cgroup(&format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice/crio-conmon-{ID}.scope\n"
            )),
            PathClass::Conmon {
                runtime: Runtime::CriO,
                id: ID.into()
            }
        );
        // v1: conmon on one line does not hide a container on another.
        let text = format!(
            "5:memory:/docker/{ID2}\n1:name=systemd:/system.slice/crio-conmon-{ID}.scope\n"
        );
        assert_eq!(container_of(&text).id, ID2);
    }

    #[test]
    fn innermost_container_wins() {
        let found = container_of(&format!("0::/docker/{ID}/docker/{ID2}\n"));
        assert_eq!(found.id, ID2);
    }

    #[test]
    fn host_processes_and_near_misses() {
        for text in [
            "0::/\n".to_owned(),
            "0::/init.scope\n".to_owned(),
            "0::/system.slice/sshd.service\n".to_owned(),
            // This CI host's own sandbox: a 32-hex id under a name no runtime uses.
            "4:memory:/process_api/7611a99d8209810ef56ddfc0d109e76a\n0::/\n".to_owned(),
            // Not 64 hex digits.
            "0::/system.slice/docker-abc.scope\n".to_owned(),
            format!("0::/system.slice/docker-{}.scope\n", ID.to_uppercase()),
            "garbage without colons\n".to_owned(),
            String::new(),
        ] {
            assert_eq!(parse_proc_cgroup(&text), PathClass::Host, "{text:?}");
        }
    }
}
