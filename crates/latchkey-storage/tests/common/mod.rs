//! Helpers shared by the storage integration tests.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use latchkey_core::{Command, Request};
use latchkey_storage::types::Membership;
use latchkey_storage::types::{Entry, LogId};
use latchkey_storage::Member;
use openraft::EntryPayload;

/// Log id with leader node 1.
pub fn log_id(term: u64, index: u64) -> LogId {
    latchkey_storage::types::log_id(term, 1, index)
}

pub fn blank(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

pub fn membership(term: u64, index: u64, voters: &[u64]) -> Entry {
    let voters: BTreeSet<u64> = voters.iter().copied().collect();
    let nodes: BTreeMap<u64, Member> = voters
        .iter()
        .map(|&id| {
            (
                id,
                Member::new(
                    format!("127.0.0.1:{}", 7000 + id),
                    format!("127.0.0.1:{}", 8000 + id),
                    id,
                ),
            )
        })
        .collect();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(
            Membership::new(vec![voters], nodes).expect("a valid membership"),
        ),
    }
}

pub fn command(term: u64, index: u64, now: u64, command: Command) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Request { now, command }),
    }
}

pub fn put(key: &str, value: &str) -> Command {
    Command::Put {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("test runtime")
}

/// The bytes of a built or current snapshot: its file, read from the start
/// (and left at its end).
#[allow(dead_code)] // not every test binary that includes `common` uses it
pub async fn snapshot_bytes(snap: &mut latchkey_storage::types::Snapshot) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    snap.snapshot
        .seek(std::io::SeekFrom::Start(0))
        .await
        .expect("rewind snapshot file");
    let mut out = Vec::new();
    snap.snapshot
        .read_to_end(&mut out)
        .await
        .expect("read snapshot file");
    out
}

/// Receive `blob` as a follower does (into the file
/// `begin_receiving_snapshot` gives) and install it as `meta`.
#[allow(dead_code)]
pub async fn receive_and_install(
    sm: &mut latchkey_storage::StateMachine,
    meta: &latchkey_storage::types::SnapshotMeta,
    blob: &[u8],
) -> Result<(), std::io::Error> {
    use openraft::storage::RaftStateMachine;
    use openraft_legacy::network_v1::SnapshotReceiverFactory;
    use tokio::io::AsyncWriteExt;
    let mut data = sm.begin_receiving_snapshot().await?;
    data.write_all(blob).await.expect("write received bytes");
    sm.install_snapshot(meta, data).await
}

/// The value a `Get` answered (`None`: absent), dropping its revisions.
#[allow(dead_code)]
pub fn got_value(
    got: Result<latchkey_core::Outcome, latchkey_core::CommandError>,
) -> Option<Vec<u8>> {
    match got {
        Ok(latchkey_core::Outcome::Value { value, .. }) => value.map(|v| v.value),
        other => panic!("not a Get's answer: {other:?}"),
    }
}
