//! Why fencing tokens matter, in one run.
//!
//! A three-replica cluster runs in this process, next to a small storage
//! service that guards its writes with a durable fence gate (it remembers the
//! highest token seen per resource). Two workers want to write `orders`:
//!
//! 1. Worker 1 takes the lock (token N), writes, and then "pauses" — as a
//!    long GC pause or a frozen VM would — for longer than its session TTL.
//!    Its watchdog cannot run, so the cluster expires its session.
//! 2. Worker 2, waiting in the lock's queue, is granted the lock with a higher
//!    token and writes.
//! 3. Worker 1 wakes up still believing it holds the lock, and writes with
//!    token N. The storage has seen a higher token and refuses; latchkey's own
//!    KV refuses its fenced write too.
//!
//! Run it with `cargo xtask demo fenced` (or
//! `cargo run -p latchkey --example fenced_storage`). It exits non-zero if any
//! step does not behave as described, so it doubles as a smoke test.

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use latchkey::{Client, FenceError, FenceGate, FileFenceGate, Sequencer};

#[path = "support/mod.rs"]
mod support;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LOCK: &str = "storage/orders";
const TTL: Duration = Duration::from_secs(3);

fn say(who: &str, msg: impl AsRef<str>) {
    println!("[{who:<8}] {}", msg.as_ref());
}

/// A toy storage service: a map of records, each write admitted by a fence
/// gate first. Admission and write happen under one lock, so no newer
/// writer can slip in between (a real store would do the check in the same
/// transaction as the write).
struct Storage {
    gate: FileFenceGate,
    records: Mutex<BTreeMap<String, String>>,
}

impl Storage {
    fn write(
        &self,
        resource: &str,
        token: u64,
        value: &str,
    ) -> std::result::Result<(), FenceError> {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = self.gate.admit(resource, token) {
            say("storage", format!("REFUSED {value:?}: {e}"));
            return Err(e);
        }
        records.insert(resource.to_string(), value.to_string());
        say("storage", format!("accepted {value:?} with token {token}"));
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (nodes, _members) = support::start_three(dir.path()).await?;
    let leader = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
    say("cluster", format!("three replicas up, node {leader} leads"));
    let endpoints: Vec<String> = nodes
        .values()
        .map(|n| n.advertise_addr().to_string())
        .collect();

    let storage = Arc::new(Storage {
        gate: FileFenceGate::open(dir.path().join("orders.fence"))?,
        records: Mutex::new(BTreeMap::new()),
    });

    // Worker 1 runs on its own single-threaded runtime in its own thread:
    // between two `block_on` calls nothing on that runtime runs, not even
    // the session's watchdog. That is our GC pause.
    let (took_lock, worker1_has_lock) = mpsc::channel::<Sequencer>();
    let (wake, pause_ends) = mpsc::channel::<()>();
    let worker1 = {
        let endpoints = endpoints.clone();
        let storage = storage.clone();
        std::thread::spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let client = {
                let _in_runtime = rt.enter();
                Client::connect(&endpoints)?
            };
            let (session, guard) = rt.block_on(async {
                let session = client.session(TTL).await?;
                let guard = session.lock(LOCK).acquire().await?;
                Ok::<_, latchkey::Error>((session, guard))
            })?;
            let token: u64 = guard.token().into();
            say("worker 1", format!("holds {LOCK:?} with token {token}"));
            storage.write("orders", token, "worker 1: first batch")?;
            took_lock.send(guard.sequencer().clone())?;

            say(
                "worker 1",
                format!("pauses (GC) for longer than its {TTL:?} session TTL..."),
            );
            let paused = Instant::now();
            pause_ends.recv()?;

            rt.block_on(async {
                say(
                    "worker 1",
                    format!(
                        "wakes up after {:.1} s; guard.is_held() = {}, session live = {}",
                        paused.elapsed().as_secs_f64(),
                        guard.is_held(),
                        session.is_live()
                    ),
                );
                if guard.is_held() {
                    return Err("worker 1 still believes it holds the lock".into());
                }
                say(
                    "worker 1",
                    format!("writes anyway with its old token {token}"),
                );
                match storage.write("orders", token, "worker 1: second batch") {
                    Err(FenceError::Stale { .. }) => {}
                    Ok(()) => return Err("the storage accepted a stale token".into()),
                    Err(e) => return Err(e.into()),
                }
                match guard.put("orders/last-writer", "worker 1").await {
                    Err(e) if e.is_stale_fence() => {
                        say("worker 1", format!("latchkey's KV refused it too: {e}"));
                        Ok(())
                    }
                    Ok(_) => Err("latchkey accepted a stale fenced write".into()),
                    Err(e) => Err(e.into()),
                }
            })
        })
    };

    let Ok(first) = tokio::task::spawn_blocking(move || worker1_has_lock.recv()).await? else {
        // Worker 1 stopped before taking the lock: report why.
        worker1.join().map_err(|_| "worker 1 panicked")??;
        return Err("worker 1 ended without taking the lock".into());
    };
    let first_token = first.token.0;
    let client = Client::connect(&endpoints)?;
    let session = client.session(Duration::from_secs(10)).await?;
    say(
        "worker 2",
        format!("waits for {LOCK:?} (worker 1 holds token {first_token})"),
    );
    let guard = session
        .lock(LOCK)
        .acquire_timeout(Duration::from_secs(60))
        .await?
        .ok_or("worker 2 was never granted the lock")?;
    let token: u64 = guard.token().into();
    say(
        "worker 2",
        format!("granted with token {token}: worker 1's session expired on the leader"),
    );
    if token <= first_token {
        return Err("the fencing token did not increase".into());
    }
    storage.write("orders", token, "worker 2: batch")?;
    guard.put("orders/last-writer", "worker 2").await?;
    say("worker 2", "fenced KV write accepted");
    let (old, new) = (
        client.check_sequencer(&first).await?,
        client.check_sequencer(guard.sequencer()).await?,
    );
    say(
        "worker 2",
        format!(
            "check_sequencer: {first} current = {old}; {} current = {new}",
            guard.sequencer()
        ),
    );
    if old || !new {
        return Err("check_sequencer does not name worker 2 as the holder".into());
    }

    wake.send(())?;
    worker1.join().map_err(|_| "worker 1 panicked")??;

    let last = client.get("orders/last-writer").await?;
    say(
        "cluster",
        format!(
            "orders/last-writer = {:?}; storage holds {:?}",
            last.as_deref().map(String::from_utf8_lossy),
            storage
                .records
                .lock()
                .map_err(|_| "poisoned")?
                .get("orders")
        ),
    );
    if last.as_deref() != Some(b"worker 2".as_slice()) {
        return Err("the stale write changed the data".into());
    }
    guard.release().await?;
    session.close().await?;
    for node in nodes.into_values() {
        node.shutdown().await;
    }
    say(
        "cluster",
        "done: the paused worker's stale writes were refused twice",
    );
    Ok(())
}
