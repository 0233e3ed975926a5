//! Entry points for the fuzz targets (`fuzz/`): what container runtimes and /proc hand over,
//! as arbitrary bytes, through the parsers that read it. Built only by `cargo fuzz`.
use std::path::Path;

use super::{Runtime, cgroup, docker, shm};

/// Lines of /proc/PID/cgroup, and cgroup paths.
pub fn cgroup_lines(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = cgroup::parse_proc_cgroup(text);
        for line in text.lines() {
            let _ = cgroup::classify_path(line);
        }
    }
}

/// A /proc/PID/mountinfo: the size of the tmpfs on /dev/shm.
pub fn mountinfo(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = shm::size_option_from_mountinfo(text);
    }
}

/// The answer of Docker's (or Podman's) `GET /containers/ID/json`.
pub fn docker_inspect(data: &[u8]) {
    if let Ok(inspect) = serde_json::from_slice::<docker::Inspect>(data) {
        let container =
            docker::to_container(inspect, Runtime::Docker, Path::new("/run/docker.sock"));
        let _ = container.display_name();
    }
}

/// The answer of a CRI runtime's verbose `ContainerStatus`.
pub fn cri_status(data: &[u8]) {
    super::cri::fuzz_status(data);
}
