//! The sequencer and session secret that fenced writes and
//! `check-sequencer` name, parsed from the command line's text.

use latchkey::{Sequencer, SessionSecret};

use super::failure::Failure;

/// The session secret a fenced write needs, from `--session-secret` or
/// `LATCHKEY_SESSION_SECRET`.
pub fn parse_session_secret(hex: Option<&str>) -> Result<SessionSecret, Failure> {
    let hex = hex.ok_or_else(|| {
        Failure::Usage(
            "a fenced write needs the secret of the sequencer's session: run it under `latchkey \
             lock`, which sets LATCHKEY_SESSION_SECRET, or pass --session-secret"
                .into(),
        )
    })?;
    SessionSecret::from_hex(hex.trim()).ok_or_else(|| {
        Failure::Usage(format!(
            "bad session secret: {} characters, it must be {} hex digits",
            hex.trim().chars().count(),
            2 * SessionSecret::LEN
        ))
    })
}

/// A sequencer as `latchkey lock` gives it (`LATCHKEY_SEQUENCER`).
pub fn parse_sequencer(s: &str) -> Result<Sequencer, Failure> {
    s.trim()
        .parse()
        .map_err(|e| Failure::Usage(format!("bad sequencer {s:?}: {e}")))
}
