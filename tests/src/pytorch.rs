//! A real PyTorch (from PyPI) for the tests, in its venv (`/opt/shmtrace-venv`, see
//! [`crate::venv`]).
use std::{path::Path, sync::OnceLock};

use crate::venv::Venv;

/// The venv, with the release the tests were measured with. The PyPI wheel loads its CUDA
/// libraries at import even on a CPU-only machine, so `--no-deps` is not enough: the whole
/// install (~4 GB) it is.
pub const VENV: Venv = Venv {
    path: "/opt/shmtrace-venv",
    requirement: "torch==2.15.0",
    module: "torch",
};

/// The venv's directory, after making sure `import torch` works in it.
pub fn venv() -> &'static Path {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| VENV.ensure());
    Path::new(VENV.path)
}

/// Docker flags that make the venv usable in a container built from the busybox test image.
pub fn docker_mounts() -> Vec<String> {
    venv();
    VENV.docker_mounts()
}
