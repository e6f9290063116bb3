//! Errors: [`StorageError`] for opening the store, and the mapping of
//! RocksDB, codec and file failures into the `std::io::Error` that openraft's
//! storage traits return, with a message saying what was being done.

use std::path::PathBuf;

/// The error openraft's storage traits return (openraft 0.10: `io::Error`).
pub(crate) type RaftStorageError = std::io::Error;

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

/// A message, as the cause of a [`raft_io`] error.
pub(crate) fn msg(m: impl ToString) -> String {
    m.to_string()
}

/// Convert this crate's open-time error into openraft's, for code shared by
/// [`crate::open`] and the trait implementations.
pub(crate) fn to_raft(e: StorageError) -> RaftStorageError {
    std::io::Error::other(e)
}

/// `io::Error`s that say which storage operation failed, for the trait
/// implementations (the names follow what failed, as openraft 0.9's
/// `StorageIOError` constructors did).
pub(crate) mod raft_io {
    use std::fmt::Display;
    use std::io;

    fn fail(what: impl Display, cause: impl Display) -> io::Error {
        io::Error::other(format!("{what}: {cause}"))
    }

    /// Reading log entries failed.
    pub(crate) fn read_logs(cause: impl Display) -> io::Error {
        fail("reading the Raft log", cause)
    }

    /// Reading the entry at `index` failed (it does not decode).
    pub(crate) fn read_log_at_index(index: u64, cause: impl Display) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("reading the Raft log entry at index {index}: {cause}"),
        )
    }

    /// Writing log entries failed.
    pub(crate) fn write_logs(cause: impl Display) -> io::Error {
        fail("writing the Raft log", cause)
    }

    /// Writing the entry `log_id` failed.
    pub(crate) fn write_log_entry(log_id: impl Display, cause: impl Display) -> io::Error {
        fail(format_args!("writing the Raft log entry {log_id}"), cause)
    }

    /// Saving the vote failed.
    pub(crate) fn write_vote(cause: impl Display) -> io::Error {
        fail("saving the vote", cause)
    }

    /// Reading a piece of Raft metadata (`what`) failed.
    pub(crate) fn read_meta(what: &str, cause: impl Display) -> io::Error {
        fail(format_args!("reading the stored {what}"), cause)
    }

    /// Writing Raft metadata failed.
    pub(crate) fn write(cause: impl Display) -> io::Error {
        fail("writing Raft metadata", cause)
    }

    /// Reading the state machine failed.
    pub(crate) fn read_state_machine(cause: impl Display) -> io::Error {
        fail("reading the state machine", cause)
    }

    /// Writing the state machine failed.
    pub(crate) fn write_state_machine(cause: impl Display) -> io::Error {
        fail("writing the state machine", cause)
    }

    /// Applying the entry `log_id` failed.
    pub(crate) fn apply(log_id: impl Display, cause: impl Display) -> io::Error {
        fail(format_args!("applying the Raft log entry {log_id}"), cause)
    }

    /// Writing or installing a snapshot failed.
    pub(crate) fn write_snapshot(cause: impl Display) -> io::Error {
        fail("writing a snapshot", cause)
    }

    /// Reading a snapshot failed.
    pub(crate) fn read_snapshot(cause: impl Display) -> io::Error {
        fail("reading a snapshot", cause)
    }
}
