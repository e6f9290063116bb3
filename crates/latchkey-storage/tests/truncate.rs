//! `truncate_after(last)` keeps `last` and removes everything after it
//! (openraft 0.10's contract; 0.9's `truncate(id)` removed `id` itself).

mod common;

use common::*;
use latchkey_storage::{open, StorageOptions};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};

#[test]
fn truncate_after_keeps_the_named_entry_and_none_empties_the_log() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        let entries: Vec<_> = (1..=8).map(|i| blank(1, i)).collect();
        log.blocking_append(entries).await.unwrap();

        log.truncate_after(Some(log_id(1, 5))).await.unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(1, 5)));
        let kept = log.try_get_log_entries(0..100).await.unwrap();
        let kept: Vec<u64> = kept.iter().map(|e| e.log_id.index).collect();
        assert_eq!(kept, [1, 2, 3, 4, 5]);

        log.truncate_after(None).await.unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, None);
        assert!(log.try_get_log_entries(0..100).await.unwrap().is_empty());
    });
}
