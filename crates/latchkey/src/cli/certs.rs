//! `certs`: write a development CA and TLS certificates for a local
//! cluster (the certificates themselves come from `latchkey::certs`).

use std::path::Path;
use std::process::ExitCode;

use super::failure::Failure;
use super::output::out;

/// Write `nodes` node certificates (valid for `hosts` too) and a client
/// certificate for each of `users` into `dir`; print each file written.
pub fn run(
    dir: &Path,
    nodes: u64,
    hosts: &[String],
    users: &[String],
) -> Result<ExitCode, Failure> {
    let written = latchkey::certs::write_cluster(dir, nodes, hosts, users)
        .map_err(|e| Failure::Usage(e.to_string()))?;
    for path in written {
        out(&[path.display().to_string().as_bytes(), b"\n"])?;
    }
    Ok(ExitCode::SUCCESS)
}
