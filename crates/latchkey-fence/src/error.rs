//! Why a gate did not admit a write.

use std::io;
use std::path::PathBuf;

/// Why a fence gate did not admit a write. On every variant, nothing was
/// admitted: do not perform the write (and, for the database gates, roll the
/// transaction back).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// A newer lock holder has written to this resource. The writer holding
    /// `token` lost its lock and must stop; retrying with the same token
    /// will never succeed.
    #[error(
        "token {token} is older than {highest} already seen for resource {resource:?}: \
         a newer lock holder has written; this writer must stop"
    )]
    Stale {
        /// The resource written to.
        resource: String,
        /// The refused token.
        token: u64,
        /// The highest token seen for the resource.
        highest: u64,
    },
    /// Token 0 is never issued by latchkey: the caller passed an unset
    /// value instead of its lock guard's fencing token.
    #[error(
        "token 0 for resource {resource:?} was never issued by latchkey (tokens start at 1): \
         pass the fencing token of the writer's lock guard"
    )]
    ZeroToken {
        /// The resource written to.
        resource: String,
    },
    /// The state file of a [`FileFenceGate`](crate::FileFenceGate) is
    /// damaged, truncated or not a fence state file. The gate does not open
    /// rather than forget tokens.
    #[error(
        "fence state file {} is corrupt: {detail}; the gate will not start with an unknown \
         set of tokens: restore the file from a backup, or move it aside to start empty only \
         once every writer holding an old token has stopped",
        path.display()
    )]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// Reading or durably writing the state of a
    /// [`FileFenceGate`](crate::FileFenceGate) failed. During `admit` the
    /// token was not admitted and the gate still remembers what it did
    /// before; the write may be retried once the cause (full disk,
    /// permissions, missing directory) is fixed.
    #[error(
        "fence state I/O failed: could not {action} {}: {source}; nothing was admitted",
        path.display()
    )]
    Io {
        /// What the gate was doing.
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The database refused or failed a statement of the gate (lost
    /// connection, missing fence table, a serialization failure or deadlock
    /// between transactions, a busy SQLite database...). Nothing was
    /// admitted; a transaction the gate opened has been rolled back. When
    /// [`retry`](FenceError::retry) is true (serialization failure,
    /// deadlock, SQLite busy or locked) run the whole transaction again;
    /// otherwise fix the cause first (the message names the table and what
    /// failed).
    #[error("fence table {table}: could not {action}: {detail}; nothing was admitted")]
    Database {
        /// The fence table.
        table: String,
        /// What the gate was doing.
        action: &'static str,
        /// The database's own words (for PostgreSQL with its SQLSTATE).
        detail: String,
        /// Whether running the whole transaction again may succeed.
        retry: bool,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database gates store tokens as signed 64-bit integers (the widest
    /// integer PostgreSQL and SQLite have). latchkey counts tokens from 1,
    /// one per grant, so a token this large is not one it issued.
    #[error(
        "token {token} for resource {resource:?} is larger than a database fence can store \
         (at most {}): it was not issued by latchkey; pass the fencing token of the writer's \
         lock guard",
        i64::MAX
    )]
    TokenTooLarge {
        /// The resource written to.
        resource: String,
        /// The refused token.
        token: u64,
    },
    /// The fence table holds a token the gate did not write (negative).
    /// Nothing was admitted; someone changed the table by hand.
    #[error(
        "the fence table {table} holds token {stored} for resource {resource:?}, which no \
         gate writes (tokens are never negative): it was changed by hand; restore it from a \
         backup or set it to the highest token granted for the lock"
    )]
    CorruptRow {
        /// The fence table.
        table: String,
        /// The resource whose row is wrong.
        resource: String,
        /// What the row holds.
        stored: i64,
    },
    /// A database gate opens the transaction itself, so that the check is
    /// its first statement and no savepoint can undo it, but the connection
    /// is already inside a transaction (an explicit `BEGIN`). Commit or roll
    /// that back first.
    #[error(
        "fence table {table}: the connection is already inside a transaction; the gate opens \
         the transaction itself (so that no savepoint can undo the check): commit or roll \
         back the open one first"
    )]
    NestedTransaction {
        /// The fence table.
        table: String,
    },
    /// A fence table name that is not a plain SQL identifier.
    #[error(
        "fence table name {name:?} is not allowed: use 1 to 63 lower-case ASCII letters, \
         digits or underscores, not starting with a digit nor with `sqlite_`, optionally \
         after a schema name of the same kind and a dot (`app.latchkey_fence`)"
    )]
    BadTableName {
        /// The name given.
        name: String,
    },
}

impl FenceError {
    /// Whether running the whole transaction again may succeed: true only
    /// for a [`FenceError::Database`] error that the database reports as a
    /// conflict between transactions (a serialization failure or deadlock
    /// in PostgreSQL, a busy or locked database in SQLite). A stale token
    /// stays stale: [`FenceError::Stale`] is never worth retrying.
    pub fn retry(&self) -> bool {
        matches!(self, FenceError::Database { retry: true, .. })
    }
}
