//! Fenced leader election: an election is an exclusive lock whose holder is
//! the leader, and a key that always says who that is.
//!
//! Election `NAME` is the lock named [`ELECTION_PREFIX`]` + NAME`. A
//! candidate campaigns with an exclusive [`LockCommand::Acquire`] of that
//! lock carrying its `value` (what it wants observers to know: an address,
//! an id). Everything a lock does, an election does the same way: FIFO
//! waiting without polling, the grant's fencing token (the leader's *term*:
//! tokens come from one cluster-wide counter, so terms only grow over the
//! election's whole life), fenced writes with the leader's sequencer,
//! release (resigning), the session's end (the next candidate leads in the
//! same log entry, unless a lock-delay holds the election empty first),
//! lock-delay and leases.
//!
//! What an election adds is its *leader key*: the user-data key with the
//! same name as the lock (`latchkey.election/NAME`). After every command
//! that touched the lock, in the same log entry and at the same revision
//! as the command's other changes, the key is made to say who leads:
//!
//! - while the lock has a holder: [`Leader`] encoded by
//!   [`Leader::encode`]: the term (u64 big-endian), the leader's session
//!   (u64 big-endian), then its value;
//! - while it has none (nobody campaigns, or a lock-delay runs after a
//!   leader's session expired): no key.
//!
//! So a reader of the key (a get, or a watch: *observing*) sees every term
//! in order, each with its leader's latest value
//! ([`LockCommand::Proclaim`]), and "no leader" in between; and a watch
//! resumes across reconnects by revision like any other.
//!
//! Keys starting with [`ELECTION_PREFIX`] are the elections' own: a
//! client's put, delete or batch op on one is refused, and a range delete
//! skips them.
//!
//! Rules settled here:
//!
//! - A campaign must be exclusive; a `value` on the acquire of any other
//!   lock is refused; a value is at most [`MAX_ELECTION_VALUE_LEN`] bytes
//!   (values of waiting candidates live in the lock's record).
//! - [`LockCommand::Proclaim`] by the leader (session, owner and term)
//!   replaces its value; by anyone else: `NotHolder` (not leading) or
//!   `StaleToken` (leading under another term).
//! - A re-entrant campaign by the leader counts one more hold and keeps its
//!   value (proclaim to change it).

use std::collections::BTreeSet;

use super::event::Event;
use super::{lock_table, SessionId, Token};
use crate::data::{self, Change};
use crate::{Store, StoreError};

/// The name prefix of every election's lock and leader key.
pub const ELECTION_PREFIX: &str = "latchkey.election/";

/// Largest value a candidate may campaign or proclaim with, in bytes.
pub const MAX_ELECTION_VALUE_LEN: usize = 1024;

/// The lock (and leader key) of election `election`.
///
/// ```
/// use latchkey_core::lock::{election_lock_name, election_of};
///
/// assert_eq!(election_lock_name("scheduler"), "latchkey.election/scheduler");
/// assert_eq!(election_of("latchkey.election/scheduler"), Some("scheduler"));
/// assert_eq!(election_of("scheduler"), None);
/// ```
pub fn election_lock_name(election: &str) -> String {
    format!("{ELECTION_PREFIX}{election}")
}

/// The election a lock name (or key) belongs to, if it is an election's.
pub fn election_of(lock_name: &str) -> Option<&str> {
    lock_name.strip_prefix(ELECTION_PREFIX)
}

/// Whether a user-data key is an election's leader key (written only by
/// the elections themselves).
pub fn is_election_key(key: &[u8]) -> bool {
    key.starts_with(ELECTION_PREFIX.as_bytes())
}

/// Who leads an election, as its leader key holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's term: the fencing token of its grant.
    pub term: Token,
    /// The leader's session.
    pub session: SessionId,
    /// The value it campaigned or last proclaimed with.
    pub value: Vec<u8>,
}

impl Leader {
    /// Bytes of the fixed part of an encoded leader: term and session.
    pub const HEADER_LEN: usize = 16;

    /// The leader key's value: term and session (u64 big-endian each),
    /// then the value. Plain bytes, so any language can read it.
    ///
    /// ```
    /// use latchkey_core::lock::{Leader, SessionId, Token};
    ///
    /// let leader = Leader { term: Token(9), session: SessionId(2), value: b"10.0.0.7".to_vec() };
    /// let bytes = leader.encode();
    /// assert_eq!(&bytes[..8], &9u64.to_be_bytes());
    /// assert_eq!(Leader::decode(&bytes), Some(leader));
    /// assert_eq!(Leader::decode(b"short"), None);
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::HEADER_LEN + self.value.len());
        out.extend_from_slice(&self.term.0.to_be_bytes());
        out.extend_from_slice(&self.session.0.to_be_bytes());
        out.extend_from_slice(&self.value);
        out
    }

    /// A leader key's value, if it is one ([`Leader::encode`]'s form).
    pub fn decode(bytes: &[u8]) -> Option<Leader> {
        let term = crate::keyspace::read_u64(bytes.get(..8)?)?;
        let session = crate::keyspace::read_u64(bytes.get(8..16)?)?;
        Some(Leader {
            term: Token(term),
            session: SessionId(session),
            value: bytes.get(16..)?.to_vec(),
        })
    }
}

/// The election locks that `events` (and `also`) touched, in name order.
pub(crate) fn touched<'a>(events: &'a [Event], also: Option<&'a str>) -> BTreeSet<&'a str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Granted { name, .. } | Event::Released { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .chain(also)
        .filter(|name| election_of(name).is_some())
        .collect()
}

/// Make the leader key of each election lock in `names` say who holds the
/// lock now, through `change` (so at the command's one revision). A key
/// already right is not written.
pub(crate) fn sync<'a, S: Store>(
    store: &mut S,
    names: impl IntoIterator<Item = &'a str>,
    change: &mut Change,
) -> Result<(), StoreError> {
    for name in names {
        let lock = lock_table::load(store, name)?;
        let now = lock.rec.holders.first().map(|h| Leader {
            term: h.token,
            session: h.session,
            value: h.value.clone(),
        });
        let key = name.as_bytes();
        let stored = data::get(store, key)?.map(|v| v.value);
        match now {
            Some(leader) => {
                let bytes = leader.encode();
                if stored.as_deref() != Some(bytes.as_slice()) {
                    change.put(store, key, &bytes)?;
                }
            }
            None => {
                if stored.is_some() {
                    change.delete(store, key)?;
                }
            }
        }
    }
    Ok(())
}
