//! The commands a client proposes, the queries it reads with, and what they return.
//!
//! Every type here is plain data: it is encoded by [`crate::codec`], stored in the
//! Raft log, and applied by [`crate::apply`] identically on every replica.

use serde::{Deserialize, Serialize};

/// Milliseconds on the leader's monotonic clock, stamped on each log entry.
///
/// The core never reads a clock: it keeps the largest `Millis` it has seen
/// (see [`crate::apply`]) so time never runs backwards across leader changes.
pub type Millis = u64;

/// One entry of the replicated log as the state machine sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The proposing leader's clock when it proposed this entry.
    pub now: Millis,
    /// What to do.
    pub command: Command,
}

/// Shown in logs (openraft prints each entry's payload in its traces): the
/// command's kind and the leader's clock, never keys, values or secrets, so
/// that a log line cannot leak a session's or a user's credentials.
///
/// ```
/// use latchkey_core::command::{Command, Request};
/// let request = Request { now: 7, command: Command::Delete { key: b"k".to_vec() } };
/// assert_eq!(request.to_string(), "delete at 7 ms");
/// ```
impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {} ms", self.command.kind(), self.now)
    }
}

/// A write. Applied atomically: either all of its effects happen or none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Set `key` to `value`. Returns [`Outcome::Written`].
    Put {
        /// The key to set.
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        /// The value to store.
        #[serde(with = "crate::codec::bytes")]
        value: Vec<u8>,
    },
    /// Set `key` to `value` only if it has no value. Returns
    /// [`Outcome::Previous`]: `None` if written, otherwise the existing value.
    PutIfAbsent {
        /// The key to set.
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        /// The value to store if the key has none.
        #[serde(with = "crate::codec::bytes")]
        value: Vec<u8>,
    },
    /// Set `key` to `value` only if `test` holds for the key: its value,
    /// its existence or one of its revisions (compare-and-swap by value or
    /// by revision). Returns [`Outcome::Swapped`]; a revision test on an
    /// absent key is refused with [`crate::CommandError::KeyAbsent`].
    CompareAndPut {
        /// The key to compare and set.
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        /// What must hold for the key now.
        test: Test,
        /// The value to store if the test holds.
        #[serde(with = "crate::codec::bytes")]
        value: Vec<u8>,
    },
    /// Set `key` to `value` and return the previous value as [`Outcome::Previous`].
    GetAndPut {
        /// The key to set.
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        /// The value to store.
        #[serde(with = "crate::codec::bytes")]
        value: Vec<u8>,
    },
    /// Remove `key`. Returns [`Outcome::Deleted`] with 0 or 1.
    Delete {
        /// The key to remove.
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
    },
    /// Remove every key in `[start, end)` but the elections' leader keys
    /// ([`crate::lock::is_election_key`]), which only elections change.
    /// Returns [`Outcome::Deleted`] with the count.
    DeleteRange {
        /// First key removed (inclusive).
        #[serde(with = "crate::codec::bytes")]
        start: Vec<u8>,
        /// End of the range (exclusive).
        #[serde(with = "crate::codec::bytes")]
        end: Vec<u8>,
    },
    /// Check every condition, then apply every op, all or nothing. Returns
    /// [`Outcome::Batch`]. The ops share one revision; a key written twice
    /// in one batch gains two versions at that revision (etcd refuses such
    /// a transaction; here the later op wins, as in any ordered batch).
    Batch {
        /// Checked first, in order; if one fails, nothing is written.
        conditions: Vec<Condition>,
        /// Applied in order once every condition holds.
        ops: Vec<BatchOp>,
    },
    /// Allocate `[start, start + step)` from the sequence stored at `key`
    /// (RheaKV's `getSequence`). Returns [`Outcome::Sequence`]. A sequence
    /// starts at 0 and never goes back; `step` 0 reads the next start.
    NextSequence {
        /// The sequence's key, in a keyspace of its own (not a data key).
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        /// How many values to allocate; 0 only reads the next start.
        step: u64,
    },
    /// A lock-service command: sessions, acquire, release, expiry, fenced
    /// writes. See [`crate::lock`]. Returns [`Outcome::Lock`] (or
    /// [`Outcome::Batch`] for a fenced write).
    Lock(crate::lock::LockCommand),
    /// Several independent commands in one log entry, formed by the leader
    /// from concurrent client requests so they share one fsync. Each is
    /// applied in order exactly as if it were an entry of its own with this
    /// entry's `now`: with its own validation, atomicity and result, so one
    /// refused command neither writes anything nor affects the others.
    /// Returns [`Outcome::Group`] with one result per command. Proposed by
    /// the leader only; a group never nests.
    Group {
        /// The commands, applied in order; none is itself a group.
        commands: Vec<Command>,
    },
    /// A change of users, roles or whether access control is on (see
    /// [`crate::auth`]). Returns [`Outcome::Auth`].
    Auth(crate::auth::AuthCommand),
    /// `command` run for `user`: while access control is enabled it runs
    /// only if the user's grants allow it ([`crate::auth::check_command`],
    /// decided here, at apply time); a session it opens belongs to `user`.
    /// Proposed by the replica that authenticated the caller; never holds a
    /// group or another `As`.
    As {
        /// The authenticated caller.
        user: String,
        /// What it asked for.
        command: Box<Command>,
    },
    /// Set `key` to `value`, bound to `session`: the key is deleted in the
    /// command that ends the session (close, expiry or an operator's end),
    /// at that command's revision. Refused, writing nothing, when the session is not live
    /// ([`crate::CommandError::UnknownSession`],
    /// [`crate::CommandError::SessionEnded`]), when `secret` is not its
    /// secret ([`crate::CommandError::WrongSessionSecret`]), or when the
    /// session has [`crate::limits::MAX_KEYS_PER_SESSION`] keys already
    /// ([`crate::CommandError::TooManySessionKeys`]). A later put of the
    /// key, bound or not, sets its binding anew (see [`crate::data`]).
    /// Returns [`Outcome::Written`].
    PutBound {
        /// The key to set.
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        /// The value to store.
        #[serde(with = "crate::codec::bytes")]
        value: Vec<u8>,
        /// The session the key lives and dies with.
        session: crate::lock::SessionId,
        /// The session's secret.
        secret: crate::lock::SessionSecret,
    },
    /// `command`, a key-value write, applied at most once for
    /// (`session`, `request_id`): a retry of the same request returns the
    /// first outcome (revision included), changes no key and raises no
    /// revision (only the stored leader clock may move), so a client
    /// may resend a write whose answer it lost. The memory is the session's
    /// request memory, shared with its acquires and releases (see
    /// [`crate::lock`]): at most [`crate::limits::MAX_REMEMBERED_REQUESTS`]
    /// outcomes, ending with the session. A retry must carry the very same
    /// `command`; another one under a remembered id is refused with
    /// [`crate::CommandError::RequestIdReused`], an id already forgotten
    /// with [`crate::CommandError::RequestTooOld`]. Refused, writing
    /// nothing, when the session is not live or `secret` is not its
    /// secret. A refused `command` is not remembered: its retry is judged
    /// afresh (it wrote nothing, so nothing can happen twice).
    ///
    /// `command` is one of `Put`, `PutBound`, `PutIfAbsent`,
    /// `CompareAndPut`, `GetAndPut`, `Delete`, `DeleteRange`, `Batch` or
    /// `NextSequence`. Returns `command`'s outcome.
    Once {
        /// The session whose request memory keeps the outcome.
        session: crate::lock::SessionId,
        /// The session's secret.
        secret: crate::lock::SessionSecret,
        /// The request's id, unique in the session; clients number them
        /// increasingly.
        request_id: u64,
        /// The write.
        command: Box<Command>,
    },
}

impl Command {
    /// The command's kind, for logs: one lower-case word, no data.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Put { .. } => "put",
            Command::PutIfAbsent { .. } => "put-if-absent",
            Command::CompareAndPut { .. } => "compare-and-put",
            Command::GetAndPut { .. } => "get-and-put",
            Command::Delete { .. } => "delete",
            Command::DeleteRange { .. } => "delete-range",
            Command::Batch { .. } => "batch",
            Command::NextSequence { .. } => "next-sequence",
            Command::Lock(_) => "lock",
            Command::Group { .. } => "group",
            Command::Auth(_) => "auth",
            Command::As { .. } => "as-user",
            Command::PutBound { .. } => "put-bound",
            Command::Once { .. } => "once",
        }
    }

    /// Whether this is a key-value write: what [`Command::Once`] may hold
    /// (and what a client makes retry-safe).
    pub fn is_key_value_write(&self) -> bool {
        match self {
            Command::Put { .. }
            | Command::PutBound { .. }
            | Command::PutIfAbsent { .. }
            | Command::CompareAndPut { .. }
            | Command::GetAndPut { .. }
            | Command::Delete { .. }
            | Command::DeleteRange { .. }
            | Command::Batch { .. }
            | Command::NextSequence { .. } => true,
            Command::Lock(_)
            | Command::Group { .. }
            | Command::Auth(_)
            | Command::As { .. }
            | Command::Once { .. } => false,
        }
    }

    /// Bytes of keys and values this command carries: a cheap measure of its
    /// encoded size.
    pub fn payload_len(&self) -> usize {
        match self {
            Command::Put { key, value }
            | Command::PutIfAbsent { key, value }
            | Command::GetAndPut { key, value }
            | Command::PutBound { key, value, .. } => key.len() + value.len(),
            Command::CompareAndPut { key, test, value } => {
                key.len() + value.len() + test.payload_len()
            }
            Command::Delete { key } | Command::NextSequence { key, .. } => key.len(),
            Command::DeleteRange { start, end } => start.len() + end.len(),
            Command::Batch { conditions, ops } => batch_payload_len(conditions, ops),
            Command::Lock(lock) => lock.payload_len(),
            Command::Group { commands } => commands.iter().map(Command::payload_len).sum(),
            Command::Auth(auth) => crate::auth::validate(auth).unwrap_or(0),
            Command::As { user, command } => user.len() + command.payload_len(),
            Command::Once { command, .. } => command.payload_len(),
        }
    }
}

/// Bytes of keys and values in a batch's conditions and ops.
pub(crate) fn batch_payload_len(conditions: &[Condition], ops: &[BatchOp]) -> usize {
    let c: usize = conditions
        .iter()
        .map(|c| c.key.len() + c.test.payload_len())
        .sum();
    let o: usize = ops
        .iter()
        .map(|op| match op {
            BatchOp::Put { key, value } => key.len() + value.len(),
            BatchOp::Delete { key } => key.len(),
        })
        .sum();
    c + o
}

/// A guard on a [`Command::Batch`] or a fenced write: `test` must hold for
/// `key`.
///
/// ```
/// use latchkey_core::{Condition, Test};
/// // Unchanged since revision 41 (compare-and-swap by revision):
/// let c = Condition::new("config", Test::mod_revision_is(41));
/// // Nobody created it yet:
/// let d = Condition::new("leader", Test::Exists(false));
/// # let _ = (c, d);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// The key to check.
    #[serde(with = "crate::codec::bytes")]
    pub key: Vec<u8>,
    /// What must hold for it.
    pub test: Test,
}

impl Condition {
    /// `test` on `key`.
    pub fn new(key: impl Into<Vec<u8>>, test: Test) -> Self {
        Condition {
            key: key.into(),
            test,
        }
    }

    /// The key's value equals `expected` (`None`: the key is absent).
    pub fn value_is(key: impl Into<Vec<u8>>, expected: Option<Vec<u8>>) -> Self {
        Condition::new(key, Test::ValueIs(expected))
    }
}

/// What a [`Condition`] or a [`Command::CompareAndPut`] checks of one key.
///
/// A revision test (`Revision`) needs the key to exist: on an absent key
/// the command is refused with [`crate::CommandError::KeyAbsent`] rather
/// than comparing against a made-up 0. Test existence with `Exists`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Test {
    /// The key's value equals this (`None`: the key is absent).
    ValueIs(#[serde(with = "crate::codec::opt_bytes")] Option<Vec<u8>>),
    /// The key exists (`true`) or is absent (`false`).
    Exists(bool),
    /// One of the key's revisions compares to `value` as `compare` says:
    /// `Revision { field: Mod, compare: Equal, value: 41 }` holds when the
    /// key was last written at revision 41.
    Revision {
        /// Which revision of the key.
        field: RevisionField,
        /// How it must compare to `value`.
        compare: Compare,
        /// The number it is compared to.
        value: u64,
    },
}

impl Test {
    /// The key was last changed at `revision` (compare-and-swap by revision).
    pub fn mod_revision_is(revision: u64) -> Self {
        Test::Revision {
            field: RevisionField::Mod,
            compare: Compare::Equal,
            value: revision,
        }
    }

    /// Bytes the test carries.
    pub(crate) fn payload_len(&self) -> usize {
        match self {
            Test::ValueIs(expected) => expected.as_ref().map_or(0, Vec::len),
            Test::Exists(_) | Test::Revision { .. } => 0,
        }
    }
}

/// Which of a key's revisions a [`Test::Revision`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RevisionField {
    /// The revision that created the key (since it was last absent).
    Create,
    /// The revision of the key's last change.
    Mod,
    /// How many times the key was written since it was created (1 after
    /// the create).
    Version,
}

/// How a key's revision must compare to a [`Test::Revision`]'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Compare {
    /// Equal to it.
    Equal,
    /// Not equal to it.
    NotEqual,
    /// Less than it.
    Less,
    /// Greater than it.
    Greater,
}

impl Compare {
    /// Whether `actual` compares to `value` as this says.
    pub fn holds(self, actual: u64, value: u64) -> bool {
        match self {
            Compare::Equal => actual == value,
            Compare::NotEqual => actual != value,
            Compare::Less => actual < value,
            Compare::Greater => actual > value,
        }
    }
}

/// A key's value with its revisions, as every read returns it.
///
/// The cluster keeps one revision counter: every applied command that
/// changes at least one key raises it by one, and every key it changes
/// takes that revision as its `mod_revision` (see [`crate::data`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versioned {
    /// The value.
    #[serde(with = "crate::codec::bytes")]
    pub value: Vec<u8>,
    /// The revision of the command that created the key (since it was last
    /// absent).
    pub create_revision: u64,
    /// The revision of the command that last changed it.
    pub mod_revision: u64,
    /// Writes since it was created: 1 after the create.
    pub version: u64,
}

/// One mutation inside a [`Command::Batch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOp {
    /// Set `key` to `value`.
    Put {
        /// The key to set.
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
        /// The value to store.
        #[serde(with = "crate::codec::bytes")]
        value: Vec<u8>,
    },
    /// Remove `key` (a no-op if it is absent).
    Delete {
        /// The key to remove.
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
    },
}

/// A read. Served from a replica's applied state (after ReadIndex for
/// linearizable reads); never goes through the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Query {
    /// Returns [`Outcome::Value`].
    Get {
        /// The key to read.
        #[serde(with = "crate::codec::bytes")]
        key: Vec<u8>,
    },
    /// Returns [`Outcome::Values`], one entry per requested key, in order.
    MultiGet {
        /// The keys to read.
        keys: Vec<Vec<u8>>,
    },
    /// Returns [`Outcome::Entries`] in key order (descending if `reverse`).
    Scan(ScanRange),
    /// A lock-service read. Returns [`Outcome::Lock`].
    Lock(crate::lock::LockQuery),
    /// A read of the access-control state. Returns [`Outcome::Auth`].
    Auth(crate::auth::AuthQuery),
    /// `query` read for `user`: while access control is enabled it is
    /// answered only if the user's grants allow it
    /// ([`crate::auth::check_query`]).
    As {
        /// The authenticated caller.
        user: String,
        /// What it asked for (never another `As`).
        query: Box<Query>,
    },
}

/// Which keys a [`Query::Scan`] visits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanRange {
    /// Inclusive lower bound; empty means from the first key.
    #[serde(with = "crate::codec::bytes")]
    pub start: Vec<u8>,
    /// Exclusive upper bound; `None` means to the last key.
    #[serde(with = "crate::codec::opt_bytes")]
    pub end: Option<Vec<u8>>,
    /// Only keys starting with this prefix (combined with the bounds).
    #[serde(with = "crate::codec::bytes")]
    pub prefix: Vec<u8>,
    /// At most this many entries; 0 means [`crate::limits::MAX_SCAN_LIMIT`].
    pub limit: u32,
    /// Visit keys from the highest down.
    pub reverse: bool,
}

impl ScanRange {
    /// Every key starting with `prefix`, in ascending order, at most `limit`.
    pub fn prefix(prefix: impl Into<Vec<u8>>, limit: u32) -> Self {
        ScanRange {
            start: Vec::new(),
            end: None,
            prefix: prefix.into(),
            limit,
            reverse: false,
        }
    }
}

/// The successful result of a [`Command`] or [`Query`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// An entry no client proposed was applied (a leader's blank entry, a
    /// membership change): nothing to report.
    Done,
    /// The put was applied, at `revision`.
    Written {
        /// The revision the put made.
        revision: u64,
    },
    /// The value the key held before the command (or the existing value, for
    /// a put-if-absent that did not write).
    Previous {
        /// The key's value before the command (`None`: absent).
        #[serde(with = "crate::codec::opt_bytes")]
        previous: Option<Vec<u8>>,
        /// The revision after the command: the one it made if it wrote.
        revision: u64,
    },
    /// Result of a compare-and-put: whether it wrote, and the key's value now.
    Swapped {
        /// Whether the test held and the value was written.
        succeeded: bool,
        /// The key's value now: the new value if written, else the value
        /// the test saw (`None`: absent).
        current: Option<Versioned>,
        /// The revision after the command: the one it made if it wrote.
        revision: u64,
    },
    /// How many keys a delete removed.
    Deleted {
        /// Keys removed.
        count: u64,
        /// The revision after the command: the one it made if it removed any.
        revision: u64,
    },
    /// Result of a batch (or fenced write): `failed_condition` is the index
    /// of the first condition that did not hold, in which case nothing was
    /// written.
    Batch {
        /// Index of the first condition that did not hold; `None`: every
        /// condition held and the ops were applied.
        failed_condition: Option<u32>,
        /// The revision after the command: the one it made if it wrote.
        revision: u64,
    },
    /// An allocated sequence range `[start, end)`. Sequences are not keys:
    /// they raise no revision.
    Sequence {
        /// First value allocated.
        start: u64,
        /// One past the last value allocated (`start` if none was).
        end: u64,
    },
    /// The value of a key, if present.
    Value {
        /// The key's value and revisions (`None`: absent).
        value: Option<Versioned>,
        /// The revision the read saw.
        revision: u64,
    },
    /// Values of several keys, in request order.
    Values {
        /// One per requested key (`None`: absent).
        values: Vec<Option<Versioned>>,
        /// The revision the read saw.
        revision: u64,
    },
    /// Key/value pairs of a scan, and whether more matched beyond the limit.
    Entries {
        /// `(key, value)` pairs in scan order.
        entries: Vec<(Vec<u8>, Versioned)>,
        /// Whether more keys matched beyond the limit.
        more: bool,
        /// The revision the scan read at: a watch from the next one misses
        /// nothing and repeats nothing.
        revision: u64,
    },
    /// The result of a lock-service command or query.
    Lock(crate::lock::LockOutcome),
    /// The results of a [`Command::Group`], one per command, in order.
    Group(Vec<CommandResult>),
    /// The result of an access-control command or query.
    Auth(crate::auth::AuthOutcome),
}

/// Outcome of applying one log entry or serving one query: deterministic, so
/// every replica returns the same one for the same entry.
pub type CommandResult = Result<Outcome, crate::CommandError>;
