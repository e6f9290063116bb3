//! Fencing a real database: two `fenced_writer` processes take the same
//! lock of a three-process cluster and write to a scratch PostgreSQL server
//! through `PgFence`. The first is frozen (SIGSTOP) while it holds the
//! lock; the second is granted the lock once the first's lease ran out and
//! writes; the first, woken up, is refused by PostgreSQL itself, and none
//! of its writes lands after the second's first write.
//!
//! Without PostgreSQL installed the test says so and passes, unless
//! `LATCHKEY_REQUIRE_POSTGRES` is set (as `cargo xtask test` does, after
//! installing it).

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use latchkey_fence::{PgFence, ScratchPostgres, REQUIRE_ENV};
use support::{Cluster, Group, LEADER_WAIT, TEST_LIMIT};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::NoTls;

/// The example this test runs, built by cargo next to this test binary
/// (`cargo test` builds the examples).
fn writer_bin() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let profile_dir = me
        .parent()
        .and_then(|deps| deps.parent())
        .context("the test binary's directory")?;
    let bin = profile_dir.join("examples").join("fenced_writer");
    ensure!(
        bin.is_file(),
        "{} is missing: build it with `cargo build -p latchkey --example fenced_writer` \
         (`cargo test` without --test filters builds it)",
        bin.display()
    );
    Ok(bin)
}

fn writer(c: &Cluster, pg: &ScratchPostgres, who: &str, err: &std::path::Path) -> Result<Group> {
    let mut cmd = Command::new(writer_bin()?);
    cmd.args(["--endpoints", &c.endpoints_arg()])
        .args(["--postgres", &pg.connection_string()])
        .args(["--who", who, "--ttl-ms", "3000", "--interval-ms", "100"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(err)?);
    Group::spawn(cmd)
}

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

/// Reads lines until one starts with `prefix`; returns it and how many
/// `wrote` lines came before (and including) it.
async fn until(
    lines: &mut UnboundedReceiver<String>,
    prefix: &str,
    wrote: &mut u32,
    what: &str,
) -> Result<String> {
    loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.recv())
            .await
            .map_err(|_| anyhow!("{what}: no line within 60 s"))?
            .ok_or_else(|| anyhow!("{what}: the process exited before printing {prefix:?}"))?;
        if line.starts_with("wrote ") {
            *wrote += 1;
        }
        if line.starts_with(prefix) {
            return Ok(line);
        }
    }
}

fn token_in(line: &str) -> Result<i64> {
    line.rsplit(' ')
        .next()
        .and_then(|t| t.parse().ok())
        .with_context(|| format!("no token at the end of {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_is_refused_by_postgres() {
    let pg = match ScratchPostgres::start_unless_missing() {
        Ok(Some(pg)) => pg,
        Ok(None) => {
            eprintln!("SKIPPED: PostgreSQL is not installed (set {REQUIRE_ENV}=1 to fail instead)");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let mut c = Cluster::start("fenced-pg", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, paused_holder(&mut c, &pg)).await;
    if !matches!(outcome, Ok(Ok(()))) {
        eprintln!("PostgreSQL's log:\n{}", pg.log_tail());
    }
    c.finish(outcome, TEST_LIMIT);
}

async fn paused_holder(c: &mut Cluster, pg: &ScratchPostgres) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let dir = tempfile::tempdir()?;
    let (db, connection) = tokio_postgres::connect(&pg.connection_string(), NoTls).await?;
    tokio::spawn(connection);

    let mut a = writer(c, pg, "A", &dir.path().join("a.err"))?;
    let mut a_lines = lines_of(&mut a)?;
    let mut a_wrote = 0;
    let held = until(&mut a_lines, "holding ", &mut a_wrote, "writer A").await?;
    let a_token = token_in(&held)?;
    // Freeze A between two transactions (frozen inside one, it would hold
    // the fence row's lock and B would wait for it): after a write, stop
    // it, and if PostgreSQL says its session is inside a transaction, let
    // it run to its next write and try again.
    let mut stopped = false;
    for _ in 0..20 {
        until(&mut a_lines, "wrote ", &mut a_wrote, "writer A").await?;
        a.signal(libc::SIGSTOP)?;
        let state: Option<String> = db
            .query_opt(
                "SELECT state FROM pg_stat_activity WHERE application_name = 'fenced_writer A'",
                &[],
            )
            .await?
            .and_then(|r| r.get(0));
        if state.as_deref() == Some("idle") {
            stopped = true;
            break;
        }
        a.signal(libc::SIGCONT)?;
    }
    ensure!(
        stopped,
        "writer A was never caught between two transactions"
    );

    // B waits in the queue; it is granted the lock once A's lease ran out.
    let mut b = writer(c, pg, "B", &dir.path().join("b.err"))?;
    let mut b_lines = lines_of(&mut b)?;
    let mut b_wrote = 0;
    let held = until(&mut b_lines, "holding ", &mut b_wrote, "writer B").await?;
    let b_token = token_in(&held)?;
    ensure!(
        b_token > a_token,
        "B's token {b_token} is not above A's {a_token}"
    );
    until(&mut b_lines, "wrote 3 ", &mut b_wrote, "writer B").await?;

    // A wakes up and writes with its old token: PostgreSQL refuses it.
    a.signal(libc::SIGCONT)?;
    let refused = until(
        &mut a_lines,
        "refused by PostgreSQL",
        &mut a_wrote,
        "writer A",
    )
    .await?;
    ensure!(
        refused.contains(&format!("token {a_token} is older than {b_token}")),
        "A was refused for another reason: {refused}"
    );
    let status = tokio::task::spawn_blocking(move || {
        let status = a.child.wait();
        (status, a)
    })
    .await?;
    ensure!(
        status.0?.code() == Some(3),
        "writer A did not exit with the refusal code 3; stderr: {}",
        std::fs::read_to_string(dir.path().join("a.err")).unwrap_or_default()
    );
    until(
        &mut b_lines,
        "wrote 6 ",
        &mut b_wrote,
        "writer B (after A woke up)",
    )
    .await?;
    b.signal(libc::SIGKILL)?;

    // What the database holds: A's writes (all it reported, none refused),
    // then B's, never one of A's after B's first.
    let rows = db
        .query("SELECT who, token FROM fenced_writes ORDER BY seq", &[])
        .await?;
    let rows: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let a_rows = rows.iter().filter(|(w, _)| w == "A").count();
    ensure!(
        a_rows == a_wrote as usize,
        "A reported {a_wrote} writes but the table holds {a_rows}: {rows:?}"
    );
    let first_b = rows
        .iter()
        .position(|(w, _)| w == "B")
        .context("no write of B landed")?;
    ensure!(
        rows[first_b..]
            .iter()
            .all(|(w, t)| w == "B" && *t == b_token),
        "a write of A landed after B's first: {rows:?}"
    );
    ensure!(
        rows[..first_b]
            .iter()
            .all(|(w, t)| w == "A" && *t == a_token),
        "unexpected rows before B's first write: {rows:?}"
    );
    let highest = PgFence::new().highest(&db, "orders").await?;
    ensure!(
        highest == Some(u64::try_from(b_token)?),
        "the fence holds {highest:?}, not B's token {b_token}"
    );
    Ok(())
}
