//! [`LockMode`]: exclusive or shared.

use serde::{Deserialize, Serialize};

/// How a lock is held.
///
/// An exclusive lock has exactly one holder. A shared lock has any number of
/// holders (up to [`crate::limits::MAX_LOCK_HOLDERS`]), all shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LockMode {
    /// One holder at a time (a mutex, a writer).
    Exclusive,
    /// Any number of shared holders at a time (readers).
    Shared,
}

impl LockMode {
    /// The one-letter form used in a printed [`crate::lock::Sequencer`]:
    /// `x` for exclusive, `s` for shared.
    pub fn as_char(self) -> char {
        match self {
            LockMode::Exclusive => 'x',
            LockMode::Shared => 's',
        }
    }

    /// The mode a [`LockMode::as_char`] letter stands for.
    pub fn from_char(c: char) -> Option<LockMode> {
        match c {
            'x' => Some(LockMode::Exclusive),
            's' => Some(LockMode::Shared),
            _ => None,
        }
    }
}

impl std::fmt::Display for LockMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
        })
    }
}
