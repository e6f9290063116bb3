//! openraft's conformance suite against the RocksDB stores.

use latchkey_storage::{open, LogStore, StateMachine, StorageOptions, TypeConfig};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{ErrorSubject, ErrorVerb, StorageError};
use tempfile::TempDir;

/// Opens a fresh store in its own temporary directory; the directory is the
/// guard, removed once the suite drops it.
struct FreshStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for FreshStore {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let failed = |e: std::io::Error| {
            StorageError::from_io_error(ErrorSubject::Store, ErrorVerb::Write, e)
        };
        let dir = tempfile::tempdir().map_err(failed)?;
        let (log, sm) = open(dir.path(), StorageOptions::default())
            .map_err(|e| failed(std::io::Error::other(e)))?;
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    if let Err(e) = Suite::test_all(FreshStore).await {
        panic!("openraft storage suite failed: {e}");
    }
}
