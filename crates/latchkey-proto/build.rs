//! Generates the gRPC code from `proto/latchkey.proto` (inside this crate,
//! so it ships in the package; the workspace's top-level `proto/` is a link
//! to it) with a vendored `protoc`, so a fresh machine needs no system
//! protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time, not with env!(): cargo shares one build-script
    // binary between checkouts at different paths (CI clones, worktrees).
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let proto_dir = std::path::Path::new(&manifest_dir).join("proto");
    let proto = proto_dir.join("latchkey.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // Raft payloads are shared, not copied, when a call is retried.
    config.bytes([
        ".latchkey.v1.RaftMessage.payload",
        // A backup's pieces are slices of one buffer, not copies.
        ".latchkey.v1.BackupChunk.data",
    ]);
    // For gRPC server reflection (`latchkey_proto::FILE_DESCRIPTOR_SET`).
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    config.file_descriptor_set_path(out_dir.join("latchkey_descriptor.bin"));
    tonic_prost_build::configure()
        // A service method a server does not implement answers
        // UNIMPLEMENTED: test doubles implement only what they fake. The
        // replica's services implement every method (its tests call each).
        .generate_default_stubs(true)
        .compile_with_config(config, &[proto], &[proto_dir])?;
    Ok(())
}
