//! Multi-process tests of fenced leader election: three real `latchkey
//! serve` processes; candidates are `latchkey elect` processes, killed with
//! SIGKILL or paused with SIGSTOP, and an observer `latchkey elect
//! --observe` prints every change of leader.
//!
//! Timing appears only as generous bounds on waits: nothing here asserts
//! how fast a hand-over is (that is `cargo xtask bench`'s).

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use futures::StreamExt;
use latchkey::{Client, Leader, Sequencer, Token};
use support::{bin, client_options, eventually, Cluster, Group, LEADER_WAIT, TEST_LIMIT};
use tokio::sync::mpsc::UnboundedReceiver;

/// The lines a process prints, read on a thread.
fn lines_of(group: &mut Group) -> Result<UnboundedReceiver<String>> {
    let stdout = group.child.stdout.take().context("stdout")?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

async fn next_line(lines: &mut UnboundedReceiver<String>, what: &str) -> Result<String> {
    tokio::time::timeout(Duration::from_secs(60), lines.recv())
        .await
        .map_err(|_| anyhow!("{what}: no line within 60 s"))?
        .ok_or_else(|| anyhow!("{what}: the process exited"))
}

/// `latchkey --endpoints E elect ARGS...`, stdout piped, stderr to `err`.
fn elect(c: &Cluster, args: &[&str], err: &std::path::Path) -> Result<Group> {
    let mut cmd = Command::new(bin());
    cmd.args(["--endpoints", &c.endpoints_arg(), "elect"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(err)?);
    Group::spawn(cmd)
}

async fn waiting_candidates(client: &Client, election: &str) -> Result<u32> {
    let name = latchkey::core::lock::election_lock_name(election);
    Ok(client
        .locks(&name)
        .await?
        .into_iter()
        .find(|l| l.name == name)
        .map_or(0, |l| l.waiters))
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_hands_over_and_observers_see_every_term() {
    let mut c = Cluster::start("elect-sigkill", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, killed_leader(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn killed_leader(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let dir = tempfile::tempdir()?;
    let mut observer = elect(
        c,
        &["sched", "--observe", "-w", "json"],
        &dir.path().join("o"),
    )?;
    let mut observed = lines_of(&mut observer)?;
    let first = next_line(&mut observed, "the observer's first line").await?;
    ensure!(
        first.contains("\"leader\":null"),
        "before any campaign the observer printed {first}"
    );

    // Candidate A runs a command while it leads; B campaigns without one
    // and prints its term once it leads.
    let a = elect(
        c,
        &["sched", "host-a", "--ttl", "3s", "--", "sleep", "600"],
        &dir.path().join("a"),
    )?;
    let a_term = eventually(Duration::from_secs(30), "A leads", async || {
        let leader = client.leader("sched").await?.context("no leader yet")?;
        ensure!(leader.value == b"host-a", "leader {leader:?}");
        Ok(leader.term)
    })
    .await?;
    let mut b = elect(
        c,
        &["sched", "host-b", "--ttl", "3s"],
        &dir.path().join("b"),
    )?;
    let mut b_lines = lines_of(&mut b)?;
    eventually(Duration::from_secs(30), "B waits", async || {
        let n = waiting_candidates(&client, "sched").await?;
        ensure!(n == 1, "{n} candidates waiting");
        Ok(())
    })
    .await?;
    ensure!(
        client.leader("sched").await?.map(|l| l.term) == Some(a_term),
        "a waiting candidate changed the leader"
    );

    a.signal(libc::SIGKILL)?;
    let printed = next_line(&mut b_lines, "B's term").await?;
    let mut fields = printed.split(' ');
    let b_term: u64 = fields
        .next()
        .and_then(|t| t.parse().ok())
        .with_context(|| format!("B printed {printed:?}"))?;
    ensure!(
        b_term > a_term.0,
        "B's term {b_term} is not above A's {a_term}"
    );
    let now = client.leader("sched").await?.context("nobody leads")?;
    ensure!(
        now.term == Token(b_term) && now.value == b"host-b",
        "the leader key says {now:?}, B printed {printed:?}"
    );

    // SIGTERM: B resigns and exits 0; nobody leads.
    b.signal(libc::SIGTERM)?;
    let status = tokio::task::spawn_blocking(move || {
        let status = b.child.wait();
        (b, status)
    })
    .await?
    .1?;
    ensure!(status.success(), "B exited {status:?} after SIGTERM");
    eventually(Duration::from_secs(30), "nobody leads", async || {
        let leader = client.leader("sched").await?;
        ensure!(leader.is_none(), "still {leader:?}");
        Ok(())
    })
    .await?;

    // The observer saw A's term, B's, then nobody: terms in increasing
    // order, with no leader skipped.
    let mut terms = Vec::new();
    loop {
        let line = next_line(&mut observed, "the observer").await?;
        let v: serde_json::Value = serde_json::from_str(&line)?;
        match v["leader"]["term"].as_u64() {
            Some(t) => terms.push(t),
            None => break,
        }
    }
    ensure!(
        terms == [a_term.0, b_term],
        "the observer saw terms {terms:?}, want [{a_term}, {b_term}]"
    );
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leaders_fenced_write_is_refused() {
    let mut c = Cluster::start("elect-sigstop", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, paused_leader(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn paused_leader(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let dir = tempfile::tempdir()?;
    let script =
        r#"echo "$LATCHKEY_SEQUENCER $LATCHKEY_SESSION_SECRET $LATCHKEY_TOKEN"; sleep 600"#;
    let mut a = elect(
        c,
        &["jobs", "a", "--ttl", "3s", "--", "sh", "-c", script],
        &dir.path().join("a"),
    )?;
    let mut a_lines = lines_of(&mut a)?;
    let printed = next_line(&mut a_lines, "A's sequencer").await?;
    let [seq, secret, token] = printed.split(' ').collect::<Vec<_>>()[..] else {
        bail!("A's command printed {printed:?}");
    };
    let seq: Sequencer = seq.parse()?;
    ensure!(
        token == seq.token.to_string(),
        "LATCHKEY_TOKEN {token} is not the term {}",
        seq.token
    );
    let fenced_put = |value: &str| {
        std::process::Command::new(bin())
            .args(["--endpoints", &c.endpoints_arg(), "put", "--fence"])
            .arg(seq.to_string())
            .args(["jobs/owner", value])
            .env("LATCHKEY_SESSION_SECRET", secret)
            .stdin(Stdio::null())
            .output()
    };
    let out = fenced_put("a")?;
    ensure!(
        out.status.success(),
        "the leader's fenced write failed: {out:?}"
    );

    // A pauses; its session expires and B leads with a higher term.
    a.signal(libc::SIGSTOP)?;
    let session = client.session(Duration::from_secs(10)).await?;
    let b = session
        .election("jobs")
        .campaign_timeout("b", Duration::from_secs(60))
        .await?
        .context("B never led")?;
    ensure!(b.term() > seq.token, "B's term did not increase");
    b.put("jobs/owner", "b").await?;

    // A wakes: the guard kills its command (the lease ended while it was
    // paused), and a fenced write under its old term is refused.
    a.signal(libc::SIGCONT)?;
    let out = fenced_put("a-again")?;
    ensure!(
        out.status.code() == Some(7),
        "a deposed leader's fenced write exited {:?}, want 7 (stale fence): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        client.get("jobs/owner").await? == Some(b"b".to_vec()),
        "the deposed leader's write changed the data"
    );
    b.resign().await?;
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_proclaim_observe_and_resign_from_rust() {
    let mut c = Cluster::start("elect-api", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, api(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn api(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let mut observed = client.observe_leader("db");
    let first = observed.next().await.context("no first change")??;
    ensure!(
        first.leader.is_none(),
        "a leader before any campaign: {first:?}"
    );

    let one = client.session(Duration::from_secs(10)).await?;
    let two = client.session(Duration::from_secs(10)).await?;
    let mut leading = one.election("db").campaign("10.0.0.1").await?;
    let term = leading.term();
    ensure!(
        one.election("db").try_campaign("x").await?.is_none(),
        "another owner of the same session led while the first did"
    );
    // One candidacy campaigns once: again while leading is refused, and
    // after its resignation it may campaign anew.
    let mut again = one.election("db2");
    let first_term = again.campaign("a").await?;
    let refused = again.try_campaign("b").await;
    ensure!(
        matches!(refused, Err(latchkey::Error::InvalidArgument(_))),
        "a second campaign while leading answered {refused:?}"
    );
    first_term.resign().await?;
    let second_term = again
        .try_campaign("b")
        .await?
        .context("no term after resigning")?;
    second_term.resign().await?;
    let mut try_two = two.election("db");
    ensure!(
        try_two.try_campaign("10.0.0.2").await?.is_none(),
        "a second candidate led while the first did"
    );
    ensure!(
        try_two
            .campaign_timeout("10.0.0.2", Duration::from_millis(300))
            .await?
            .is_none(),
        "a timed campaign led while another did"
    );
    leading.proclaim("10.0.0.9").await?;
    ensure!(
        client.leader("db").await?
            == Some(Leader {
                term,
                session: one.id(),
                value: b"10.0.0.9".to_vec()
            }),
        "the proclamation is not in the leader key"
    );
    let waiting = tokio::spawn(async move {
        let leadership = try_two.campaign("10.0.0.2").await?;
        Ok::<_, latchkey::Error>((leadership, two))
    });
    eventually(
        Duration::from_secs(30),
        "the second candidate waits",
        async || {
            let n = waiting_candidates(&client, "db").await?;
            ensure!(n == 1, "{n} waiting");
            Ok(())
        },
    )
    .await?;
    leading.resign().await?;
    let (mut second, _two) = waiting.await??;
    ensure!(second.term() > term, "terms did not grow");
    let refused = second
        .proclaim(vec![0u8; latchkey::core::lock::MAX_ELECTION_VALUE_LEN + 1])
        .await;
    ensure!(refused.is_err(), "an oversized proclamation was accepted");

    // The observer saw: the first term, its proclamation, the second term.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let change = tokio::time::timeout(Duration::from_secs(30), observed.next())
            .await
            .map_err(|_| anyhow!("the observer saw only {seen:?}"))?
            .context("the observer ended")??;
        let leader = change.leader.context("a gap without a leader")?;
        seen.push((leader.term, leader.value));
    }
    ensure!(
        seen == [
            (term, b"10.0.0.1".to_vec()),
            (term, b"10.0.0.9".to_vec()),
            (second.term(), b"10.0.0.2".to_vec()),
        ],
        "the observer saw {seen:?}"
    );
    // Clients cannot forge the leader key.
    let forged = client
        .put(latchkey::core::lock::election_lock_name("db"), "forged")
        .await;
    ensure!(forged.is_err(), "a client wrote a leader key");
    second.resign().await?;
    Ok(())
}
