//! Intentionally empty. This crate's `[build-dependencies]` exist only to pin
//! the features of build-time crates shared with RocksDB's build script, so
//! every cargo command that includes this crate computes the same
//! librocksdb-sys build hash and reuses the compiled C++ (see Cargo.toml).
fn main() {}
