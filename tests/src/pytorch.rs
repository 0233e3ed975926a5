//! A real PyTorch (from PyPI) for the tests, in a venv outside the tree (`/opt/shmtrace-venv`),
//! installed once by .ci/run, or by [`venv`] when it is missing. Containers get it bind-mounted
//! read-only with the host's /usr (the venv's interpreter is Debian's python3.11).
use std::{path::Path, process::Command, sync::OnceLock};

/// Where the venv lives.
pub const VENV: &str = "/opt/shmtrace-venv";
/// The release the tests were measured with.
pub const TORCH: &str = "torch==2.15.0";

fn imports_torch() -> bool {
    Command::new(Path::new(VENV).join("bin/python"))
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The venv's interpreter, after making sure `import torch` works in it; installs the venv
/// (as .ci/run does) when it does not. Fails loudly when that is impossible.
pub fn venv() -> &'static Path {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        if imports_torch() {
            return;
        }
        let made = Command::new("/usr/bin/python3")
            .args(["-m", "venv", VENV])
            .status()
            .expect("running python3 -m venv (apt-get install python3-venv)");
        assert!(made.success(), "python3 -m venv {VENV} failed");
        // The PyPI wheel loads its CUDA libraries at import even on a CPU-only machine, so
        // `--no-deps` is not enough: the whole install (~4 GB) it is.
        let installed = Command::new(Path::new(VENV).join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", TORCH])
            .status()
            .expect("running pip");
        assert!(
            installed.success() && imports_torch(),
            "could not install {TORCH} into {VENV} (PyPI must be reachable): run .ci/run"
        );
    });
    Path::new(VENV)
}

/// Docker flags that make the venv usable in a container built from the busybox test image.
pub fn docker_mounts() -> Vec<String> {
    let venv = venv().display().to_string();
    vec!["-v".to_owned(), format!("{venv}:{venv}:ro")]
}
