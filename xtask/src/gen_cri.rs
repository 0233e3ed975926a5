//! `cargo xtask gen-cri`: regenerates the CRI client (`runtime.v1`) in
//! `shmtrace/src/container/cri/` from the vendored `api.proto` beside it.
//!
//! The output is committed, so building shmtrace never needs `protoc`; only this chore does
//! (Debian: protobuf-compiler). Client only, no server and no transport: shmtrace connects over
//! a unix socket itself.
use anyhow::{Context, Result};

use crate::root;

pub fn run() -> Result<()> {
    let dir = root().join("shmtrace/src/container/cri");
    let proto = dir.join("api.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .out_dir(&dir)
        .compile_protos(&[&proto], &[&dir])
        .context("generating the CRI client needs protoc (apt-get install protobuf-compiler)")?;
    println!("regenerated {}", dir.join("runtime.v1.rs").display());
    Ok(())
}
