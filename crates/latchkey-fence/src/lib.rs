//! # latchkey-fence
//!
//! The storage side of fencing: what makes a store refuse a write from a
//! lock holder that has been superseded.
//!
//! A lease-based lock cannot stop a paused holder (a GC pause, SIGSTOP, a
//! partition) from acting after its lease ran out; only the resource can.
//! Every grant of a latchkey lock carries a fencing token, strictly
//! increasing across the cluster. The holder sends its token along with
//! each write; the store remembers the highest token it has admitted per
//! resource and refuses anything older. The rules every gate follows are
//! listed on [`FenceGate`]; [`Admission`] and [`FenceError`] are shared by
//! all gates.
//!
//! | Gate | Where the highest tokens live | The check is one step with the write because |
//! |------|-------------------------------|-----------------------------------------------|
//! | [`MemoryFenceGate`] | process memory | the caller holds its own lock across admit and write |
//! | [`FileFenceGate`] | one state file, fsynced | the same |
//! | [`PgFence`] (feature `postgres`) | a table of the guarded PostgreSQL database | it is the first statement of the write's own transaction and locks the resource's row until commit |
//! | [`SqliteFence`] (feature `sqlite`) | a table of the guarded SQLite database | it is the first statement of the write's own transaction, under SQLite's write lock |
//!
//! ## Why two shapes
//!
//! The memory and file gates keep their own state, so they share one trait,
//! [`FenceGate`] (`admit`, `highest`). The database gates cannot: their whole
//! point is that the check and the caller's write share one transaction, so
//! `begin` opens that transaction on the caller's connection, checks, and
//! hands it back for the write (a `tokio_postgres::Transaction`, async; a
//! `rusqlite::Transaction`, sync). A gate that ran its check in a
//! transaction of its own would be exactly the mistake they exist to
//! prevent. What they share is the decision, the error type and the
//! conformance suite (`tests/conformance.rs` runs the memory, file, SQLite
//! and PostgreSQL gates through the same checks).
//!
//! ## The database gates, step by step
//!
//! `begin` opens a transaction on the caller's connection and, as its first
//! statements, for one resource:
//!
//! 1. **Lock and read** the resource's row with one upsert that changes
//!    nothing (`INSERT INTO t AS fence ... VALUES (resource, 0) ON CONFLICT
//!    (resource) DO UPDATE SET token = fence.token RETURNING token`). A missing row is created
//!    with token 0 ("nothing admitted yet"); an existing one is locked. In
//!    PostgreSQL the row lock makes every other transaction fencing the
//!    same resource wait here until this one ends; in SQLite the statement
//!    takes the database's write lock.
//! 2. **Decide**: refuse a lower token, accept an equal one, raise to a
//!    higher one.
//! 3. **Raise** the row when the token is higher.
//!
//! The caller then writes in the same transaction and commits: the check,
//! the raise and the write become visible together, and no other writer of
//! the resource runs in between. A check made in another transaction (or in
//! autocommit mode) lets writer 33 be admitted, writer 34 be admitted and
//! commit, and writer 33's write land last; the gates' tests build exactly
//! that interleaving and fail if the check leaves the transaction. The gate
//! opens the transaction itself, rather than joining one the caller opened,
//! because a check inside a savepoint would be undone, and its row lock
//! released, by rolling the savepoint back while the write still commits.
//!
//! ## What this crate must not do
//!
//! It knows nothing of the cluster or the network: a gate runs in the
//! storage service, a token is a plain `u64` and a resource any string the
//! service chooses (usually the lock's name). It never forgets a token, and
//! on any error it admits nothing.
//!
//! [`ScratchPostgres`] (feature `scratch-postgres`) starts a throwaway
//! PostgreSQL server for tests and demos.

#![warn(missing_docs)]

mod error;
mod file;
mod file_format;
mod gate;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod rule;
#[cfg(feature = "scratch-postgres")]
mod scratch;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod table;

pub use error::FenceError;
pub use file::FileFenceGate;
pub use gate::FenceGate;
pub use memory::MemoryFenceGate;
#[cfg(feature = "postgres")]
pub use postgres::PgFence;
pub use rule::Admission;
#[cfg(feature = "scratch-postgres")]
pub use scratch::{ScratchError, ScratchPostgres, BINDIR_ENV, REQUIRE_ENV, USER as SCRATCH_USER};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use sql::DEFAULT_TABLE;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteFence;
