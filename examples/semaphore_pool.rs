//! Two permits, five workers: a semaphore.
//!
//! A three-replica cluster runs in this process. Five workers share a pool
//! of two permits (say, two licences of an external service): each takes a
//! permit, works for a moment, writes a record fenced by its permit's own
//! token, and gives the permit back. The demo holds a permit itself while
//! they start, and asks for the pool with another count: refused. It exits
//! non-zero if more than two permits were ever held at once.
//!
//! Run it with `cargo xtask demo semaphore` (or `cargo run -p latchkey
//! --example semaphore_pool`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use latchkey::Client;

#[path = "support/mod.rs"]
mod support;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const POOL: &str = "licences";
const PERMITS: u32 = 2;

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (nodes, _members) = support::start_three(dir.path()).await?;
    let leader = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
    println!("[cluster ] three replicas up, node {leader} leads");
    let endpoints: Vec<String> = nodes
        .values()
        .map(|n| n.advertise_addr().to_string())
        .collect();

    // The pool is in use (the demo holds a permit) before anyone else asks,
    // so nobody can set another count first.
    let client = Client::connect(&endpoints)?;
    let session = client.session(Duration::from_secs(5)).await?;
    let own = session.semaphore(POOL, PERMITS).acquire().await?;
    println!(
        "[main    ] holds a permit while the workers start, token {}",
        own.token()
    );
    match session.semaphore(POOL, 3).try_acquire().await {
        Err(e) => println!("[mistaken] asked for 3 permits: {e}"),
        Ok(_) => return Err("a permit with another count was granted".into()),
    }

    let inside = Arc::new(AtomicUsize::new(1));
    let most = Arc::new(AtomicUsize::new(1));
    let mut workers = Vec::new();
    for w in 1..=5 {
        let client = Client::connect(&endpoints)?;
        let (inside, most) = (inside.clone(), most.clone());
        workers.push(tokio::spawn(async move {
            let session = client.session(Duration::from_secs(5)).await?;
            let permit = session.semaphore(POOL, PERMITS).acquire().await?;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            println!(
                "[worker {w}] holds a permit, token {} ({now} of {PERMITS} in use)",
                permit.token()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            permit
                .put(format!("licences/last-{w}"), format!("worker {w}"))
                .await?;
            inside.fetch_sub(1, Ordering::SeqCst);
            permit.release().await?;
            session.close().await?;
            Ok::<_, latchkey::Error>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    own.release().await?;
    println!("[main    ] released its permit");
    for w in workers {
        w.await??;
    }
    let most = most.load(Ordering::SeqCst);
    println!("[cluster ] at most {most} workers held a permit at once");
    if most > PERMITS as usize {
        return Err(format!("{most} permits of {PERMITS} were held at once").into());
    }
    session.close().await?;
    for node in nodes.into_values() {
        node.shutdown().await;
    }
    Ok(())
}
