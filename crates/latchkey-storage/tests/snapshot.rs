//! Snapshots: build on one replica, install on another, both answer alike;
//! damaged blobs are refused; the current snapshot survives restarts.

mod common;

use std::ops::Bound;

use common::*;
use latchkey_core::{BatchOp, Command, Condition, Outcome, Query, ScanRange, Store};
use latchkey_storage::types::Snapshot;
use latchkey_storage::{open, StateMachine, StateReader, StorageOptions};
use openraft::storage::RaftStateMachine;
use openraft::RaftSnapshotBuilder;
use openraft_legacy::network_v1::SnapshotReceiverFactory;

fn everything(reader: &StateReader) -> Vec<(Vec<u8>, Vec<u8>)> {
    reader
        .scan(Bound::Unbounded, Bound::Unbounded, false, usize::MAX)
        .unwrap()
}

/// The cluster's revision `reader` sees.
fn revision_of(reader: &StateReader) -> u64 {
    match reader.query(&Query::Get { key: b"a".to_vec() }).unwrap() {
        Ok(Outcome::Value { revision, .. }) => revision,
        other => panic!("not a Get's answer: {other:?}"),
    }
}

fn queries() -> Vec<Query> {
    let keys: Vec<Vec<u8>> = ["a", "b", "c", "k1", "k2", "k3", "zz"]
        .iter()
        .map(|k| k.as_bytes().to_vec())
        .collect();
    let mut qs: Vec<Query> = keys.iter().map(|k| Query::Get { key: k.clone() }).collect();
    qs.push(Query::MultiGet { keys });
    qs.push(Query::Scan(ScanRange::prefix("k", 0)));
    qs.push(Query::Scan(ScanRange::prefix("", 2)));
    qs.push(Query::Scan(ScanRange {
        start: b"b".to_vec(),
        end: Some(b"k3".to_vec()),
        prefix: Vec::new(),
        limit: 0,
        reverse: true,
    }));
    qs
}

/// A state machine with some history: membership, puts, deletes, a batch,
/// a sequence.
async fn populated(sm: &mut StateMachine) {
    let mut entries = vec![membership(1, 1, &[1, 2])];
    let commands = vec![
        put("a", "1"),
        put("b", "2"),
        put("c", "3"),
        put("k1", "x"),
        put("k2", "y"),
        put("k3", "z"),
        Command::Delete { key: b"b".to_vec() },
        Command::Batch {
            conditions: vec![Condition::value_is("a", Some(b"1".to_vec()))],
            ops: vec![
                BatchOp::Put {
                    key: b"zz".to_vec(),
                    value: b"last".to_vec(),
                },
                BatchOp::Delete {
                    key: b"k2".to_vec(),
                },
            ],
        },
        Command::NextSequence {
            key: b"ids".to_vec(),
            step: 100,
        },
    ];
    for (i, c) in commands.into_iter().enumerate() {
        let index = i as u64 + 2;
        entries.push(command(1, index, 100 + index, c));
    }
    entries.push(blank(2, 20));
    // Two apply calls, so more than one batch is involved.
    let rest = entries.split_off(5);
    sm.apply_entries(entries).await.unwrap();
    sm.apply_entries(rest).await.unwrap();
}

async fn install(
    sm: &mut StateMachine,
    snap: &Snapshot,
    blob: Vec<u8>,
) -> Result<(), std::io::Error> {
    receive_and_install(sm, &snap.meta, &blob).await
}

#[test]
fn build_install_and_compare() {
    let rt = runtime();
    let dir_l = tempfile::tempdir().unwrap();
    let dir_f = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let (_log_l, mut sm_l) = open(dir_l.path(), StorageOptions::default()).unwrap();
        let (_log_f, mut sm_f) = open(dir_f.path(), StorageOptions::default()).unwrap();
        populated(&mut sm_l).await;
        // The follower starts with unrelated state that the install must wipe.
        sm_f.apply_entries(vec![
            command(1, 1, 5, put("junk", "j")),
            command(1, 2, 6, put("a", "old")),
        ])
        .await
        .unwrap();

        let mut snap = sm_l
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(2, 20)));
        assert_eq!(snap.meta.last_membership.log_id(), &Some(log_id(1, 1)));
        let blob = snapshot_bytes(&mut snap).await;
        install(&mut sm_f, &snap, blob).await.unwrap();

        let (reader_l, reader_f) = (sm_l.reader(), sm_f.reader());
        for q in queries() {
            assert_eq!(
                reader_l.query(&q).unwrap(),
                reader_f.query(&q).unwrap(),
                "{q:?}"
            );
        }
        assert_eq!(everything(&reader_l), everything(&reader_f));
        assert_eq!(
            reader_f
                .query(&Query::Get {
                    key: b"junk".to_vec()
                })
                .unwrap(),
            Ok(Outcome::Value {
                value: None,
                revision: revision_of(&reader_l)
            })
        );
        assert_eq!(reader_f.last_applied_index(), Some(20));
        assert_eq!(
            sm_l.applied_state().await.unwrap(),
            sm_f.applied_state().await.unwrap()
        );
        let current = sm_f
            .get_current_snapshot()
            .await
            .unwrap()
            .expect("installed snapshot");
        assert_eq!(current.meta, snap.meta);

        // Both keep applying identically after the install.
        let next = vec![command(
            2,
            21,
            500,
            Command::NextSequence {
                key: b"ids".to_vec(),
                step: 1,
            },
        )];
        let l = sm_l.apply_entries(next.clone()).await.unwrap();
        let f = sm_f.apply_entries(next).await.unwrap();
        assert_eq!(l, f);
        assert_eq!(
            l,
            vec![Ok(Outcome::Sequence {
                start: 100,
                end: 101
            })]
        );
        assert_eq!(everything(&reader_l), everything(&reader_f));
    });
}

#[test]
fn damaged_snapshots_are_refused() {
    let rt = runtime();
    let dir_l = tempfile::tempdir().unwrap();
    let dir_f = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let (_log_l, mut sm_l) = open(dir_l.path(), StorageOptions::default()).unwrap();
        let (_log_f, mut sm_f) = open(dir_f.path(), StorageOptions::default()).unwrap();
        populated(&mut sm_l).await;
        sm_f.apply_entries(vec![command(1, 1, 5, put("mine", "kept"))])
            .await
            .unwrap();
        let before = everything(&sm_f.reader());

        let (snap, good) = built(&mut sm_l).await;
        let mut flipped = good.clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0x01;
        let bad_blobs = vec![
            ("empty", Vec::new()),
            ("garbage", b"definitely not a snapshot".to_vec()),
            ("truncated", good[..good.len() - 9].to_vec()),
            ("flipped byte", flipped),
        ];
        for (what, blob) in bad_blobs {
            let res = install(&mut sm_f, &snap, blob).await;
            assert!(res.is_err(), "{what} blob was installed");
            assert_eq!(
                everything(&sm_f.reader()),
                before,
                "{what} blob changed the state"
            );
        }
        assert!(sm_f.get_current_snapshot().await.unwrap().is_none());

        // A good blob under the wrong meta is refused too.
        let mut wrong = snap.meta.clone();
        wrong.last_log_id = Some(log_id(9, 99));
        assert!(receive_and_install(&mut sm_f, &wrong, &good).await.is_err());
        assert_eq!(everything(&sm_f.reader()), before);

        // And the good one installs.
        install(&mut sm_f, &snap, good).await.unwrap();
        assert_eq!(everything(&sm_f.reader()), everything(&sm_l.reader()));
    });
}

#[test]
fn current_snapshot_survives_restart() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let (built, built_bytes) = rt.block_on(async {
        let (_log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        assert!(sm.get_current_snapshot().await.unwrap().is_none());
        populated(&mut sm).await;
        let mut built = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let bytes = snapshot_bytes(&mut built).await;
        (built.meta, bytes)
    });
    rt.block_on(async {
        let (_log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        let mut current = sm
            .get_current_snapshot()
            .await
            .unwrap()
            .expect("snapshot after restart");
        assert_eq!(current.meta, built);
        assert_eq!(snapshot_bytes(&mut current).await, built_bytes);
    });
}

#[test]
fn a_damaged_snapshot_file_fails_open() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let (_log, mut sm) = open(dir.path(), StorageOptions::default()).unwrap();
        populated(&mut sm).await;
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    });
    let path = dir.path().join("snapshots").join("current.snap");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert!(open(dir.path(), StorageOptions::default()).is_err());
}

/// A backup restores into a new directory row for row (through the
/// transform), with its seed; a damaged backup, a refused row or a used
/// directory writes nothing.
#[test]
fn backups_restore_into_new_directories_only() {
    use latchkey_storage::backup::{read_backup, restore, BackupError};
    let rt = runtime();
    let source = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let (_log, mut sm) = open(source.path(), StorageOptions::default()).unwrap();
        populated(&mut sm).await;
        let reader = sm.reader();
        let (meta, blob) = reader.backup().unwrap();
        assert_eq!(meta.last_index(), 20);
        let mut rows = Vec::new();
        assert_eq!(read_backup(&blob, |k, v| rows.push((k, v))).unwrap(), meta);
        assert_eq!(rows, everything(&reader));
        assert_eq!(reader.restored_seed().unwrap(), None);

        // Damaged: refused, nothing created.
        let mut bad = blob.clone();
        let middle = bad.len() / 2;
        bad[middle] ^= 1;
        let fresh = target.path().join("a");
        let err = restore(&fresh, &bad, b"plan", |_, v| Ok(Some(v.to_vec())), &[]).unwrap_err();
        assert!(matches!(err, BackupError::Damaged(_)), "{err}");
        assert!(!fresh.exists());
        // A row the transform refuses: nothing created either.
        let err = restore(
            &fresh,
            &blob,
            b"plan",
            |k, v| {
                if k == b"Dzz" {
                    Err("no".into())
                } else {
                    Ok(Some(v.to_vec()))
                }
            },
            &[],
        )
        .unwrap_err();
        assert!(matches!(err, BackupError::Refused(_)), "{err}");
        assert!(!fresh.exists());

        // Restored: every row, transformed; the seed depends on the plan.
        let meta_a = restore(
            &fresh,
            &blob,
            b"plan",
            |k, v| {
                Ok(Some(if k == b"Da" {
                    b"changed".to_vec()
                } else {
                    v.to_vec()
                }))
            },
            &[(b"Mextra".to_vec(), b"x".to_vec())],
        )
        .unwrap();
        assert_eq!(meta_a, meta);
        let other = target.path().join("b");
        // A restore cut short left its building directory: it is replaced.
        std::fs::create_dir_all(target.path().join("b.restoring/junk")).unwrap();
        restore(
            &other,
            &blob,
            b"other plan",
            |_, v| Ok(Some(v.to_vec())),
            &[],
        )
        .unwrap();
        assert!(!target.path().join("b.restoring").exists());
        // A used directory is refused.
        let err = restore(&fresh, &blob, b"plan", |_, v| Ok(Some(v.to_vec())), &[]).unwrap_err();
        assert!(matches!(err, BackupError::NotEmpty(_)), "{err}");

        let (_log_a, sm_a) = open(&fresh, StorageOptions::default()).unwrap();
        let restored = sm_a.reader();
        let mut expected = rows.clone();
        for (k, v) in &mut expected {
            if k.as_slice() == b"Da" {
                *v = b"changed".to_vec();
            }
        }
        expected.push((b"Mextra".to_vec(), b"x".to_vec()));
        expected.sort();
        assert_eq!(everything(&restored), expected);
        assert_eq!(
            restored.last_applied_index(),
            None,
            "a restore applies no log"
        );
        let seed_a = restored.restored_seed().unwrap();
        let (_log_b, sm_b) = open(&other, StorageOptions::default()).unwrap();
        let seed_b = sm_b.reader().restored_seed().unwrap();
        assert!(seed_a.is_some() && seed_b.is_some() && seed_a != seed_b);
    });
}

/// Build a snapshot of `sm`; return it and its bytes.
async fn built(sm: &mut StateMachine) -> (Snapshot, Vec<u8>) {
    let mut snap = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let bytes = snapshot_bytes(&mut snap).await;
    (snap, bytes)
}

/// `count` puts of `bytes`-byte values under `prefix`, applied from index
/// `first` on in one apply call. The values are pseudo-random, so they do
/// not compress: an install of them spans several SST files.
async fn load(sm: &mut StateMachine, first: u64, prefix: &str, count: u64, bytes: usize) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let entries = (0..count)
        .map(|i| {
            let value = (0..bytes)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            command(
                1,
                first + i,
                1_000 + i,
                Command::Put {
                    key: format!("{prefix}{i:06}").into_bytes(),
                    value,
                },
            )
        })
        .collect::<Vec<_>>();
    sm.apply_entries(entries).await.unwrap();
}

/// A snapshot larger than one install SST file (32 MiB) installs whole;
/// and while it is installed, a reader sees the old state or the new one,
/// or is told the replica is installing, but never a mix of the two.
#[test]
fn a_large_install_is_never_seen_half_done() {
    let rt = runtime();
    let dir_l = tempfile::tempdir().unwrap();
    let dir_f = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let (_log_l, mut sm_l) = open(dir_l.path(), StorageOptions::default()).unwrap();
        let (_log_f, mut sm_f) = open(dir_f.path(), StorageOptions::default()).unwrap();
        sm_l.apply_entries(vec![membership(1, 1, &[1, 2, 3])])
            .await
            .unwrap();
        load(&mut sm_l, 2, "new/", 12_000, 6_000).await; // ~70 MiB
        load(&mut sm_f, 1, "old/", 100, 16).await;
        let (snap, blob) = built(&mut sm_l).await;
        assert!(blob.len() > 64 << 20, "{} bytes", blob.len());

        let reader = sm_f.reader();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let watching = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let probe = Query::MultiGet {
                    keys: vec![b"old/000000".to_vec(), b"new/011999".to_vec()],
                };
                let (mut old, mut new, mut refused) = (0, 0, 0);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    match reader.query(&probe) {
                        Err(e) => {
                            assert!(e.to_string().contains("installing a snapshot"), "{e}");
                            refused += 1;
                        }
                        Ok(Ok(Outcome::Values { values: v, .. })) => match (&v[0], &v[1]) {
                            (Some(_), None) => {
                                old += 1;
                                let _ = started_tx.send(());
                            }
                            (None, Some(_)) => new += 1,
                            other => panic!("a read saw a half-installed state: {other:?}"),
                        },
                        other => panic!("unexpected answer {other:?}"),
                    }
                }
                (old, new, refused)
            })
        };
        // The reader is reading before the install begins.
        started_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        install(&mut sm_f, &snap, blob).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (old, new, refused) = watching.join().unwrap();
        assert!(
            new > 0,
            "never saw the new state (old {old}, refused {refused})"
        );
        assert_eq!(everything(&sm_l.reader()), everything(&sm_f.reader()));
        assert_eq!(sm_f.reader().last_applied_index(), Some(12_001));
    });
}

/// A crash between saving a received snapshot and the end of its install
/// (the current snapshot is newer than the applied state) is finished when
/// the directory is opened again, before anything is served.
#[test]
fn an_install_cut_short_is_finished_at_open() {
    let rt = runtime();
    let dir_l = tempfile::tempdir().unwrap();
    let dir_f = tempfile::tempdir().unwrap();
    let expected = rt.block_on(async {
        let (_log_l, mut sm_l) = open(dir_l.path(), StorageOptions::default()).unwrap();
        let (_log_f, mut sm_f) = open(dir_f.path(), StorageOptions::default()).unwrap();
        populated(&mut sm_l).await;
        sm_f.apply_entries(vec![command(1, 1, 5, put("junk", "j"))])
            .await
            .unwrap();
        sm_l.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        everything(&sm_l.reader())
    });
    // What `receive` leaves just before replacing the rows: the checked
    // snapshot is current, the state machine still the old one.
    std::fs::copy(
        dir_l.path().join("snapshots/current.snap"),
        dir_f.path().join("snapshots/current.snap"),
    )
    .unwrap();
    std::fs::write(dir_f.path().join("snapshots/installing-x.tmp"), b"partial").unwrap();
    rt.block_on(async {
        let (_log_f, mut sm_f) = open(dir_f.path(), StorageOptions::default()).unwrap();
        assert_eq!(everything(&sm_f.reader()), expected);
        assert_eq!(sm_f.reader().last_applied_index(), Some(20));
        let (applied, _) = sm_f.applied_state().await.unwrap();
        assert_eq!(applied, Some(log_id(2, 20)));
        assert!(
            !dir_f.path().join("snapshots/installing-x.tmp").exists(),
            "a leftover temporary file was kept"
        );
    });
}

/// openraft 0.9 purged the log behind a snapshot as soon as it had queued
/// the install (0.10 waits by itself); the purge waits until the snapshot is saved as current (or
/// the entries are applied), so a crash in between cannot leave a log that
/// starts past the applied state with nothing to fill the gap.
#[test]
fn a_purge_waits_for_the_snapshot_that_covers_it() {
    use openraft::storage::RaftLogStorage;
    let rt = runtime();
    let dir_l = tempfile::tempdir().unwrap();
    let dir_f = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let (_log_l, mut sm_l) = open(dir_l.path(), StorageOptions::default()).unwrap();
        let (log_f, mut sm_f) = open(dir_f.path(), StorageOptions::default()).unwrap();
        sm_l.apply_entries(vec![membership(1, 1, &[1, 2, 3])])
            .await
            .unwrap();
        load(&mut sm_l, 2, "k", 60, 16).await;
        let (snap, blob) = built(&mut sm_l).await;

        // Nothing being received: a bare purge goes ahead (openraft's
        // conformance suite does this).
        let mut bare = log_f.clone();
        tokio::time::timeout(std::time::Duration::from_secs(10), bare.purge(log_id(1, 1)))
            .await
            .expect("a purge with no snapshot arriving does not wait")
            .unwrap();
        // The leader's chunks arrive, then openraft purges at once.
        let mut data = sm_f.begin_receiving_snapshot().await.unwrap();
        {
            use tokio::io::AsyncWriteExt;
            data.write_all(&blob).await.unwrap();
        }
        let mut purging_log = log_f.clone();
        let purge = tokio::spawn(async move { purging_log.purge(log_id(1, 50)).await });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            !purge.is_finished(),
            "purged entries that neither a snapshot nor the state holds"
        );
        sm_f.install_snapshot(&snap.meta, data).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), purge)
            .await
            .expect("the purge goes on once the snapshot is current")
            .unwrap()
            .unwrap();
    });
}
