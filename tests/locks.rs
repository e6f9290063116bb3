//! Multi-process tests of the lock service: three real `latchkey serve`
//! processes, lock holders in their own processes (the `latchkey lock` CLI,
//! or this test binary re-run in a holder role), killed with SIGKILL or
//! paused with SIGSTOP; a `lock -- CMD` whose cluster is paused signals its
//! command when the session is at risk.
//!
//! Timing appears only as lower bounds ("never sooner than"), which a slow
//! machine cannot break, but in one place: the at-risk signal must reach
//! the command in the ~2 s between the session turning at risk and its loss
//! (a 9 s TTL), else the hard kill comes first.

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use latchkey::{Client, LockInfo, Sequencer, Token};
use support::{bin, client_options, eventually, Cluster, Group, LEADER_WAIT, TEST_LIMIT};

async fn lock_info(client: &Client, name: &str) -> Result<Option<LockInfo>> {
    Ok(client
        .locks(name)
        .await?
        .into_iter()
        .find(|l| l.name == name))
}

async fn wait_for_waiters(client: &Client, name: &str, n: u32) -> Result<()> {
    eventually(Duration::from_secs(30), "waiters queued", async || {
        let waiting = lock_info(client, name).await?.map_or(0, |l| l.waiters);
        ensure!(waiting == n, "{waiting} waiting, want {n}");
        Ok(())
    })
    .await
}

/// Start `latchkey lock NAME ARGS -- sleep 600` in its own process group
/// and wait until it holds the lock: the group and the grant's token.
async fn cli_holder(
    c: &Cluster,
    client: &Client,
    name: &str,
    args: &[&str],
) -> Result<(Group, Token)> {
    let mut cmd = Command::new(bin());
    cmd.args(["--endpoints", &c.endpoints_arg(), "lock", name])
        .args(args)
        .args(["--", "sleep", "600"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let holder = Group::spawn(cmd)?;
    let held = eventually(
        Duration::from_secs(30),
        "the CLI holds the lock",
        async || {
            let info = lock_info(client, name).await?.context("not held yet")?;
            info.holders.first().map(|h| h.token).context("no holder")
        },
    )
    .await?;
    Ok((holder, held))
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_passes_the_lock_after_ttl_and_lock_delay() {
    let mut c = Cluster::start("lock-sigkill", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, killed_holder(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn killed_holder(c: &mut Cluster) -> Result<()> {
    const TTL: Duration = Duration::from_secs(3);
    const DELAY: Duration = Duration::from_secs(2);
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let (holder, held) =
        cli_holder(c, &client, "jobs", &["--ttl", "3s", "--lock-delay", "2s"]).await?;

    let session = client.session(Duration::from_secs(10)).await?;
    let waiter = tokio::spawn(async move {
        let guard = session
            .lock("jobs")
            .acquire_timeout(Duration::from_secs(60))
            .await?;
        Ok::<_, latchkey::Error>((Instant::now(), guard))
    });
    wait_for_waiters(&client, "jobs", 1).await?;
    // Let the holder's watchdog run for a while: the lock must stay put.
    tokio::time::sleep(TTL * 2).await;
    let info = lock_info(&client, "jobs").await?.context("lock vanished")?;
    ensure!(
        info.holders.first().map(|h| h.token) == Some(held),
        "a kept-alive holder lost the lock: {info:?}"
    );

    holder.signal(libc::SIGKILL)?;
    let killed = Instant::now();
    let (granted_at, guard) = waiter.await??;
    let guard = guard.context("the waiter was never granted")?;
    // The last keep-alive reached the leader at most ttl/3 before the kill;
    // the session then lives a full TTL, and the lock-delay follows.
    let floor = TTL - TTL / 3 + DELAY;
    let waited = granted_at.duration_since(killed);
    ensure!(
        waited >= floor - Duration::from_millis(200),
        "granted {waited:?} after the kill, sooner than TTL - ttl/3 + lock-delay = {floor:?}"
    );
    ensure!(guard.token() > held, "token did not increase");
    guard.release().await?;
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lists_sessions_and_force_releases_a_hung_holder() {
    let mut c = Cluster::start("lock-force-release", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, force_release(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

/// A CLI holder (`lock jobs --ttl 5s -- sleep 600`) is listed by
/// `sessions` with the lock it holds and the name it opened under;
/// `locks release jobs --force` is refused without the cluster secret and
/// works with it: the holder's command is stopped (exit 206, lost while it
/// ran) though its process and session live on until then, and the waiter
/// is granted under a higher token, never before the holder's TTL (the
/// forced release's lock-delay) has passed.
async fn force_release(c: &mut Cluster) -> Result<()> {
    const TTL: Duration = Duration::from_secs(5);
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let (mut holder, held) = cli_holder(c, &client, "jobs", &["--ttl", "5s"]).await?;

    let pid = holder.pid().to_string();
    // How long the session has left comes from the leader's countdowns,
    // which a new leader resumes only once it has read the state (a quorum
    // round and the apply of everything committed before it): on a loaded
    // machine that can come after the first listing.
    eventually(
        Duration::from_secs(10),
        "the holder listed with its time left",
        async || {
            let listed = c.cli(&["-w", "json", "sessions"]).await?;
            let rows: serde_json::Value = serde_json::from_str(listed.ok()?)
                .with_context(|| format!("`sessions -w json` printed {:?}", listed.stdout))?;
            let row = rows
                .as_array()
                .and_then(|rows| {
                    rows.iter()
                        .find(|r| r["held"][0]["token"].as_u64() == Some(held.0))
                })
                .with_context(|| format!("the holder is not listed: {rows}"))?;
            ensure!(
                row["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("latchkey") && n.contains(&pid))
                    && row["held"][0]["name"] == "jobs"
                    && row["held"][0]["kind"] == "lock"
                    && row["ttl_ms"] == 5_000
                    && row["left_ms"].as_u64().is_some_and(|l| l <= 5_000),
                "the holder's row (pid {pid}): {row}"
            );
            Ok(())
        },
    )
    .await?;
    let table = c.cli(&["sessions"]).await?;
    ensure!(
        table.ok()?.contains(&format!("jobs#{}", held.0)),
        "`sessions` table: {:?}",
        table.stdout
    );

    let session = client.session(Duration::from_secs(10)).await?;
    let waiter = tokio::spawn(async move {
        let guard = session
            .lock("jobs")
            .acquire_timeout(Duration::from_secs(60))
            .await?;
        Ok::<_, latchkey::Error>((Instant::now(), guard))
    });
    wait_for_waiters(&client, "jobs", 1).await?;

    let stranger = c
        .cli_with(false, &["locks", "release", "jobs", "--force"], None)
        .await?;
    ensure!(
        stranger.code == Some(2) && stranger.stderr.contains("cluster secret"),
        "a forced release without the cluster secret: {stranger:?}"
    );
    let info = lock_info(&client, "jobs").await?.context("lock vanished")?;
    ensure!(
        info.holders.first().map(|h| h.token) == Some(held),
        "a refused forced release released: {info:?}"
    );
    let forced = c.cli(&["locks", "release", "jobs", "--force"]).await?;
    let released_at = Instant::now();
    ensure!(
        forced
            .ok()?
            .contains(&format!("token {} of session", held.0)),
        "`locks release --force` said {:?}",
        forced.stdout
    );
    // The holder hears at its next keep-alive (every TTL/3) and stops its
    // command: lost while CMD ran.
    let exited = eventually(Duration::from_secs(30), "the holder exits", async || {
        holder.child.try_wait()?.context("still running")
    })
    .await?;
    ensure!(
        exited.code() == Some(206),
        "the force-released holder exited {exited:?}"
    );
    let (granted_at, guard) = waiter.await??;
    let guard = guard.context("the waiter was never granted")?;
    ensure!(guard.token() > held, "token did not increase");
    let waited = granted_at.duration_since(released_at);
    // The lock-delay (the holder's TTL) began before the command returned.
    ensure!(
        waited >= TTL - Duration::from_millis(500),
        "granted {waited:?} after the forced release, sooner than the holder's TTL {TTL:?}"
    );
    let again = c
        .cli(&[
            "locks",
            "release",
            "jobs",
            "--force",
            "--token",
            &held.0.to_string(),
        ])
        .await?;
    ensure!(
        again.code == Some(1) && again.stderr.contains("has no grant"),
        "a second forced release of the same grant: {again:?}"
    );
    guard.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_killed_in_a_row_keep_a_live_holder_and_free_a_dead_one() {
    let mut c = Cluster::start("lock-rolling-failover", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, rolling_failovers(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

/// Kill the leader once it has led for a while (long enough to record
/// every countdown it took over), restart it, and do it again `times`.
async fn kill_leaders(c: &mut Cluster, times: usize) -> Result<()> {
    for _ in 0..times {
        let leader = c.wait_for_leader(LEADER_WAIT).await?;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        c.kill(leader)?;
        let next = c.wait_for_leader(LEADER_WAIT).await?;
        ensure!(next != leader, "no new leader after killing {leader}");
        c.restart(leader)?;
    }
    Ok(())
}

/// Each new leader records every session it took over (a record slot
/// later), so every keep-alive after a failover must wait for a reset of
/// its session's record: a live holder and a live waiter keep their
/// sessions over four failovers in a row. Then the holder is SIGKILLed and
/// two more leaders are killed: the waiter gets the lock, and never before
/// the dead holder's TTL could have run out.
///
/// The TTL outlasts a keep-alive gap (a third of it) plus an election on a
/// loaded machine with room to spare, and the holder sends its command no
/// at-risk signal: a 3 s TTL put the CLI holder at risk (two thirds of the
/// TTL without an acknowledgement) in two runs of three, and its
/// command, told to stop, released the lock. What is judged here is the
/// cluster keeping live sessions, not how close to an election a client
/// can cut its TTL.
async fn rolling_failovers(c: &mut Cluster) -> Result<()> {
    const TTL: Duration = Duration::from_secs(6);
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let (holder, held) = cli_holder(
        c,
        &client,
        "rolling",
        &["--ttl", "6s", "--at-risk-signal", "none"],
    )
    .await?;
    let session = client.session(TTL).await?;
    let waiter = tokio::spawn(async move {
        let guard = session
            .lock("rolling")
            .acquire_timeout(Duration::from_secs(90))
            .await?;
        Ok::<_, latchkey::Error>((Instant::now(), guard))
    });
    wait_for_waiters(&client, "rolling", 1).await?;

    kill_leaders(c, 4).await?;
    let info = eventually(Duration::from_secs(30), "the lock is listed", async || {
        lock_info(&client, "rolling")
            .await?
            .context("lock vanished")
    })
    .await?;
    ensure!(
        info.holders.first().map(|h| h.token) == Some(held) && info.waiters == 1,
        "a kept-alive holder or waiter lost its session over the failovers (a lost \
         waiter's wait is cancelled): {info:?}"
    );

    holder.signal(libc::SIGKILL)?;
    let killed = Instant::now();
    kill_leaders(c, 2).await?;
    let (granted_at, guard) = waiter.await??;
    let guard = guard.context("the waiter was never granted")?;
    let floor = TTL - TTL / 3;
    let waited = granted_at.duration_since(killed);
    ensure!(
        waited >= floor - Duration::from_millis(200),
        "granted {waited:?} after the kill, sooner than TTL - ttl/3 = {floor:?}"
    );
    ensure!(guard.token() > held, "token did not increase");
    guard.release().await?;
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_clients_wait() {
    let mut c = Cluster::start("lock-leader-killed", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, waiters_survive_failover(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn waiters_survive_failover(c: &mut Cluster) -> Result<()> {
    const TTL: Duration = Duration::from_secs(8);
    const WAITERS: u32 = 4;
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let holder = client.session(TTL).await?;
    let first = holder.lock("failover").acquire().await?;

    let inside = Arc::new(AtomicBool::new(false));
    let grants: Arc<Mutex<Vec<(u32, Token)>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let own = Client::with_options(c.endpoints(), client_options())?;
        let session = own.session(TTL).await?;
        let inside = inside.clone();
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            let guard = session
                .lock("failover")
                .acquire_timeout(Duration::from_secs(90))
                .await?
                .ok_or_else(|| anyhow!("waiter {i} timed out"))?;
            ensure!(
                !inside.swap(true, Ordering::SeqCst),
                "waiter {i} was granted while another held the lock"
            );
            grants
                .lock()
                .map_err(|_| anyhow!("poisoned"))?
                .push((i, guard.token()));
            tokio::time::sleep(Duration::from_millis(100)).await;
            inside.store(false, Ordering::SeqCst);
            guard.release().await?;
            Ok(())
        }));
        wait_for_waiters(&client, "failover", i + 1).await?;
    }

    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    c.kill(leader)?;
    let new_leader = c.wait_for_leader(LEADER_WAIT).await?;
    ensure!(new_leader != leader, "no new leader");
    // The queue survived the failover.
    wait_for_waiters(&client, "failover", WAITERS).await?;
    ensure!(
        holder.is_live(),
        "the holder's session lapsed over the failover"
    );
    let first_token = first.token();
    first.release().await?;
    for t in tasks {
        t.await.context("waiter task")??;
    }
    let grants = grants.lock().map_err(|_| anyhow!("poisoned"))?.clone();
    let order: Vec<u32> = grants.iter().map(|(i, _)| *i).collect();
    ensure!(
        order == (0..WAITERS).collect::<Vec<_>>(),
        "grants out of FIFO order: {order:?}"
    );
    let mut last = first_token;
    for (i, t) in &grants {
        ensure!(*t > last, "waiter {i} got token {t}, not above {last}");
        last = *t;
    }
    c.restart(leader)?;
    Ok(())
}

// ---------------------------------------------------------------------------

/// Environment variables of the holder role.
const ROLE: &str = "LATCHKEY_TEST_ROLE";
const ROLE_ENDPOINTS: &str = "LATCHKEY_TEST_ENDPOINTS";
const ROLE_GO: &str = "LATCHKEY_TEST_GO";

/// Not a test of its own (ignored in normal runs): when this binary is re-run with
/// `LATCHKEY_TEST_ROLE=holder`, this is the holder process of
/// `paused_holder_write_is_fenced`. It takes the lock, prints its sequencer,
/// waits for the go file, then tries a fenced write and prints the result.
#[test]
#[ignore = "the holder process of paused_holder_write_is_fenced, which runs it"]
fn holder_role() -> Result<()> {
    if std::env::var(ROLE).ok().as_deref() != Some("holder") {
        return Ok(());
    }
    let endpoints = std::env::var(ROLE_ENDPOINTS)?;
    let go = std::path::PathBuf::from(std::env::var(ROLE_GO)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let client = Client::with_options(endpoints.split(','), client_options())?;
        let session = client.session(Duration::from_secs(3)).await?;
        let guard = session.lock("storage").acquire().await?;
        println!("SEQ {}", guard.sequencer());
        while !go.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("HELD {}", guard.is_held());
        match guard.put("storage/owner", "paused-holder").await {
            Ok(_) => println!("WRITE accepted"),
            Err(e) if e.is_stale_fence() => println!("WRITE stale"),
            Err(e) => println!("WRITE error {e}"),
        }
        Ok(())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_write_is_fenced() {
    let mut c = Cluster::start("lock-sigstop", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, paused_holder(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn paused_holder(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let dir = tempfile::tempdir()?;
    let go = dir.path().join("go");
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([
        "holder_role",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, "holder")
    .env(ROLE_ENDPOINTS, c.endpoints_arg())
    .env(ROLE_GO, &go)
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(dir.path().join("holder.err"))?);
    let mut holder = Group::spawn(cmd)?;
    let holder_err = dir.path().join("holder.err");
    let stdout = holder.child.stdout.take().context("holder stdout")?;
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut next_line = async |prefix: &str| -> Result<String> {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.recv())
                .await
                .map_err(|_| anyhow!("the holder printed no {prefix} line"))?
                .ok_or_else(|| anyhow!("the holder exited before a {prefix} line"))?;
            // The test harness prints "test holder_role ... " without a
            // newline before the role's first line.
            if let Some(at) = line.find(prefix) {
                return Ok(line[at + prefix.len()..].trim().to_string());
            }
        }
    };
    let seq: Sequencer = match next_line("SEQ ").await {
        Ok(s) => s.parse()?,
        Err(e) => bail!(
            "{e}; its stderr: {}",
            std::fs::read_to_string(&holder_err).unwrap_or_default()
        ),
    };
    ensure!(
        client.check_sequencer(&seq).await?,
        "holder's grant not current"
    );

    // The pause: the holder's watchdog cannot renew.
    holder.signal(libc::SIGSTOP)?;
    let session = client.session(Duration::from_secs(10)).await?;
    let second = session
        .lock("storage")
        .acquire_timeout(Duration::from_secs(60))
        .await?
        .context("nobody got the lock from the paused holder")?;
    ensure!(second.token() > seq.token, "token did not increase");
    second.put("storage/owner", "second").await?;
    ensure!(
        !client.check_sequencer(&seq).await?,
        "paused grant still current"
    );

    std::fs::write(&go, b"go")?;
    holder.signal(libc::SIGCONT)?;
    let held = next_line("HELD ").await?;
    ensure!(
        held == "false",
        "the paused holder believes it still holds the lock"
    );
    let write = next_line("WRITE ").await?;
    ensure!(
        write == "stale",
        "the paused holder's write answered {write:?}"
    );
    ensure!(
        client.get("storage/owner").await? == Some(b"second".to_vec()),
        "the stale write changed the data"
    );
    second.release().await?;
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_lock_never_overlaps() {
    let mut c = Cluster::start("lock-cli", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, cli_lock(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn cli_lock(c: &mut Cluster) -> Result<()> {
    const RUNS: usize = 5;
    c.wait_for_leader(LEADER_WAIT).await?;
    let dir = tempfile::tempdir()?;
    let shared = dir.path().display().to_string();
    // Each command takes a directory as its "I hold it" mark: mkdir fails if
    // another holder's mark is there.
    let script = r#"mkdir "$D/held" || echo OVERLAP >> "$D/log"
echo "$LATCHKEY_TOKEN $LATCHKEY_SEQUENCER" >> "$D/tokens"
sleep 0.2
rmdir "$D/held""#;
    let endpoints = c.endpoints_arg();
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let run = tokio::process::Command::new(bin())
            .args([
                "--endpoints",
                &endpoints,
                "--timeout",
                "30s",
                "lock",
                "cli",
                "--ttl",
                "5s",
                "--wait",
                "60s",
                "--",
                "sh",
                "-c",
                script,
            ])
            .env("D", &shared)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        runs.push(tokio::spawn(run));
    }
    for r in runs {
        let out = r.await??;
        ensure!(
            out.status.code() == Some(0),
            "`latchkey lock` exited {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    ensure!(
        !dir.path().join("log").exists(),
        "two `latchkey lock` commands held the lock at once"
    );
    let tokens = std::fs::read_to_string(dir.path().join("tokens"))?;
    let tokens: Vec<u64> = tokens
        .lines()
        .map(|l| {
            l.split_whitespace()
                .next()
                .unwrap_or_default()
                .parse::<u64>()
                .map_err(|e| anyhow!("bad token line {l:?}: {e}"))
        })
        .collect::<Result<_>>()?;
    ensure!(
        tokens.len() == RUNS,
        "{} of {RUNS} commands ran",
        tokens.len()
    );
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing in grant order: {tokens:?}"
    );

    // The command's exit code comes back; a busy lock exits 205 (200 +
    // latchkey's own 5, out of the command's way).
    let out = c.cli(&["lock", "cli", "--", "sh", "-c", "exit 3"]).await?;
    ensure!(out.code == Some(3), "exit code not passed on: {out:?}");
    let session = Client::with_options(c.endpoints(), client_options())?
        .session(Duration::from_secs(10))
        .await?;
    let guard = session.lock("cli").acquire().await?;
    c.cli(&["lock", "cli", "--no-wait", "--", "true"])
        .await?
        .refused_with(205)?;
    let seq = guard.sequencer().to_string();
    ensure!(c.cli(&["check-sequencer", &seq]).await?.ok()?.trim() == "current");
    let listed = c.cli(&["locks", "--prefix", "cl"]).await?;
    ensure!(
        listed.ok()?.contains(&guard.token().to_string()),
        "`latchkey locks` does not show the holder's token: {listed:?}"
    );
    // A fenced write needs the holder's session secret: without one it is a
    // usage error, with another one it is refused and writes nothing.
    c.cli(&["put", "--fence", &seq, "k", "v"])
        .await?
        .refused_with(2)?;
    let other = Client::with_options(c.endpoints(), client_options())?
        .session(Duration::from_secs(10))
        .await?;
    let forged = c
        .cli(&[
            "put",
            "--fence",
            &seq,
            "--session-secret",
            &other.secret().to_hex(),
            "k",
            "forged",
        ])
        .await?;
    ensure!(
        forged.code != Some(0) && forged.stderr.contains("secret"),
        "a fenced put with another session's secret: {forged:?}"
    );
    other.close().await?;
    let secret = session.secret().to_hex();
    let (seq_arg, secret_arg) = (seq.as_str(), secret.as_str());
    let fenced_put = |value| {
        [
            "put",
            "--fence",
            seq_arg,
            "--session-secret",
            secret_arg,
            "k",
            value,
        ]
    };
    c.cli(&fenced_put("v")).await?.ok()?;
    guard.release().await?;
    c.cli(&["check-sequencer", &seq]).await?.refused_with(1)?;
    c.cli(&fenced_put("w")).await?.refused_with(7)?;
    c.cli(&["check-sequencer", "not-a-sequencer"])
        .await?
        .refused_with(2)?;
    if c.cli(&["get", "k"]).await?.ok()?.trim() != "v" {
        bail!("a refused fenced put wrote");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// `lock -- CMD` and job control: the command never runs while the CLI
// cannot watch the lock.

/// The one-letter state of process `pid` (`R`, `S`, `T`, `Z`, ...), `None`
/// once it is gone.
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rfind(')')?;
    stat[after + 1..].trim_start().chars().next()
}

/// Send `sig` to the single process `pid`.
fn signal_pid(pid: i32, sig: libc::c_int) -> Result<()> {
    // SAFETY: kill(2) of a process this test started.
    let rc = unsafe { libc::kill(pid, sig) };
    ensure!(rc == 0, "kill({pid}, {sig}) failed");
    Ok(())
}

/// Start `latchkey lock NAME --ttl 3s -- sh -c ...` whose command writes its
/// pid to a file and sleeps; returns the CLI's group and the command's pid.
async fn hold_with_cli(c: &Cluster, name: &str, dir: &std::path::Path) -> Result<(Group, i32)> {
    hold_with_cli_as(c, name, dir, &["--ttl", "3s"], "exec sleep 600").await
}

/// [`hold_with_cli`] with `options` for `lock` and `rest` of the script
/// after it writes its pid.
async fn hold_with_cli_as(
    c: &Cluster,
    name: &str,
    dir: &std::path::Path,
    options: &[&str],
    rest: &str,
) -> Result<(Group, i32)> {
    let pidfile = dir.join(format!("{name}.pid"));
    let script = format!("echo $$ > {}; {rest}", pidfile.display());
    let mut cmd = Command::new(bin());
    cmd.args(["--endpoints", &c.endpoints_arg(), "lock", name])
        .args(options)
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let holder = Group::spawn(cmd)?;
    let pid = eventually(Duration::from_secs(30), "the command runs", async || {
        let text = std::fs::read_to_string(&pidfile).context("no pid file yet")?;
        let pid: i32 = text.trim().parse().context("pid file")?;
        ensure!(proc_state(pid).is_some(), "not running");
        Ok(pid)
    })
    .await?;
    Ok((holder, pid))
}

/// SIGSTOP the CLI holding `name` for `command`: once `session` is
/// granted the lock, the command must be gone (the guard killed it by the
/// lock's end); continued, the CLI finds its lock lost and exits 206.
async fn stopped_cli_loses(
    session: &latchkey::Session,
    name: &str,
    mut holder: Group,
    command: i32,
) -> Result<()> {
    signal_pid(holder.pid(), libc::SIGSTOP)?;
    let guard = session
        .lock(name)
        .acquire_timeout(Duration::from_secs(60))
        .await?
        .context("never granted after the holder stopped")?;
    let state = proc_state(command);
    ensure!(
        matches!(state, None | Some('Z')),
        "the command still runs ({state:?}) while another holds lock {name}"
    );
    signal_pid(holder.pid(), libc::SIGCONT)?;
    let status = tokio::task::spawn_blocking(move || holder.child.wait()).await??;
    ensure!(status.code() == Some(206), "the CLI exited {status:?}");
    guard.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_command_never_runs_while_the_cli_is_stopped() {
    let mut c = Cluster::start("lock-job-control", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, stopped_cli(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn stopped_cli(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = Client::with_options(c.endpoints(), client_options())?;
    let dir = tempfile::tempdir()?;

    // 1. SIGSTOP, which the CLI cannot see: the guard kills the command by
    //    the lease's end, before anyone else can be granted the lock.
    let (holder, command) = hold_with_cli(c, "stop", dir.path()).await?;
    let session = client.session(Duration::from_secs(10)).await?;
    stopped_cli_loses(&session, "stop", holder, command).await?;

    // 2. SIGTSTP (Ctrl-Z without a terminal): the CLI stops the command
    //    with itself; once continued after the lock passed on, it kills the
    //    command without letting it run again.
    let (mut holder, command) = hold_with_cli(c, "tstp", dir.path()).await?;
    signal_pid(holder.pid(), libc::SIGTSTP)?;
    eventually(Duration::from_secs(10), "both stopped", async || {
        ensure!(
            proc_state(command) == Some('T'),
            "command {:?}",
            proc_state(command)
        );
        ensure!(
            proc_state(holder.pid()) == Some('T'),
            "cli {:?}",
            proc_state(holder.pid())
        );
        Ok(())
    })
    .await?;
    let guard = session
        .lock("tstp")
        .acquire_timeout(Duration::from_secs(60))
        .await?
        .context("never granted after the holder stopped")?;
    ensure!(
        proc_state(command) == Some('T'),
        "the command runs ({:?}) while another holds the lock",
        proc_state(command)
    );
    signal_pid(holder.pid(), libc::SIGCONT)?;
    let status = tokio::task::spawn_blocking(move || holder.child.wait()).await??;
    ensure!(status.code() == Some(206), "the CLI exited {status:?}");
    let state = proc_state(command);
    ensure!(
        matches!(state, None | Some('Z')),
        "the command was left {state:?}"
    );
    guard.release().await?;

    // 3. A lock lease shorter than the session: the guard kills by the
    //    lease's end even though the session lives on.
    let (holder, command) = hold_with_cli_as(
        c,
        "lease",
        dir.path(),
        &["--ttl", "60s", "--lease", "3s"],
        "exec sleep 600",
    )
    .await?;
    stopped_cli_loses(&session, "lease", holder, command).await?;

    // 4. SIGTERM to the CLI reaches the command, which decides: its trap
    //    runs and its exit code comes back.
    let (mut holder, _) = hold_with_cli_as(
        c,
        "term",
        dir.path(),
        &["--ttl", "10s"],
        "trap 'exit 7' TERM; while :; do sleep 0.1; done",
    )
    .await?;
    signal_pid(holder.pid(), libc::SIGTERM)?;
    let status = tokio::task::spawn_blocking(move || holder.child.wait()).await??;
    ensure!(
        status.code() == Some(7),
        "the CLI exited {status:?}, not the trap's 7"
    );

    // 5. A command that reads the terminal: it gets the terminal (the CLI
    //    runs in the foreground of a pseudo-terminal made by `script`).
    let line = format!(
        "{} --endpoints {} lock tty --ttl 3s -- sh -c 'read x; echo got:$x'",
        bin(),
        c.endpoints_arg()
    );
    let mut child = tokio::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("run script(1)")?;
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        // Typed once the command reads (the terminal keeps the line).
        tokio::time::sleep(Duration::from_secs(1)).await;
        stdin.write_all(b"hello\n").await?;
        // Kept open until the end: an EOF would end the terminal.
        let out = tokio::time::timeout(Duration::from_secs(30), async {
            let status = child.wait().await;
            drop(stdin);
            status
        })
        .await
        .map_err(|_| {
            anyhow!("a command reading the terminal hung (it was stopped in the background)")
        })??;
        let mut stdout = String::new();
        if let Some(mut o) = child.stdout.take() {
            use tokio::io::AsyncReadExt;
            o.read_to_string(&mut stdout).await?;
        }
        ensure!(
            out.success() && stdout.contains("got:hello"),
            "{out:?}: {stdout:?}"
        );
    }

    // 6. The whole cluster paused: once the session is at risk the command
    //    gets the chosen signal (its trap writes a file) while it still
    //    runs, before the hard kill at the lease's end.
    let warned = dir.path().join("at-risk");
    let (holder, command) = hold_with_cli_as(
        c,
        "risk",
        dir.path(),
        &["--ttl", "9s", "--at-risk-signal", "usr1"],
        &format!(
            "trap 'echo warned > {}' USR1; while :; do sleep 0.1; done",
            warned.display()
        ),
    )
    .await?;
    let ids = c.ids();
    for id in &ids {
        c.stop(*id)?;
    }
    let seen = eventually(Duration::from_secs(20), "the at-risk signal", async || {
        let text = std::fs::read_to_string(&warned).context("no file from the trap yet")?;
        ensure!(!text.is_empty(), "the trap's file is empty yet");
        Ok((text, proc_state(command)))
    })
    .await;
    for id in &ids {
        c.cont(*id)?;
    }
    let (text, state) = seen?;
    ensure!(text.trim() == "warned", "the trap wrote {text:?}");
    ensure!(
        matches!(state, Some(s) if s != 'Z'),
        "the command was gone ({state:?}) when its trap's file appeared"
    );
    drop(holder);
    Ok(())
}
