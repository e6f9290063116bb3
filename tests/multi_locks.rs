//! Multi-process tests of multi-locks: three real `latchkey serve`
//! processes; holders are `latchkey lock A B -- CMD` processes naming their
//! locks in opposite orders, and one of them killed with SIGKILL while a
//! Rust client waits for the same locks.
//!
//! Timing appears only as generous bounds on waits.

#[path = "support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use latchkey::{Client, Sequencer};
use support::{bin, client_options, eventually, Cluster, Group, LEADER_WAIT, TEST_LIMIT};

/// (holders, waiters) of lock `name`.
async fn usage(client: &Client, name: &str) -> Result<(usize, u32)> {
    Ok(client
        .locks(name)
        .await?
        .into_iter()
        .find(|l| l.name == name)
        .map_or((0, 0), |l| (l.holders.len(), l.waiters)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_locks_in_opposite_orders_never_overlap_nor_deadlock() {
    let mut c = Cluster::start("multi", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, opposite_orders(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn opposite_orders(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let dir = tempfile::tempdir()?;
    let shared = dir.path().display().to_string();
    // Each run takes a directory per lock it holds (mkdir is atomic): a
    // failed mkdir means another run holds that lock at the same time.
    let script = r#"for l in $LATCHKEY_LOCKS; do
  mkdir "$D/held-$l" 2>/dev/null || echo "OVERLAP on $l" >> "$D/log"
done
echo "$LATCHKEY_LOCKS|$LATCHKEY_TOKENS|$LATCHKEY_SEQUENCERS" >> "$D/grants"
sleep 0.2
for l in $LATCHKEY_LOCKS; do rmdir "$D/held-$l"; done"#;
    let endpoints = c.endpoints_arg();
    let orders: [&[&str]; 6] = [
        &["a", "b"],
        &["b", "a"],
        &["a", "b"],
        &["b", "a"],
        &["a"],
        &["b", "c"],
    ];
    let mut runs = Vec::new();
    for names in orders {
        let run = tokio::process::Command::new(bin())
            .args(["--endpoints", &endpoints, "--timeout", "30s", "lock"])
            .args(names)
            .args(["--ttl", "5s", "--wait", "60s", "--"])
            .args(["sh", "-c", script])
            .env("D", &shared)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        runs.push(tokio::spawn(run));
    }
    for r in runs {
        let out = r.await??;
        ensure!(
            out.status.success(),
            "a lock run failed: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    ensure!(log.is_empty(), "two runs held a lock at once: {log}");
    let grants = std::fs::read_to_string(dir.path().join("grants"))?;
    ensure!(grants.lines().count() == orders.len(), "runs: {grants}");
    let mut tokens: Vec<u64> = Vec::new();
    for line in grants.lines() {
        let mut parts = line.split('|');
        let (names, toks, seqs) = (
            parts.next().context("names")?,
            parts.next().context("tokens")?,
            parts.next().context("sequencers")?,
        );
        let names: Vec<&str> = names.split(' ').collect();
        let seqs: Vec<Sequencer> = seqs.split(' ').map(str::parse).collect::<Result<_, _>>()?;
        ensure!(
            orders.contains(&names.as_slice()),
            "LATCHKEY_LOCKS {names:?} is not in the order named"
        );
        for ((name, token), seq) in names.iter().zip(toks.split(' ')).zip(&seqs) {
            ensure!(
                seq.name == *name && seq.token.to_string() == token,
                "lock {name} token {token} does not match its sequencer {seq}"
            );
            tokens.push(seq.token.0);
        }
        ensure!(seqs.len() == names.len(), "one sequencer per lock: {line}");
    }
    let all = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    ensure!(tokens.len() == all, "a token was issued twice");
    for name in ["a", "b", "c"] {
        ensure!(
            usage(&client, name).await? == (0, 0),
            "lock {name} still in use after every run ended"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_multi_lock_holds_nothing_and_gets_all_when_a_holder_dies() {
    let mut c = Cluster::start("multi-kill", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, dead_holder(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn dead_holder(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let endpoints = c.endpoints_arg();
    let mut cmd = Command::new(bin());
    cmd.args(["--endpoints", &endpoints, "lock", "x", "y"])
        .args(["--ttl", "3s", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let first = Group::spawn(cmd)?;
    eventually(
        Duration::from_secs(30),
        "the CLI holds x and y",
        async || {
            ensure!(usage(&client, "x").await?.0 == 1, "x not held yet");
            ensure!(usage(&client, "y").await?.0 == 1, "y not held yet");
            Ok(())
        },
    )
    .await?;
    let old: Vec<u64> = {
        let mut t = Vec::new();
        for name in ["x", "y"] {
            let locks = client.locks(name).await?;
            let l = locks.iter().find(|l| l.name == name).context("listed")?;
            t.push(l.holders.first().context("a holder")?.token.0);
        }
        t
    };
    let session = client.session(Duration::from_secs(10)).await?;
    // Busy: a try of the set takes nothing.
    ensure!(
        session.lock_all(["z", "y"]).try_acquire().await?.is_none(),
        "a multi-lock of a held lock was granted"
    );
    ensure!(
        usage(&client, "z").await? == (0, 0),
        "a refused multi-lock left z in use"
    );
    // A waiter, naming the locks in the other order, and another single
    // waiter for z behind it.
    let waiter = {
        let all = session.lock_all(["z", "y", "x"]);
        tokio::spawn(async move { all.acquire_timeout(Duration::from_secs(60)).await })
    };
    eventually(
        Duration::from_secs(30),
        "the multi-lock queues",
        async || {
            ensure!(usage(&client, "x").await? == (1, 1), "not queued on x");
            ensure!(usage(&client, "z").await? == (0, 1), "not queued on z");
            Ok(())
        },
    )
    .await?;
    // While it waits it holds none of them, and z, free, is not handed to
    // a later single acquire either (FIFO: the multi-lock is first).
    ensure!(
        session.lock("z").try_acquire().await?.is_none(),
        "a single acquire overtook the waiting multi-lock on z"
    );
    first.signal(libc::SIGKILL)?;
    let held = waiter
        .await??
        .context("the dead holder's locks never came to the waiter")?;
    let names: Vec<&str> = held.sequencers().iter().map(|s| s.name.as_str()).collect();
    ensure!(
        names == ["z", "y", "x"],
        "grants {names:?}, not in the order asked"
    );
    let tokens = held.tokens();
    ensure!(
        tokens.iter().all(|t| t.0 > old[0].max(old[1])),
        "new tokens {tokens:?} are not above the dead holder's {old:?}"
    );
    for name in ["x", "y", "z"] {
        ensure!(usage(&client, name).await? == (1, 0), "{name} not held");
    }
    held.get("x")
        .context("a guard for x")?
        .put("multi/out", "fenced by x")
        .await?;
    held.release().await?;
    for name in ["x", "y", "z"] {
        ensure!(usage(&client, name).await? == (0, 0), "{name} still held");
    }
    Ok(())
}
