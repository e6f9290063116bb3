//! Money transfers between accounts, each locking both accounts at once: a
//! multi-lock.
//!
//! A three-replica cluster runs in this process. Four accounts start with
//! 100 each; six workers make transfers between random pairs, naming the
//! two accounts in whatever order the transfer has them (A to B locks
//! [A, B], B to A locks [B, A]). Taken one at a time, such locks deadlock;
//! a multi-lock takes both in one step or waits holding neither. Each
//! balance is written fenced by its own account's lock. The demo exits
//! non-zero if the total is not 400 at the end.
//!
//! Run it with `cargo xtask demo multilock` (or `cargo run -p latchkey
//! --example transfer`).

use std::time::Duration;

use latchkey::Client;

#[path = "support/mod.rs"]
mod support;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ACCOUNTS: [&str; 4] = ["alice", "bob", "carol", "dave"];
const TRANSFERS_PER_WORKER: usize = 8;

fn key(account: &str) -> String {
    format!("accounts/{account}")
}

async fn balance(client: &Client, account: &str) -> Result<i64> {
    let value = client.get(key(account)).await?.ok_or("no balance")?;
    Ok(std::str::from_utf8(&value)?.parse()?)
}

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
    let client = Client::connect(&endpoints)?;
    for account in ACCOUNTS {
        client.put(key(account), "100").await?;
    }

    let mut workers = Vec::new();
    for w in 0..6usize {
        let client = Client::connect(&endpoints)?;
        workers.push(tokio::spawn(async move {
            let session = client.session(Duration::from_secs(5)).await?;
            for t in 0..TRANSFERS_PER_WORKER {
                // A deterministic spread of pairs, in both directions.
                let from = ACCOUNTS[(w + t) % ACCOUNTS.len()];
                let to = ACCOUNTS[(w + 2 * t + 1) % ACCOUNTS.len()];
                if from == to {
                    continue;
                }
                let held = session.lock_all([from, to]).acquire().await?;
                let (a, b) = (balance(&client, from).await?, balance(&client, to).await?);
                let amount = 1 + (w + t) as i64 % 10;
                let (from_lock, to_lock) = (
                    held.get(from).ok_or("no guard")?,
                    held.get(to).ok_or("no guard")?,
                );
                from_lock.put(key(from), (a - amount).to_string()).await?;
                to_lock.put(key(to), (b + amount).to_string()).await?;
                println!(
                    "[worker {w}] {from} -> {to}: {amount} (tokens {})",
                    held.tokens()
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                held.release().await?;
            }
            session.close().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    let mut total = 0;
    for account in ACCOUNTS {
        let b = balance(&client, account).await?;
        println!("[cluster ] {account}: {b}");
        total += b;
    }
    println!("[cluster ] total {total} (started at 400)");
    for node in nodes.into_values() {
        node.shutdown().await;
    }
    if total != 400 {
        return Err(format!("money was lost or made: total {total}").into());
    }
    Ok(())
}
