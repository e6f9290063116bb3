//! [`Sequencer`]: the description of one grant, and its printable form.
//!
//! Printable form (version 1), safe in an HTTP header value, an environment
//! variable or a URL path segment:
//!
//! ```text
//! lk1.<token>.<session>.<mode>.<name>
//! ```
//!
//! - `token`, `session`: canonical decimal u64 (no sign, no leading zeros),
//!   never 0;
//! - `mode`: `x` (exclusive) or `s` (shared);
//! - `name`: the lock name's UTF-8 bytes, with every byte outside
//!   `A-Z a-z 0-9 - . _ ~` written as `%XX` (upper-case hex). The name is the
//!   last field, so a `.` inside it needs no escape.
//!
//! Parsing accepts exactly the strings [`Sequencer`]'s `Display` produces
//! (one spelling per sequencer: a needless or lower-case escape is refused),
//! so `parse(print(s)) == s` and `print(parse(t)) == t`. Anything else is a
//! [`SequencerParseError`]; parsing never panics.
//!
//! ```
//! use latchkey_core::lock::{LockMode, Sequencer, SessionId, Token};
//!
//! let s = Sequencer {
//!     name: "jobs/étape 1".to_string(),
//!     mode: LockMode::Exclusive,
//!     token: Token(34),
//!     session: SessionId(7),
//! };
//! let printed = s.to_string();
//! assert_eq!(printed, "lk1.34.7.x.jobs%2F%C3%A9tape%201");
//! assert_eq!(printed.parse::<Sequencer>(), Ok(s));
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{LockMode, SessionId, Token};
use crate::limits::{MAX_LOCK_NAME_LEN, MAX_SEQUENCER_LEN};

/// One grant of a lock: which lock, in which mode, under which fencing token,
/// to which session. Pass it to whatever the lock protects; the resource (or
/// latchkey itself, for fenced writes) checks it is still current.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Sequencer {
    /// The lock's name.
    pub name: String,
    /// The mode of the grant.
    pub mode: LockMode,
    /// The grant's fencing token.
    pub token: Token,
    /// The session the lock was granted to.
    pub session: SessionId,
}

/// What the printable form starts with.
const PREFIX: &str = "lk1.";

/// Why a string is not a printed [`Sequencer`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SequencerParseError {
    /// Longer than any sequencer can be.
    #[error("sequencer is {len} bytes, the longest possible is {max}")]
    TooLong {
        /// The string's length in bytes.
        len: usize,
        /// [`MAX_SEQUENCER_LEN`].
        max: usize,
    },
    /// Does not start with `lk1.`.
    #[error("not a latchkey sequencer: it must start with \"{PREFIX}\"")]
    NotASequencer,
    /// A field is missing.
    #[error("sequencer has no {field} field")]
    MissingField {
        /// The first field that is missing, by name (e.g. `"mode"`).
        field: &'static str,
    },
    /// A number field is not a canonical decimal u64.
    #[error("sequencer {field} is not a decimal number without sign or leading zeros")]
    BadNumber {
        /// The field: `"token"` or `"session"`.
        field: &'static str,
    },
    /// Token 0 is never issued.
    #[error("sequencer token is 0, which is never issued")]
    ZeroToken,
    /// Session 0 is never issued.
    #[error("sequencer session is 0, which is never issued")]
    ZeroSession,
    /// The mode is neither `x` nor `s`.
    #[error("sequencer mode must be \"x\" or \"s\"")]
    BadMode,
    /// The name has a character that must be escaped, a malformed or
    /// lower-case escape, or an escape of a character that needs none.
    #[error("sequencer name is badly escaped at byte {at}")]
    BadEscape {
        /// Byte offset of the bad character or escape in the whole string.
        at: usize,
    },
    /// The unescaped name is not UTF-8.
    #[error("sequencer name is not UTF-8")]
    NotUtf8,
    /// The name is empty or longer than [`MAX_LOCK_NAME_LEN`] bytes.
    #[error("sequencer name is {len} bytes, it must be 1 to {MAX_LOCK_NAME_LEN}")]
    BadNameLength {
        /// The unescaped name's length in bytes.
        len: usize,
    },
}

/// Bytes written as themselves in the printed name.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for Sequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}.{}.{}.",
            self.token.0,
            self.session.0,
            self.mode.as_char()
        )?;
        for &b in self.name.as_bytes() {
            if is_plain(b) {
                write!(f, "{}", char::from(b))?;
            } else {
                let hi = HEX[usize::from(b >> 4)];
                let lo = HEX[usize::from(b & 0x0f)];
                write!(f, "%{}{}", char::from(hi), char::from(lo))?;
            }
        }
        Ok(())
    }
}

/// A canonical decimal u64: digits only, no leading zero unless it is "0".
fn number(field: &'static str, s: &str) -> Result<u64, SequencerParseError> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return Err(SequencerParseError::BadNumber { field });
    }
    s.parse()
        .map_err(|_| SequencerParseError::BadNumber { field })
}

/// Undo the name escaping, refusing every non-canonical spelling. `offset`
/// is where the name starts in the whole string, for error positions.
fn unescape(s: &str, offset: usize) -> Result<String, SequencerParseError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if is_plain(b) {
            out.push(b);
            i += 1;
            continue;
        }
        let bad = SequencerParseError::BadEscape { at: offset + i };
        if b != b'%' {
            return Err(bad);
        }
        let hi = bytes.get(i + 1).copied().and_then(hex_value);
        let lo = bytes.get(i + 2).copied().and_then(hex_value);
        let (Some(hi), Some(lo)) = (hi, lo) else {
            return Err(bad);
        };
        let decoded = (hi << 4) | lo;
        if is_plain(decoded) {
            return Err(bad);
        }
        out.push(decoded);
        i += 3;
    }
    String::from_utf8(out).map_err(|_| SequencerParseError::NotUtf8)
}

impl FromStr for Sequencer {
    type Err = SequencerParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() > MAX_SEQUENCER_LEN {
            return Err(SequencerParseError::TooLong {
                len: s.len(),
                max: MAX_SEQUENCER_LEN,
            });
        }
        let rest = s
            .strip_prefix(PREFIX)
            .ok_or(SequencerParseError::NotASequencer)?;
        let mut fields = rest.splitn(4, '.');
        let mut next = |field: &'static str| {
            fields
                .next()
                .ok_or(SequencerParseError::MissingField { field })
        };
        let token = number("token", next("token")?)?;
        let session = number("session", next("session")?)?;
        let mode = next("mode")?;
        let name = next("name")?;
        if token == 0 {
            return Err(SequencerParseError::ZeroToken);
        }
        if session == 0 {
            return Err(SequencerParseError::ZeroSession);
        }
        let mut mode_chars = mode.chars();
        let mode = match (mode_chars.next(), mode_chars.next()) {
            (Some(c), None) => LockMode::from_char(c).ok_or(SequencerParseError::BadMode)?,
            _ => return Err(SequencerParseError::BadMode),
        };
        let name = unescape(name, s.len() - name.len())?;
        if name.is_empty() || name.len() > MAX_LOCK_NAME_LEN {
            return Err(SequencerParseError::BadNameLength { len: name.len() });
        }
        Ok(Sequencer {
            name,
            mode,
            token: Token(token),
            session: SessionId(session),
        })
    }
}
