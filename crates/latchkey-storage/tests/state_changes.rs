//! Subscribers hear about the core's events once they are committed.

mod common;

use common::*;
use latchkey_core::lock::LockCommand;
use latchkey_core::{Command, Event};
use latchkey_storage::{open, StateChange, StorageOptions};
use openraft::storage::RaftStateMachine;
use openraft::RaftSnapshotBuilder;

#[test]
fn events_are_published_after_commit() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let (_log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        let mut changes = sm.subscribe();
        let reader = sm.reader();
        sm.apply_entries(vec![
            command(1, 1, 1_000, put("k", "v")),
            command(
                1,
                2,
                1_001,
                Command::Lock(LockCommand::OpenSession {
                    ttl_ms: 10_000,
                    secret: latchkey_core::lock::SessionSecret::default(),
                    name: String::new(),
                }),
            ),
            blank(1, 3),
        ])
        .await
        .unwrap();

        match changes.try_recv().expect("an event for the session") {
            StateChange::Applied { log_id: id, events } => {
                assert_eq!(id, log_id(1, 2));
                assert!(
                    matches!(events.as_slice(), [Event::SessionOpened { .. }]),
                    "{events:?}"
                );
                // Published after the commit: the reader already sees it.
                assert!(reader.last_applied_index() >= Some(2));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            changes.try_recv().is_err(),
            "puts and blanks have no events"
        );

        // A snapshot install is announced as such.
        let mut snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let (_log2, mut sm2) = open(dir2.path(), StorageOptions::default()).unwrap();
        let mut changes2 = sm2.subscribe();
        let blob = snapshot_bytes(&mut snap).await;
        receive_and_install(&mut sm2, &snap.meta, &blob)
            .await
            .unwrap();
        assert_eq!(
            changes2.try_recv().unwrap(),
            StateChange::SnapshotInstalled {
                last_log_id: Some(log_id(1, 3))
            }
        );

        // A dropped receiver unsubscribes without disturbing applies.
        drop(changes);
        sm.apply_entries(vec![command(
            1,
            4,
            1_002,
            Command::Lock(LockCommand::OpenSession {
                ttl_ms: 10_000,
                secret: latchkey_core::lock::SessionSecret::default(),
                name: String::new(),
            }),
        )])
        .await
        .unwrap();
    });
}
