//! Keep-alive probe: what keeping many lock sessions alive costs. Three
//! `latchkey serve` processes on loopback; one client opens SESSIONS
//! sessions with a TTL of TTL seconds (each renewed by its watchdog every
//! TTL / 3), then for SECONDS seconds does nothing else while the CPU time
//! of every replica and of the client itself is measured (from /proc).
//!
//! `cargo run -p latchkey --example keepalive_probe -- <latchkey binary> [SESSIONS] [TTL] [SECONDS] [--unary]`
//!
//! Defaults: 3,000 sessions, TTL 3 s (the minimum: 3,000 keep-alives a
//! second), 20 s. `--unary` turns the client's call stream off, so
//! keep-alives go as one unary `Lock.KeepAlive` call each (as before they
//! travelled on the stream); run both to compare.

use std::time::{Duration, Instant};

use latchkey::{Client, ClientOptions};

#[path = "process_cluster.rs"]
mod process_cluster;
use process_cluster::{cpu_seconds, ProcessCluster};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: keepalive_probe <latchkey binary> [SESSIONS] [TTL] [SECONDS] [--unary]";
    let bin = args.get(1).ok_or(usage)?;
    let unary = args.iter().any(|a| a == "--unary");
    let numbers: Vec<u64> = args
        .iter()
        .skip(2)
        .filter(|a| *a != "--unary")
        .map(|a| a.parse::<u64>().map_err(|e| format!("{a}: {e}; {usage}")))
        .collect::<Result<_, _>>()?;
    let sessions = numbers.first().copied().unwrap_or(3_000);
    let ttl = Duration::from_secs(numbers.get(1).copied().unwrap_or(3));
    let seconds = numbers.get(2).copied().unwrap_or(20);

    let cluster = ProcessCluster::start(bin, Vec::new())?;
    let client = Client::with_options(
        &cluster.addrs,
        ClientOptions::default().with_call_stream(!unary),
    )?;
    let started = Instant::now();
    while client.put("probe/up", "1").await.is_err() {
        if started.elapsed() > Duration::from_secs(60) {
            return Err("no leader within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut open = Vec::new();
    while (open.len() as u64) < sessions {
        let n = (sessions - open.len() as u64).min(64);
        let batch: Vec<_> = (0..n)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { client.session(ttl).await })
            })
            .collect();
        for s in batch {
            open.push(s.await??);
        }
    }
    // Let the watchdogs' renewals spread out before measuring.
    tokio::time::sleep(ttl).await;

    let pids: Vec<String> = cluster
        .children
        .iter()
        .map(|c| c.id().to_string())
        .collect();
    let cpu = |pid: &str| cpu_seconds(pid).ok_or(format!("cannot read /proc/{pid}/stat"));
    let before: Vec<f64> = pids.iter().map(|p| cpu(p)).collect::<Result<_, _>>()?;
    let self_before = cpu("self")?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let elapsed = t0.elapsed().as_secs_f64();
    let after: Vec<f64> = pids.iter().map(|p| cpu(p)).collect::<Result<_, _>>()?;
    let self_after = cpu("self")?;

    let leader = client.status().await?.leader_id;
    let lost = open.iter().filter(|s| !s.is_live()).count();
    println!(
        "{sessions} sessions, ttl {}s ({:.0} keep-alives/s), keep-alives {}, {elapsed:.1}s measured",
        ttl.as_secs(),
        sessions as f64 * 3.0 / ttl.as_secs_f64(),
        if unary { "unary" } else { "on the call stream" }
    );
    let mut total = 0.0;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let share = (a - b) / elapsed;
        total += share;
        let role = if leader == Some(i as u64 + 1) {
            " (leader)"
        } else {
            ""
        };
        println!("node {}{role}: {share:.3} CPU s/s", i + 1);
    }
    let client_share = (self_after - self_before) / elapsed;
    println!("client: {client_share:.3} CPU s/s");
    println!(
        "total: {:.3} CPU s/s; sessions lost: {lost}",
        total + client_share
    );
    Ok(())
}
