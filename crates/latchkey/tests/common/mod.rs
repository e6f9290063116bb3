//! Helpers shared by the in-process cluster tests: loopback listeners and
//! node start-up with test Raft settings (small snapshot interval, so
//! snapshots happen during the tests).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;

use latchkey::{Node, RaftSettings};

pub fn reserve(n: u64) -> std::io::Result<BTreeMap<u64, TcpListener>> {
    (1..=n)
        .map(|id| Ok((id, TcpListener::bind("127.0.0.1:0")?)))
        .collect()
}

pub fn addrs(listeners: &BTreeMap<u64, TcpListener>) -> std::io::Result<Vec<(u64, String)>> {
    listeners
        .iter()
        .map(|(id, l)| Ok((*id, l.local_addr()?.to_string())))
        .collect()
}

pub fn settings() -> RaftSettings {
    RaftSettings::default()
        .with_snapshot_every(50)
        .with_keep_after_snapshot(5)
}

pub async fn start(
    id: u64,
    listener: TcpListener,
    dir: &Path,
    members: &[(u64, String)],
) -> Result<Node, Box<dyn std::error::Error>> {
    Ok(Node::builder(id)
        .listener(listener)
        .data_dir(dir.join(format!("node-{id}")))
        .initial_members(members.iter().cloned())
        .raft_settings(settings())
        .start()
        .await?)
}

/// Start `n` nodes (ids 1..=n) forming one cluster in `dir`; returns them
/// and the member list `(id, address)`.
pub async fn start_cluster(
    dir: &Path,
    n: u64,
) -> Result<(BTreeMap<u64, Node>, Vec<(u64, String)>), Box<dyn std::error::Error>> {
    let listeners = reserve(n)?;
    let members = addrs(&listeners)?;
    let mut nodes = BTreeMap::new();
    for (id, l) in listeners {
        nodes.insert(id, start(id, l, dir, &members).await?);
    }
    Ok((nodes, members))
}
