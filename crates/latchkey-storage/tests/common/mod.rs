//! Helpers shared by the storage integration tests.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use latchkey_core::{Command, Request};
use latchkey_storage::types::{Entry, LogId};
use latchkey_storage::Member;
use openraft::{CommittedLeaderId, EntryPayload, Membership};

/// Log id with leader node 1.
pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
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
        payload: EntryPayload::Membership(Membership::new(vec![voters], nodes)),
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
