//! What a peer's Raft message must look like before openraft sees it.
//!
//! openraft 0.10 checks much of a peer's message with `assert!` and
//! `debug_assert!` (a panic in its core, which stops the replica), or adds
//! one to a term or an index unchecked, on the grounds that a
//! protocol-following cluster never breaks them; latchkey's builds keep
//! debug assertions and overflow checks on. A message comes from the
//! network, so a member that is broken, or whose data came from another
//! incarnation of the cluster, could send any of it. Each check here refuses
//! such a message for that one call (`INVALID_ARGUMENT`), and the replica
//! runs on:
//! - [`bounds`]: terms and indexes far below `u64::MAX`, so that openraft's
//!   `+ 1` on them cannot overflow;
//! - [`membership`]: a membership openraft can work with (one or two
//!   non-empty voter sets, every voter with a node);
//! - [`sender`]: the vote a message carries names its sender, which is not
//!   this replica;
//! - [`leader`]: an AppendEntries, a snapshot or a hand-over as a leader
//!   sends them (its own committed vote, entries that follow on, a commit
//!   index on the sent log, log ids and a snapshot that agree with what this
//!   replica committed);
//! - [`candidate`]: a vote or pre-vote request as a candidate sends it (its
//!   own uncommitted vote, a last log id no later than that vote).
//!
//! What a message is checked against on this replica is its committed log
//! id and its vote, read from openraft's metrics just before: both only
//! grow, and a current leader's message agrees with every earlier value, so
//! a stale reading can let a forged message through but never refuses a
//! real one. Not checked (it needs the replica's uncommitted log or its
//! memberships, which only openraft's core reads consistently): a snapshot
//! that ends at or beyond this replica's last index with an older log id
//! than its last entry, a snapshot whose membership has the log id of one
//! this replica holds but other voters, and a second membership entry sent
//! while an earlier one is not committed. A member sends those only if its
//! log contradicts entries this replica holds, which Raft rules out for a
//! member that follows the protocol.

pub(crate) mod bounds;
pub(crate) mod candidate;
pub(crate) mod leader;
pub(crate) mod membership;
pub(crate) mod sender;
