//! Memory probe: three `latchkey serve` processes on loopback, load
//! KEYS 128-byte values and open SESSIONS lock sessions, then print every
//! replica's resident memory (VmRSS now, VmHWM peak).
//!
//! `cargo run -p latchkey --example memory_probe -- <latchkey binary> [KEYS] [SESSIONS] [SERVE ARGS...]`
//!
//! Extra arguments go to `latchkey serve`: `--snapshot-every 500
//! --keep-after-snapshot 10` makes the replicas build snapshots of the loaded
//! state and purge the log behind them, so that a new replica has to be
//! sent a snapshot.
//!
//! Last, one follower is killed, its data directory wiped, and it is started
//! again: its peak (VmHWM) is what catching up with the whole loaded state
//! costs. The probe reads the follower's log to say how it caught up: by
//! installing the leader's snapshot, or from the log (writes are packed into
//! few log entries, so without the two flags above the leader still holds
//! every entry and sends those instead).

use std::time::{Duration, Instant};

use latchkey::{Batch, Client, ClientOptions};

#[path = "process_cluster.rs"]
mod process_cluster;
use process_cluster::{rss, ProcessCluster, CLUSTER_SECRET};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .ok_or("usage: memory_probe <latchkey binary> [KEYS] [SESSIONS]")?;
    let keys: usize = args
        .get(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let sessions: usize = args
        .get(3)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10_000);
    let serve_args: Vec<String> = args.iter().skip(4).cloned().collect();
    let mut cluster = ProcessCluster::start(bin, serve_args)?;
    let addrs = cluster.addrs.clone();
    let client = Client::with_options(
        &addrs,
        ClientOptions::default().with_cluster_secret(CLUSTER_SECRET),
    )?;
    let started = Instant::now();
    while client.put("probe/up", "1").await.is_err() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let value = vec![b'v'; 128];
    let per_batch = 1000;
    let batches = keys.div_ceil(per_batch);
    let mut tasks = Vec::new();
    for t in 0..8 {
        let client = client.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut b = t;
            while b < batches {
                let mut batch = Batch::new();
                for k in (b * per_batch)..((b + 1) * per_batch).min(keys) {
                    batch = batch.put(format!("probe/key/{k:09}"), &value);
                }
                client
                    .batch(batch)
                    .await?
                    .map_err(|c| format!("condition {c}"))?;
                b += 8;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }
    println!(
        "{keys} keys loaded in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    for (i, c) in cluster.children.iter().enumerate() {
        println!("after keys: node {} {}", i + 1, rss(c.id()));
    }
    let mut open = Vec::with_capacity(sessions);
    let t0 = Instant::now();
    while open.len() < sessions {
        let n = (sessions - open.len()).min(64);
        let mut batch = Vec::new();
        for _ in 0..n {
            let client = client.clone();
            batch.push(tokio::spawn(async move {
                client.session(Duration::from_secs(600)).await
            }));
        }
        for s in batch {
            open.push(s.await??);
        }
    }
    println!(
        "{sessions} sessions opened in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    // Enough further entries to pass a snapshot threshold of 10,000.
    for i in 0..200 {
        let mut batch = Batch::new();
        for k in 0..60 {
            batch = batch.put(format!("probe/more/{i:03}/{k:02}"), &value);
        }
        client
            .batch(batch)
            .await?
            .map_err(|c| format!("condition {c}"))?;
    }
    tokio::time::sleep(Duration::from_secs(15)).await;
    for (i, c) in cluster.children.iter().enumerate() {
        println!("after sessions + 15 s: node {} {}", i + 1, rss(c.id()));
    }

    // A follower that lost its disk is replaced and catches up from the
    // leader's snapshot.
    let leader = client.status().await?;
    let Some(f) = (0..addrs.len()).find(|&i| Some((i + 1) as u64) != leader.leader_id) else {
        return Err("no follower to restart".into());
    };
    let t0 = Instant::now();
    cluster.restart_wiped(f)?;
    // A wiped replica is a new member (a new incarnation): it waits until
    // it is added, then catches up as a learner and is promoted.
    client
        .add_member((f + 1) as u64, &cluster.peer_addrs[f], true)
        .await?;
    let now = client.status().await?;
    let target = now.last_applied;
    // Packed writes make few log entries: without `--snapshot-every`, the
    // leader may hold no snapshot yet, and the follower catches up from the
    // log instead.
    loop {
        match client.status_of(&addrs[f]).await {
            Ok(s) if s.last_applied >= target => break,
            _ if t0.elapsed() > Duration::from_secs(600) => {
                return Err("the wiped follower did not catch up in 10 min".into())
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let log = std::fs::read_to_string(cluster.log_path(f)).unwrap_or_default();
    let installed = log.contains("installing snapshot");
    println!(
        "wiped follower (node {}) caught up {} in {:.1}s: {}",
        f + 1,
        if installed {
            "by installing the leader's snapshot"
        } else {
            "from the log (the leader still held every entry)"
        },
        t0.elapsed().as_secs_f64(),
        rss(cluster.children[f].id())
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!(
        "wiped follower (node {}) 5 s later: {}",
        f + 1,
        rss(cluster.children[f].id())
    );
    Ok(())
}
