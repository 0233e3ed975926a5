//! A real Ray (from PyPI) for the tests: its venv (`/opt/shmtrace-ray-venv`, see
//! [`crate::venv`]), and a local cluster as a sizing [`Job`] that works when Ray keeps its
//! object store in /dev/shm, whole. Ray decides that from /dev/shm's free space and no call
//! fails either way, so the job's exit status alone cannot tell.
use std::{fs, sync::OnceLock};

use crate::{
    docker::Container,
    sizing::{Job, MIB, Started, workloads_mount},
    venv::Venv,
};

pub const VENV: Venv = Venv {
    path: "/opt/shmtrace-ray-venv",
    requirement: "ray==2.60.0",
    module: "ray",
};

fn venv() -> &'static str {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| VENV.ensure());
    VENV.path
}

/// What `ray_object_store.py` reports when the store is in /dev/shm, at its full size.
const WHOLE_IN_DEV_SHM: &str = "directory=/dev/shm shrunk=0";

/// `ray.init(object_store_memory=store)` and one object through the store, in a container.
pub struct RayCluster {
    pub store: u64,
}

impl RayCluster {
    /// A container whose Ray driver is running already and waits for [`Container::signal`]
    /// `go` to start the cluster (a driver a node agent meets mid-run, no exec of it seen).
    /// Returns once the driver waits; `/work/store` says where the store went, at the end.
    pub fn driver_waiting(&self, shm_bytes: u64) -> Container {
        let venv = venv();
        let mut flags = vec![format!("--shm-size={shm_bytes}b")];
        flags.extend(workloads_mount());
        flags.extend(VENV.docker_mounts());
        for file in ["/etc/passwd", "/etc/group"] {
            flags.extend(["-v".to_owned(), format!("{file}:{file}:ro")]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let script = format!(
            "cd /w && {venv}/bin/python -B ray_object_store.py {} --report /work/store \
             --after /work/go",
            self.store
        );
        let container = Container::run("ray-driver", &flags, &script);
        crate::docker::wait_for(&container.work.join("go.waiting"));
        container
    }
}

impl Job for RayCluster {
    fn describe(&self) -> String {
        format!("Ray, a {} MiB object store", self.store / MIB)
    }

    fn start(&self, shm_bytes: u64) -> Box<dyn Started> {
        let venv = venv();
        let mut flags = vec![format!("--shm-size={shm_bytes}b")];
        flags.extend(workloads_mount());
        flags.extend(VENV.docker_mounts());
        // Ray looks its user up (its token goes to $HOME/.ray).
        for file in ["/etc/passwd", "/etc/group"] {
            flags.extend(["-v".to_owned(), format!("{file}:{file}:ro")]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let script = format!(
            "while [ ! -e /work/go ]; do sleep 0.05; done; cd /w && \
             {venv}/bin/python -B ray_object_store.py {} --report /work/store",
            self.store
        );
        Box::new(StartedRay(Container::run("ray", &flags, &script)))
    }
}

struct StartedRay(Container);

impl Started for StartedRay {
    fn container(&self) -> &str {
        &self.0.name
    }

    fn go(&mut self) -> bool {
        self.0.signal("go");
        let exit_code = self.0.wait();
        let report = fs::read_to_string(self.0.work.join("store")).unwrap_or_default();
        exit_code == 0 && report.trim() == WHOLE_IN_DEV_SHM
    }
}
