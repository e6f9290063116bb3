//! Multi-process tests of keys bound to sessions: three real `latchkey
//! serve` processes and `latchkey put --ephemeral` processes that end in
//! every way a process can.
//!
//! - SIGTERM (or Ctrl-C) closes the session: the key is gone at once, and
//!   a watcher sees the delete.
//! - SIGKILL stops the keep-alives: the key outlives the process until the
//!   session's TTL runs out, then goes, and a watcher sees the delete.
//! - An operator's `latchkey session end ID`: the key is gone when the
//!   command returns, and the process learns at its next keep-alive that
//!   its session was lost (exit 6).
//! - A session's end deletes every key bound to it at one revision, while
//!   keys bound to other sessions and plain keys stay; a plain put unbinds.
//! - Bad input: a put bound to an ended or foreign session, `--ephemeral`
//!   with `--fence`, a TTL out of range: refused with a clear error,
//!   nothing written.

#[path = "support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use futures::StreamExt;
use latchkey::{Client, CommandError, Consistency, Error, Selection, WatchMessage};
use support::{eventually, retrying, Cluster, LEADER_WAIT, TEST_LIMIT};
use tokio::process::Child;

/// The TTL of the `put --ephemeral` processes.
const TTL: Duration = Duration::from_secs(6);

/// Start `latchkey put KEY VALUE --ephemeral --ttl 6s`, and read the
/// revision it prints once the key is written.
async fn put_ephemeral(c: &Cluster, key: &str, value: &str) -> Result<(Child, u64)> {
    let ttl = format!("{}s", TTL.as_secs());
    let (child, line) =
        spawn_ephemeral(c, &["put", key, value, "--ephemeral", "--ttl", &ttl]).await?;
    let revision = line
        .trim()
        .parse()
        .with_context(|| format!("not a revision: {line:?}"))?;
    Ok((child, revision))
}

/// Start the `put --ephemeral` of `args` and read the line it prints once
/// the key is written.
async fn spawn_ephemeral(c: &Cluster, args: &[&str]) -> Result<(Child, String)> {
    let (child, mut lines) = c.spawn_cli(args)?;
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .context("`put --ephemeral` printed no revision")??;
    let Some(line) = line else {
        let out = child.wait_with_output().await?;
        bail!(
            "`put --ephemeral` ended early: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    Ok((child, line))
}

fn signal(child: &Child, sig: i32) -> Result<()> {
    let pid = child.id().context("the child's pid")?;
    // SAFETY: a plain signal to a child this test started and still holds.
    let sent = unsafe { libc::kill(pid as i32, sig) };
    ensure!(sent == 0, "signal {sig} failed");
    Ok(())
}

/// The next delete of `key` a watch delivers, and its revision.
async fn next_delete(watch: &mut latchkey::Watch, key: &str, within: Duration) -> Result<u64> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .context("no delete in time")?;
        let message = tokio::time::timeout(left, watch.next())
            .await
            .with_context(|| format!("no delete of {key:?} within {within:?}"))?
            .context("the watch ended")?;
        match message {
            Ok(WatchMessage::Changes {
                revision, changes, ..
            }) => {
                if changes
                    .iter()
                    .any(|ch| ch.key == key.as_bytes() && ch.current.is_none())
                {
                    return Ok(revision);
                }
            }
            Ok(WatchMessage::Progress { .. }) | Err(Error::Unavailable { .. }) => {}
            Err(e) => bail!("the watch failed: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_at_once_and_sigkill_waits_for_the_ttl() {
    let mut c = Cluster::start("ephemeral", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, ends(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn ends(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = c.client()?;
    let start = retrying("write", async || client.put("plain", "x").await).await?;
    let mut watch = client
        .watch(Selection::prefix("members/"))
        .from_revision(start + 1);

    // SIGTERM: closed at once.
    let (child, revision) = put_ephemeral(c, "members/a", "10.0.0.1").await?;
    let read = client
        .get_versioned("members/a", Consistency::Linearizable)
        .await?;
    ensure!(
        read.value
            .as_ref()
            .is_some_and(|v| v.mod_revision == revision),
        "members/a after the put: {read:?}"
    );
    signal(&child, libc::SIGTERM)?;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .context("`put --ephemeral` did not stop on SIGTERM")??;
    ensure!(status.status.success(), "exit: {status:?}");
    // The close was acknowledged before the process exited: the key is
    // gone now, not after a TTL.
    ensure!(
        client.get("members/a").await?.is_none(),
        "members/a outlived its closed session"
    );
    let gone = next_delete(&mut watch, "members/a", Duration::from_secs(30)).await?;
    ensure!(gone > revision, "deleted at {gone}, written at {revision}");

    // SIGKILL: the key stays until the TTL runs out.
    let (mut child, revision) = put_ephemeral(c, "members/b", "10.0.0.2").await?;
    child.kill().await?;
    let killed = Instant::now();
    let present = client.get("members/b").await?;
    // Checked well inside the TTL (6 s): a session outlives its last
    // keep-alive by at least its TTL.
    if killed.elapsed() < TTL / 2 {
        ensure!(
            present.is_some(),
            "members/b went before its session's TTL ran out"
        );
    }
    let gone = next_delete(&mut watch, "members/b", TTL * 2 + Duration::from_secs(60)).await?;
    ensure!(gone > revision, "deleted at {gone}, written at {revision}");
    ensure!(
        killed.elapsed() >= TTL / 2,
        "members/b went {:?} after the kill, before its TTL of {TTL:?}",
        killed.elapsed()
    );
    ensure!(client.get("members/b").await?.is_none());
    ensure!(
        client.get("plain").await?.is_some(),
        "the plain key went too"
    );
    operator_ends(c, &client, &mut watch).await
}

/// An operator ends a live `put --ephemeral`'s session: the key goes at
/// once, the process says its session was lost, and ending it again is
/// refused.
async fn operator_ends(c: &Cluster, client: &Client, watch: &mut latchkey::Watch) -> Result<()> {
    let args = [
        "-w",
        "json",
        "put",
        "members/c",
        "10.0.0.3",
        "--ephemeral",
        "--ttl",
        "15s",
    ];
    let (child, line) = spawn_ephemeral(c, &args).await?;
    let printed: serde_json::Value =
        serde_json::from_str(&line).with_context(|| format!("not JSON: {line:?}"))?;
    let (Some(revision), Some(session)) =
        (printed["revision"].as_u64(), printed["session"].as_u64())
    else {
        bail!("`put --ephemeral -w json` printed {line:?}");
    };
    // Without access control, only a caller with the cluster secret may.
    let id = session.to_string();
    let stranger = c.cli_with(false, &["sessions", "end", &id], None).await?;
    ensure!(
        stranger.code == Some(2)
            && stranger.stderr.contains("permission denied")
            && stranger.stderr.contains("cluster secret"),
        "`session end` without the cluster secret: {stranger:?}"
    );
    ensure!(
        client.get("members/c").await?.is_some(),
        "a refused `session end` took the key"
    );
    // The owner's own secret is not needed: the operator's end is enough.
    let ended = c.cli(&["sessions", "end", &id]).await?;
    let said = ended.ok()?;
    ensure!(
        said.contains(&format!("session {session} ended")),
        "`session end` said {said:?}"
    );
    // Gone by the time the operator's command returned.
    ensure!(
        client.get("members/c").await?.is_none(),
        "members/c outlived the operator's end of its session"
    );
    let gone = next_delete(watch, "members/c", Duration::from_secs(30)).await?;
    ensure!(gone > revision, "deleted at {gone}, written at {revision}");
    // Its next keep-alive (every TTL/3, 5 s) tells the process.
    let exited = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .context("`put --ephemeral` did not notice its session ended")??;
    ensure!(
        exited.status.code() == Some(6),
        "`put --ephemeral` after its session was ended: {exited:?}"
    );
    // Again: the session is not live any more.
    let again = c.cli(&["sessions", "end", &id]).await?;
    ensure!(
        again.code == Some(1) && again.stderr.contains("is not live"),
        "a second `session end`: {again:?}"
    );
    let never = c.cli(&["sessions", "end", "999999"]).await?;
    ensure!(
        never.code != Some(0) && never.stderr.contains("999999"),
        "`session end` of a session never opened: {never:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_keys_go_together_and_bad_binds_are_refused() {
    let mut c = Cluster::start("ephemeral-api", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, together(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn together(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client: Client = c.client()?;
    let one = client.session(Duration::from_secs(10)).await?;
    let other = client.session(Duration::from_secs(10)).await?;
    one.put("s/a", "1").await?;
    one.put("s/b", "2").await?;
    one.put("s/unbound", "3").await?;
    other.put("s/c", "4").await?;
    // A plain put unbinds.
    let unbound = client.put("s/unbound", "plain now").await?;
    let mut watch = client
        .watch(Selection::prefix("s/"))
        .from_revision(unbound + 1);
    one.close().await?;
    let changes = loop {
        let message = tokio::time::timeout(Duration::from_secs(30), watch.next())
            .await
            .context("no message after the close")?
            .context("the watch ended")??;
        match message {
            WatchMessage::Changes { changes, .. } => break changes,
            WatchMessage::Progress { .. } => {}
        }
    };
    let deleted: Vec<(String, bool)> = changes
        .iter()
        .map(|ch| {
            (
                String::from_utf8_lossy(&ch.key).into_owned(),
                ch.current.is_none(),
            )
        })
        .collect();
    ensure!(
        deleted == [("s/a".to_string(), true), ("s/b".to_string(), true)],
        "the close's message: {deleted:?}"
    );
    ensure!(
        client.get("s/c").await?.is_some(),
        "another session's key went"
    );
    ensure!(
        client.get("s/unbound").await? == Some(b"plain now".to_vec()),
        "an unbound key went"
    );

    // Bound to an ended session: refused, nothing written.
    match one.put("s/late", "x").await {
        Err(Error::Refused(CommandError::SessionEnded { .. })) => {}
        other => bail!("a put bound to a closed session: {other:?}"),
    }
    ensure!(client.get("s/late").await?.is_none());

    // The CLI: refusals with a clear error and exit code 2.
    let fenced = c
        .cli(&["put", "k", "v", "--ephemeral", "--fence", "a:1:1:1"])
        .await?;
    ensure!(
        fenced.code == Some(2) && fenced.stderr.contains("cannot be used with"),
        "--ephemeral with --fence: {fenced:?}"
    );
    let short = c
        .cli(&["put", "k", "v", "--ephemeral", "--ttl", "1s"])
        .await?;
    short.refused_with(2)?;
    ensure!(
        short.stderr.contains("TTL") || short.stderr.contains("ttl"),
        "{short:?}"
    );
    ensure!(client.get("k").await?.is_none(), "a refused put wrote");
    other.close().await?;
    eventually(
        Duration::from_secs(30),
        "s/c goes with its session",
        async || {
            ensure!(client.get("s/c").await?.is_none());
            Ok(())
        },
    )
    .await
}
