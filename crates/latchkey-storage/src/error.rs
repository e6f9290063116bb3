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
