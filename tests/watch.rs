//! Multi-process tests of watches: three real `latchkey serve` processes,
//! SIGKILLed and restarted while watchers follow a prefix.
//!
//! - A watch survives a SIGKILL of the replica it reads from and of the
//!   leader: every acknowledged write reaches the watcher once, in revision
//!   order, with no gap or repeat across the reconnects.
//! - A watch from a revision the history no longer holds ends with
//!   `Compacted`, and list-then-watch from the list's revision misses
//!   nothing; a record sent whole to several watches (encoded once) gives
//!   each the previous values it asked for, and a batch that also writes
//!   elsewhere comes as the watched part only.
//! - A watcher that never reads is ended (`WATCH_TOO_SLOW`, naming the
//!   revision to resume from) while writes go on, and resuming there misses
//!   nothing.
//! - Watches whose caller stops reading hold up none of the same client's
//!   other calls: its reads and its session's keep-alives still answer
//!   while the watches are sent more than any flow-control window holds,
//!   a new watch of that client at that replica gets its change, and the
//!   unread watches, read at last, deliver every change once, in order.
//! - A watch on a follower cut off from the rest of the cluster says it is
//!   behind in its progress notices, and stops saying so once the cluster
//!   is back; a change made then arrives.
//! - A watch on a replica that is paused (SIGSTOP: its connection stays
//!   open) hears of a change made elsewhere long before HTTP/2 keep-alive
//!   pings would give up on the connection: it moves to another replica
//!   once its replica has sent nothing for three progress intervals.
//! - `latchkey watch` prints each change as it happens and ends on SIGINT.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use futures::StreamExt;
use latchkey::{Client, Error, ScanRange, Selection, WatchMessage};
use support::{eventually, retrying, Cluster, LEADER_WAIT, TEST_LIMIT};

/// What a watcher saw: revision -> the (key, value or None for a delete)
/// changes of that revision, and the revisions in the order they came.
#[derive(Debug, Default)]
struct Seen {
    order: Vec<u64>,
    changes: BTreeMap<u64, Vec<(String, Option<String>)>>,
    progress: u64,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Follow `keys` from revision `from` into `seen` until the stream ends.
async fn follow(client: Client, keys: Selection, from: u64, seen: Arc<Mutex<Seen>>) -> Result<()> {
    let mut watch = client.watch(keys).from_revision(from);
    while let Some(message) = watch.next().await {
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        match message {
            Ok(WatchMessage::Changes {
                revision, changes, ..
            }) => {
                seen.order.push(revision);
                seen.changes.insert(
                    revision,
                    changes
                        .iter()
                        .map(|c| (text(&c.key), c.current.as_ref().map(|v| text(&v.value))))
                        .collect(),
                );
            }
            Ok(WatchMessage::Progress { revision, .. }) => seen.progress = revision,
            // The cluster was unreachable for a while: the watch goes on.
            Err(Error::Unavailable { .. }) => {}
            Err(e) => bail!("the watch ended: {e}"),
        }
    }
    Ok(())
}

/// The revisions came in increasing order, each once.
fn check_order(seen: &Seen) -> Result<()> {
    for pair in seen.order.windows(2) {
        ensure!(
            pair[0] < pair[1],
            "revision {} came after {}: out of order or repeated",
            pair[1],
            pair[0]
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_killing_its_replica_and_the_leader() {
    let mut c = Cluster::start("watch-kills", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, watch_across_kills(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

/// The leader, a follower and the third node.
async fn roles(c: &Cluster) -> Result<(u64, u64, u64)> {
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let follower = c.follower_of(leader)?;
    let third = c
        .ids()
        .into_iter()
        .find(|id| *id != leader && *id != follower)
        .context("a third node")?;
    Ok((leader, follower, third))
}

async fn watch_across_kills(c: &mut Cluster) -> Result<()> {
    let (leader, follower, third) = roles(c).await?;
    let writer = c.client()?;
    let start = retrying("write", async || writer.put("other", "x").await).await? + 1;
    // The watcher tries the follower first: that is the replica it reads
    // from until it is killed.
    let watcher = c.client_for(&[follower, third, leader])?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let task = tokio::spawn(follow(
        watcher,
        Selection::prefix("w/"),
        start,
        seen.clone(),
    ));

    let mut acked: BTreeMap<u64, (String, String)> = BTreeMap::new();
    let write = async |acked: &mut BTreeMap<u64, (String, String)>, i: usize| -> Result<()> {
        let (key, value) = (format!("w/{:03}", i % 40), format!("v{i}"));
        match writer.put(&key, &value).await {
            Ok(revision) => {
                acked.insert(revision, (key, value));
                Ok(())
            }
            Err(Error::UnknownOutcome(_)) | Err(Error::Unavailable { .. }) => Ok(()),
            Err(e) => bail!("put {key}: {e}"),
        }
    };
    for i in 0..60 {
        write(&mut acked, i).await?;
    }
    c.kill(follower)?;
    for i in 60..120 {
        write(&mut acked, i).await?;
    }
    c.restart(follower)?;
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    c.kill(leader)?;
    for i in 120..180 {
        write(&mut acked, i).await?;
    }
    c.restart(leader)?;
    let last = retrying("write", async || writer.put("w/last", "end").await).await?;
    acked.insert(last, ("w/last".into(), "end".into()));

    eventually(
        Duration::from_secs(60),
        "the watcher saw the last write",
        async || {
            let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            ensure!(
                seen.changes.contains_key(&last),
                "up to {:?}",
                seen.order.last()
            );
            Ok(())
        },
    )
    .await?;
    task.abort();
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    check_order(&seen)?;
    for (revision, (key, value)) in &acked {
        let got = seen.changes.get(revision);
        ensure!(
            got == Some(&vec![(key.clone(), Some(value.clone()))]),
            "acknowledged put {key}={value} at revision {revision}: the watcher saw {got:?}"
        );
    }
    // Every revision from the start to the last write changed w/ (the only
    // other write came before the start): none may be missing.
    let missing: Vec<u64> = (start..=last)
        .filter(|r| !seen.changes.contains_key(r))
        .collect();
    ensure!(missing.is_empty(), "revisions never delivered: {missing:?}");
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_revision_is_refused_and_list_then_watch_misses_nothing() {
    let mut c = Cluster::start("watch-compacted", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, compacted(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn compacted(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = c.client()?;
    // 1 MiB values over 1 MiB values: each revision keeps ~2 MiB of
    // history, so 40 of them pass the 64 MiB window.
    let big = vec![b'x'; latchkey::core::limits::MAX_VALUE_LEN];
    for _ in 0..40 {
        retrying("write", async || client.put("big", &big).await).await?;
    }
    let mut watch = client.watch(Selection::key("big")).from_revision(1);
    match watch.next().await {
        Some(Err(Error::Compacted {
            requested: 1,
            oldest_revision,
        })) if oldest_revision > 1 => {}
        other => bail!("a watch from revision 1 answered {other:?}"),
    }
    ensure!(
        watch.next().await.is_none(),
        "the watch went on after Compacted"
    );
    let cli = support::run_cli(&[
        "watch",
        "big",
        "--rev",
        "1",
        "--endpoints",
        &c.endpoints_arg(),
    ])
    .await?;
    cli.refused_with(2)?;
    ensure!(cli.stderr.contains("compacted"), "stderr: {}", cli.stderr);

    // List, then watch from the list's revision plus one.
    for i in 0..5 {
        retrying("write", async || client.put(format!("cfg/{i}"), "a").await).await?;
    }
    let page = client.scan(ScanRange::prefix("cfg/", 0)).await?;
    ensure!(page.entries.len() == 5, "listed {:?}", page.entries.len());
    let after = retrying("write", async || client.put("cfg/9", "b").await).await?;
    let mut watch = client
        .watch(Selection::prefix("cfg/"))
        .from_revision(page.revision + 1);
    loop {
        match watch.next().await {
            Some(Ok(WatchMessage::Progress { .. })) => continue,
            Some(Ok(WatchMessage::Changes {
                revision, changes, ..
            })) => {
                ensure!(
                    revision == after && changes.len() == 1 && changes[0].key == b"cfg/9",
                    "the first change after the list is {revision} {changes:?}, not the put at {after}"
                );
                break;
            }
            other => bail!("the watch after the list answered {other:?}"),
        }
    }

    // A record every change of which is watched goes whole, encoded once
    // for all watches: a watch with previous values and one without each
    // get what they asked for. A batch that also writes elsewhere goes as
    // the watch's own part of it.
    let mut plain = client
        .watch(Selection::prefix("cfg/"))
        .from_revision(after + 1);
    let mut with_prev = client
        .watch(Selection::prefix("cfg/"))
        .from_revision(after + 1)
        .with_prev_value();
    let whole = retrying("write", async || client.put("cfg/9", "c").await).await?;
    let part = client
        .batch(
            latchkey::Batch::new()
                .put("cfg/8", "d")
                .put("elsewhere", "e"),
        )
        .await?
        .map_err(|i| anyhow::anyhow!("the batch's condition {i} failed"))?;
    for (watch, prev) in [(&mut plain, None), (&mut with_prev, Some(&b"b"[..]))] {
        let (revision, changes) = next_changes(watch).await?;
        ensure!(
            revision == whole
                && changes.len() == 1
                && changes[0].key == b"cfg/9"
                && changes[0].current.as_ref().map(|v| &v.value[..]) == Some(&b"c"[..])
                && changes[0].previous.as_ref().map(|v| &v.value[..]) == prev,
            "the put at {whole} came as {revision} {changes:?}"
        );
        let (revision, changes) = next_changes(watch).await?;
        ensure!(
            revision == part && changes.len() == 1 && changes[0].key == b"cfg/8",
            "the batch at {part} came as {revision} {changes:?}"
        );
    }
    Ok(())
}

/// The next changes a watch sends, past its progress notices.
async fn next_changes(watch: &mut latchkey::Watch) -> Result<(u64, Vec<latchkey::KeyChange>)> {
    loop {
        match watch.next().await {
            Some(Ok(WatchMessage::Progress { .. })) => continue,
            Some(Ok(WatchMessage::Changes {
                revision, changes, ..
            })) => return Ok((revision, changes)),
            other => bail!("the watch answered {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_never_reads_is_ended_and_resumes_without_a_gap() {
    let mut c = Cluster::start("watch-slow", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, never_reads(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

/// Connections of the idle watches besides the first, and watches on each.
const EXTRA_IDLE_CONNECTIONS: usize = 4;
const EXTRA_IDLE_WATCHES_PER_CONNECTION: usize = 6;
/// How much the leader's resident memory may grow while the idle watches
/// do not read: about half of what they would hold if each kept every
/// change (it grew 58 MiB here: the writes themselves, and at most 64
/// queued messages and a flow-control window per watch).
const MEMORY_GROWTH_LIMIT: u64 = 128 << 20;

/// A process's resident memory (`VmRSS` of `/proc/PID/status`), in bytes.
fn resident_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("unreadable {line:?}"))?;
    Ok(kib * 1024)
}

async fn never_reads(c: &mut Cluster) -> Result<()> {
    use latchkey_proto::v1::{watch_client::WatchClient, watch_request::Keys, ErrorKind};
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let client = c.client()?;
    let start = retrying("write", async || client.put("s/first", "0").await).await?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", c.addr(leader)))?
        .connect()
        .await?;
    let mut raw = WatchClient::new(channel);
    let request = latchkey_proto::v1::WatchRequest {
        keys: Some(Keys::Prefix(b"s/".to_vec())),
        start_revision: start,
        ..Default::default()
    };
    let mut replies = raw.watch(request.clone()).await?.into_inner();
    // More that never read, over connections of their own: held whole,
    // they would take 2 x 600 x 8 KiB each, 240 MiB in all.
    let pid = c.pid(leader).context("the leader's pid")?;
    let before = resident_bytes(pid)?;
    let mut idle = Vec::new();
    for _ in 0..EXTRA_IDLE_CONNECTIONS {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", c.addr(leader)))?
                .connect()
                .await?;
        for _ in 0..EXTRA_IDLE_WATCHES_PER_CONNECTION {
            let mut w = WatchClient::new(channel.clone());
            idle.push(w.watch(request.clone()).await?.into_inner());
        }
    }
    // Never read while 600 writes of 8 KiB go on: far more than the
    // watch's queue (64 messages) and the connection's flow-control window
    // hold, and fewer than the feed's ring (1,024 records), so it is the
    // wait for room (5 s) that ends the watch.
    let value = vec![b'v'; 8 * 1024];
    let mut last = start;
    for round in 0..2 {
        for i in 0..600 {
            last = retrying("write", async || {
                client.put(format!("s/{}", i % 100), &value).await
            })
            .await?;
        }
        if round == 0 {
            // Give the replica time to notice (its wait for room is 5 s).
            tokio::time::sleep(Duration::from_secs(7)).await;
        }
    }
    // The replica's memory did not grow with what the idle watches were
    // sent: a watch holds at most 64 messages, and an ended one nothing.
    let grown = resident_bytes(pid)?.saturating_sub(before);
    ensure!(
        grown < MEMORY_GROWTH_LIMIT,
        "the leader's resident memory grew by {} MiB while {} watches did not read",
        grown >> 20,
        idle.len() + 1
    );
    // Drained together: streams of one connection share its flow-control
    // window, so one read alone may wait for the others.
    let ends = futures::future::join_all(idle.into_iter().map(|mut stream| async move {
        loop {
            let reply = tokio::time::timeout(Duration::from_secs(30), stream.message())
                .await
                .context("an idle watch neither sent nor ended")??
                .context("an idle watch ended without an error")?;
            if let Some(e) = reply.error {
                return anyhow::Ok(e);
            }
        }
    }))
    .await;
    for ended in ends {
        let ended = ended?;
        ensure!(
            ended.kind == ErrorKind::WatchTooSlow as i32,
            "an idle watch ended with {ended:?}"
        );
    }
    let mut delivered = Vec::new();
    let resume_from = loop {
        let reply = tokio::time::timeout(Duration::from_secs(30), replies.message())
            .await
            .context("the watch neither sent nor ended")??
            .context("the watch ended without an error")?;
        if let Some(e) = reply.error {
            ensure!(
                e.kind == ErrorKind::WatchTooSlow as i32,
                "the watch ended with {e:?}"
            );
            break e.value;
        }
        if !reply.events.is_empty() {
            delivered.push(reply.revision);
        }
    };
    ensure!(
        resume_from < last,
        "the slow watch delivered everything (resume from {resume_from}, last {last})"
    );
    ensure!(
        delivered.last().is_none_or(|r| *r + 1 == resume_from),
        "delivered up to {:?} but resumes from {resume_from}",
        delivered.last()
    );
    // Resuming where it said: the very next revision comes first.
    let mut watch = client
        .watch(Selection::prefix("s/"))
        .from_revision(resume_from);
    loop {
        match watch.next().await {
            Some(Ok(WatchMessage::Progress { .. })) => continue,
            Some(Ok(WatchMessage::Changes { revision, .. })) => {
                ensure!(
                    revision == resume_from,
                    "resumed at {revision}, not {resume_from}"
                );
                break;
            }
            other => bail!("the resumed watch answered {other:?}"),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_paused_replica_moves_to_another() {
    let mut c = Cluster::start("watch-paused", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, paused_replica(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

/// How soon a watch on a paused replica must hear of a change made
/// elsewhere: well under the ~15 s (a 10 s ping interval, then 5 s for the
/// answer) HTTP/2 keep-alive takes to give up on the paused replica's
/// connection, which is what the watch would otherwise wait for.
const PAUSED_WAIT: Duration = Duration::from_secs(10);

async fn paused_replica(c: &mut Cluster) -> Result<()> {
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let follower = c.follower_of(leader)?;
    // The watch opens at its client's first endpoint: the follower.
    let client = c.client_for(&[follower, leader])?;
    let mut watch = client
        .watch(Selection::prefix("paused/"))
        .progress_every(Duration::from_millis(100));
    match tokio::time::timeout(Duration::from_secs(10), watch.next()).await {
        Ok(Some(Ok(_))) => {}
        other => bail!("the watch did not open: {other:?}"),
    }
    // Read on in a task of its own, so the watch's caller is never away
    // (a caller away for 5 s would have its stream closed for that).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        while let Some(message) = watch.next().await {
            if tx.send(message).is_err() {
                return;
            }
        }
    });
    c.stop(follower)?;
    let writer = c.client_for(&[leader])?;
    let heard = async {
        let put = writer.put("paused/a", "1").await?;
        let deadline = tokio::time::Instant::now() + PAUSED_WAIT;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Ok(WatchMessage::Progress { .. }))) => continue,
                Ok(Some(Ok(WatchMessage::Changes { revision, .. }))) if revision == put => {
                    return Ok(());
                }
                other => bail!(
                    "a watch whose replica was paused answered {other:?} (the change is at \
                     revision {put})"
                ),
            }
        }
    }
    .await;
    reader.abort();
    c.cont(follower)?;
    heard
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_their_caller_does_not_read_hold_up_no_other_call() {
    let mut c = Cluster::start("watch-unread", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, unread_watches(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

/// Watches one client opens and then stops reading.
const UNREAD_WATCHES: usize = 4;
/// Puts of 64 KiB under their prefix while they are not read.
const UNREAD_PUTS: usize = 384;
/// The session TTL of that client: its keep-alives must keep landing
/// (stalled, they stall for good; the TTL only bounds how soon that shows).
const UNREAD_SESSION_TTL: Duration = Duration::from_secs(10);

async fn unread_watches(c: &mut Cluster) -> Result<()> {
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    // Everything this client does goes to the leader: its reads, its
    // session's keep-alives and its watches.
    let client = c.client_for(&[leader])?;
    let session = client.session(UNREAD_SESSION_TTL).await?;
    let mut watches = Vec::new();
    for _ in 0..UNREAD_WATCHES {
        let mut watch = client.watch(Selection::prefix("unread/"));
        // Its first message (a progress notice) says it is open; after
        // that it is never read.
        match tokio::time::timeout(Duration::from_secs(10), watch.next()).await {
            Ok(Some(Ok(_))) => watches.push(watch),
            other => bail!("a watch did not open: {other:?}"),
        }
    }
    // Another client writes 24 MiB under the prefix: each watch is sent
    // far more than the flow-control windows of its stream hold.
    let writer = c.client()?;
    let value = vec![b'v'; 64 * 1024];
    let mut last = 0;
    for i in 0..UNREAD_PUTS {
        last = retrying("write", async || {
            writer.put(format!("unread/{}", i % 32), &value).await
        })
        .await?;
    }
    // The client's own calls still answer, and its session stays live past
    // its TTL.
    for round in 0..12 {
        tokio::time::timeout(Duration::from_secs(5), client.get("unread/0"))
            .await
            .with_context(|| {
                format!(
                    "round {round}: a read by the client whose {UNREAD_WATCHES} watches are not \
                     read did not answer within 5 s"
                )
            })?
            .with_context(|| format!("round {round}: the read failed"))?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ensure!(
        session.is_live(),
        "the session was lost while its client's watches were not read"
    );
    // A new watch of the same client at the same replica is not held up
    // either: the unread ones let their streams go after a while.
    // (Opened before the put it must see: a watch starts at its first poll,
    // from the next revision.)
    let mut fresh = client.watch(Selection::key("fresh"));
    match tokio::time::timeout(Duration::from_secs(30), fresh.next()).await {
        Ok(Some(Ok(_))) => {}
        other => bail!("a new watch next to the unread ones did not open: {other:?}"),
    }
    let put = writer.put("fresh", "1").await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, fresh.next()).await {
            Ok(Some(Ok(WatchMessage::Progress { .. }))) => continue,
            Ok(Some(Ok(WatchMessage::Changes { revision, .. }))) if revision == put => break,
            other => bail!("a new watch next to the unread ones answered {other:?}"),
        }
    }
    // Had leadership moved, the calls would have gone elsewhere.
    ensure!(
        c.leader_id().await == Some(leader),
        "leadership moved during the test: it proves nothing"
    );
    // Read at last, each unread watch delivers every change once, in order.
    for (n, watch) in watches.iter_mut().enumerate() {
        let mut changes = 0;
        let mut seen = 0;
        while seen < last {
            match tokio::time::timeout(Duration::from_secs(30), watch.next()).await {
                Ok(Some(Ok(WatchMessage::Progress { revision, .. }))) => {
                    ensure!(
                        revision >= seen,
                        "watch {n}: progress went back to {revision}"
                    );
                    seen = revision;
                }
                Ok(Some(Ok(WatchMessage::Changes {
                    revision,
                    changes: batch,
                    ..
                }))) => {
                    ensure!(
                        revision > seen,
                        "watch {n}: revision {revision} after {seen}"
                    );
                    seen = revision;
                    changes += batch.len();
                }
                other => bail!("watch {n}, read at last, answered {other:?}"),
            }
        }
        ensure!(
            changes == UNREAD_PUTS,
            "watch {n} delivered {changes} changes of {UNREAD_PUTS}"
        );
    }
    drop(watches);
    session.close().await?;
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_says_it_is_behind() {
    let mut c = Cluster::start("watch-behind", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, cut_off(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

/// The next progress notice of `watch` whose `behind` is `behind`, skipping
/// other notices; a change before it is returned as an error.
async fn notice(watch: &mut latchkey::Watch, behind: bool) -> Result<u64> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), watch.next())
            .await
            .with_context(|| format!("no progress notice with behind = {behind}"))?
            .context("the watch ended")?;
        match message {
            Ok(WatchMessage::Progress {
                revision,
                behind: b,
            }) if b == behind => return Ok(revision),
            Ok(WatchMessage::Progress { .. }) => {}
            other => bail!("waiting for behind = {behind}, the watch sent {other:?}"),
        }
    }
}

async fn cut_off(c: &mut Cluster) -> Result<()> {
    let (leader, follower, third) = roles(c).await?;
    let writer = c.client()?;
    let start = retrying("write", async || writer.put("b/0", "0").await).await?;
    // Only the follower: the watch cannot move elsewhere. (A start the
    // follower has not applied yet is waited for.)
    let mut watch = c
        .client_for(&[follower])?
        .watch(Selection::prefix("b/"))
        .from_revision(start + 1)
        .progress_every(Duration::from_millis(200));
    let seen = notice(&mut watch, false).await?;
    ensure!(seen == start, "in place at {seen}, not {start}");
    // The rest of the cluster stops answering: the follower soon knows no
    // leader, and says so. (A leader never says it is behind: the watched
    // node must not have taken over meanwhile.)
    let now = c.wait_for_leader(LEADER_WAIT).await?;
    ensure!(
        now != follower,
        "leadership moved to the watched node n{follower} before the cut"
    );
    c.stop(leader)?;
    c.stop(third)?;
    let while_cut = notice(&mut watch, true).await?;
    ensure!(
        while_cut == start,
        "a cut-off follower moved to revision {while_cut}"
    );
    // Its health says the same: not ready while it has heard no leader
    // for longer than an election timeout (with pre-vote it keeps its term
    // and openraft's idea of who leads, so only the silence tells).
    let follower_addr = c.addr(follower);
    eventually(
        LEADER_WAIT,
        "the cut-off follower reports NOT_SERVING",
        async || health_is(&follower_addr, NOT_SERVING).await,
    )
    .await?;
    c.cont(leader)?;
    c.cont(third)?;
    let after = retrying("write", async || writer.put("b/1", "1").await).await?;
    // The write made once it is back arrives (a resend after an unknown
    // outcome may have written it twice: up to `after`), then a notice
    // without `behind`.
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), watch.next())
            .await
            .context("the write after the cut never arrived")?
            .context("the watch ended")?;
        match message {
            Ok(WatchMessage::Progress { .. }) => {}
            Ok(WatchMessage::Changes { revision, .. }) if revision < after => {}
            Ok(WatchMessage::Changes { revision, .. }) => {
                ensure!(revision == after, "got revision {revision}, not {after}");
                break;
            }
            Err(e) => bail!("the watch failed: {e}"),
        }
    }
    notice(&mut watch, false).await?;
    eventually(
        LEADER_WAIT,
        "the follower reports SERVING again",
        async || health_is(&follower_addr, SERVING).await,
    )
    .await?;
    Ok(())
}

/// grpc.health.v1 statuses (`tonic_health::pb::health_check_response::ServingStatus`).
const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;

/// Ok if the replica at `addr` reports `want` on grpc.health.v1 (the whole
/// server).
async fn health_is(addr: &str, want: i32) -> Result<()> {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let channel = latchkey_proto::channel(addr, Duration::from_secs(1), None)?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    let got = reply.into_inner().status;
    ensure!(got == want, "health status {got}, not {want}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_each_change_and_stops_on_sigint() {
    let mut c = Cluster::start("watch-cli", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, cli_watch(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn cli_watch(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = c.client()?;
    let first = retrying("write", async || client.put("p/a", "1").await).await?;
    let (mut child, mut lines) = c.spawn_cli(&[
        "watch",
        "--prefix",
        "p/",
        "--rev",
        &first.to_string(),
        "-w",
        "json",
    ])?;
    retrying("write", async || client.delete("p/a").await).await?;
    retrying("write", async || client.put("other", "x").await).await?;
    let put = retrying("write", async || client.put("p/b", "2").await).await?;
    let mut events = Vec::new();
    while events.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .context("no line from `latchkey watch`")??
            .context("`latchkey watch` ended early")?;
        let event: serde_json::Value = serde_json::from_str(&line)?;
        events.push(event);
    }
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    ensure!(kinds == ["PUT", "DELETE", "PUT"], "events {events:?}");
    ensure!(events[0]["revision"] == first, "first event {}", events[0]);
    ensure!(events[2]["revision"] == put, "last event {}", events[2]);
    ensure!(events[2]["kv"]["version"] == 1, "p/b: {}", events[2]);
    let pid = child.id().context("the watch's pid")?;
    // SAFETY: a plain signal to a child this test started and still holds.
    let sent = unsafe { libc::kill(pid as i32, libc::SIGINT) };
    ensure!(sent == 0, "SIGINT failed");
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .context("`latchkey watch` did not stop on SIGINT")??;
    ensure!(status.success(), "`latchkey watch` exited {status}");
    Ok(())
}
