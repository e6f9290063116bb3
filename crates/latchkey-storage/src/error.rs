//! Errors: [`StorageError`] for opening the store, and the mapping of
//! RocksDB, codec and file failures into openraft's storage errors inside the
//! trait implementations.

use std::path::PathBuf;

use openraft::{AnyError, StorageIOError};

use crate::types::NodeId;

/// openraft's storage error for this crate's node id type.
pub(crate) type RaftStorageError = openraft::StorageError<NodeId>;

/// Opening the store failed; nothing is running and nothing was changed
/// beyond creating missing directories and column families.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// A directory or file of the store could not be created or read.
    #[error("{what} {path:?}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying failure.
        source: std::io::Error,
    },
    /// RocksDB refused to open or read the database.
    #[error("rocksdb: {0}")]
    RocksDb(#[from] rocksdb::Error),
    /// The database was opened without one of this crate's column families.
    #[error("column family {0:?} is missing")]
    MissingColumnFamily(&'static str),
    /// Stored bytes do not decode: the data directory is damaged or was
    /// written by an incompatible version.
    #[error("corrupt {what}: {detail}")]
    Corrupt {
        /// Which record.
        what: &'static str,
        /// Why it does not decode.
        detail: String,
    },
    /// The data directory lost state this replica had acknowledged (its log
    /// or vote is behind the acknowledgement mark, or the mark is gone while
    /// Raft state is there). Such a replica must never vote or count in a
    /// quorum again: its directory has to be emptied and the node re-added.
    #[error(
        "the data directory {dir:?} lost state this replica had acknowledged: {detail}. \
         It must not rejoin as it is (it could help lose committed writes). Repair: stop it, \
         move the directory away, start it again with an empty one (it waits as a new \
         member), then run `latchkey members add ID ADDR` against the cluster \
         (README: \"Replacing a failed disk or node\")"
    )]
    LostAcknowledged {
        /// The data directory.
        dir: PathBuf,
        /// What is missing.
        detail: String,
    },
    /// The group-commit flusher thread could not be started.
    #[error("cannot start the group-commit flusher: {0}")]
    Flusher(std::io::Error),
}

/// An [`AnyError`] from any error value.
pub(crate) fn any<E: std::error::Error + 'static>(e: &E) -> AnyError {
    AnyError::new(e)
}

/// An [`AnyError`] from a message.
pub(crate) fn msg(m: impl ToString) -> AnyError {
    AnyError::error(m)
}

/// Convert this crate's open-time error into openraft's, for code shared by
/// [`crate::open`] and the trait implementations.
pub(crate) fn to_raft(e: StorageError, verb: openraft::ErrorVerb) -> RaftStorageError {
    StorageIOError::new(openraft::ErrorSubject::Store, verb, any(&e)).into()
}
