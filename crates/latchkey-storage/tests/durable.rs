//! The durable log: what a replica acknowledges and reports as committed
//! never runs ahead of what its disk holds, on a leader as on a follower.

mod common;

use common::*;
use latchkey_core::Query;
use latchkey_storage::types::Vote;
use latchkey_storage::{open, StorageOptions};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};

#[test]
fn every_append_is_durable_once_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        // Replica 1 leads term 1: its own entries, too, are acknowledged
        // only once synced (openraft replicates them meanwhile).
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        log.blocking_append([membership(1, 1, &[1, 2, 3])])
            .await
            .unwrap();
        assert_eq!(log.durable().last(), Some(log_id(1, 1)));
        for index in 2..=5 {
            log.blocking_append([blank(1, index)]).await.unwrap();
            assert_eq!(log.durable().last(), Some(log_id(1, index)));
        }
        // Replica 2 wins term 2: the same for the entries it sends.
        log.save_vote(&Vote::new_committed(2, 2)).await.unwrap();
        for index in 6..=8 {
            log.blocking_append([blank(2, index)]).await.unwrap();
            assert_eq!(log.durable().last(), Some(log_id(2, index)));
        }
    });
}

#[test]
fn applied_entries_are_readable() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        let reader = sm.reader();
        let mut entries = vec![membership(1, 1, &[1, 2, 3])];
        for index in 2..=40 {
            entries.push(command(1, index, index, put(&format!("k{index}"), "v")));
        }
        log.blocking_append(entries.clone()).await.unwrap();
        sm.apply_entries(entries).await.unwrap();
        assert_eq!(
            log.durable().clamp_commit(Some(log_id(1, 40))),
            Some(log_id(1, 40))
        );
        let got = reader
            .query(&Query::Get {
                key: b"k40".to_vec(),
            })
            .unwrap();
        assert_eq!(got_value(got), Some(b"v".to_vec()));
    });
}

#[test]
fn truncation_takes_back_what_it_removed() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        let entries: Vec<_> = (1..=6).map(|i| blank(1, i)).collect();
        log.blocking_append(entries).await.unwrap();
        // Deposed before 4..=6 committed; the new leader's log differs there.
        log.save_vote(&Vote::new_committed(2, 2)).await.unwrap();
        log.truncate_after(Some(log_id(1, 3))).await.unwrap();
        assert_eq!(log.durable().last(), Some(log_id(1, 3)));
        assert_eq!(
            log.durable().clamp_commit(Some(log_id(1, 6))),
            Some(log_id(1, 3))
        );
        log.blocking_append([blank(2, 4)]).await.unwrap();
        assert_eq!(log.durable().last(), Some(log_id(2, 4)));
    });
}

#[test]
fn reopening_syncs_what_was_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        let entries: Vec<_> = (1..=5).map(|i| blank(1, i)).collect();
        log.blocking_append(entries).await.unwrap();
    });
    rt.block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        assert_eq!(log.durable().last(), Some(log_id(1, 5)));
        // The vote is kept as saved; openraft (with leader restore off, as
        // latchkey-server sets it) makes a restarted leader win a new term.
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(1, 1))
        );
    });
}
