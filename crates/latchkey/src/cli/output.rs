//! Answers on stdout: bytes as they are, lines, and keys and values in
//! the encodings `--write-out` names (hex, etcdctl's base64 JSON).

use std::io::Write;
use std::process::ExitCode;

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

/// A key and its value as JSON, in base64 (etcdctl's convention).
pub fn json_entry(key: &[u8], value: &[u8]) -> serde_json::Value {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    serde_json::json!({"key": b64.encode(key), "value": b64.encode(value)})
}
