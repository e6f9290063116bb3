//! Multi-process tests of "nothing acknowledged is lost when a disk lies or
//! vanishes": three real `latchkey serve` processes whose data directories
//! are wiped, cut short, replaced by an older copy or deleted under them.
//!
//! Each test covers one failure mode and fails without the fix for it:
//!
//! - a wiped member restarted with its usual command line waits to be added
//!   instead of re-initialising and voting (the main scenario, tested first below);
//! - a write-ahead log cut short is refused at start (exit code 8);
//! - a follower restored from an older copy of its directory is refused by
//!   the leader that saw it acknowledge more (no panic, `peer_problems`);
//! - a data directory deleted under a running follower makes it exit (8);
//! - `--initial-cluster-state existing` never forms a cluster and waits;
//! - a leader whose own disk was replaced adds back another replaced member
//!   from the snapshot it caught up from (whose membership lists the
//!   leader's former incarnation): the member takes the leader's entries.
//!
//! Every repair is the documented one: stop the replica, move its data
//! directory away, start it again with the same command line (it waits),
//! then `latchkey members add ID ADDR`.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use latchkey::{Client, Error, NodeStatus};
use support::{
    eventually, verify_linearizable, wait_node_has, write_all, Cluster, CONVERGE_WAIT, LEADER_WAIT,
};

/// Bound on one test's body: each one also repairs a replica (a learner
/// catches up, then is promoted), on a noisy 2-core machine.
const LIMIT: Duration = Duration::from_secs(300);

/// How long a replica that must refuse to run may take to exit.
const EXIT_WAIT: Duration = Duration::from_secs(60);

/// What `latchkey serve` prints (and exits 8 with) when its data directory
/// lost state it had acknowledged.
const LOST_STATE: &str = "lost state this replica had acknowledged";

/// Poll until node `id` reports `Waiting` (a new data directory waiting to
/// be added) with a `detail` that tells the operator to run `members add`.
async fn wait_waiting(c: &Cluster, id: u64) -> Result<NodeStatus> {
    eventually(
        CONVERGE_WAIT,
        &format!("node {id} reports Waiting"),
        async || {
            let s = c.status(id).await?;
            ensure!(
                s.state == "Waiting",
                "node {id} is {} (detail {:?})",
                s.state,
                s.detail
            );
            let detail = s.detail.as_deref().unwrap_or_default();
            ensure!(
                detail.contains("members add"),
                "node {id} waits, but its detail does not say how to add it: {detail:?}"
            );
            Ok(s)
        },
    )
    .await
}

/// Fail unless node `id` (waiting) never initialised nor voted: no log, no
/// term, no membership of its own.
fn never_joined(id: u64, s: &NodeStatus) -> Result<()> {
    ensure!(
        s.state == "Waiting" && s.last_log_index == 0 && s.term == 0 && s.members.is_empty(),
        "node {id} was to wait, never initialising nor voting, but reports state {} term {} \
         last_log_index {} members {:?} (detail {:?})",
        s.state,
        s.term,
        s.last_log_index,
        s.members,
        s.detail
    );
    Ok(())
}

/// The incarnation the agreed leader's membership records for node `id`.
async fn member_incarnation(c: &Cluster, id: u64) -> Result<u64> {
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let s = c.status(leader).await?;
    let m = s.members.iter().find(|m| m.id == id).with_context(|| {
        format!(
            "leader {leader}'s membership lacks node {id}: {:?}",
            s.members
        )
    })?;
    ensure!(
        m.incarnation != 0,
        "node {id} is recorded with incarnation 0"
    );
    Ok(m.incarnation)
}

/// `latchkey members add ID PEER_ADDR` through the CLI, as an operator would;
/// run again (it is idempotent) if the cluster was briefly unavailable.
async fn members_add(c: &Cluster, id: u64) -> Result<()> {
    let id_arg = id.to_string();
    let addr = c.peer_addr(id);
    let mut last = None;
    for _ in 0..3 {
        let out = c.cli(&["members", "add", &id_arg, &addr]).await?;
        if out.code == Some(0) {
            ensure!(
                out.stdout.trim() == "OK",
                "members add printed {:?}",
                out.stdout
            );
            return Ok(());
        }
        eprintln!("members add {id} {addr} failed (will retry): {out:?}");
        // Exit code 3: the cluster could not answer (an election); anything
        // else is a refusal that retrying does not change.
        if out.code != Some(3) {
            bail!("members add {id} {addr} failed: {out:?}");
        }
        last = Some(out);
        c.wait_for_leader(LEADER_WAIT).await?;
    }
    bail!("members add {id} {addr} failed three times, last: {last:?}")
}

/// Poll until node `id` serves as a member again under a new incarnation:
/// it reports itself Follower (or Leader), and the agreed leader's
/// membership lists it as a voter with the incarnation it reports, with
/// every other node still a voter and `old` gone. Returns the new
/// incarnation.
async fn wait_voter_again(c: &Cluster, id: u64, old: u64) -> Result<u64> {
    let n = c.ids().len();
    eventually(
        CONVERGE_WAIT,
        &format!("node {id} is a voter again with a new incarnation"),
        async || {
            let own = c.status(id).await?;
            ensure!(
                own.state == "Follower" || own.state == "Leader",
                "node {id} is {} (detail {:?})",
                own.state,
                own.detail
            );
            ensure!(
                own.incarnation != 0 && own.incarnation != old,
                "node {id} reports incarnation {} (the old one was {old})",
                own.incarnation
            );
            let leader = c.leader_id().await.context("no agreed leader")?;
            let ls = c.status(leader).await?;
            let voters: Vec<_> = ls.members.iter().filter(|m| m.voter).collect();
            ensure!(
                voters.len() == n && ls.members.len() == n,
                "leader {leader}'s membership is {:?}",
                ls.members
            );
            let m = voters
                .iter()
                .find(|m| m.id == id)
                .with_context(|| format!("node {id} is no voter: {:?}", ls.members))?;
            ensure!(
                m.incarnation == own.incarnation,
                "leader {leader} records node {id} with incarnation {}, it reports {}",
                m.incarnation,
                own.incarnation
            );
            Ok(own.incarnation)
        },
    )
    .await
}

/// The documented repair of node `id` (not running) whose data directory
/// lost state or is gone: move the directory away (if there is one), start
/// it again with the same command line (it waits), then [`add_back`].
async fn repair(
    c: &mut Cluster,
    id: u64,
    old: u64,
    acked: &BTreeMap<String, String>,
) -> Result<()> {
    if c.data_dir(id).exists() {
        c.move_data_dir_aside(id, "replaced")?;
    }
    c.restart(id)?;
    let waiting = wait_waiting(c, id).await?;
    never_joined(id, &waiting)?;
    add_back(c, id, old, &waiting, acked).await
}

/// The last step of the repair: node `id`, `waiting` on an empty data
/// directory, is added with `latchkey members add`; check it becomes a
/// voter under the incarnation it waited as (not `old`) and holds `acked`.
async fn add_back(
    c: &Cluster,
    id: u64,
    old: u64,
    waiting: &NodeStatus,
    acked: &BTreeMap<String, String>,
) -> Result<()> {
    ensure!(
        waiting.incarnation != old,
        "node {id} kept incarnation {old} on an empty data directory"
    );
    members_add(c, id).await?;
    let new = wait_voter_again(c, id, old).await?;
    ensure!(
        new == waiting.incarnation,
        "node {id} waited as incarnation {} but joined as {new}",
        waiting.incarnation
    );
    wait_node_has(c, id, acked).await
}

/// The newest RocksDB write-ahead log (`db/NNNNNN.log`) in `data_dir`.
fn newest_wal(data_dir: &Path) -> Result<PathBuf> {
    let db = data_dir.join("db");
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&db)
        .with_context(|| format!("list {}", db.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    // RocksDB numbers its files increasingly, with the same width.
    logs.sort_by_key(|p| {
        p.file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
    });
    logs.pop()
        .with_context(|| format!("no write-ahead log in {}", db.display()))
}

/// Remove `dir` and everything in it, retrying while the running replica
/// creates files in it (RocksDB may create one between listing and removal).
fn remove_dir_under_writer(dir: &Path) -> Result<()> {
    let mut last = None;
    for _ in 0..20 {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    bail!("cannot remove {}: {last:?}", dir.display())
}

// ---------------------------------------------------------------------------

/// The main scenario: node 2 down, 50 writes acknowledged by nodes 1 and
/// 3, then node 3's disk is wiped and it restarts with the same command
/// line, and node 2 comes back. Node 3 must wait (never initialise nor
/// vote), so nodes 1 and 2 elect a leader that has every write; nothing
/// panics; the repair brings node 3 back as a new incarnation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_member_waits_and_nothing_acknowledged_is_lost() {
    let mut c = Cluster::start("wiped-member", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(LIMIT, wiped_member(&mut c)).await;
    c.finish(outcome, LIMIT);
}

async fn wiped_member(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let old3 = member_incarnation(c, 3).await?;
    let own3 = c.status(3).await?.incarnation;
    ensure!(
        own3 == old3,
        "node 3 reports incarnation {own3}, the membership records {old3}"
    );

    c.kill(2)?;
    // With node 2 down every acknowledgement needs node 3's.
    let survivors = c.client_for(&[1, 3])?;
    let mut acked = write_all(&survivors, "k/", 50).await?;

    c.kill(3)?;
    c.move_data_dir_aside(3, "wiped")?;
    c.restart(3)?;
    let waiting = wait_waiting(c, 3).await?;
    never_joined(3, &waiting)?;
    ensure!(
        waiting.incarnation != old3,
        "node 3's empty data directory kept incarnation {old3}"
    );
    c.restart(2)?;

    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    ensure!(leader != 3, "the wiped node 3 leads");
    let client = c.client()?;
    verify_linearizable(&client, "k/", &acked).await?;
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    eprintln!(
        "leader {leader} after node 2's return; its peer problems: {:?}",
        c.status(leader).await?.peer_problems
    );
    // Still waiting with nodes 1 and 2 serving: it never voted for either.
    never_joined(3, &c.status(3).await?)?;
    c.assert_all_alive()?;

    // The repair: node 3 already runs on an empty directory with its
    // usual command line, so `members add` is all that is left.
    add_back(c, 3, old3, &waiting, &acked).await?;
    // Writes keep working, and reach the repaired node.
    acked.extend(write_all(&client, "k/after/", 10).await?);
    verify_linearizable(&client, "k/", &acked).await?;
    wait_node_has(c, 3, &acked).await?;
    c.assert_all_alive()
}

// ---------------------------------------------------------------------------

/// A follower's newest write-ahead log cut short to a tenth of its length
/// (entries it had acknowledged are gone, which RocksDB's point-in-time
/// recovery does not notice): `latchkey serve` must refuse the directory
/// (exit code 8, "lost state ..." and the repair on stderr), and the others
/// keep serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_wal_is_refused_at_start() {
    let mut c = Cluster::start("truncated-wal", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(LIMIT, truncated_wal(&mut c)).await;
    c.finish(outcome, LIMIT);
}

async fn truncated_wal(c: &mut Cluster) -> Result<()> {
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let follower = c.follower_of(leader)?;
    let old = member_incarnation(c, follower).await?;
    let client = c.client()?;
    let mut acked = write_all(&client, "t/", 200).await?;
    wait_node_has(c, follower, &acked).await?;
    let before = c.status(follower).await?;
    c.kill(follower)?;

    let wal = newest_wal(&c.data_dir(follower))?;
    let len = std::fs::metadata(&wal)
        .with_context(|| format!("stat {}", wal.display()))?
        .len();
    // 200 puts (each a log entry and its application) are far more than a
    // few kilobytes; a tenth keeps the first entries only.
    ensure!(
        len >= 16 * 1024,
        "{} holds only {len} bytes: the writes are not in it",
        wal.display()
    );
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .with_context(|| format!("open {}", wal.display()))?;
    file.set_len(len / 10)
        .with_context(|| format!("truncate {}", wal.display()))?;
    file.sync_all().context("sync the truncated log")?;
    drop(file);
    eprintln!(
        "truncated {} from {len} to {} bytes (node {follower} had log index {})",
        wal.display(),
        len / 10,
        before.last_log_index
    );

    c.restart(follower)?;
    let exit = c.wait_exit(follower, EXIT_WAIT).await?;
    ensure!(
        exit.code() == Some(8),
        "node {follower} with a truncated log exited with {exit}, expected code 8"
    );
    let text = c.log_text(follower);
    let refusal = text
        .lines()
        .rev()
        .find(|l| l.contains(LOST_STATE))
        .with_context(|| {
            format!(
                "node {follower}'s log lacks {LOST_STATE:?}; last lines:\n{}",
                support::tail(&c.log_path(follower), 20)
            )
        })?;
    ensure!(
        refusal.contains("members add"),
        "the refusal does not give the repair: {refusal}"
    );
    eprintln!("node {follower} refused to start: {refusal}");

    // The other two keep serving.
    acked.extend(write_all(&client, "t/more/", 20).await?);
    verify_linearizable(&client, "t/", &acked).await?;
    c.assert_all_alive()?;

    repair(c, follower, old, &acked).await?;
    acked.extend(write_all(&client, "t/after/", 10).await?);
    verify_linearizable(&client, "t/", &acked).await?;
    wait_node_has(c, follower, &acked).await?;
    c.assert_all_alive()
}

// ---------------------------------------------------------------------------

/// A follower's whole data directory replaced by an older copy of itself
/// (same incarnation, older log and older mark: nothing local can tell).
/// The leader that saw it acknowledge more must refuse it (reported in its
/// `peer_problems`) instead of panicking, and keep serving with the third
/// node. The election timeout is long so the leader stays the same across
/// the swap: only that leader knows how far the follower had got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_old_copy_is_refused_by_the_leader() {
    let mut c = Cluster::start("restored-old-copy", 3, &["--election-timeout", "1500ms"])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(LIMIT, restored_old_copy(&mut c)).await;
    c.finish(outcome, LIMIT);
}

async fn restored_old_copy(c: &mut Cluster) -> Result<()> {
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let follower = c.follower_of(leader)?;
    let old = member_incarnation(c, follower).await?;
    let client = c.client()?;
    let mut acked = write_all(&client, "r/a/", 20).await?;
    wait_node_has(c, follower, &acked).await?;

    // The "backup": a copy of the stopped follower's directory.
    c.kill(follower)?;
    let dir = c.data_dir(follower);
    let backup = dir.with_extension("backup");
    support::copy_dir(&dir, &backup)?;
    c.restart(follower)?;

    // It acknowledges more than the copy holds: wait until it applied
    // everything, then once more after further writes, so the leader has
    // its acknowledgement of the first batch.
    acked.extend(write_all(&client, "r/b/", 50).await?);
    wait_node_has(c, follower, &acked).await?;
    acked.extend(write_all(&client, "r/c/", 5).await?);
    wait_node_has(c, follower, &acked).await?;
    let ahead = c.status(follower).await?;
    let before = c.status(leader).await?;
    ensure!(
        before.state == "Leader" && before.leader_id == Some(leader),
        "node {leader} no longer leads ({} in term {})",
        before.state,
        before.term
    );

    c.kill(follower)?;
    c.move_data_dir_aside(follower, "newer")?;
    std::fs::rename(&backup, &dir)
        .with_context(|| format!("restore {} to {}", backup.display(), dir.display()))?;
    c.restart(follower)?;

    // The restored copy starts (nothing local shows the loss) ...
    let restored = eventually(CONVERGE_WAIT, "the restored follower answers", async || {
        c.status(follower).await
    })
    .await?;
    eprintln!(
        "node {follower}: log index {} before the swap, {} restored (incarnation {})",
        ahead.last_log_index, restored.last_log_index, restored.incarnation
    );
    ensure!(
        restored.incarnation == old && restored.last_log_index < ahead.last_log_index,
        "the copy was meant to be the same incarnation {old} behind log index {}: it reports \
         incarnation {} at {}",
        ahead.last_log_index,
        restored.incarnation,
        restored.last_log_index
    );

    // ... and the leader that saw it acknowledge more refuses it.
    let problems = eventually(
        CONVERGE_WAIT,
        "the leader reports the reverted follower",
        async || {
            let s = c.status(leader).await?;
            let named: Vec<String> = s
                .peer_problems
                .iter()
                .filter(|p| p.contains(&format!("node {follower}")))
                .cloned()
                .collect();
            ensure!(
                !named.is_empty(),
                "leader {leader} ({} term {}) reports peer problems {:?}",
                s.state,
                s.term,
                s.peer_problems
            );
            Ok((s, named))
        },
    )
    .await;
    let now = c.status(leader).await?;
    let same_leader = now.state == "Leader" && now.term == before.term;
    match problems {
        Ok((_, named)) => eprintln!("leader {leader} refuses node {follower}: {named:?}"),
        Err(e) if !same_leader => {
            // Not a product failure: a new leader never saw the follower's
            // higher acknowledgement, so it cannot tell. Say so loudly.
            eprintln!(
                "WARNING: leadership changed during the swap (node {leader} was leader in term \
                 {}, now {} in term {}): the refusal could not be checked: {e:#}",
                before.term, now.state, now.term
            );
        }
        Err(e) => return Err(e),
    }

    // No panic anywhere (openraft asserts on a follower whose log went
    // backwards), and the leader keeps serving with the third node.
    c.assert_all_alive()?;
    acked.extend(write_all(&client, "r/d/", 20).await?);
    verify_linearizable(&client, "r/", &acked).await?;
    c.assert_all_alive()?;
    let follower_now = c.status(follower).await?;
    eprintln!(
        "the refused node {follower} reports {} term {} log index {}",
        follower_now.state, follower_now.term, follower_now.last_log_index
    );

    // Repair: a fresh directory, added again.
    c.kill(follower)?;
    repair(c, follower, old, &acked).await?;
    acked.extend(write_all(&client, "r/e/", 10).await?);
    verify_linearizable(&client, "r/", &acked).await?;
    wait_node_has(c, follower, &acked).await?;
    c.assert_all_alive()
}

// ---------------------------------------------------------------------------

/// Outcomes of writes sent straight to one replica.
#[derive(Debug, Default)]
struct Direct {
    acked: BTreeMap<String, String>,
    unavailable: usize,
    /// Writes started after the data directory was removed.
    after_removal: usize,
    /// Key and error of each write answered "outcome unknown".
    unknown: Vec<(String, String)>,
    other: Vec<String>,
}

/// Writers sending straight to the follower at once: the replica fails and
/// exits within milliseconds, so several make it likely that some write
/// reaches it in that window.
const DIRECT_WRITERS: usize = 8;

/// Send writes to `addr` alone, each through a new client (so each one's
/// first attempt goes to that replica), until `stop`; keys
/// `v/direct/{writer}/{i}`.
async fn direct_writes(
    addr: String,
    writer: usize,
    stop: Arc<AtomicBool>,
    removed: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
) -> Result<Direct> {
    let options = support::client_options()
        .with_request_timeout(Duration::from_secs(3))
        .with_attempt_timeout(Duration::from_secs(2));
    let mut out = Direct::default();
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let client =
            Client::with_options([addr.clone()], options.clone()).context("build a client")?;
        let key = format!("v/direct/{writer}/{i:05}");
        let value = format!("direct-{writer}-{i}");
        if removed.load(Ordering::SeqCst) {
            out.after_removal += 1;
        }
        match client.put(&key, &value).await {
            Ok(_) => {
                out.acked.insert(key, value);
            }
            Err(Error::Unavailable { .. }) => out.unavailable += 1,
            Err(Error::UnknownOutcome(m)) => out.unknown.push((key, m)),
            Err(e) => out.other.push(format!("{key}: {e}")),
        }
        sent.fetch_add(1, Ordering::SeqCst);
        i += 1;
        tokio::task::yield_now().await;
    }
    Ok(out)
}

/// A running follower's data directory deleted under it: it must exit with
/// code 8 (bounded, polled wait) instead of serving on; writes sent straight
/// to it meanwhile are answered (done by the leader) or unavailable, never
/// "outcome unknown"; the other two keep serving; the repair brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_dir_deleted_under_a_running_follower() {
    let mut c = Cluster::start("dir-deleted", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(LIMIT, dir_deleted(&mut c)).await;
    c.finish(outcome, LIMIT);
}

async fn dir_deleted(c: &mut Cluster) -> Result<()> {
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let follower = c.follower_of(leader)?;
    let old = member_incarnation(c, follower).await?;
    let client = c.client()?;
    let mut acked = write_all(&client, "v/a/", 20).await?;
    wait_node_has(c, follower, &acked).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let removed = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..DIRECT_WRITERS)
        .map(|w| {
            tokio::spawn(direct_writes(
                c.addr(follower),
                w,
                stop.clone(),
                removed.clone(),
                sent.clone(),
            ))
        })
        .collect();
    eventually(CONVERGE_WAIT, "writes sent to the follower", async || {
        let n = sent.load(Ordering::SeqCst);
        ensure!(n >= 5, "{n} sent");
        Ok(())
    })
    .await?;

    remove_dir_under_writer(&c.data_dir(follower))?;
    removed.store(true, Ordering::SeqCst);
    eprintln!("removed node {follower}'s data directory");
    let exited = c.wait_exit(follower, Duration::from_secs(20)).await;
    stop.store(true, Ordering::SeqCst);
    let mut direct = Direct::default();
    for writer in writers {
        let d = writer.await.context("a writer task panicked")??;
        direct.acked.extend(d.acked);
        direct.unavailable += d.unavailable;
        direct.after_removal += d.after_removal;
        direct.unknown.extend(d.unknown);
        direct.other.extend(d.other);
    }
    let exit = exited?;
    eprintln!(
        "node {follower} exited ({exit}); direct writes: {} done, {} unavailable, {} started \
         after the removal, unknown {:?}, other {:?}",
        direct.acked.len(),
        direct.unavailable,
        direct.after_removal,
        direct.unknown,
        direct.other
    );
    ensure!(
        exit.code() == Some(8),
        "node {follower} exited with {exit} after its data directory vanished, expected code 8"
    );
    if !direct.unknown.is_empty() {
        // Evidence for the report: a follower never proposes a write, so
        // none of these can have been applied.
        let mut seen = Vec::new();
        for (key, error) in &direct.unknown {
            let applied = client.get(key).await.map(|v| v.is_some());
            seen.push(format!("{key} ({error}; applied: {applied:?})"));
        }
        bail!(
            "writes sent straight to the failing follower {follower} were answered \
             \"outcome unknown\": {seen:?}"
        );
    }
    ensure!(
        direct.other.is_empty(),
        "writes sent to the failing node {follower} failed unexpectedly: {:?}",
        direct.other
    );
    ensure!(
        direct.after_removal > 0,
        "no write was sent after the removal"
    );
    let text = c.log_text(follower);
    eprintln!(
        "node {follower}'s last words: {:?}",
        text.lines().rev().find(|l| l.starts_with("latchkey:"))
    );

    // The other two keep serving; every write acknowledged through the
    // failing node (done by the leader) is there.
    acked.extend(direct.acked);
    acked.extend(write_all(&client, "v/b/", 20).await?);
    verify_linearizable(&client, "v/", &acked).await?;
    c.assert_all_alive()?;

    // Its directory is gone: the same command line starts a new one.
    repair(c, follower, old, &acked).await?;
    c.assert_all_alive()
}

// ---------------------------------------------------------------------------

/// A replica started on an empty data directory with
/// `--initial-cluster-state existing` never asks the others nor forms a
/// cluster: it waits even while no other member answers, and `members add`
/// brings it in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_cluster_state_waits_to_be_added() {
    let mut c = Cluster::start("existing-state", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(LIMIT, existing_state(&mut c)).await;
    c.finish(outcome, LIMIT);
}

async fn existing_state(c: &mut Cluster) -> Result<()> {
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let replaced = c.follower_of(leader)?;
    let old = member_incarnation(c, replaced).await?;
    let client = c.client()?;
    let mut acked = write_all(&client, "e/", 20).await?;

    // Every node down; the replaced one's directory emptied.
    for id in c.ids() {
        c.kill(id)?;
    }
    c.move_data_dir_aside(replaced, "old")?;
    c.restart_with(replaced, &["--initial-cluster-state", "existing"])?;
    // With nobody to ask it must still know it is not to form a cluster.
    let waiting = wait_waiting(c, replaced).await?;
    never_joined(replaced, &waiting)?;

    for id in c.ids().into_iter().filter(|id| *id != replaced) {
        c.restart(id)?;
    }
    c.wait_for_leader(LEADER_WAIT).await?;
    verify_linearizable(&client, "e/", &acked).await?;
    never_joined(replaced, &c.status(replaced).await?)?;

    add_back(c, replaced, old, &waiting, &acked).await?;
    acked.extend(write_all(&client, "e/after/", 10).await?);
    verify_linearizable(&client, "e/", &acked).await?;
    wait_node_has(c, replaced, &acked).await?;
    c.assert_all_alive()
}

// ---------------------------------------------------------------------------

/// Snapshots after 100 entries, so that the leader purges its log and a
/// replaced member catches up from a snapshot.
const SMALL_SNAPSHOTS: [&str; 4] = ["--snapshot-every", "100", "--keep-after-snapshot", "10"];

/// Node `a`, whose disk was replaced, comes to lead; it still holds the
/// snapshot it caught up from, built before its replacement, so that
/// snapshot's membership lists `a`'s former incarnation. Then node `b`'s
/// disk is replaced and `a` adds it back: `b` installs that snapshot and
/// must take `a`'s entries after it (which record `a`'s new incarnation)
/// rather than refuse `a` as a stranger, which stalled `b` for good and
/// made `members add` time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_leader_adds_back_a_member_from_its_older_snapshot() {
    let mut c = Cluster::start("replaced-leader", 3, &SMALL_SNAPSHOTS)
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(LIMIT, replaced_leader(&mut c)).await;
    c.finish(outcome, LIMIT);
}

async fn replaced_leader(c: &mut Cluster) -> Result<()> {
    let first = c.wait_for_leader(LEADER_WAIT).await?;
    let client = c.client()?;
    let mut acked = write_all(&client, "s/", 300).await?;
    eventually(CONVERGE_WAIT, "the leader has a snapshot", async || {
        let s = c.status(first).await?;
        ensure!(s.snapshot_index > 0, "leader {first}: no snapshot yet");
        Ok(())
    })
    .await?;

    let a = c.follower_of(first)?;
    let old_a = member_incarnation(c, a).await?;
    c.kill(a)?;
    repair(c, a, old_a, &acked).await?;
    let own = c.status(a).await?;
    ensure!(
        own.snapshot_index > 0,
        "node {a} caught up without a snapshot: {own:?}"
    );
    let snapshot_of_a = own.snapshot_index;

    let b = c
        .ids()
        .into_iter()
        .find(|id| *id != first && *id != a)
        .context("a third node")?;
    make_lead(c, a).await?;
    let own = c.status(a).await?;
    ensure!(
        own.snapshot_index == snapshot_of_a,
        "node {a} built a snapshot of its own ({} after {snapshot_of_a}): the scenario needs \
         the older one",
        own.snapshot_index
    );

    let old_b = member_incarnation(c, b).await?;
    c.kill(b)?;
    repair(c, b, old_b, &acked).await?;
    acked.extend(write_all(&client, "s/after/", 10).await?);
    verify_linearizable(&client, "s/", &acked).await?;
    for id in c.ids() {
        wait_node_has(c, id, &acked).await?;
    }
    c.assert_all_alive()
}

/// Have node `want` lead: while another node leads, freeze it (SIGSTOP)
/// until the other two elect a leader, then resume it; repeat until `want`
/// wins (each round it does with even odds).
async fn make_lead(c: &mut Cluster, want: u64) -> Result<()> {
    for _ in 0..12 {
        let leader = c.wait_for_leader(LEADER_WAIT).await?;
        if leader == want {
            return Ok(());
        }
        let term = c.status(want).await?.term;
        c.stop(leader)?;
        let elected = eventually(CONVERGE_WAIT, "a new leader", async || {
            let s = c.status(want).await?;
            ensure!(
                s.leader_id.is_some_and(|l| l != leader) && s.term > term,
                "node {want} knows no new leader after term {term} yet"
            );
            Ok(())
        })
        .await;
        c.cont(leader)?;
        elected?;
    }
    bail!("node {want} did not come to lead in twelve elections")
}
