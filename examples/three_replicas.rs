//! Three `latchkey serve` processes on loopback, each with its own RocksDB
//! directory: write, read, crash the leader with SIGKILL (no shutdown, no
//! flush: what a power cut or an OOM kill does to a process), watch a new
//! leader take over, check that every acknowledged write survived, and
//! bring the crashed replica back on its data.
//!
//! Run it with `cargo xtask demo`, which builds the `latchkey` binary first
//! (or `cargo run -p latchkey --example three_replicas -- [LATCHKEY_BIN]
//! [--tls]`, with the binary next to the example's by default). With `--tls`
//! (`cargo xtask demo --tls`) it first makes a development CA and
//! certificates with `latchkey certs`, and everything (clients to replicas,
//! replicas to each other, mutually) runs over TLS.

use std::time::{Duration, Instant};

use latchkey::{Client, ClientOptions, ScanRange, TlsOptions};

#[path = "process_cluster.rs"]
mod process_cluster;
use process_cluster::ProcessCluster;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn say(msg: impl AsRef<str>) {
    println!("[three_replicas] {}", msg.as_ref());
}

/// The leader as the cluster reports it, waiting up to `within`; `not`
/// excludes a replica known to be dead.
async fn leader(client: &Client, not: Option<u64>, within: Duration) -> Result<u64> {
    let started = Instant::now();
    loop {
        if let Ok(s) = client.status().await {
            if let Some(l) = s.leader_id.filter(|l| Some(*l) != not) {
                return Ok(l);
            }
        }
        if started.elapsed() > within {
            return Err(format!("no leader within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tls = args.iter().any(|a| a == "--tls");
    let bin = match args.iter().find(|a| *a != "--tls") {
        Some(bin) => bin.clone(),
        None => process_cluster::sibling_server_bin()
            .ok_or(
                "no latchkey binary next to this example: run `cargo xtask demo`, or pass its path",
            )?
            .to_string_lossy()
            .into_owned(),
    };
    let mut cluster = ProcessCluster::start_with(&bin, Vec::new(), tls)?;
    let addrs = cluster.addrs.clone();
    say(format!(
        "started three `latchkey serve` processes: {addrs:?}"
    ));
    let client = match &cluster.certs {
        Some(certs) => {
            say(format!(
                "TLS: a development CA and certificates (as `latchkey certs` writes them) are in {}; the replicas talk \
                 mutual TLS to each other, and this client trusts the CA and presents \
                 client.pem",
                certs.display()
            ));
            let tls = TlsOptions::from_files(
                &certs.join("ca.pem"),
                Some((&certs.join("client.pem"), &certs.join("client-key.pem"))),
            )?;
            Client::with_options(&addrs, ClientOptions::default().with_tls(tls))?
        }
        None => Client::connect(&addrs)?,
    };

    let first = leader(&client, None, Duration::from_secs(30)).await?;
    say(format!("node {first} was elected leader"));

    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let key = format!("order/{i:03}");
        client.put(&key, format!("paid-{i}")).await?;
        acknowledged.push(key);
    }
    say(format!(
        "wrote {} keys; each was acknowledged only once fsynced on a majority",
        acknowledged.len()
    ));
    let ids = client.next_sequence("invoice-ids", 100).await?;
    say(format!("allocated invoice ids {ids:?}"));

    // Crash the leader: SIGKILL, no graceful anything.
    let crashed = (first - 1) as usize;
    cluster.kill(crashed);
    say(format!("killed the leader, node {first}, with SIGKILL"));

    let started = Instant::now();
    let next = leader(&client, Some(first), Duration::from_secs(30)).await?;
    say(format!(
        "node {next} took over {} ms after the crash",
        started.elapsed().as_millis()
    ));

    // Every acknowledged write is still there (linearizable reads).
    let page = client.scan(ScanRange::prefix("order/", 0)).await?;
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
    let more = client.next_sequence("invoice-ids", 100).await?;
    say(format!(
        "the sequence continues after failover: {more:?} (never reuses {ids:?})"
    ));
    client.put("order/020", "paid-20").await?;
    say("the two remaining replicas still form a majority and accept writes");

    // The crashed replica restarts on its data and catches up.
    cluster.restart(crashed)?;
    let target = client.status().await?.last_applied;
    let started = Instant::now();
    loop {
        match client.status_of(&addrs[crashed]).await {
            Ok(s) if s.last_applied >= target => break,
            _ if started.elapsed() > Duration::from_secs(60) => {
                return Err(format!("node {first} did not catch up within 60 s").into())
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    say(format!(
        "node {first} restarted on its data and caught up in {} ms (it missed order/020)",
        started.elapsed().as_millis()
    ));
    drop(cluster);
    say("done (the README's \"Replacing a failed disk or node\" shows what to do when a disk is lost)");
    Ok(())
}
