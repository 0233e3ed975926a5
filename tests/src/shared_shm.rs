//! Jobs of two Docker containers on one /dev/shm (`--ipc=shareable`, `--ipc=container:`, as a
//! pod's containers share one): what one holds or removes is felt by the other.
use std::path::PathBuf;

use crate::{
    docker::{Container, wait_for},
    sizing::{Job, Started, workloads_mount},
    tempdir,
};

const PYTHON: &str = "/usr/bin/python3 -B";

/// Two containers on one /dev/shm: the owner's job (shared_name.py) and a clean-up in the
/// other that removes the job's name once it is there (`rm`); the job's reader attaches once
/// it is gone.
pub struct RemovedNextDoor {
    /// For a host-wide tracer: the owner touches /dev/shm until it goes, so that the tracer
    /// can be seen to know its container first; and the clean-up is a sweeper that stays (a
    /// sidecar's), whose command line /proc still has when its removal is read (host-wide,
    /// the probes report no exec of a process before its first /dev/shm call, and an `rm` is
    /// gone by then).
    pub host_wide: bool,
}

/// The host-wide clean-up: Python removing the name, then staying.
const SWEEPER: &str = "/usr/bin/python3 -B -c 'import os, time\nwhile not \
                       os.path.exists(\"/dev/shm/job_buf\"): time.sleep(0.05)\n\
                       os.unlink(\"/dev/shm/job_buf\")\nopen(\"/sync/removed\", \"w\")\n\
                       time.sleep(600)'";

/// The cleaner first: dropped (removed) before the container whose /dev/shm it uses.
pub struct RemovedNextDoorRun {
    pub cleaner: Container,
    pub owner: Container,
    names: String,
    sync: PathBuf,
}

impl Job for RemovedNextDoor {
    fn describe(&self) -> String {
        "a name removed by a clean-up in another container".to_owned()
    }

    fn start(&self, shm_bytes: u64) -> Box<dyn Started> {
        let sync = tempdir();
        let sync_mount = format!("{}:/sync", sync.display());
        let mut flags = workloads_mount();
        flags.extend(
            [
                "-w",
                "/w",
                "-v",
                &sync_mount,
                "--ipc=shareable",
                &format!("--shm-size={shm_bytes}b"),
            ]
            .map(str::to_owned),
        );
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let warm_up = if self.host_wide {
            "touch /dev/shm/warm-up; rm -f /dev/shm/warm-up; "
        } else {
            ""
        };
        let owner = Container::run(
            "shared-owner",
            &flags,
            &format!(
                "while [ ! -e /work/go ]; do {warm_up}sleep 0.05; done; {PYTHON} shared_name.py \
                 --attach-after /sync/removed"
            ),
        );
        let cleaner = Container::run(
            "shared-cleaner",
            &[
                "-v",
                &sync_mount,
                &format!("--ipc=container:{}", owner.name),
            ],
            if self.host_wide {
                SWEEPER
            } else {
                "while [ ! -e /dev/shm/job_buf ]; do sleep 0.05; done; rm -f /dev/shm/job_buf; \
                 touch /sync/removed; exec sleep 600"
            },
        );
        let names = format!("{},{}", owner.name, cleaner.name);
        Box::new(RemovedNextDoorRun {
            cleaner,
            owner,
            names,
            sync,
        })
    }
}

impl Started for RemovedNextDoorRun {
    fn container(&self) -> &str {
        &self.names
    }

    fn go(&mut self) -> bool {
        self.owner.signal("go");
        self.owner.wait() == 0
    }
}

impl Drop for RemovedNextDoorRun {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.sync);
    }
}

/// Two containers on one /dev/shm of the size asked for: the holder's 40 MiB, and the
/// writer asking for 40 MiB more (the one to trace: [`Started::container`]).
pub struct SharedShm;

pub struct SharedRun {
    _holder: Container,
    writer: Container,
}

impl Job for SharedShm {
    fn describe(&self) -> String {
        "a writer beside a holder on a shared /dev/shm".to_owned()
    }

    fn start(&self, shm_bytes: u64) -> Box<dyn Started> {
        let size = format!("--shm-size={shm_bytes}b");
        let holder = Container::run(
            "shared-holder",
            &["--ipc=shareable", &size],
            "dd if=/dev/zero of=/dev/shm/cache bs=1M count=40 2>/dev/null && touch /work/up && \
             exec sleep 600 < /dev/shm/cache",
        );
        wait_for(&holder.work.join("up"));
        let writer = Container::run(
            "shared-writer",
            &[&format!("--ipc=container:{}", holder.name), &size],
            "while [ ! -e /work/go ]; do sleep 0.05; done; /usr/bin/python3 -c 'import os; \
             fd = os.open(\"/dev/shm/more\", os.O_CREAT | os.O_RDWR, 0o600); \
             os.posix_fallocate(fd, 0, 40 << 20)'",
        );
        Box::new(SharedRun {
            _holder: holder,
            writer,
        })
    }
}

impl Started for SharedRun {
    fn container(&self) -> &str {
        &self.writer.name
    }

    fn go(&mut self) -> bool {
        self.writer.signal("go");
        self.writer.wait() == 0
    }
}
