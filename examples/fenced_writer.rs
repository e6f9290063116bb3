//! A worker that takes a latchkey lock and writes to PostgreSQL with the
//! lock's fencing token, the check done by the database in each write's own
//! transaction (`latchkey_fence::PgFence`).
//!
//! ```text
//! cargo run -p latchkey-fence --example fenced_writer -- \
//!     --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 \
//!     --postgres "host=127.0.0.1 user=app dbname=app" --who worker-1
//! ```
//!
//! It creates the table `fenced_writes (seq BIGSERIAL, who TEXT, token
//! BIGINT, n INT)` and the fence table if missing, takes the lock `orders`
//! (waiting in its FIFO queue), then writes one row every `--interval-ms`,
//! printing `wrote N with token T` after each commit.
//!
//! To show the database's refusal, this worker trusts only the fence: it
//! does not stop when its lease is lost (a real worker also stops when
//! `guard.lost()` resolves, and checks `guard.is_held()` before starting a
//! write). Paused past its lease (SIGSTOP, a GC pause) and woken up after a
//! newer holder wrote, its next write is refused by PostgreSQL: it prints
//! `refused by PostgreSQL: ...` and exits with code 3. It exits 0 after
//! `--writes` writes.
//!
//! A worker frozen in the middle of a transaction would also hold the
//! fence row's lock, and the next holder's writes would wait for it: set
//! PostgreSQL's `idle_in_transaction_session_timeout` so that the database
//! ends such a transaction (nothing of it lands).
//!
//! `crates/latchkey-fence/tests/cluster_writers.rs` runs it against a real cluster (its
//! connection's `application_name` is `fenced_writer <who>`).

use std::time::Duration;

use clap::Parser;
use latchkey::{Client, ClientOptions};
use latchkey_fence::{FenceError, PgFence};
use tokio_postgres::NoTls;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Exit code when the fence refused a write.
const REFUSED: i32 = 3;

#[derive(Parser)]
struct Args {
    /// The cluster's client endpoints, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    /// libpq-style connection string of the guarded database.
    #[arg(long)]
    postgres: String,
    /// Who writes (stored with each row).
    #[arg(long)]
    who: String,
    /// The lock (and fence resource) name.
    #[arg(long, default_value = "orders")]
    lock: String,
    /// Session TTL, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    ttl_ms: u64,
    /// Time between writes, in milliseconds.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Writes before releasing the lock and exiting.
    #[arg(long, default_value_t = 1000)]
    writes: u32,
}

#[tokio::main]
async fn main() {
    match run(Args::parse()).await {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("fenced_writer: {e}");
            std::process::exit(1);
        }
    }
}

async fn run(args: Args) -> Result<i32> {
    let mut config: tokio_postgres::Config = args.postgres.parse()?;
    config.application_name(format!("fenced_writer {}", args.who));
    let (mut db, connection) = config.connect(NoTls).await?;
    tokio::spawn(connection);
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS fenced_writes (
             seq BIGSERIAL PRIMARY KEY, who TEXT NOT NULL, token BIGINT NOT NULL, n INT NOT NULL)",
    )
    .await?;
    let fence = PgFence::new();
    fence.install(&db).await?;

    let options = ClientOptions::default().with_request_timeout(Duration::from_secs(30));
    let client = Client::with_options(&args.endpoints, options)?;
    let session = client.session(Duration::from_millis(args.ttl_ms)).await?;
    let guard = session.lock(&args.lock).acquire().await?;
    let token = u64::from(guard.token());
    println!("holding {} with token {token}", args.lock);

    for n in 1..=args.writes {
        let tx = match fence.begin(&mut db, &args.lock, token).await {
            Ok((tx, _)) => tx,
            Err(e @ FenceError::Stale { .. }) => {
                println!("refused by PostgreSQL: {e}");
                return Ok(REFUSED);
            }
            Err(e) => return Err(e.into()),
        };
        let stored = i64::try_from(token)?;
        let n_stored = i32::try_from(n)?;
        tx.execute(
            "INSERT INTO fenced_writes (who, token, n) VALUES ($1, $2, $3)",
            &[&args.who, &stored, &n_stored],
        )
        .await?;
        tx.commit().await?;
        println!("wrote {n} with token {token}");
        tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
    }
    guard.release().await?;
    session.close().await?;
    Ok(0)
}
