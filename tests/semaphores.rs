//! Multi-process tests of semaphores: three real `latchkey serve`
//! processes; holders are `latchkey sem NAME --permits N -- CMD` processes,
//! one of them killed with SIGKILL.
//!
//! Timing appears only as generous bounds on waits.

#[path = "support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use latchkey::{Client, Sequencer};
use support::{bin, client_options, eventually, Cluster, Group, LEADER_WAIT, TEST_LIMIT};

/// The permits of the semaphore the tests use.
const PERMITS: usize = 2;

async fn holders(client: &Client, name: &str) -> Result<(usize, u32, Option<u32>)> {
    Ok(client
        .locks(name)
        .await?
        .into_iter()
        .find(|l| l.name == name)
        .map_or((0, 0, None), |l| (l.holders.len(), l.waiters, l.permits)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_holders_than_permits_and_a_dead_holders_permit_returns() {
    let mut c = Cluster::start("sem", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, semaphore(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn semaphore(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let dir = tempfile::tempdir()?;
    let shared = dir.path().display().to_string();
    // Each run takes one of PERMITS slot directories (mkdir is atomic); if
    // none is free, more than PERMITS commands run at once.
    let script = r#"i=0
while [ "$i" -lt 2 ]; do
  if mkdir "$D/slot$i" 2>/dev/null; then
    echo "$LATCHKEY_TOKEN $LATCHKEY_SEQUENCER" >> "$D/tokens"
    sleep 0.3
    rmdir "$D/slot$i"
    exit 0
  fi
  i=$((i+1))
done
echo OVERLAP >> "$D/log""#;
    let endpoints = c.endpoints_arg();
    let mut runs = Vec::new();
    for _ in 0..5 {
        let run = tokio::process::Command::new(bin())
            .args(["--endpoints", &endpoints, "--timeout", "30s", "sem", "jobs"])
            .args(["--permits", "2", "--ttl", "5s", "--wait", "60s", "--"])
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
            "a sem run failed: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    ensure!(
        log.is_empty(),
        "more than {PERMITS} commands ran at once: {log}"
    );
    let tokens = std::fs::read_to_string(dir.path().join("tokens"))?;
    let mut seen: Vec<u64> = Vec::new();
    for line in tokens.lines() {
        let (token, seq) = line.split_once(' ').context("a token line")?;
        let seq: Sequencer = seq.parse()?;
        ensure!(
            seq.token.to_string() == token,
            "LATCHKEY_TOKEN {token} is not the permit's {}",
            seq.token
        );
        seen.push(seq.token.0);
    }
    seen.sort_unstable();
    seen.dedup();
    ensure!(
        seen.len() == 5,
        "5 runs, {} distinct permit tokens",
        seen.len()
    );
    ensure!(
        holders(&client, "jobs").await?.0 == 0,
        "permits still held after every run ended"
    );

    // A holder killed with SIGKILL: its permit returns when its session
    // expires, and a waiter gets it.
    let mut cmd = Command::new(bin());
    cmd.args(["--endpoints", &endpoints, "sem", "jobs", "--permits", "2"])
        .args(["--ttl", "3s", "--", "sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let first = Group::spawn(cmd)?;
    let session = client.session(Duration::from_secs(10)).await?;
    let pool = session.semaphore("jobs", 2);
    let mine = eventually(Duration::from_secs(30), "two permits held", async || {
        ensure!(
            holders(&client, "jobs").await?.0 == 1,
            "the CLI holds no permit yet"
        );
        pool.try_acquire().await?.context("no second permit")
    })
    .await?;
    ensure!(
        pool.try_acquire().await?.is_none(),
        "a third permit of two was granted"
    );
    let wrong = session.semaphore("jobs", 3).try_acquire().await;
    ensure!(wrong.is_err(), "a permit with another count was granted");
    let (_, _, permits) = holders(&client, "jobs").await?;
    ensure!(
        permits == Some(2),
        "the semaphore lists {permits:?} permits"
    );
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire_timeout(Duration::from_secs(60)).await })
    };
    eventually(Duration::from_secs(30), "the waiter queues", async || {
        ensure!(holders(&client, "jobs").await?.1 == 1, "not queued yet");
        Ok(())
    })
    .await?;
    first.signal(libc::SIGKILL)?;
    let third = waiter
        .await??
        .context("the dead holder's permit never returned")?;
    ensure!(
        third.token() > mine.token(),
        "the returned permit's token did not grow"
    );
    third.put("jobs/out", "fenced by a permit").await?;
    mine.release().await?;
    third.release().await?;
    Ok(())
}
