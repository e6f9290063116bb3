//! # latchkey-storage
//!
//! Where a latchkey replica keeps its Raft state: one RocksDB instance
//! holding the Raft log with its metadata ([`LogStore`], an openraft
//! `RaftLogStorage`), and the state machine that applies committed entries
//! through `latchkey-core` ([`StateMachine`], an openraft
//! `RaftStateMachine`), with durable snapshots.
//!
//! What it guarantees:
//! - **Durability.** A vote is fsynced before `save_vote` returns; an
//!   appended entry is acknowledged (its callback fired) only after a WAL
//!   sync covering it, on a leader as on a follower; truncations and purges
//!   are synced before they return. openraft replicates a leader's entries
//!   while the leader syncs them and counts the leader only once synced, so
//!   nothing is committed, or applied anywhere, before it is on a majority
//!   of disks ([`durable`] has the argument).
//! - **Group commit.** Appends are readable at once and share fsyncs: one
//!   flusher syncs once for every append queued meanwhile
//!   ([`LogStore::fsync_count`] tells how many syncs were needed).
//! - **Atomic applies.** Each `apply()` call is one RocksDB write batch
//!   holding the data, the last applied log id and the membership.
//! - **Lock rooms in memory.** Sessions, locks, request memory, access
//!   control and the core's counters are also held in memory, always equal
//!   to what RocksDB holds, so applying a lock command reads nothing from
//!   RocksDB (`rooms` says how the copy stays exact).
//! - **Consistent reads.** A [`StateReader`] answers queries from whole apply
//!   batches, concurrently with applying.
//! - **Change notification.** [`StateMachine::subscribe`] streams the core's
//!   events (lock grants, queued waiters, ...) after they are committed.
//!
//! What it must not do: decide what a command means (that is
//! `latchkey-core`'s job: this crate only stores bytes the core writes),
//! encode anything except through `latchkey_core::codec`, let a
//! log write be applied or reported committed before a majority synced it, iterate a `HashMap` where it affects state, or panic
//! on bytes read from disk or the network.
//!
//! Layout of a data directory: `db/` is the RocksDB instance (column
//! families are described in the `columns` module), `snapshots/current.snap`
//! the current snapshot blob (beside it, `*.tmp` files while one is built
//! or installed; `snapshot_install` says how an install stays whole across
//! a crash), and `acknowledged.mark` the directory's
//! incarnation and the high-water mark of what it acknowledged
//! ([`ack_mark`]): opening refuses a directory that lost acknowledged state.
//! [`backup`] takes backups of the applied state and seeds new directories
//! from them.
//!
//! ```
//! use latchkey_core::{Command, Outcome, Query, Request};
//! use latchkey_storage::{open, StorageOptions};
//! use latchkey_storage::types::{log_id, Entry};
//! use openraft::EntryPayload;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let (_log, mut sm) = open(dir.path(), StorageOptions::default())?;
//! let reader = sm.reader();
//!
//! let put = Request { now: 1, command: Command::Put { key: b"k".to_vec(), value: b"v".to_vec() } };
//! let entry = Entry { log_id: log_id(1, 1, 1), payload: EntryPayload::Normal(put) };
//! let replies = tokio::runtime::Runtime::new()?.block_on(sm.apply_entries([entry]))?;
//! assert_eq!(replies, vec![Ok(Outcome::Written { revision: 1 })]);
//!
//! assert_eq!(reader.last_applied_index(), Some(1));
//! let got = reader.query(&Query::Get { key: b"k".to_vec() })?;
//! let Ok(Outcome::Value { value: Some(v), revision: 1 }) = got else { panic!("{got:?}") };
//! assert_eq!((v.value, v.create_revision, v.mod_revision, v.version), (b"v".to_vec(), 1, 1, 1));
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod ack_mark;
mod applied_state;
pub mod backup;
mod blocking;
mod columns;
mod data_view;
pub mod durable;
mod error;
mod group_commit;
mod log_store;
mod observe;
mod open;
mod rooms;
mod snapshot_builder;
mod snapshot_file;
mod snapshot_format;
mod snapshot_install;
mod state_change;
mod state_machine;
mod state_reader;
pub mod types;

pub use ack_mark::{MarkRecord, MARK_FILE};
pub use durable::DurableLog;
pub use error::StorageError;
pub use log_store::{LogReader, LogStore};
pub use observe::{SnapshotPace, StorageObserver};
pub use open::{open, StorageOptions};
pub use snapshot_builder::SnapshotBuilder;
pub use state_change::StateChange;
pub use state_machine::{DbClosed, StateMachine};
pub use state_reader::StateReader;
pub use types::{Member, NodeId, TypeConfig};
