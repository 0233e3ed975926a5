//! Generates the CRI client (runtime.v1) from the vendored api.proto: client only, no server,
//! no transport (shmtrace connects over a unix socket itself).
fn main() {
    let dir = std::env::args()
        .nth(1)
        .expect("usage: gen-cri DIR (the directory holding api.proto)");
    let proto = format!("{dir}/api.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .out_dir(&dir)
        .compile_protos(&[proto.as_str()], &[dir.as_str()])
        .expect("protoc failed (is protobuf-compiler installed?)");
}
