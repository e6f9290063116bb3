//! Fencing a real database with real lock holders: two `fenced_writer`
//! processes take the same lock of a three-replica cluster (run in this
//! test process) and write to a scratch PostgreSQL server through
//! `PgFence`. The first is frozen (SIGSTOP) while it holds the lock; the
//! second is granted the lock once the first's lease ran out and writes; the
//! first, woken up, is refused by PostgreSQL itself, and none of its writes
//! lands after the second's first write.
//!
//! Without PostgreSQL installed the test says so and passes, unless
//! `LATCHKEY_REQUIRE_POSTGRES` is set (as `cargo xtask test` does, after
//! installing it).

mod support;

#[path = "../../../examples/support/mod.rs"]
mod cluster;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use latchkey_fence::{PgFence, ScratchPostgres};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_postgres::NoTls;

/// The whole test's time limit.
const TEST_LIMIT: Duration = Duration::from_secs(120);

/// A writer process this test started; stopped (by pid) when dropped.
struct Writer {
    child: Child,
}

impl Writer {
    fn signal(&self, sig: libc::c_int) -> Result<()> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        // SAFETY: kill(2) on our own child, not yet reaped (we reap only in
        // `wait` and `drop`).
        let rc = unsafe { libc::kill(pid, sig) };
        ensure!(rc == 0, "kill({pid}, {sig}) failed");
        Ok(())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.signal(libc::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The example this test runs, built by cargo next to this test binary
/// (`cargo test` builds the package's examples).
fn writer_bin() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let profile_dir = me
        .parent()
        .and_then(|deps| deps.parent())
        .context("the test binary's directory")?;
    let bin = profile_dir.join("examples").join("fenced_writer");
    ensure!(
        bin.is_file(),
        "{} is missing: build it with `cargo build -p latchkey-fence --example fenced_writer` \
         (`cargo test` without --test filters builds it)",
        bin.display()
    );
    Ok(bin)
}

fn writer(
    endpoints: &str,
    pg: &ScratchPostgres,
    who: &str,
    err: &std::path::Path,
) -> Result<(Writer, UnboundedReceiver<String>)> {
    let mut child = Command::new(writer_bin()?)
        .args(["--endpoints", endpoints])
        .args(["--postgres", &pg.connection_string()])
        .args(["--who", who, "--ttl-ms", "3000", "--interval-ms", "100"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(err)?)
        .spawn()
        .context("start fenced_writer")?;
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok((Writer { child }, rx))
}

/// Reads lines until one starts with `prefix`; counts the `wrote` lines
/// read on the way (and including it) in `wrote`.
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
    let Some(pg) = support::scratch_postgres() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (nodes, _) = cluster::start_three(dir.path())
        .await
        .expect("start three replicas");
    let endpoints: Vec<String> = nodes
        .values()
        .map(|n| n.advertise_addr().to_string())
        .collect();
    let outcome = tokio::time::timeout(
        TEST_LIMIT,
        paused_holder(&endpoints.join(","), &pg, dir.path()),
    )
    .await;
    for node in nodes.into_values() {
        node.shutdown().await;
    }
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{e:#}\nPostgreSQL's log:\n{}", pg.log_tail()),
        Err(_) => panic!("did not finish within {TEST_LIMIT:?}"),
    }
}

async fn paused_holder(endpoints: &str, pg: &ScratchPostgres, dir: &std::path::Path) -> Result<()> {
    let (db, connection) = tokio_postgres::connect(&pg.connection_string(), NoTls).await?;
    tokio::spawn(connection);

    let (mut a, mut a_lines) = writer(endpoints, pg, "A", &dir.join("a.err"))?;
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
    let (b, mut b_lines) = writer(endpoints, pg, "B", &dir.join("b.err"))?;
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
        std::fs::read_to_string(dir.join("a.err")).unwrap_or_default()
    );
    until(
        &mut b_lines,
        "wrote 6 ",
        &mut b_wrote,
        "writer B (after A woke up)",
    )
    .await?;
    drop(b);

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
