//! Concurrent appends share fsyncs, and every one of them is acknowledged.

mod common;

use common::*;
use latchkey_storage::{open, StorageOptions};
use openraft::storage::RaftLogStorageExt;
use openraft::RaftLogReader;

const APPENDS: u64 = 200;

#[test]
fn concurrent_appends_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let (log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        let before = log.fsync_count();
        let mut tasks = tokio::task::JoinSet::new();
        for index in 1..=APPENDS {
            let mut log = log.clone();
            // Each append waits for its own durability callback.
            tasks.spawn(async move { log.blocking_append([blank(1, index)]).await });
        }
        let mut acknowledged = 0u64;
        while let Some(done) = tasks.join_next().await {
            done.expect("append task").expect("append acknowledged");
            acknowledged += 1;
        }
        assert_eq!(acknowledged, APPENDS);

        let fsyncs = log.fsync_count() - before;
        println!(
            "group commit: {APPENDS} appends, {fsyncs} WAL syncs, {:.1} appends per sync",
            APPENDS as f64 / fsyncs.max(1) as f64
        );
        assert!(fsyncs >= 1, "acknowledged appends without any sync");
        assert!(fsyncs <= APPENDS, "more syncs ({fsyncs}) than appends");

        let mut reader = log.clone();
        let stored = reader.try_get_log_entries(1..=APPENDS).await.unwrap();
        let indexes: Vec<u64> = stored.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indexes, (1..=APPENDS).collect::<Vec<_>>());
    });
}

#[test]
fn entries_are_readable_as_soon_as_append_returns() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        for index in 1..=20 {
            log.blocking_append([blank(1, index)]).await.unwrap();
            let got = log.try_get_log_entries(index..index + 1).await.unwrap();
            assert_eq!(got, vec![blank(1, index)]);
        }
        // Sequential appends cannot share: one sync each at most.
        assert!(log.fsync_count() <= 20);
    });
}
