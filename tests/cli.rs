//! The `latchkey` command-line tool against a real three-process cluster,
//! and the cluster's refusal of bad input (CLI, client API and raw gRPC).

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use latchkey::core::limits;
use latchkey::Error;
use latchkey_proto::v1::call::Request as Req;
use latchkey_proto::v1::kv_client::KvClient;
use latchkey_proto::v1::lock_client::LockClient;
use latchkey_proto::v1::pipeline_client::PipelineClient;
use latchkey_proto::v1::raft_client::RaftClient;
use latchkey_proto::v1::{self as v1, Call, CallFrame, ErrorKind, RaftMessage};
use support::{eventually, run_cli, run_cli_with_stdin, Cluster, LEADER_WAIT, TEST_LIMIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_node_keeps_serving() {
    let mut c = Cluster::start("bad-input", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, bad_input(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

fn expect_invalid(what: &str, result: Result<impl std::fmt::Debug, Error>) -> Result<()> {
    match result {
        Err(Error::InvalidArgument(msg)) => {
            ensure!(!msg.is_empty(), "{what}: InvalidArgument without a message");
            Ok(())
        }
        other => bail!("{what}: expected Error::InvalidArgument, got {other:?}"),
    }
}

/// The `error` of a typed reply: INVALID_ARGUMENT, with a message.
fn expect_invalid_reply<R: std::fmt::Debug>(
    what: &str,
    reply: Result<tonic::Response<R>, tonic::Status>,
    error: fn(&R) -> Option<&v1::Error>,
) -> Result<()> {
    let reply = reply
        .map_err(|s| anyhow::anyhow!("{what}: expected a reply with an error, got status {s:?}"))?
        .into_inner();
    let e =
        error(&reply).with_context(|| format!("{what}: the reply carries no error: {reply:?}"))?;
    expect_invalid_error(what, e)
}

fn expect_invalid_error(what: &str, e: &v1::Error) -> Result<()> {
    ensure!(
        e.kind == ErrorKind::InvalidArgument as i32,
        "{what}: expected INVALID_ARGUMENT, got {e:?}"
    );
    ensure!(!e.message.is_empty(), "{what}: an error without a message");
    ensure!(!e.retryable, "{what}: an invalid argument marked retryable");
    Ok(())
}

/// The error a call reply carries, whichever call it answers.
fn call_reply_error(reply: &v1::call_reply::Reply) -> Option<&v1::Error> {
    use v1::call_reply::Reply as Rep;
    match reply {
        Rep::Error(e) => Some(e),
        Rep::Put(r) => r.error.as_ref(),
        Rep::Get(r) => r.error.as_ref(),
        Rep::Acquire(r) => r.error.as_ref(),
        Rep::FencedWrite(r) => r.error.as_ref(),
        Rep::Batch(r) => r.error.as_ref(),
        other => panic!("an unexpected reply in this test: {other:?}"),
    }
}

async fn channel(addr: &str) -> Result<Channel> {
    Channel::from_shared(format!("http://{addr}"))
        .context("endpoint")?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .with_context(|| format!("connect to {addr}"))
}

async fn bad_input(c: &mut Cluster) -> Result<()> {
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let follower = c.follower_of(leader)?;

    // CLI: an empty key.
    let out = c.cli(&["put", "", "x"]).await?;
    ensure!(
        out.code != Some(0),
        "put of an empty key succeeded: {out:?}"
    );
    out.one_line_error()?;

    // CLI: a malformed endpoint is a usage error.
    let out = run_cli(&["--endpoints", "not-an-endpoint", "get", "k"]).await?;
    out.refused_with(2)?;

    // Client API: limits.
    let client = c.client()?;
    let big_value = vec![b'v'; limits::MAX_VALUE_LEN + 1];
    expect_invalid("oversized value", client.put("big", &big_value).await)?;
    let big_key = vec![b'k'; limits::MAX_KEY_LEN + 1];
    expect_invalid("oversized key", client.put(&big_key, "v").await)?;
    expect_invalid("oversized key get", client.get(&big_key).await)?;
    expect_invalid("empty key", client.put("", "v").await)?;

    // Raw gRPC, bypassing the client's own checks, to the leader and to a
    // follower: the replica validates before proposing or forwarding.
    for id in [leader, follower] {
        let addr = c.addr(id);
        let mut kv = KvClient::new(channel(&addr).await?)
            .max_encoding_message_size(64 << 20)
            .max_decoding_message_size(64 << 20);
        let mut lock = LockClient::new(channel(&addr).await?);
        let put = |key: &[u8], value: &[u8]| v1::PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            ..Default::default()
        };
        let put_error: fn(&v1::PutReply) -> Option<&v1::Error> = |r| r.error.as_ref();
        expect_invalid_reply(
            &format!("oversized value to node {id}"),
            kv.put(put(b"big", &big_value)).await,
            put_error,
        )?;
        expect_invalid_reply(
            &format!("oversized key to node {id}"),
            kv.put(put(&big_key, b"v")).await,
            put_error,
        )?;
        expect_invalid_reply(
            &format!("empty key to node {id}"),
            kv.put(put(b"", b"v")).await,
            put_error,
        )?;
        // Far over any command's size: refused from the gRPC length prefix,
        // before the message is read or decoded.
        let huge = vec![b'h'; limits::MAX_COMMAND_BYTES + 2 * 1024 * 1024];
        match kv.put(put(b"huge", &huge)).await {
            Err(status) => {
                ensure!(
                    status.code() == tonic::Code::OutOfRange
                        && status.message().contains("too large"),
                    "a {} MiB put to node {id}: {status:?}",
                    huge.len() >> 20
                );
            }
            Ok(reply) => bail!(
                "a {} MiB put to node {id} was answered: {reply:?}",
                huge.len() >> 20
            ),
        }
        for stale in [false, true] {
            expect_invalid_reply(
                &format!("oversized key read (stale {stale}) to node {id}"),
                kv.get(v1::GetRequest {
                    key: big_key.clone(),
                    stale,
                })
                .await,
                |r: &v1::GetReply| r.error.as_ref(),
            )?;
        }
        expect_invalid_reply(
            &format!("a batch op that is neither put nor delete, to node {id}"),
            kv.batch(v1::BatchRequest {
                conditions: Vec::new(),
                ops: vec![v1::BatchOp { op: None }],
                once: None,
            })
            .await,
            |r: &v1::BatchReply| r.error.as_ref(),
        )?;
        for mode in [0, 42] {
            expect_invalid_reply(
                &format!("an acquire with lock mode {mode}, to node {id}"),
                lock.acquire(v1::AcquireRequest {
                    session: 1,
                    name: "l".into(),
                    mode,
                    ..Default::default()
                })
                .await,
                |r: &v1::AcquireReply| r.error.as_ref(),
            )?;
        }
        expect_invalid_reply(
            &format!("a fenced write without a sequencer, to node {id}"),
            lock.fenced_write(v1::FencedWriteRequest::default()).await,
            |r: &v1::BatchReply| r.error.as_ref(),
        )?;

        // The call stream: each bad call (and a call with no request) is
        // refused call by call, and the stream ends normally.
        let bad = [
            Some(Req::Put(put(b"", b"v"))),
            Some(Req::Get(v1::GetRequest {
                key: big_key.clone(),
                stale: false,
            })),
            Some(Req::Acquire(v1::AcquireRequest {
                mode: 42,
                hold_ms: 1,
                ..Default::default()
            })),
            Some(Req::FencedWrite(v1::FencedWriteRequest::default())),
            None,
        ];
        let n = bad.len() as u64;
        let frame = CallFrame {
            calls: (1..)
                .zip(bad)
                .map(|(id, request)| Call { id, request })
                .collect(),
        };
        let mut replies = PipelineClient::new(channel(&addr).await?)
            .calls(futures::stream::iter(vec![frame]))
            .await
            .with_context(|| format!("open a call stream to node {id}"))?
            .into_inner();
        let mut answered = Vec::new();
        while let Some(frame) = replies.message().await? {
            for r in frame.replies {
                let reply = r
                    .reply
                    .with_context(|| format!("node {id}: a call reply without a reply"))?;
                let what = format!("bad call {} on a stream to node {id}", r.id);
                let e = call_reply_error(&reply)
                    .with_context(|| format!("{what}: no error in {reply:?}"))?;
                expect_invalid_error(&what, e)?;
                answered.push(r.id);
            }
        }
        answered.sort_unstable();
        ensure!(
            answered == (1..=n).collect::<Vec<_>>(),
            "node {id} answered calls {answered:?}"
        );

        // Bytes that are not HTTP/2 on the port: the connection is closed,
        // and the replica serves on.
        let mut raw = tokio::net::TcpStream::connect(&addr).await?;
        raw.write_all(b"\x00\x01 definitely not a gRPC client \xff\xfe\r\n\r\n")
            .await?;
        let mut sink = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut sink)).await;
        ensure!(
            closed.is_ok(),
            "node {id} kept a connection that sent garbage open for 10 s"
        );

        // Raft transport garbage: an error status, never a crash. Addressed
        // to the replica as it is (so the payload is decoded), and also to
        // another incarnation of it (refused before decoding).
        let mut raft = RaftClient::new(channel(&addr).await?);
        let incarnation = client.status_of(&addr).await?.incarnation;
        let payloads: [Vec<u8>; 3] = [
            Vec::new(),
            vec![1, 255, 255, 255, 255],
            b"definitely not a raft message".to_vec(),
        ];
        for (payload, to_incarnation) in payloads
            .iter()
            .flat_map(|p| [(p.clone(), incarnation), (p.clone(), incarnation ^ 1)])
        {
            let msg = || RaftMessage {
                payload: payload.clone().into(),
                to_id: id,
                to_incarnation,
                ..RaftMessage::default()
            };
            // AppendEntries travel on a stream: garbage ends it with an error.
            let r = match raft
                .append_entries_stream(tokio_stream::iter([msg()]))
                .await
            {
                Ok(replies) => replies.into_inner().message().await.map(|_| ()),
                Err(status) => Err(status),
            };
            ensure!(
                r.is_err(),
                "node {id} accepted garbage AppendEntries {payload:?}: {r:?}"
            );
            let r = raft.vote(msg()).await;
            ensure!(
                r.is_err(),
                "node {id} accepted garbage Vote {payload:?}: {r:?}"
            );
            let r = raft.install_snapshot(msg()).await;
            ensure!(
                r.is_err(),
                "node {id} accepted garbage InstallSnapshot {payload:?}: {r:?}"
            );
        }
    }

    // CLI: nothing listens there; a bounded wait, then exit code 3.
    let out = run_cli(&["--endpoints", "127.0.0.1:1", "--timeout", "2s", "get", "k"]).await?;
    out.refused_with(3)?;

    // The cluster still serves, and no process died.
    c.assert_all_alive()?;
    client
        .put("still", "serving")
        .await
        .context("put after the bad input")?;
    let got = client.get("still").await?;
    ensure!(got.as_deref() == Some(&b"serving"[..]), "read back {got:?}");
    let out = c.cli(&["get", "still"]).await?;
    ensure!(out.ok()? == "serving\n", "CLI get printed {:?}", out.stdout);
    for id in c.ids() {
        ensure!(c.is_alive(id), "node {id} is no longer running");
    }
    c.assert_all_alive()?;
    cli_data_and_exit_codes(c).await
}

/// The CLI's values from stdin and files, its distinct exit codes (a
/// configuration error, a lock command's own code, a command that cannot
/// run), and `status` failing while a replica is down. Kills a follower.
async fn cli_data_and_exit_codes(c: &mut Cluster) -> Result<()> {
    // `put k -` reads stdin, bytes as they are; --file reads a file.
    let value = "line one\nline\ttwo\n";
    let out = c
        .cli_with(true, &["put", "from-stdin", "-"], Some(value))
        .await?;
    ensure!(out.ok()? == "OK\n", "put from stdin: {out:?}");
    let got = c.client()?.get("from-stdin").await?;
    ensure!(
        got.as_deref() == Some(value.as_bytes()),
        "stdin value: {got:?}"
    );
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("value");
    std::fs::write(&file, b"\x00binary\xff")?;
    let path = file.display().to_string();
    let out = c.cli(&["put", "from-file", "--file", &path]).await?;
    ensure!(out.ok()? == "OK\n", "put --file: {out:?}");
    let got = c.client()?.get("from-file").await?;
    ensure!(
        got.as_deref() == Some(&b"\x00binary\xff"[..]),
        "file value: {got:?}"
    );
    std::fs::write(&file, vec![b'v'; limits::MAX_VALUE_LEN + 1])?;
    c.cli(&["put", "too-big", "--file", &path])
        .await?
        .refused_with(2)?;
    // (clap's own usage error: several lines, exit 2)
    let out = c.cli(&["put", "both", "v", "--file", &path]).await?;
    ensure!(
        out.code == Some(2) && out.stderr.contains("cannot be used with"),
        "a value and --file: {out:?}"
    );

    // `get -w hex|json`: unambiguous for any bytes.
    let out = c.cli(&["-w", "hex", "get", "from-file"]).await?;
    ensure!(out.ok()? == "0062696e617279ff\n", "get -w hex: {out:?}");
    let out = c.cli(&["-w", "json", "get", "from-stdin"]).await?;
    let json: serde_json::Value = serde_json::from_str(out.ok()?)?;
    ensure!(
        json["key"] == "ZnJvbS1zdGRpbg==" && json["value"] == "bGluZSBvbmUKbGluZQl0d28K",
        "get -w json: {json}"
    );

    // Revisions: `put -w json` prints the revision it made, `get -w json`
    // the key's create and mod revisions and its version.
    let out = c.cli(&["-w", "json", "put", "versioned", "1"]).await?;
    let first: serde_json::Value = serde_json::from_str(out.ok()?)?;
    let created = first["revision"]
        .as_u64()
        .context("put -w json: no revision")?;
    let out = c.cli(&["-w", "json", "put", "versioned", "2"]).await?;
    let second: serde_json::Value = serde_json::from_str(out.ok()?)?;
    let changed = second["revision"]
        .as_u64()
        .context("put -w json: no revision")?;
    ensure!(changed > created, "revisions {created} then {changed}");
    let out = c.cli(&["-w", "json", "get", "versioned"]).await?;
    let json: serde_json::Value = serde_json::from_str(out.ok()?)?;
    ensure!(
        json["create_revision"] == created
            && json["mod_revision"] == changed
            && json["version"] == 2,
        "get -w json after two puts at {created} and {changed}: {json}"
    );

    // `scan` pages through every key (more than one page of 10,000), in
    // both directions; --limit stops early and says so.
    const KEYS: usize = 10_500;
    let client = c.client()?;
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let batch = chunk.iter().fold(latchkey::Batch::new(), |b, i| {
            b.put(format!("many/{i:05}"), "v")
        });
        ensure!(client.batch(batch).await?.is_ok(), "batch refused");
    }
    for reverse in [false, true] {
        let mut args = vec!["scan", "--prefix", "many/"];
        if reverse {
            args.push("--reverse");
        }
        let out = c.cli(&args).await?;
        let lines: Vec<&str> = out.ok()?.lines().collect();
        ensure!(
            lines.len() == KEYS,
            "scan (reverse: {reverse}): {} lines",
            lines.len()
        );
        let (first, last) = (
            format!("many/{:05}\tv", 0),
            format!("many/{:05}\tv", KEYS - 1),
        );
        let expected = if reverse {
            (&last, &first)
        } else {
            (&first, &last)
        };
        ensure!(
            (lines.first(), lines.last())
                == (Some(&expected.0.as_str()), Some(&expected.1.as_str())),
            "scan (reverse: {reverse}) from {:?} to {:?}",
            lines.first(),
            lines.last()
        );
        ensure!(
            lines.windows(2).all(|w| (w[0] < w[1]) != reverse),
            "scan (reverse: {reverse}) out of order"
        );
    }
    let out = c
        .cli(&["scan", "--prefix", "many/", "--limit", "10"])
        .await?;
    ensure!(
        out.ok()?.lines().count() == 10 && out.stderr.contains("stopped at --limit 10"),
        "scan --limit: {out:?}"
    );
    let out = c
        .cli(&["-w", "json", "scan", "--prefix", "many/", "--limit", "2"])
        .await?;
    let rows: Vec<serde_json::Value> = out
        .ok()?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    ensure!(
        rows.len() == 2
            && rows[0]["key"] == "bWFueS8wMDAwMA=="
            && rows[0]["version"] == 1
            && rows[0]["mod_revision"] == rows[0]["create_revision"]
            && rows[0]["mod_revision"] == rows[1]["mod_revision"],
        "scan -w json (keys of one batch: one revision): {rows:?}"
    );

    // The longest timeout parses and works (no overflow).
    let out = c
        .cli(&["--timeout", "18446744073709551615s", "get", "from-file"])
        .await?;
    ensure!(out.code == Some(0), "the longest timeout: {out:?}");

    // A lock command that cannot run: 127, and the lock is free at once
    // (not held by an orphaned session until its TTL ends).
    let out = c
        .cli(&[
            "lock",
            "orphan",
            "--ttl",
            "60s",
            "--",
            "/nonexistent/command",
        ])
        .await?;
    out.refused_with(127)?;
    let session = c.client()?.session(Duration::from_secs(10)).await?;
    let free = session.lock("orphan").try_acquire().await?;
    ensure!(
        free.is_some(),
        "the lock stayed held after the command could not run"
    );
    // latchkey's own failure around a command is 200 + its code: busy is
    // 205, out of the range commands usually use.
    c.cli(&["lock", "orphan", "--no-wait", "--", "true"])
        .await?
        .refused_with(205)?;
    drop(free);
    session.close().await?;

    // `serve` configuration errors exit 9.
    let data = dir.path().join("data");
    let data = data.display().to_string();
    for members in ["1=127.0.0.1:1,1=127.0.0.1:2", "1=127.0.0.1:1,2=127.0.0.1:1"] {
        let out = run_cli(&[
            "serve",
            "--id",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
            "--initial-members",
            members,
        ])
        .await?;
        out.refused_with(9)?;
        ensure!(out.stderr.contains("initial members"), "{members}: {out:?}");
    }

    // `members list` names the leader, the voters and their addresses.
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    let out = c.cli(&["members", "list"]).await?;
    let listed = out.ok()?;
    ensure!(
        listed.lines().count() == 4
            && listed.contains(&format!("{leader:>4} leader"))
            && listed.matches(" voter ").count() == 2,
        "members list: {listed}"
    );
    let out = c.cli(&["-w", "json", "members", "list"]).await?;
    let json: serde_json::Value = serde_json::from_str(out.ok()?)?;
    ensure!(
        json["members"].as_array().map(Vec::len) == Some(3)
            && json["leader"].as_u64() == Some(leader),
        "members list --json: {json}"
    );
    // Promoting a voter changes nothing; an unknown node is refused.
    let out = c.cli(&["members", "promote", &leader.to_string()]).await?;
    ensure!(out.ok()? == "OK\n", "promote a voter: {out:?}");
    c.cli(&["members", "promote", "9"]).await?.refused_with(2)?;

    // `members transfer-leader` moves leadership and says to whom; a node
    // that is not a voter is refused and nothing moves.
    let to = c.follower_of(leader)?;
    let out = c
        .cli(&["members", "transfer-leader", &to.to_string()])
        .await?;
    ensure!(
        out.ok()? == format!("node {to} leads\n"),
        "transfer-leader: {out:?}"
    );
    c.cli(&["members", "transfer-leader", "9"])
        .await?
        .refused_with(2)?;
    let out = c.cli(&["-w", "json", "members", "list"]).await?;
    let json: serde_json::Value = serde_json::from_str(out.ok()?)?;
    ensure!(
        json["leader"].as_u64() == Some(to),
        "members list after transfer-leader: {json}"
    );
    let leader = to;

    // `status` says which endpoint is down, and exits 3.
    let follower = c.follower_of(leader)?;
    c.kill(follower)?;
    let out = c.cli(&["--timeout", "2s", "status"]).await?;
    ensure!(
        out.code == Some(3)
            && out.stdout.contains("unreachable")
            && out.stderr.contains("1 of 3 endpoints did not answer"),
        "status with a replica down: {out:?}"
    );
    // With that replica down, removing the other follower would leave one
    // live voter of two: refused, naming the silent node, and nothing
    // changes; `members list` shows how far each member has replicated.
    let other = c
        .ids()
        .into_iter()
        .find(|id| *id != leader && *id != follower)
        .context("no third node")?;
    let out = c.cli(&["members", "remove", &other.to_string()]).await?;
    out.refused_with(2)?;
    ensure!(
        out.stderr.contains("live") && out.stderr.contains(&format!("[{follower}]")),
        "remove without a live majority: {out:?}"
    );
    let out = c.cli(&["-w", "json", "members", "list"]).await?;
    let json: serde_json::Value = serde_json::from_str(out.ok()?)?;
    let members = json["members"].as_array().context("members")?;
    ensure!(
        members.len() == 3,
        "the refused removal changed the membership: {json}"
    );
    ensure!(
        members
            .iter()
            .any(|m| m["id"] == leader && m["matched_index"].as_u64() > Some(0)),
        "the leader's matched index is missing: {json}"
    );
    // Removing the dead one keeps a live majority of the rest: allowed.
    let out = c.cli(&["members", "remove", &follower.to_string()]).await?;
    ensure!(out.ok()? == "OK\n", "remove the dead follower: {out:?}");
    Ok(())
}

// ---------------------------------------------------------------------------

/// What the load of [`replace_under_load`] saw.
#[derive(Debug, Default)]
struct Seen {
    /// Acknowledged puts.
    acked: BTreeMap<String, String>,
    /// Lock grants, and the newest token granted.
    grants: u64,
    last_token: u64,
    /// Every error a call returned (the client retries what it may: none
    /// must reach the caller).
    errors: Vec<String>,
}

type Shared = Arc<Mutex<Seen>>;

fn seen(s: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Most puts one load task makes (the checks read every one back).
const PUTS_PER_TASK: u64 = 2_000;

/// Puts `w/{task}/{i}` until `stop`, a millisecond apart, at most
/// [`PUTS_PER_TASK`].
async fn put_load(client: latchkey::Client, task: usize, s: Shared, stop: Arc<AtomicBool>) {
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        if i >= PUTS_PER_TASK {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let (key, value) = (format!("w/{task}/{i:06}"), format!("v{task}-{i}"));
        match client.put(&key, &value).await {
            Ok(_) => {
                seen(&s).acked.insert(key, value);
            }
            Err(e) => {
                seen(&s).errors.push(format!("put {key}: {e}"));
                return;
            }
        }
        i += 1;
    }
}

/// Acquire `replace`, write through the grant's fence, release, until
/// `stop`; every grant's token must be newer than every earlier one.
async fn lock_load(client: latchkey::Client, s: Shared, stop: Arc<AtomicBool>) {
    let fail = |what: String| seen(&s).errors.push(what);
    let session = match client.session(Duration::from_secs(10)).await {
        Ok(session) => session,
        Err(e) => return fail(format!("open a session: {e}")),
    };
    while !stop.load(Ordering::SeqCst) {
        let guard = match session
            .lock("replace")
            .acquire_timeout(Duration::from_secs(20))
            .await
        {
            Ok(Some(guard)) => guard,
            Ok(None) => return fail("no grant within 20 s".into()),
            Err(e) => return fail(format!("acquire: {e}")),
        };
        let token = u64::from(guard.token());
        {
            let mut s = seen(&s);
            if token <= s.last_token {
                let last = s.last_token;
                s.errors.push(format!("token {token} after token {last}"));
            }
            s.last_token = token;
            s.grants += 1;
        }
        if let Err(e) = guard.put("fenced", token.to_string()).await {
            return fail(format!("fenced put with token {token}: {e}"));
        }
        if let Err(e) = guard.release().await {
            return fail(format!("release token {token}: {e}"));
        }
    }
    if let Err(e) = session.close().await {
        fail(format!("close the session: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_replaced_under_load_without_a_client_error() {
    let mut c = Cluster::create_with_spares("replace", 3, 1, &[])
        .await
        .expect("create the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, replace_under_load(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

/// Replace the leader's replica (the hardest one) with a new node 4, the
/// way the README says (add the new one, then remove the old one), while
/// clients write and take a lock: no call fails, every acknowledged write
/// is on the new node, and fencing tokens only go up.
async fn replace_under_load(c: &mut Cluster) -> Result<()> {
    for id in 1..=3 {
        c.restart(id)?;
    }
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = c.client()?;
    let s: Shared = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for task in 0..2 {
        tasks.push(tokio::spawn(put_load(
            client.clone(),
            task,
            s.clone(),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(lock_load(
            client.clone(),
            s.clone(),
            stop.clone(),
        )));
    }
    // Let the load run a little further at each step, and fail early if
    // it already saw an error.
    let progress = async |what: &str| -> Result<()> {
        let (puts, grants) = {
            let s = seen(&s);
            (s.acked.len(), s.grants)
        };
        eventually(Duration::from_secs(60), what, async || {
            let s = seen(&s);
            ensure!(s.errors.is_empty(), "the load failed: {:?}", s.errors);
            let capped = s.acked.len() as u64 >= 2 * PUTS_PER_TASK;
            ensure!(
                (capped || s.acked.len() >= puts + 20) && s.grants >= grants + 5,
                "{} puts and {} grants so far",
                s.acked.len(),
                s.grants
            );
            Ok(())
        })
        .await
    };
    progress("load before the change").await?;

    c.restart_with(4, &["--initial-cluster-state", "existing"])?;
    let out = c.cli(&["members", "add", "4", &c.peer_addr(4)]).await?;
    ensure!(out.ok()? == "OK\n", "members add: {out:?}");
    progress("load with node 4 added").await?;
    // Whoever leads now (an election may have moved it) is replaced.
    let victim = c.wait_for_leader(LEADER_WAIT).await?;
    let out = c.cli(&["members", "remove", &victim.to_string()]).await?;
    ensure!(out.ok()? == "OK\n", "members remove {victim}: {out:?}");
    ensure!(
        c.log_text(victim)
            .contains("this leader is removing itself"),
        "node {victim} did not remove itself as the leader (did leadership move?)"
    );
    progress("load after the old leader was removed").await?;
    if c.is_alive(victim) {
        c.kill(victim)?;
    }
    progress("load with the old leader gone").await?;

    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.context("a load task panicked")?;
    }
    let s = std::mem::take(&mut *seen(&s));
    ensure!(s.errors.is_empty(), "the load failed: {:?}", s.errors);
    let leader = c.wait_for_leader(LEADER_WAIT).await?;
    ensure!(leader != victim, "the removed node {victim} still leads");
    let out = c.cli(&["-w", "json", "members", "list"]).await?;
    let json: serde_json::Value = serde_json::from_str(out.ok()?)?;
    let mut ids: Vec<u64> = json["members"]
        .as_array()
        .context("members")?
        .iter()
        .filter_map(|m| m["id"].as_u64())
        .collect();
    ids.sort_unstable();
    let want: Vec<u64> = [1, 2, 3, 4]
        .into_iter()
        .filter(|id| *id != victim)
        .collect();
    ensure!(ids == want, "members after the replacement: {json}");
    // Every acknowledged write reads back, and node 4 holds each one.
    support::verify_linearizable(&c.client()?, "w/", &s.acked).await?;
    support::wait_node_has(c, 4, &s.acked).await?;
    eprintln!(
        "replaced node {victim} with node 4 under load: {} puts, {} grants, no client error",
        s.acked.len(),
        s.grants
    );
    Ok(())
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_round_trip() {
    let mut c = Cluster::start("cli", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, cli_body(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn cli_body(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;

    // put / get
    let out = c.cli(&["put", "greeting", "hello world"]).await?;
    ensure!(out.ok()? == "OK\n", "put printed {:?}", out.stdout);
    let out = c.cli(&["get", "greeting"]).await?;
    ensure!(out.ok()? == "hello world\n", "get printed {:?}", out.stdout);
    let out = c.cli(&["get", "--stale", "greeting"]).await?;
    // A stale read may lag, but this one was acknowledged by a majority and
    // the first endpoint answers; accept only the value or "not found".
    ensure!(
        (out.code == Some(0) && out.stdout == "hello world\n") || out.code == Some(1),
        "stale get: {out:?}"
    );

    // A one-shot write closes the session its write went under before the
    // process exits: every session opened between two probes (the CLI's)
    // has ended.
    let client = c.client()?;
    let ttl = Duration::from_secs(30);
    let before = client.session(ttl).await?;
    before.close().await?;
    let out = c.cli(&["seq", "one-shot"]).await?;
    ensure!(out.ok()? == "0\n", "seq printed {:?}", out.stdout);
    let after = client.session(ttl).await?;
    after.close().await?;
    let (first, last) = (before.id().0 + 1, after.id().0);
    ensure!(first < last, "the CLI's write opened no session");
    for id in first..last {
        let id = id.to_string();
        let out = c.cli(&["sessions", "end", &id]).await?;
        ensure!(
            out.code == Some(1) && out.stderr.contains("is not live"),
            "the CLI's write session {id} outlived it: {out:?}"
        );
    }

    // get of an absent key: exit code 1, a message on stderr.
    let out = c.cli(&["get", "no-such-key"]).await?;
    out.refused_with(1)?;
    ensure!(out.stdout.is_empty(), "absent get printed {:?}", out.stdout);
    ensure!(
        out.stderr.contains("no-such-key"),
        "the message does not name the key: {:?}",
        out.stderr
    );

    // del: present, then absent.
    let out = c.cli(&["del", "greeting"]).await?;
    ensure!(out.ok()? == "1\n", "del printed {:?}", out.stdout);
    c.cli(&["get", "greeting"]).await?.refused_with(1)?;
    let out = c.cli(&["del", "greeting"]).await?;
    ensure!(out.ok()? == "0\n", "second del printed {:?}", out.stdout);

    // scan --prefix: key<TAB>value lines, in key order, nothing else.
    for (k, v) in [
        ("p/2", "two"),
        ("p/1", "one"),
        ("q/1", "other"),
        ("p/3", "three"),
    ] {
        c.cli(&["put", k, v]).await?.ok()?;
    }
    let out = c.cli(&["scan", "--prefix", "p/"]).await?;
    ensure!(
        out.ok()? == "p/1\tone\np/2\ttwo\np/3\tthree\n",
        "scan printed {:?}",
        out.stdout
    );
    let out = c
        .cli(&["scan", "--prefix", "p/", "--limit", "2", "--reverse"])
        .await?;
    ensure!(
        out.ok()? == "p/3\tthree\np/2\ttwo\n",
        "reverse scan printed {:?}",
        out.stdout
    );

    // seq --step 10: the first number, then one at least 10 further.
    let first: u64 = c
        .cli(&["seq", "ids", "--step", "10"])
        .await?
        .ok()?
        .trim()
        .parse()
        .context("seq did not print a number")?;
    let next: u64 = c
        .cli(&["seq", "ids", "--step", "10"])
        .await?
        .ok()?
        .trim()
        .parse()
        .context("seq did not print a number")?;
    ensure!(next >= first + 10, "seq printed {first} then {next}");

    cli_access_control(c).await?;

    // status --json names a leader that the nodes agree on.
    eventually(
        Duration::from_secs(30),
        "status --json names a leader",
        async || {
            let out = c.cli(&["-w", "json", "status"]).await?;
            let json: serde_json::Value =
                serde_json::from_str(out.ok()?).context("status --json is not JSON")?;
            let nodes = json
                .get("nodes")
                .and_then(|n| n.as_object())
                .with_context(|| format!("no \"nodes\" object in {json}"))?;
            ensure!(nodes.len() == 3, "expected 3 nodes in {json}");
            let leader = nodes
                .values()
                .find(|n| n["state"] == "Leader")
                .with_context(|| format!("no node is Leader in {json}"))?;
            let leader_id = leader["id"].as_u64().context("leader without an id")?;
            let agreeing = nodes
                .values()
                .filter(|n| n["leader_id"].as_u64() == Some(leader_id))
                .count();
            ensure!(
                agreeing >= 2,
                "only {agreeing} nodes name leader {leader_id}: {json}"
            );
            ensure!(
                leader["members"].as_array().map(Vec::len) == Some(3),
                "the leader does not list 3 members: {json}"
            );
            Ok(())
        },
    )
    .await?;
    Ok(())
}

/// Users, roles and `auth enable` from the CLI: once on, a call without a
/// user exits 2 naming what is missing, a user's role lets it write under
/// its prefix only (the refusal names user, permission and key), a wrong
/// password is refused; root turns it off again. The cluster secret (which
/// `Cluster::cli` passes) is the cluster's own credential and acts as root,
/// so the user calls here name only the endpoints.
async fn cli_access_control(c: &Cluster) -> Result<()> {
    let endpoints = c.endpoints_arg();
    let as_user = |user: &'static str| {
        let endpoints = endpoints.clone();
        move |args: &[&str]| {
            let mut all = vec!["--endpoints".to_string(), endpoints.clone()];
            if !user.is_empty() {
                all.extend(["--user".to_string(), user.to_string()]);
            }
            all.extend(args.iter().map(|a| a.to_string()));
            async move {
                let all: Vec<&str> = all.iter().map(String::as_str).collect();
                run_cli(&all).await
            }
        }
    };
    let with_secret = |args: &[&str], stdin: &str| {
        let secret = c.secret_file();
        let endpoints = endpoints.clone();
        let all: Vec<String> = ["--endpoints", &endpoints, "--cluster-secret-file", &secret]
            .iter()
            .map(|s| s.to_string())
            .chain(args.iter().map(|a| a.to_string()))
            .collect();
        let stdin = stdin.to_string();
        async move {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            run_cli_with_stdin(&all, Some(&stdin)).await
        }
    };
    for (user, password) in [("root", "root-pw"), ("app", "app-pw")] {
        let out = with_secret(&["user", "add", user], &format!("{password}\n")).await?;
        ensure!(out.ok()? == "OK\n", "user add {user}: {out:?}");
    }
    for args in [
        &["role", "add", "jobs"][..],
        &["role", "grant", "jobs", "write", "jobs/"],
        &["role", "grant", "jobs", "read", "jobs/"],
        &["user", "grant-role", "app", "jobs"],
        &["auth", "enable"],
    ] {
        let out = with_secret(args, "").await?;
        ensure!(out.ok()? == "OK\n", "{args:?}: {out:?}");
    }
    let anonymous = as_user("");
    let out = anonymous(&["put", "jobs/1", "x"]).await?;
    ensure!(
        out.code == Some(2) && out.stderr.contains("access control is enabled"),
        "a put without a user: {out:?}"
    );
    let app = as_user("app:app-pw");
    let out = app(&["put", "jobs/1", "x"]).await?;
    ensure!(out.ok()? == "OK\n", "app's put under its prefix: {out:?}");
    let out = app(&["put", "billing/1", "x"]).await?;
    ensure!(
        out.code == Some(2)
            && out.stderr.contains("permission denied")
            && out.stderr.contains("write")
            && out.stderr.contains("billing/1"),
        "app's put outside its prefix: {out:?}"
    );
    // Ending a session is an operator's act, even for its owner.
    let out = app(&["sessions", "end", "1"]).await?;
    ensure!(
        out.code == Some(2)
            && out.stderr.contains("permission denied")
            && out.stderr.contains("admin"),
        "session end by a user without admin: {out:?}"
    );
    let out = app(&["auth", "status"]).await?;
    ensure!(
        out.ok()? == "access control: enabled\nuser: app\n",
        "auth status: {out:?}"
    );
    let out = app(&["role", "get", "jobs"]).await?;
    ensure!(
        out.code == Some(2),
        "app reads roles without admin: {out:?}"
    );
    let wrong = as_user("app:nope");
    let out = wrong(&["get", "jobs/1"]).await?;
    ensure!(
        out.code == Some(2) && out.stderr.contains("wrong user or password"),
        "a wrong password: {out:?}"
    );
    let root = as_user("root:root-pw");
    let out = root(&["role", "get", "jobs"]).await?;
    ensure!(
        out.ok()? == "read\tjobs/\nwrite\tjobs/\n",
        "role get: {out:?}"
    );
    // Membership changes need an admin by name, besides the secret.
    let out = with_secret(&["members", "remove", "3"], "").await?;
    ensure!(
        out.code == Some(2) && out.stderr.contains("access control is enabled"),
        "members remove with the secret alone: {out:?}"
    );
    let out = with_secret(&["--user", "app:app-pw", "members", "remove", "3"], "").await?;
    ensure!(
        out.code == Some(2)
            && out.stderr.contains("permission denied")
            && out.stderr.contains("admin"),
        "members remove by a user without admin: {out:?}"
    );
    let out = root(&["status"]).await?;
    ensure!(
        out.ok()?.contains("3="),
        "node 3 is still a member: {out:?}"
    );
    let out = root(&["auth", "disable"]).await?;
    ensure!(out.ok()? == "OK\n", "auth disable: {out:?}");
    let out = anonymous(&["get", "jobs/1"]).await?;
    ensure!(out.ok()? == "x\n", "a get once disabled: {out:?}");
    Ok(())
}

// ---------------------------------------------------------------------------

/// `latchkey certs`, then three `latchkey serve` processes with TLS, each
/// with its own certificate, and mutual TLS between them; the CLI over TLS;
/// and the CLI's clear refusals of TLS options that do not fit together or
/// files it cannot use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_over_tls() {
    let certs = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("temporary directory: {e}"),
    };
    let dir = certs.path().display().to_string();
    let made = run_cli(&["certs", "--out", &dir, "--nodes", "3", "--users", "alice"]).await;
    let file = |name: &str| certs.path().join(name).display().to_string();
    match made {
        Ok(out) if out.code == Some(0) => {}
        other => panic!("latchkey certs: {other:?}"),
    }
    let (ca, node, node_key) = (
        file("ca.pem"),
        file("node-{id}.pem"),
        file("node-{id}-key.pem"),
    );
    let c = Cluster::start(
        "cli-tls",
        3,
        &[
            "--cacert",
            &ca,
            "--cert",
            &node,
            "--key",
            &node_key,
            "--client-cert-users",
        ],
    )
    .await
    .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, cli_tls_body(&c, certs.path())).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn cli_tls_body(c: &Cluster, certs: &std::path::Path) -> Result<()> {
    let file = |name: &str| certs.join(name).display().to_string();
    let ca = file("ca.pem");
    // The replicas elect a leader over mutual TLS; the CLI waits for it.
    let out = c
        .cli(&["--cacert", &ca, "--timeout", "30s", "put", "k", "over tls"])
        .await?;
    ensure!(out.ok()? == "OK\n", "put over TLS printed {:?}", out.stdout);
    let out = c.cli(&["--cacert", &ca, "get", "k"]).await?;
    ensure!(
        out.ok()? == "over tls\n",
        "get over TLS printed {:?}",
        out.stdout
    );
    // With a client certificate too.
    let out = c
        .cli(&[
            "--cacert",
            &ca,
            "--cert",
            &file("client.pem"),
            "--key",
            &file("client-key.pem"),
            "get",
            "k",
        ])
        .await?;
    ensure!(
        out.ok()? == "over tls\n",
        "get with a client certificate: {out:?}"
    );
    // A user named by a client certificate: alice, with no password.
    let admin = |args: &[&str]| {
        let mut all = vec!["--cacert", &ca];
        all.extend_from_slice(args);
        let all: Vec<String> = all.iter().map(|a| a.to_string()).collect();
        async move {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            c.cli(&all).await
        }
    };
    let out = c
        .cli_with(
            true,
            &["--cacert", &ca, "user", "add", "root"],
            Some("root-pw\n"),
        )
        .await?;
    ensure!(out.ok()? == "OK\n", "user add root: {out:?}");
    for args in [
        &["user", "add", "alice", "--no-password"][..],
        &["role", "add", "jobs"],
        &["role", "grant", "jobs", "write", "jobs/"],
        &["user", "grant-role", "alice", "jobs"],
        &["auth", "enable"],
    ] {
        let out = admin(args).await?;
        ensure!(out.ok()? == "OK\n", "{args:?}: {out:?}");
    }
    let (alice, alice_key) = (file("user-alice.pem"), file("user-alice-key.pem"));
    let as_alice = |args: &[&str]| {
        let mut all = vec!["--cacert", &ca, "--cert", &alice, "--key", &alice_key];
        all.extend_from_slice(args);
        let all: Vec<String> = all.iter().map(|a| a.to_string()).collect();
        async move {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            // Without the cluster secret, which would make the calls root's.
            c.cli_with(false, &all, None).await
        }
    };
    let out = as_alice(&["auth", "status"]).await?;
    ensure!(
        out.ok()? == "access control: enabled\nuser: alice\n",
        "alice's status: {out:?}"
    );
    let out = as_alice(&["put", "jobs/1", "by certificate"]).await?;
    ensure!(out.ok()? == "OK\n", "alice's put: {out:?}");
    let out = as_alice(&["put", "billing/1", "x"]).await?;
    ensure!(
        out.code == Some(2) && out.stderr.contains("permission denied"),
        "alice's put outside her prefix: {out:?}"
    );
    let out = c
        .cli_with(false, &["--cacert", &ca, "get", "k"], None)
        .await?;
    ensure!(
        out.code == Some(2) && out.stderr.contains("access control is enabled"),
        "an anonymous get: {out:?}"
    );
    let out = admin(&["--user", "root:root-pw", "auth", "disable"]).await?;
    ensure!(out.ok()? == "OK\n", "auth disable: {out:?}");
    // Plaintext on the TLS port: refused, never answered.
    let out = c.cli(&["--timeout", "2s", "get", "k"]).await?;
    ensure!(
        out.code != Some(0) && !out.stdout.contains("over tls"),
        "a plaintext CLI was answered: {out:?}"
    );
    // ... and the replica says so, with the caller's address and a hint.
    let logs = c.logs();
    ensure!(
        logs.contains("refused a TLS handshake")
            && logs.contains("from=127.0.0.1:")
            && logs.contains("plaintext client on a TLS port"),
        "no log line for the refused plaintext handshake:\n{}",
        logs.lines()
            .filter(|l| l.contains("WARN"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Options that do not fit together, and files that cannot be used: a
    // usage error (exit 2) naming the cause.
    for (args, cause) in [
        (
            vec!["--cacert", &ca, "--cert", &file("client.pem")],
            "--cert needs --key",
        ),
        (
            vec!["--cacert", "/nonexistent/ca.pem"],
            "cannot read CA certificate",
        ),
        (
            vec!["--cacert", &file("client-key.pem")],
            "no PEM certificate",
        ),
    ] {
        let mut all = args.clone();
        all.extend(["get", "k"]);
        let out = c.cli(&all).await?;
        ensure!(
            out.code == Some(2) && out.stderr.contains(cause),
            "{args:?}: expected exit 2 naming {cause:?}, got {out:?}"
        );
    }
    // `latchkey certs` never replaces an existing CA.
    let again = run_cli(&["certs", "--out", &certs.display().to_string()]).await?;
    ensure!(
        again.code == Some(2) && again.stderr.contains("exists already"),
        "a second `latchkey certs` into the same directory: {again:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------

/// A replica's resident memory, from /proc.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/PID/status")
}

/// 20,000 idle connections, in four waves of 5,000 (each beyond the
/// replica's cap of 4,096): the replica keeps serving, and once they are
/// closed its memory comes back to within 20 MiB of what it was before
/// (without `conn_limit`'s trim it stayed ~110 MB above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connection_floods_are_capped_and_memory_comes_back() {
    let c = Cluster::start("flood", 1, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, flood_body(&c)).await;
    c.finish(outcome, TEST_LIMIT);
}

async fn flood_body(c: &Cluster) -> Result<()> {
    const WAVES: usize = 4;
    const PER_WAVE: usize = 5_000;
    const SLACK_KIB: u64 = 20 * 1024;
    c.wait_for_leader(LEADER_WAIT).await?;
    let pid = c.pid(1).context("node 1 is not running")?;
    let addr = c.endpoints().first().cloned().context("no endpoint")?;
    for i in 0..50 {
        c.cli(&["put", &format!("warm/{i}"), "v"]).await?.ok()?;
    }
    let baseline = rss_kib(pid)?;
    let mut peak = baseline;
    let mut opened = 0usize;
    for _ in 0..WAVES {
        let mut held = Vec::with_capacity(PER_WAVE);
        for _ in 0..PER_WAVE {
            // Connections past the cap are reset by the replica: only the
            // attempt counts.
            if let Ok(s) = tokio::net::TcpStream::connect(&addr).await {
                held.push(s);
            }
        }
        opened += held.len();
        tokio::time::sleep(Duration::from_millis(500)).await;
        peak = peak.max(rss_kib(pid)?);
        drop(held);
    }
    ensure!(opened >= PER_WAVE, "only {opened} connections were made");
    // Still serving everyone else.
    let out = c.cli(&["get", "warm/0"]).await?;
    ensure!(
        out.ok()? == "v\n",
        "get after the flood printed {:?}",
        out.stdout
    );
    let after = eventually(
        Duration::from_secs(30),
        "memory back after the flood",
        async || {
            let now = rss_kib(pid)?;
            ensure!(
                now <= baseline + SLACK_KIB,
                "RSS {now} KiB, baseline {baseline} KiB, peak {peak} KiB"
            );
            Ok(now)
        },
    )
    .await?;
    eprintln!("flood: baseline {baseline} KiB, peak {peak} KiB, after {after} KiB");
    Ok(())
}
