//! Size limits enforced on every command and query, by the client, by the
//! replica before proposing, and again by the state machine.

/// Longest key, in bytes. Keys must also be non-empty.
pub const MAX_KEY_LEN: usize = 4 * 1024;
/// Largest value, in bytes.
pub const MAX_VALUE_LEN: usize = 1024 * 1024;
/// Most operations (puts and deletes) in one batch.
pub const MAX_BATCH_OPS: usize = 1024;
/// Most conditions in one batch.
pub const MAX_BATCH_CONDITIONS: usize = 128;
/// Most keys in one multi-get.
pub const MAX_MULTI_GET: usize = 1024;
/// Most entries one scan returns; also the default when a scan asks for 0.
pub const MAX_SCAN_LIMIT: u32 = 10_000;
/// Largest total payload (keys + values) of one command, in bytes.
pub const MAX_COMMAND_BYTES: usize = 4 * 1024 * 1024;
/// Most commands in one [`crate::Command::Group`]. A group's total payload is
/// bounded by [`MAX_COMMAND_BYTES`] like any command's.
pub const MAX_GROUP_COMMANDS: usize = 1024;

// ---------------------------------------------------------------- watch history

/// Most revisions the watch history keeps ([`crate::history`]): a watch
/// may start or resume at most this many revisions back.
pub const HISTORY_MAX_REVISIONS: u64 = 100_000;
/// Most bytes of encoded records the watch history keeps (the newest
/// record is kept whatever its size). A record holds each changed key's
/// new value and previous value, so 1 MiB values over 1 MiB values keep
/// about 32 revisions.
pub const HISTORY_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Most bytes of previous values one history record keeps; past it the
/// record keeps none ([`crate::history::Record::previous_dropped`]).
pub const HISTORY_MAX_PREVIOUS_BYTES: usize = 8 * 1024 * 1024;

// ---------------------------------------------------------------- locks

/// Shortest session TTL, in milliseconds: a few election timeouts, so a
/// leader change alone cannot expire a healthy session.
pub const MIN_SESSION_TTL_MS: u64 = 3_000;
/// Longest session TTL, in milliseconds (10 minutes): a dead client must not
/// hold its locks for longer than this.
pub const MAX_SESSION_TTL_MS: u64 = 600_000;
/// Longest lock name, in bytes of UTF-8. Names must also be non-empty.
pub const MAX_LOCK_NAME_LEN: usize = 256;
/// Shortest wait an acquire may ask for, in milliseconds. "Do not wait" is
/// `wait_ms: None`, not 0.
pub const MIN_LOCK_WAIT_MS: u64 = 1;
/// Longest wait an acquire may ask for, in milliseconds (one day).
pub const MAX_LOCK_WAIT_MS: u64 = 86_400_000;
/// Shortest lock lease (maximum hold time), in milliseconds.
pub const MIN_LOCK_LEASE_MS: u64 = 1_000;
/// Longest lock lease, in milliseconds (one day).
pub const MAX_LOCK_LEASE_MS: u64 = 86_400_000;
/// Shortest lock-delay, in milliseconds. "No lock-delay" is `None`, not 0.
pub const MIN_LOCK_DELAY_MS: u64 = 1;
/// Longest lock-delay, in milliseconds (one minute, Chubby's bound).
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;
/// Most holders one lock can have at once (shared holders; an exclusive lock
/// has one).
pub const MAX_LOCK_HOLDERS: usize = 1_024;
/// Most requests waiting in one lock's queue.
pub const MAX_LOCK_WAITERS: usize = 1_024;
/// Most locks one multi-lock ([`crate::lock::LockCommand::AcquireAll`])
/// takes. Its waiter is stored in each of their queues with every name, so
/// its size grows with the square of this.
pub const MAX_MULTI_LOCK_NAMES: usize = 32;
/// Most sessions and leases one [`crate::lock::LockCommand::Checkpoint`]
/// records; the leader records more in further entries.
pub const MAX_CHECKPOINT_ITEMS: usize = 4_096;
/// Most sessions live at once in the whole cluster: an `OpenSession` beyond
/// it is refused with [`crate::CommandError::TooManySessions`] until others
/// close or expire. Every replica keeps each live session, and up to
/// [`MAX_REMEMBERED_REQUESTS`] outcomes of it, in memory (the lock rooms,
/// `latchkey_storage_lock_rooms_bytes`), so without a bound a client that
/// opens sessions in a loop would grow every replica's memory at once until
/// they all fail. 100,000 sessions is ~15 MB of session records;
/// remembered outcomes add ~150 bytes each (with short lock names) for the
/// sessions that use locks, and for retry-safe writes
/// ([`crate::Command::Once`]) the write's answer: a put's or a delete's is
/// a few bytes, but a get-and-put's, put-if-absent's or compare-and-put's
/// holds a value (up to [`MAX_VALUE_LEN`]), so a session that keeps
/// swapping large values holds up to 256 of them. This bounds sessions only: the locks one
/// session holds are not capped, and one client that keeps 100,000
/// sessions alive keeps every other client from opening one (there is no
/// per-user quota). Sessions expire within their TTL
/// ([`MAX_SESSION_TTL_MS`]) unless kept alive, so a client that leaks
/// sessions frees its places by itself.
pub const MAX_LIVE_SESSIONS: u64 = 100_000;
/// How many keys one session may have bound to it
/// ([`crate::Command::PutBound`]). Ending the session deletes them all in
/// one command (one revision, one watch message), so this bounds that
/// command's work and its history record. A member registering itself for
/// discovery needs one or a few.
pub const MAX_KEYS_PER_SESSION: u64 = 1_000;
/// How many acquire/release outcomes each session remembers for retries.
/// When a session goes past it, the outcome with the lowest request id is
/// forgotten, and from then on a request whose id is at or below a forgotten
/// one, and is not remembered, is refused as too old (it may have been
/// applied). A client must therefore number its requests increasingly and
/// keep fewer than this many in flight.
pub const MAX_REMEMBERED_REQUESTS: u32 = 256;
/// Most locks one [`crate::lock::LockQuery::Locks`] returns; also the default
/// when it asks for 0.
pub const MAX_LOCK_LIST_LIMIT: u32 = 1_000;
/// Most sessions one [`crate::lock::LockQuery::Sessions`] returns; also the
/// default when it asks for 0. Small, because each listed session costs a
/// read of every lock it holds or waits for.
pub const MAX_SESSION_LIST_LIMIT: u32 = 100;
/// Most held or awaited locks listed per session by
/// [`crate::lock::LockQuery::Sessions`]; the counts cover them all.
pub const MAX_SESSION_LISTED_LOCKS: usize = 64;
/// Longest session name ([`crate::lock::LockCommand::OpenSession`]), in
/// bytes.
pub const MAX_SESSION_NAME_BYTES: usize = 256;
/// How many of its most recent force-released grants a session remembers
/// and reports with every keep-alive ([`crate::lock::SessionInfo::forced`]);
/// a client that missed more than this many between two keep-alives
/// counts its session lost.
pub const MAX_FORCED_REMEMBERED: usize = 16;
/// Longest printable [`crate::lock::Sequencer`], in bytes: the prefix, two
/// u64s, the mode and a name of [`MAX_LOCK_NAME_LEN`] bytes, each escaped as
/// `%XX`.
pub const MAX_SEQUENCER_LEN: usize = 4 + 20 + 1 + 20 + 1 + 1 + 1 + 3 * MAX_LOCK_NAME_LEN;
