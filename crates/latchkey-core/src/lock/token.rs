//! [`Token`], the fencing token, and the cluster-wide counter every new
//! grant takes the next one from (the rules are in `fence.rs`). Imports
//! only `applied`.

use serde::{Deserialize, Serialize};

use super::applied::Applied;
use crate::keyspace::META_LAST_TOKEN;
use crate::store::read_counter;
use crate::{CommandError, Store};

/// A fencing token: identifies one grant of a lock. Never 0; a later grant
/// always has a larger token.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Token(pub u64);

impl From<Token> for u64 {
    /// The number to hand to a storage service or a
    /// `FenceGate::admit(resource, token.into())`.
    fn from(t: Token) -> u64 {
        t.0
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Issue the next fencing token.
pub(crate) fn next_token<S: Store>(store: &mut S) -> Applied<Token> {
    let last = read_counter(store, META_LAST_TOKEN)?;
    let next = last
        .checked_add(1)
        .ok_or_else(|| CommandError::CounterExhausted {
            counter: "fencing tokens".to_string(),
        })?;
    store.put(META_LAST_TOKEN, &next.to_be_bytes())?;
    Ok(Token(next))
}
