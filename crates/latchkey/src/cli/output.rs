//! Answers on stdout: bytes as they are, lines, and keys and values in
//! the encodings `--write-out` names (hex, etcdctl's base64 JSON).

use std::io::Write;
use std::process::ExitCode;

use latchkey::Versioned;

use super::failure::Failure;

/// Write `bytes` to stdout, in order.
pub fn out(bytes: &[&[u8]]) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    for b in bytes {
        stdout
            .write_all(b)
            .map_err(|e| Failure::Other(format!("cannot write output: {e}")))?;
    }
    Ok(())
}

/// Print `lines`, one a line.
pub fn print_lines(lines: &[String]) -> Result<ExitCode, Failure> {
    let mut text = String::new();
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    out(&[text.as_bytes()])?;
    Ok(ExitCode::SUCCESS)
}

/// `bytes` in lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key, its value and its revisions as JSON, key and value in base64
/// (etcdctl's convention and field names).
pub fn json_entry(key: &[u8], v: &Versioned) -> serde_json::Value {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    serde_json::json!({
        "key": b64.encode(key),
        "value": b64.encode(&v.value),
        "create_revision": v.create_revision,
        "mod_revision": v.mod_revision,
        "version": v.version,
    })
}
