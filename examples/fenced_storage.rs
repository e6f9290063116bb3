//! Why fencing tokens matter, in one run, with PostgreSQL refusing the
//! stale write itself.
//!
//! A three-replica cluster runs in this process, next to a throwaway
//! PostgreSQL server (started in a temporary directory, on loopback) whose
//! `orders` table is guarded by `latchkey_fence::PgFence`: every write
//! checks its fencing token in its own transaction. Two workers want to
//! write `orders`:
//!
//! 1. Worker 1 takes the lock (token N), writes, and then "pauses" — as a
//!    long GC pause or a frozen VM would — for longer than its session TTL.
//!    Its watchdog cannot run, so the cluster expires its session.
//! 2. Worker 2, waiting in the lock's queue, is granted the lock with a higher
//!    token and writes.
//! 3. Worker 1 wakes up and writes with token N. PostgreSQL has committed a
//!    higher token for `orders` and refuses the transaction; latchkey's own
//!    KV refuses its fenced write too.
//!
//! Run it with `cargo xtask demo fenced` (which installs PostgreSQL with
//! apt-get when it is missing and it can), or `cargo run -p latchkey-fence
//! --example fenced_storage`. Without PostgreSQL it says how to get it and
//! exits 1. It exits non-zero if any step does not behave as described, so
//! it doubles as a smoke test.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use latchkey::{Client, Sequencer};
use latchkey_fence::{FenceError, PgFence, ScratchError, ScratchPostgres};
use tokio_postgres::NoTls;

#[path = "support/mod.rs"]
mod support;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LOCK: &str = "storage/orders";
const TTL: Duration = Duration::from_secs(3);

fn say(who: &str, msg: impl AsRef<str>) {
    println!("[{who:<8}] {}", msg.as_ref());
}

/// The guarded storage: a PostgreSQL table whose every write first passes
/// the fence, in the same transaction.
struct Storage {
    db: tokio::sync::Mutex<tokio_postgres::Client>,
    fence: PgFence,
}

impl Storage {
    async fn open(pg: &ScratchPostgres) -> Result<Storage> {
        let (db, connection) = tokio_postgres::connect(&pg.connection_string(), NoTls).await?;
        tokio::spawn(connection);
        db.batch_execute("CREATE TABLE orders (resource TEXT PRIMARY KEY, value TEXT NOT NULL)")
            .await?;
        let fence = PgFence::new();
        fence.install(&db).await?;
        Ok(Storage {
            db: tokio::sync::Mutex::new(db),
            fence,
        })
    }

    /// One transaction: admit `token`, write `value`, commit. The inner
    /// error is the fence's refusal (the transaction was rolled back).
    async fn write(
        &self,
        resource: &str,
        token: u64,
        value: &str,
    ) -> Result<std::result::Result<(), FenceError>> {
        let mut db = self.db.lock().await;
        let tx = match self.fence.begin(&mut db, resource, token).await {
            Ok((tx, _)) => tx,
            Err(e) => {
                say("postgres", format!("REFUSED {value:?}: {e}"));
                return Ok(Err(e)); // nothing was written: the transaction rolled back
            }
        };
        tx.execute(
            "INSERT INTO orders (resource, value) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET value = $2",
            &[&resource, &value],
        )
        .await?;
        tx.commit().await?;
        say(
            "postgres",
            format!("committed {value:?} with token {token}"),
        );
        Ok(Ok(()))
    }

    async fn read(&self, resource: &str) -> Result<Option<String>> {
        let db = self.db.lock().await;
        let row = db
            .query_opt("SELECT value FROM orders WHERE resource = $1", &[&resource])
            .await?;
        Ok(row.map(|r| r.get(0)))
    }
}

/// The scratch PostgreSQL server, or how to get PostgreSQL.
async fn start_postgres() -> Result<ScratchPostgres> {
    match tokio::task::spawn_blocking(ScratchPostgres::start).await? {
        Ok(pg) => Ok(pg),
        Err(e @ ScratchError::NotInstalled { .. }) => {
            say(
                "demo",
                "this demo shows PostgreSQL refusing a stale writer, and needs PostgreSQL's \
                 server programs (nothing is installed for good: the server lives in a \
                 temporary directory while the demo runs)",
            );
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let pg = start_postgres().await?;
    say(
        "postgres",
        format!(
            "scratch server up on 127.0.0.1:{} (pid {})",
            pg.port(),
            pg.pid()
        ),
    );
    let dir = tempfile::tempdir()?;
    let (nodes, _members) = support::start_three(dir.path()).await?;
    let leader = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
    say("cluster", format!("three replicas up, node {leader} leads"));
    let endpoints: Vec<String> = nodes
        .values()
        .map(|n| n.advertise_addr().to_string())
        .collect();

    let storage = std::sync::Arc::new(Storage::open(&pg).await?);

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
            rt.block_on(storage.write("orders", token, "worker 1: first batch"))??;
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
                match storage
                    .write("orders", token, "worker 1: second batch")
                    .await?
                {
                    Err(FenceError::Stale { .. }) => {}
                    Ok(()) => return Err("PostgreSQL accepted a stale token".into()),
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
    storage.write("orders", token, "worker 2: batch").await??;
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
    let stored = storage.read("orders").await?;
    say(
        "cluster",
        format!(
            "orders/last-writer = {:?}; PostgreSQL holds {stored:?}",
            last.as_deref().map(String::from_utf8_lossy),
        ),
    );
    if last.as_deref() != Some(b"worker 2".as_slice())
        || stored.as_deref() != Some("worker 2: batch")
    {
        return Err("the stale write changed the data".into());
    }
    guard.release().await?;
    session.close().await?;
    for node in nodes.into_values() {
        node.shutdown().await;
    }
    say(
        "cluster",
        "done: the paused worker's stale writes were refused twice (by PostgreSQL, and by latchkey's KV)",
    );
    Ok(())
}
