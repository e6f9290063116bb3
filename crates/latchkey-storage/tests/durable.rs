//! The durable log: what a replica acknowledges, applies and reports as
//! committed never runs ahead of what its disk holds, whether it acknowledges
//! appends after their sync (a follower) or before it (a leader with
//! `overlap_leader_fsync`).

mod common;

use common::*;
use latchkey_core::Query;
use latchkey_storage::types::Vote;
use latchkey_storage::{open, StorageOptions};
use latchkey_storage::{LogStore, StateMachine};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};

/// A store in `dir` of replica 1, leading term 1, acknowledging its own
/// appends early.
async fn leader_store(dir: &std::path::Path) -> (LogStore, StateMachine) {
    let (mut log, sm) = open(dir, StorageOptions::default()).unwrap();
    log.overlap_leader_fsync(1).unwrap();
    log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
    (log, sm)
}

#[test]
fn a_follower_append_is_durable_once_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        // Early acknowledgement is on, but the vote names another replica.
        log.overlap_leader_fsync(2).unwrap();
        log.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        for index in 1..=5 {
            log.blocking_append([blank(1, index)]).await.unwrap();
            assert_eq!(log.durable().last(), Some(log_id(1, index)));
        }
    });
}

#[test]
fn a_leader_applies_its_own_entries_only_once_synced() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, mut sm) = leader_store(dir.path()).await;
        let reader = sm.reader();
        let mut entries = vec![membership(1, 1, &[1, 2, 3])];
        for index in 2..=40 {
            entries.push(command(1, index, index, put(&format!("k{index}"), "v")));
        }
        for entry in &entries {
            log.blocking_append([entry.clone()]).await.unwrap();
        }
        // Applying each entry returns only once the log holds it durably.
        // (The sync is usually quick; the deterministic check of the gate
        // is `state_machine::tests::apply_waits_for_the_leaders_own_sync`.)
        for entry in entries {
            let index = entry.log_id.index;
            sm.apply_entries([entry]).await.unwrap();
            let durable = log.durable().last().map(|l| l.index);
            assert!(
                durable >= Some(index),
                "applied {index}, durable {durable:?}"
            );
        }
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
fn another_leaders_vote_brings_back_synced_acknowledgements() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, _sm) = leader_store(dir.path()).await;
        log.blocking_append([blank(1, 1), blank(1, 2)])
            .await
            .unwrap();
        // Replica 2 wins term 2: from now on appends are its entries, and an
        // acknowledgement must again mean "on disk".
        log.save_vote(&Vote::new_committed(2, 2)).await.unwrap();
        for index in 3..=6 {
            log.blocking_append([blank(2, index)]).await.unwrap();
            assert_eq!(log.durable().last().map(|l| l.index), Some(index));
        }
    });
}

#[test]
fn truncation_takes_back_what_it_removed() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, _sm) = leader_store(dir.path()).await;
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
        let (mut log, _sm) = leader_store(dir.path()).await;
        let entries: Vec<_> = (1..=5).map(|i| blank(1, i)).collect();
        log.blocking_append(entries).await.unwrap();
    });
    rt.block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        assert_eq!(log.durable().last(), Some(log_id(1, 5)));
        // It was the leader of term 1. After a machine crash its log could
        // have lost a tail that followers hold; resuming term 1 would give
        // new entries the same log ids as those. So its vote is lowered
        // (not committed) and it must win a new term first.
        log.overlap_leader_fsync(1).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(1, 1)));
    });
    rt.block_on(async {
        // The lowered vote stays lowered; a restart without the option
        // leaves it as it is.
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(1, 1)));
        log.save_vote(&Vote::new_committed(2, 2)).await.unwrap();
        log.overlap_leader_fsync(1).unwrap();
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(2, 2))
        );
    });
}

#[test]
fn a_leader_syncs_membership_entries_before_acknowledging_them() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let (mut log, _sm) = leader_store(dir.path()).await;
        // openraft changes membership on its own commit index, so a
        // membership entry is acknowledged only once it is on disk.
        for index in 1..=5 {
            log.blocking_append([membership(1, index, &[1, 2, 3])])
                .await
                .unwrap();
            assert_eq!(log.durable().last(), Some(log_id(1, index)));
        }
    });
}
