//! [`open`]: the one RocksDB instance of a replica, and its [`StorageOptions`].

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DBCompressionType, Options, DB};

use crate::applied_state::AppliedState;
use crate::columns::{self, Handles};
use crate::error::StorageError;
use crate::log_store::LogStore;
use crate::snapshot_file::SnapshotFile;
use crate::state_machine::StateMachine;

/// Subdirectory of the data directory holding the RocksDB instance.
const DB_DIR: &str = "db";
/// Subdirectory of the data directory holding the current snapshot.
const SNAPSHOT_DIR: &str = "snapshots";

/// How to open the store. `Default` is what a replica should use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageOptions {
    /// Sync every state machine apply batch. Not needed for safety (see
    /// [`crate::StateMachine`]); costs one fsync per apply call. Default: off.
    pub sync_apply: bool,
    /// Compress the log and the state machine data with LZ4. Default: on.
    pub compression: bool,
    /// Let the leader sync its own log in parallel with replicating it
    /// (see [`crate::durable`]). `open` itself does not act on it: the
    /// replica, which knows its node id, calls
    /// [`LogStore::overlap_leader_fsync`] when it is on (latchkey-server's
    /// `Node` does). Default: on.
    pub overlap_leader_fsync: bool,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            sync_apply: false,
            compression: true,
            overlap_leader_fsync: true,
        }
    }
}

/// Open (creating if missing) the store in `dir`: one RocksDB instance with
/// column families for the log, the raft metadata, the state machine data
/// and the state machine metadata, plus the current snapshot file.
///
/// Returns the log store and the state machine to hand to `openraft::Raft::new`.
/// Opening is synchronous; the stores' trait methods must run inside a tokio
/// runtime (they use its blocking pool for fsyncs). Only one process may open
/// a directory at a time (RocksDB's lock file enforces it).
pub fn open(dir: &Path, options: StorageOptions) -> Result<(LogStore, StateMachine), StorageError> {
    let db_dir = dir.join(DB_DIR);
    std::fs::create_dir_all(&db_dir).map_err(|source| StorageError::Io {
        what: "create data directory",
        path: db_dir.clone(),
        source,
    })?;
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    let descriptors = columns::ALL.iter().map(|&name| {
        let mut cf_opts = Options::default();
        cf_opts.set_compression_type(if options.compression {
            DBCompressionType::Lz4
        } else {
            DBCompressionType::None
        });
        ColumnFamilyDescriptor::new(name, cf_opts)
    });
    let db = DB::open_cf_descriptors(&db_opts, &db_dir, descriptors)?;
    let state = {
        let cfs = Handles::of(&db)?;
        AppliedState::read(|k| db.get_cf(cfs.sm_meta, k)).map_err(|e| StorageError::Corrupt {
            what: "state machine metadata",
            detail: e.to_string(),
        })?
    };
    let file = SnapshotFile::open(&dir.join(SNAPSHOT_DIR))?;
    tracing::info!(
        dir = %dir.display(),
        last_applied = ?state.last_applied,
        "opened latchkey storage"
    );
    let db = Arc::new(db);
    let log = LogStore::new(Arc::clone(&db))?;
    let sm = StateMachine::new(db, file, state, options.sync_apply, log.durable());
    Ok((log, sm))
}
