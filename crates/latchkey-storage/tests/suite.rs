//! openraft's conformance suite against the RocksDB stores.

use latchkey_storage::{open, LogStore, StateMachine, StorageOptions, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageError, StorageIOError};
use tempfile::TempDir;

/// Opens a fresh store in its own temporary directory; the directory is the
/// guard, removed once the suite drops it.
struct FreshStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for FreshStore {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        let (log, sm) = open(dir.path(), StorageOptions::default())
            .map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    if let Err(e) = Suite::test_all(FreshStore) {
        panic!("openraft storage suite failed: {e}");
    }
}
