//! Opening refuses a data directory that lost state it had acknowledged:
//! entries behind the acknowledgement mark, a vote behind it, or Raft state
//! without a mark. The loss is made by editing the RocksDB instance
//! directly, as a write-ahead log cut short or a replaced file would leave
//! it.

mod common;

use std::path::Path;

use common::*;
use latchkey_storage::types::Vote;
use latchkey_storage::{open, StorageError, StorageOptions, MARK_FILE};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use rocksdb::{ColumnFamilyDescriptor, Options, DB};

/// Append entries 1..=10 (synced), vote for 2 in term 3, and close.
fn acknowledge_ten(dir: &Path) -> u64 {
    runtime().block_on(async {
        let (mut log, _sm) = open(dir, StorageOptions::default()).unwrap();
        log.save_vote(&Vote::new(3, 2)).await.unwrap();
        for index in 1..=10 {
            log.blocking_append([blank(3, index)]).await.unwrap();
        }
        assert_eq!(log.mark().log_index, 10);
        log.incarnation()
    })
}

/// Edit the closed store's RocksDB instance with `edit`.
fn edit_db(dir: &Path, edit: impl FnOnce(&DB)) {
    let cfs = ["log", "log_meta", "sm_data", "sm_meta"]
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
    let db = DB::open_cf_descriptors(&Options::default(), dir.join("db"), cfs).unwrap();
    edit(&db);
    db.flush_wal(true).unwrap();
}

fn lost(result: Result<impl Sized, StorageError>) -> String {
    match result {
        Err(e @ StorageError::LostAcknowledged { .. }) => e.to_string(),
        Err(other) => panic!("expected LostAcknowledged, got {other}"),
        Ok(_) => panic!("a directory that lost acknowledged state was opened"),
    }
}

#[test]
fn a_new_directory_draws_an_incarnation_that_survives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let incarnation = acknowledge_ten(dir.path());
    assert_ne!(incarnation, 0);
    let (log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
    assert_eq!(log.incarnation(), incarnation);
    assert_eq!(log.mark().vote, Some(Vote::new(3, 2)));
    let other = tempfile::tempdir().unwrap();
    let (log2, _sm2) = open(other.path(), StorageOptions::default()).unwrap();
    assert_ne!(
        log2.incarnation(),
        incarnation,
        "each directory draws its own"
    );
}

#[test]
fn a_log_cut_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    acknowledge_ten(dir.path());
    edit_db(dir.path(), |db| {
        let log = db.cf_handle("log").unwrap();
        for index in 7..=10u64 {
            db.delete_cf(log, index.to_be_bytes()).unwrap();
        }
    });
    let message = lost(open(dir.path(), StorageOptions::default()));
    assert!(
        message.contains("ends at index 6") && message.contains("up to 10"),
        "{message}"
    );
    assert!(
        message.contains("members add"),
        "names the repair: {message}"
    );
}

#[test]
fn a_vote_that_went_back_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    acknowledge_ten(dir.path());
    edit_db(dir.path(), |db| {
        let meta = db.cf_handle("log_meta").unwrap();
        let older = latchkey_core::codec::encode(&Vote::new(2, 1)).unwrap();
        db.put_cf(meta, b"vote", older).unwrap();
    });
    let message = lost(open(dir.path(), StorageOptions::default()));
    assert!(message.contains("saved vote"), "{message}");
}

/// A leader answered with a higher ballot of its own term (a follower woke
/// from a pause and stood for election) steps down and saves that ballot;
/// a kill between that save and the mark's catching up leaves a saved vote
/// for another candidate of the acknowledged term. That is a later ballot,
/// not a loss: the replica starts. A lower candidate is still refused.
#[test]
fn a_later_ballot_of_the_same_term_is_kept_and_a_lower_one_refused() {
    for (candidate, starts) in [(3, true), (1, false)] {
        let dir = tempfile::tempdir().unwrap();
        acknowledge_ten(dir.path());
        edit_db(dir.path(), |db| {
            let meta = db.cf_handle("log_meta").unwrap();
            let vote = latchkey_core::codec::encode(&Vote::new(3, candidate)).unwrap();
            db.put_cf(meta, b"vote", vote).unwrap();
        });
        let opened = open(dir.path(), StorageOptions::default());
        if starts {
            let (log, _sm) = opened.unwrap();
            assert_eq!(log.mark().log_index, 10);
        } else {
            let message = lost(opened);
            assert!(message.contains("saved vote is <T3-N1"), "{message}");
        }
    }
}

#[test]
fn raft_state_without_a_mark_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    acknowledge_ten(dir.path());
    std::fs::remove_file(dir.path().join(MARK_FILE)).unwrap();
    let message = lost(open(dir.path(), StorageOptions::default()));
    assert!(message.contains("mark"), "{message}");
}

#[test]
fn a_new_leaders_truncation_lowers_the_mark_first_so_reopening_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    acknowledge_ten(dir.path());
    runtime().block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        // A new leader (vote saved first, as openraft does) truncates a
        // conflicting tail that was acknowledged to the previous one.
        log.save_vote(&Vote::new_committed(4, 3)).await.unwrap();
        log.truncate_after(Some(log_id(3, 7))).await.unwrap();
        assert_eq!(log.mark().log_index, 7);
    });
    let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
    let state = runtime().block_on(log.get_log_state()).unwrap();
    assert_eq!(state.last_log_id, Some(log_id(3, 7)));
}

/// openraft may install a snapshot by first truncating the log from the
/// local commit index, even entries acknowledged to the current leader. The
/// mark keeps those: a crash before the snapshot is in place is refused at
/// start rather than coming back with fewer acknowledged entries.
#[test]
fn a_truncation_under_the_same_leader_keeps_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    acknowledge_ten(dir.path());
    runtime().block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        log.truncate_after(Some(log_id(3, 7))).await.unwrap();
        assert_eq!(log.mark().log_index, 10);
    });
    let message = lost(open(dir.path(), StorageOptions::default()));
    assert!(message.contains("ends at index 7"), "{message}");
}
