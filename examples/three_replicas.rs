//! Three replicas in one process, each with its own RocksDB directory: write,
//! read, stop the leader, watch a new leader take over, and check that every
//! acknowledged write survived.
//!
//! Run it with `cargo xtask demo` (or `cargo run -p latchkey --example three_replicas`).

use std::time::{Duration, Instant};

use latchkey::ScanRange;

#[path = "support/mod.rs"]
mod support;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn say(msg: impl AsRef<str>) {
    println!("[three_replicas] {}", msg.as_ref());
}

#[tokio::main]
async fn main() -> Result<()> {
    let dirs = tempfile::tempdir()?;

    let (mut nodes, members) = support::start_three(dirs.path()).await?;
    say(format!("started three replicas: {members:?}"));

    let first = nodes.values().next().ok_or("no node started")?;
    let leader = first.wait_for_leader(Duration::from_secs(10)).await?;
    say(format!("node {leader} was elected leader"));

    // Write through a follower's in-process client: it forwards to the leader.
    let follower = *nodes
        .keys()
        .find(|id| **id != leader)
        .ok_or("no follower")?;
    let kv = nodes[&follower].client();
    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let key = format!("order/{i:03}");
        kv.put(&key, format!("paid-{i}")).await?;
        acknowledged.push(key);
    }
    say(format!(
        "wrote {} keys through node {follower} (forwarded to leader {leader}); each is fsynced on a majority",
        acknowledged.len()
    ));
    let ids = kv.next_sequence("invoice-ids", 100).await?;
    say(format!("allocated invoice ids {ids:?}"));

    // Stop the leader.
    let stopped = nodes.remove(&leader).ok_or("leader vanished")?;
    stopped.shutdown().await;
    say(format!("stopped the leader, node {leader}"));

    let started = Instant::now();
    let survivor = nodes.values().next().ok_or("no survivor")?;
    let new_leader = loop {
        match survivor.status().leader_id {
            Some(l) if l != leader => break l,
            _ if started.elapsed() > Duration::from_secs(15) => {
                return Err("no new leader within 15 s".into())
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    say(format!(
        "node {new_leader} took over after {} ms",
        started.elapsed().as_millis()
    ));

    // Every acknowledged write is still there (linearizable reads).
    let kv = survivor.client();
    let page = kv.scan(ScanRange::prefix("order/", 0)).await?;
    let found: Vec<String> = page
        .entries
        .iter()
        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
        .collect();
    if found != acknowledged {
        return Err(format!("lost writes: expected {acknowledged:?}, found {found:?}").into());
    }
    say(format!(
        "all {} acknowledged writes are served by the new leader",
        found.len()
    ));
    let more = kv.next_sequence("invoice-ids", 100).await?;
    say(format!(
        "the sequence continues after failover: {more:?} (never reuses {ids:?})"
    ));
    kv.put("order/020", "paid-20").await?;
    say("the two remaining replicas still form a majority and accept writes");

    for node in nodes.into_values() {
        node.shutdown().await;
    }
    say("done");
    Ok(())
}
