//! Real Python programs from PyPI for the tests, each in a venv outside the tree (under /opt),
//! installed once by .ci/run, or here when it is missing. Containers get a venv bind-mounted
//! read-only with the host's /usr: its interpreter is Debian's python3.11.
use std::{path::Path, process::Command};

/// A venv holding one pinned package.
pub struct Venv {
    pub path: &'static str,
    /// What pip installs: `torch==2.15.0`.
    pub requirement: &'static str,
    /// The module whose import says the venv works.
    pub module: &'static str,
}

impl Venv {
    fn imports(&self) -> bool {
        Command::new(Path::new(self.path).join("bin/python"))
            .args(["-c", &format!("import {}", self.module)])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// Makes sure the module imports, installing the venv (as .ci/run does) when it does not.
    /// Fails loudly when that is impossible. Callers run it once per test process.
    pub fn ensure(&self) {
        if self.imports() {
            return;
        }
        let made = Command::new("/usr/bin/python3")
            .args(["-m", "venv", self.path])
            .status()
            .expect("running python3 -m venv (apt-get install python3-venv)");
        assert!(made.success(), "python3 -m venv {} failed", self.path);
        let installed = Command::new(Path::new(self.path).join("bin/pip"))
            .args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                self.requirement,
            ])
            .status()
            .expect("running pip");
        assert!(
            installed.success() && self.imports(),
            "could not install {} into {} (PyPI must be reachable): run .ci/run",
            self.requirement,
            self.path
        );
    }

    /// Docker flags that make the venv usable in a container built from the busybox test
    /// image.
    pub fn docker_mounts(&self) -> Vec<String> {
        vec!["-v".to_owned(), format!("{0}:{0}:ro", self.path)]
    }
}
