//! Everything a replica stored is still there after it restarts.

mod common;

use common::*;
use latchkey_core::{Command, Outcome, Query};
use latchkey_storage::types::Vote;
use latchkey_storage::{open, StorageOptions};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::RaftLogReader;

#[test]
fn state_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    let entries = vec![
        membership(1, 1, &[1, 2, 3]),
        command(1, 2, 10, put("a", "1")),
        command(1, 3, 11, put("b", "2")),
        command(
            1,
            4,
            12,
            Command::NextSequence {
                key: b"seq".to_vec(),
                step: 5,
            },
        ),
        command(1, 5, 13, Command::Delete { key: b"a".to_vec() }),
        blank(2, 6),
    ];
    let vote = Vote::new_committed(2, 1);

    rt.block_on(async {
        let (mut log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        log.blocking_append(entries.clone()).await.unwrap();
        log.save_vote(&vote).await.unwrap();
        log.save_committed(Some(log_id(1, 4))).await.unwrap();
        // Apply up to index 4 only; 5 and 6 stay in the log.
        let replies = sm.apply_entries(entries[..4].to_vec()).await.unwrap();
        assert_eq!(replies.len(), 4);
        assert_eq!(replies[3], Ok(Outcome::Sequence { start: 0, end: 5 }));
    });

    // Everything above was dropped: the database is closed. Reopen.
    rt.block_on(async {
        let (mut log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 4)));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(2, 6)));
        assert_eq!(state.last_purged_log_id, None);
        assert_eq!(log.try_get_log_entries(0..).await.unwrap(), entries);

        let (applied, membership) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(log_id(1, 4)));
        assert_eq!(membership.log_id(), &Some(log_id(1, 1)));
        assert_eq!(
            membership.membership().voter_ids().collect::<Vec<_>>(),
            vec![1, 2, 3]
        );

        let reader = sm.reader();
        assert_eq!(reader.last_applied_index(), Some(4));
        let get = |k: &str| {
            reader
                .query(&Query::Get {
                    key: k.as_bytes().to_vec(),
                })
                .unwrap()
        };
        assert_eq!(got_value(get("a")), Some(b"1".to_vec()));
        assert_eq!(got_value(get("b")), Some(b"2".to_vec()));
        // The revisions came back with the data: two puts, two revisions.
        let Ok(Outcome::Value {
            value: Some(b),
            revision,
        }) = get("b")
        else {
            panic!("b is gone")
        };
        assert_eq!((b.create_revision, b.mod_revision, revision), (2, 2, 2));

        // Applying the rest continues from where it stopped.
        let replies = sm.apply_entries(entries[4..].to_vec()).await.unwrap();
        assert_eq!(
            replies,
            vec![
                Ok(Outcome::Deleted {
                    count: 1,
                    revision: 3
                }),
                Ok(Outcome::Done)
            ]
        );
        assert_eq!(got_value(get("a")), None);
        assert_eq!(reader.last_applied_index(), Some(6));
    });

    // Purge and truncate are durable too.
    rt.block_on(async {
        let (mut log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
        log.purge(log_id(1, 2)).await.unwrap();
        log.truncate_after(Some(log_id(1, 4))).await.unwrap();
    });
    rt.block_on(async {
        let (mut log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
        assert_eq!(state.last_log_id, Some(log_id(1, 4)));
        assert_eq!(
            log.try_get_log_entries(0..).await.unwrap(),
            entries[2..4].to_vec()
        );
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(2, 6)));
    });
}

#[test]
fn state_reader_refuses_writes() {
    use latchkey_core::Store;
    let dir = tempfile::tempdir().unwrap();
    let (_log, sm) = open(dir.path(), StorageOptions::default()).unwrap();
    let mut reader = sm.reader();
    assert!(reader.put(b"k", b"v").is_err());
    assert!(reader.delete(b"k").is_err());
    assert_eq!(reader.get(b"k").unwrap(), None);
}
