//! In-process cluster tests of the embedding `Node`: formation, forwarding,
//! membership changes and restart on existing data. Multi-process kill tests
//! live in the top-level `tests/` folder.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use latchkey::Node;
use latchkey_client::{Client, ClientOptions, Consistency, Error};

mod common;

use common::{addrs, reserve, start, start_cluster};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(90);

async fn wait_until<F: FnMut() -> bool>(what: &str, mut f: F) -> TestResult {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_form_a_cluster_and_forward_writes() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        // Every node's in-process client works, leader or not.
        for (id, node) in &nodes {
            node.client().put(format!("from/{id}"), "x").await?;
        }
        let follower = nodes
            .keys()
            .copied()
            .find(|i| *i != leader)
            .ok_or("no follower")?;
        let page = nodes[&follower]
            .client()
            .scan(latchkey_core::ScanRange::prefix("from/", 0))
            .await?;
        assert_eq!(page.entries.len(), 3);
        // A remote client given only a follower's address finds the leader.
        let remote = Client::connect([nodes[&follower].advertise_addr()])?;
        assert_eq!(remote.get("from/1").await?, Some(b"x".to_vec()));
        let status = nodes[&leader].status();
        assert_eq!(status.members.len(), 3);
        assert!(status.members.iter().all(|m| m.voter));
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// The leader syncs its own log in parallel with replication and tells
/// followers no commit index beyond its durable log; once writes stop, the
/// final commit index still reaches every follower (by heartbeat) and every
/// replica applies everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_apply_every_write_once_traffic_stops() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let client = nodes[&leader].client();
        let mut writes = tokio::task::JoinSet::new();
        for i in 0..64 {
            let client = client.clone();
            writes.spawn(async move { client.put(format!("k/{i}"), "v").await });
        }
        // Concurrent puts are packed into shared log entries; each still
        // makes a revision of its own.
        let mut revisions = std::collections::BTreeSet::new();
        while let Some(done) = writes.join_next().await {
            revisions.insert(done??);
        }
        assert_eq!(revisions.len(), 64, "puts shared a revision: {revisions:?}");
        // One last write, alone: its commit index has no later entry to
        // ride on.
        let last = client.put("k/last", "v").await?;
        assert!(
            revisions.iter().all(|r| *r < last),
            "{last} after {revisions:?}"
        );
        let target = nodes[&leader].status().last_applied;
        for (id, node) in &nodes {
            wait_until(&format!("replica {id} to apply {target}"), || {
                node.status().last_applied >= target
            })
            .await?;
        }
        // Every replica computed the same revisions: its own state, read
        // stale from it alone, is the leader's, revisions included.
        let mut pages = Vec::new();
        for node in nodes.values() {
            let direct = Client::connect([node.advertise_addr()])?;
            let page = direct
                .scan_with(
                    latchkey_core::ScanRange::prefix("k/", 0),
                    Consistency::Stale,
                )
                .await?;
            pages.push(page);
        }
        assert_eq!(pages[0].entries.len(), 65);
        assert_eq!(pages[0].revision, last);
        assert!(pages.windows(2).all(|w| w[0] == w[1]), "{pages:?}");
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_keeps_data_and_does_not_reinitialise() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (mut nodes, members) = start_cluster(dir.path(), 3).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let kv = nodes[&1].client();
        for i in 0..120 {
            kv.put(format!("k{i:03}"), format!("v{i}")).await?;
        }
        let seq = kv.next_sequence("ids", 5).await?;
        let term_before = nodes[&1].status().term;
        let clients = common::client_addrs(&nodes);
        for node in std::mem::take(&mut nodes).into_values() {
            node.shutdown().await;
        }
        // Restart all three on the same data and ports.
        for ((id, addr), client) in members.iter().zip(&clients) {
            let ports = common::Ports {
                client: TcpListener::bind(client.as_str())?,
                peer: TcpListener::bind(addr.as_str())?,
            };
            nodes.insert(*id, start(*id, ports, dir.path(), &members).await?);
        }
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let kv = nodes[&2].client();
        assert_eq!(kv.get("k119").await?, Some(b"v119".to_vec()));
        let page = kv.scan(latchkey_core::ScanRange::prefix("k", 0)).await?;
        assert_eq!(page.entries.len(), 120);
        let next = kv.next_sequence("ids", 5).await?;
        assert!(
            next.start >= seq.end,
            "sequence went back: {seq:?} then {next:?}"
        );
        assert!(nodes[&1].status().term >= term_before);
        // Snapshots were taken along the way (snapshot_every = 50).
        wait_until("a snapshot", || {
            nodes.values().any(|n| n.status().snapshot_index > 0)
        })
        .await?;
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// `n` bytes that do not compress (xorshift), different for each `seed`.
fn incompressible(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Snapshots are paced by bytes as well as entries
/// (`latchkey_storage::SnapshotPace`): once the state is large, many small
/// entries past `snapshot_every` (50 here) do not make any replica rewrite
/// it; a log as large as the snapshot does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_state_is_snapshotted_only_after_as_much_log() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let kv = nodes[&1].client();
        // ~10 MiB of state in 40 entries, then small entries past 50: the
        // first snapshot (nothing to compare with) comes at 50 entries.
        for i in 0..40u64 {
            kv.put(format!("big/{i:02}"), incompressible(i, 256 * 1024))
                .await?;
        }
        for i in 0..30 {
            kv.put(format!("small/{i:03}"), "x").await?;
        }
        wait_until("a snapshot on every replica", || {
            nodes.values().all(|n| n.status().snapshot_index > 0)
        })
        .await?;
        let first: Vec<u64> = nodes.values().map(|n| n.status().snapshot_index).collect();
        // Six times `snapshot_every` small entries: far less log than the
        // snapshot holds, so no replica builds another.
        for i in 0..300 {
            kv.put(format!("small/{i:03}"), "y").await?;
        }
        let last = nodes[&1].status().last_log_index;
        wait_until("every replica applied the small puts", || {
            nodes.values().all(|n| n.status().last_applied >= last)
        })
        .await?;
        let after_small: Vec<u64> = nodes.values().map(|n| n.status().snapshot_index).collect();
        assert_eq!(
            after_small, first,
            "a replica rebuilt its snapshot of a large state after a little log"
        );
        // As much log as the snapshot, which holds the keys and their watch
        // history (each value once more): every replica builds the next one.
        for i in 0..100u64 {
            kv.put(format!("big/{i:02}"), incompressible(100 + i, 256 * 1024))
                .await?;
        }
        wait_until("a second snapshot on every replica", || {
            nodes
                .values()
                .zip(&first)
                .all(|(n, f)| n.status().snapshot_index > *f)
        })
        .await?;
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learner_is_added_promoted_and_removed() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let mut listeners = reserve(4)?;
        let fourth = listeners.remove(&4).ok_or("no 4th listener")?;
        let fourth_addr = fourth.peer_addr()?;
        let members = addrs(&listeners)?;
        let mut nodes = BTreeMap::new();
        for (id, l) in listeners {
            nodes.insert(id, start(id, l, dir.path(), &members).await?);
        }
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let kv = nodes[&1].client();
        for i in 0..80 {
            kv.put(format!("k{i}"), "v").await?;
        }
        // Node 4 starts empty, without initial members, and waits to be added.
        let n4 = start(4, fourth, dir.path(), &[]).await?;
        let admin = Client::with_options(
            common::client_addrs(&nodes),
            latchkey::ClientOptions::default().with_cluster_secret(common::SECRET),
        )?;
        admin.add_member(4, &fourth_addr, false).await?;
        wait_until("learner catch-up", || n4.status().last_applied >= 80).await?;
        // The entry that made it a learner follows the 80 puts in the log,
        // so it may reach the learner after they were applied (seen in CI).
        wait_until("node 4 sees itself a learner", || {
            n4.status().members.iter().any(|m| m.id == 4 && !m.voter)
        })
        .await?;
        // The learner is promoted by id (the leader adds it to the voters
        // without touching the others).
        admin.promote(4).await?;
        wait_until("4 voters", || {
            n4.status().members.iter().filter(|m| m.voter).count() == 4
        })
        .await?;
        // The new voter serves stale reads from its own state.
        let direct = Client::connect([n4.advertise_addr()])?;
        assert_eq!(
            direct.get_with("k79", Consistency::Stale).await?,
            Some(b"v".to_vec())
        );
        admin.remove_voter(4).await?;
        wait_until("node 4 removed", || {
            nodes[&1].status().members.iter().all(|m| m.id != 4)
        })
        .await?;
        // Bad membership requests are refused with a clear error.
        match admin.change_voters([1, 2, 9]).await {
            Err(Error::InvalidArgument(_)) => {}
            other => return Err(format!("expected InvalidArgument, got {other:?}").into()),
        }
        n4.shutdown().await;
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_is_a_clear_error() -> TestResult {
    let dir = tempfile::tempdir()?;
    let l = TcpListener::bind("127.0.0.1:0")?;
    let err = Node::builder(5)
        .listener(l)
        .data_dir(dir.path())
        .initial_members([(1, "127.0.0.1:1")])
        .start()
        .await
        .err()
        .ok_or("node 5 started although it is not an initial member")?;
    assert!(
        err.to_string().contains("not in the initial members"),
        "{err}"
    );
    let err = Node::builder(0)
        .data_dir(dir.path())
        .start()
        .await
        .err()
        .ok_or("id 0 accepted")?;
    assert!(err.to_string().contains("reserved"), "{err}");
    let err = Node::builder(1)
        .start()
        .await
        .err()
        .ok_or("no data dir accepted")?;
    assert!(err.to_string().contains("data directory"), "{err}");
    // Both listeners are needed, on different ports; a wildcard client
    // address needs an advertised one.
    let err = Node::builder(1)
        .listener(TcpListener::bind("127.0.0.1:0")?)
        .data_dir(dir.path().join("a"))
        .start()
        .await
        .err()
        .ok_or("no peer listener accepted")?;
    assert!(err.to_string().contains("--peer-listen"), "{err}");
    let err = Node::builder(1)
        .listen("0.0.0.0:0".parse()?)
        .peer_listener(TcpListener::bind("127.0.0.1:0")?)
        .data_dir(dir.path().join("b"))
        .start()
        .await
        .err()
        .ok_or("a wildcard client address without --advertise accepted")?;
    assert!(err.to_string().contains("--advertise"), "{err}");
    let _ = ClientOptions::default();
    Ok(())
}

/// Concurrent writes are packed into shared log entries by the leader; each
/// keeps its own result: of many racing compare-and-puts exactly one wins,
/// concurrent sequence allocations never overlap, and writes the state
/// machine refuses do not affect the ones packed with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_keep_their_own_results() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let remote = Client::connect(common::client_addrs(&nodes))?;
        remote.put("warm-up", "x").await?;
        let mut tasks = Vec::new();
        for i in 0..48u32 {
            let kv = remote.clone();
            tasks.push(tokio::spawn(async move {
                let (won, _) = kv
                    .compare_and_put("race", None::<&str>, format!("{i}"))
                    .await?;
                let ids = kv.next_sequence("ids", 3).await?;
                // Only the first of these fits; the others are refused by
                // the state machine, alone.
                let whole = kv.next_sequence("whole", u64::MAX).await.is_ok();
                kv.put(format!("own/{i:02}"), format!("{i}")).await?;
                Ok::<_, Error>((won, ids, whole))
            }));
        }
        let mut winners = 0;
        let mut wholes = 0;
        let mut ranges = Vec::new();
        for t in tasks {
            let (won, ids, whole) = t.await??;
            winners += usize::from(won);
            wholes += usize::from(whole);
            ranges.push(ids);
        }
        assert_eq!(winners, 1, "exactly one compare-and-put wins the race");
        assert_eq!(
            wholes, 1,
            "exactly one allocation of the whole sequence fits"
        );
        ranges.sort_by_key(|r| r.start);
        for pair in ranges.windows(2) {
            assert_eq!(pair[0].end, pair[1].start, "sequence ranges {pair:?}");
        }
        assert_eq!(ranges.first().map(|r| r.start), Some(0));
        let page = remote
            .scan(latchkey_core::ScanRange::prefix("own/", 0))
            .await?;
        assert_eq!(page.entries.len(), 48);
        // A client cannot send a group itself.
        let group = latchkey_core::Command::Group {
            commands: vec![latchkey_core::Command::Put {
                key: b"g".to_vec(),
                value: b"v".to_vec(),
            }],
        };
        assert!(matches!(
            remote.execute(group).await,
            Err(Error::InvalidArgument(_))
        ));
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// An AppendEntries from `from` as a stale leader (term 0), encoded and
/// addressed to `to`: a replica answers it with its higher vote and
/// changes nothing. The vote names its sender, as a leader's does.
fn stale_append(
    to: &Node,
    from: &Node,
) -> Result<latchkey_proto::v1::RaftMessage, Box<dyn std::error::Error>> {
    let stale = openraft::raft::AppendEntriesRequest::<latchkey_storage::TypeConfig> {
        vote: latchkey_storage::types::Vote::new_committed(0, from.id()),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    Ok(latchkey_proto::v1::RaftMessage {
        payload: latchkey_core::codec::encode(&stale)?.into(),
        ..addressed(to, from)
    })
}

/// An empty Raft message addressed to `to` as it is, from `from` as it is
/// (a member, so the message gets past the sender check).
fn addressed(to: &Node, from: &Node) -> latchkey_proto::v1::RaftMessage {
    latchkey_proto::v1::RaftMessage {
        to_id: to.id(),
        to_incarnation: to.incarnation(),
        from_id: from.id(),
        from_incarnation: from.incarnation(),
        ..Default::default()
    }
}

/// The replica side of `AppendEntriesStream`: each request message gets one
/// reply, in order; a malformed one gets INVALID_ARGUMENT and ends the
/// stream, and the replica keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_entries_stream_answers_in_order_and_ends_on_a_malformed_message() -> TestResult {
    use latchkey_proto::v1::RaftMessage;
    use openraft::error::RaftError;
    use openraft::raft::AppendEntriesResponse;

    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        // Two replicas: a message comes from a member other than its
        // addressee.
        let (nodes, members) = start_cluster(dir.path(), 2).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let mut raft = common::raft_client(&members[0].1, Some(common::SECRET)).await?;
        // A request from a stale leader: the replica answers each one with
        // its higher vote.
        let good = stale_append(&nodes[&1], &nodes[&2])?;
        let bad = RaftMessage {
            payload: vec![0xff; 7].into(),
            ..addressed(&nodes[&1], &nodes[&2])
        };
        let requests = vec![good.clone(), good, bad, RaftMessage::default()];
        let mut replies = raft
            .append_entries_stream(tokio_stream::iter(requests))
            .await?
            .into_inner();
        for _ in 0..2 {
            let reply = replies.message().await?.ok_or("stream ended early")?;
            let decoded: Result<
                AppendEntriesResponse<latchkey_storage::TypeConfig>,
                RaftError<latchkey_storage::TypeConfig>,
            > = latchkey_core::codec::decode(&reply.payload)?;
            assert!(
                matches!(decoded, Ok(AppendEntriesResponse::HigherVote(_))),
                "{decoded:?}"
            );
        }
        match replies.message().await {
            Err(status) => assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}"),
            Ok(other) => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
        assert!(matches!(replies.message().await, Ok(None) | Err(_)));
        // The replica still serves.
        nodes[&1].client().put("after/bad-stream", "ok").await?;
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// A leader's open `AppendEntriesStream` and a client's open `Calls`
/// stream do not hold up a replica's shutdown: the replica ends them and
/// stops at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams() -> TestResult {
    use latchkey_proto::v1::pipeline_client::PipelineClient;
    use tokio_stream::wrappers::ReceiverStream;

    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (mut nodes, members) = start_cluster(dir.path(), 2).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let addr = format!("http://{}", nodes[&1].advertise_addr());
        let mut raft = common::raft_client(&members[0].1, Some(common::SECRET)).await?;
        let (requests, outgoing) = tokio::sync::mpsc::channel(1);
        let mut replies = raft
            .append_entries_stream(ReceiverStream::new(outgoing))
            .await?
            .into_inner();
        requests.send(stale_append(&nodes[&1], &nodes[&2])?).await?;
        replies.message().await?.ok_or("no reply")?;
        let mut pipeline = PipelineClient::connect(addr).await?;
        let (frames, outgoing) = tokio::sync::mpsc::channel(1);
        let mut answers = pipeline
            .calls(ReceiverStream::new(outgoing))
            .await?
            .into_inner();
        frames.send(frame(vec![get_call(1, b"k")?])).await?;
        answers.message().await?.ok_or("no reply")?;
        // Both streams stay open on our side (`requests`, `frames` alive).
        let node = nodes.remove(&1).ok_or("no node 1")?;
        let started = Instant::now();
        node.shutdown().await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "shutdown took {took:?} with streams open"
        );
        let end = tokio::time::timeout(Duration::from_secs(5), replies.message()).await?;
        assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
        // The call stream ends with UNAVAILABLE and the trailer that tells
        // the client every call it read was answered: anything unanswered
        // was not executed.
        let end = tokio::time::timeout(Duration::from_secs(5), answers.message()).await?;
        match end {
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
                assert!(
                    status
                        .metadata()
                        .contains_key(latchkey_proto::STOPPED_AFTER_ANSWERING),
                    "{status:?}"
                );
            }
            other => return Err(format!("expected a stopping status, got {other:?}").into()),
        }
        drop((requests, frames));
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

fn frame(calls: Vec<latchkey_proto::v1::Call>) -> latchkey_proto::v1::CallFrame {
    latchkey_proto::v1::CallFrame { calls }
}

fn call(id: u64, request: latchkey_proto::v1::call::Request) -> latchkey_proto::v1::Call {
    latchkey_proto::v1::Call {
        id,
        request: Some(request),
    }
}

fn get_call(id: u64, key: &[u8]) -> Result<latchkey_proto::v1::Call, Box<dyn std::error::Error>> {
    Ok(call(
        id,
        latchkey_proto::v1::call::Request::Get(latchkey_proto::v1::GetRequest {
            key: key.to_vec(),
            stale: false,
        }),
    ))
}

fn put_call(
    id: u64,
    key: &[u8],
    value: &[u8],
) -> Result<latchkey_proto::v1::Call, Box<dyn std::error::Error>> {
    Ok(call(
        id,
        latchkey_proto::v1::call::Request::Put(latchkey_proto::v1::PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            ..Default::default()
        }),
    ))
}

/// The replica side of `Pipeline.Calls`: every call gets the reply its
/// unary call would get, matched by id; a call without a request, a
/// malformed one and a frame above the call limit are refused without
/// ending the stream, and the oversized frame runs none of its calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_stream_answers_by_id_and_refuses_bad_calls() -> TestResult {
    use latchkey_core::{CommandResult, Outcome};
    use latchkey_proto::v1::call::Request as Req;
    use latchkey_proto::v1::pipeline_client::PipelineClient;
    use latchkey_proto::v1::CallReply;
    use latchkey_proto::ReplicaFailure;
    use tokio_stream::wrappers::ReceiverStream;

    /// The next `n` replies, by id.
    async fn replies(
        answers: &mut tonic::Streaming<latchkey_proto::v1::CallReplies>,
        n: usize,
    ) -> Result<BTreeMap<u64, CallReply>, Box<dyn std::error::Error>> {
        let mut got = BTreeMap::new();
        while got.len() < n {
            let frame = answers.message().await?.ok_or("stream ended early")?;
            for r in frame.replies {
                if got.insert(r.id, r).is_some() {
                    return Err("two replies with one id".into());
                }
            }
        }
        Ok(got)
    }
    fn answer(reply: &CallReply) -> Result<CommandResult, ReplicaFailure> {
        let reply = reply
            .reply
            .clone()
            .ok_or_else(|| ReplicaFailure::UnknownOutcome("a call reply without a reply".into()))?;
        latchkey_proto::wire::reply_from_wire(reply)
    }
    fn result(reply: &CallReply) -> Result<CommandResult, Box<dyn std::error::Error>> {
        answer(reply).map_err(|f| format!("failure {f:?}").into())
    }
    fn invalid(reply: &CallReply) -> bool {
        matches!(answer(reply), Err(ReplicaFailure::InvalidArgument(_)))
    }

    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 1).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let mut pipeline =
            PipelineClient::connect(format!("http://{}", nodes[&1].advertise_addr())).await?;
        let (frames, outgoing) = tokio::sync::mpsc::channel(4);
        let mut answers = pipeline
            .calls(ReceiverStream::new(outgoing))
            .await?
            .into_inner();

        // Writes and a read in one frame, with ids in any order.
        frames
            .send(frame(vec![
                put_call(30, b"a", b"1")?,
                put_call(10, b"b", b"2")?,
                get_call(20, b"missing")?,
            ]))
            .await?;
        let got = replies(&mut answers, 3).await?;
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![10, 20, 30]);
        // Two puts, two revisions, whichever order they were applied in.
        let (Ok(Outcome::Written { revision: r10 }), Ok(Outcome::Written { revision: r30 })) =
            (result(&got[&10])?, result(&got[&30])?)
        else {
            return Err(format!("puts answered {:?} and {:?}", got[&10], got[&30]).into());
        };
        assert_ne!(r10, r30);
        assert!(matches!(
            result(&got[&20])?,
            Ok(Outcome::Value { value: None, .. })
        ));

        // Bad calls get their own refusal; the good one in their frame runs.
        let no_body = latchkey_proto::v1::Call {
            id: 1,
            request: None,
        };
        let malformed = call(
            2,
            Req::Acquire(latchkey_proto::v1::AcquireRequest {
                mode: 42,
                ..Default::default()
            }),
        );
        frames
            .send(frame(vec![no_body, malformed, get_call(3, b"a")?]))
            .await?;
        let got = replies(&mut answers, 3).await?;
        assert!(invalid(&got[&1]), "{:?}", got[&1]);
        // A call without a request has no reply of its own kind.
        assert!(
            matches!(
                got[&1].reply,
                Some(latchkey_proto::v1::call_reply::Reply::Error(_))
            ),
            "{:?}",
            got[&1]
        );
        assert!(invalid(&got[&2]), "{:?}", got[&2]);
        assert!(matches!(
            result(&got[&3])?,
            Ok(Outcome::Value { value: Some(v), .. }) if v.value == b"1"
        ));

        // Keep-alives: of a live session with its secret, with another
        // secret, without one, and of a session never opened.
        let open = call(
            40,
            Req::OpenSession(latchkey_proto::v1::OpenSessionRequest {
                ttl_ms: 10_000,
                name: String::new(),
            }),
        );
        frames.send(frame(vec![open])).await?;
        let got = replies(&mut answers, 1).await?;
        let (session, secret) = match result(&got[&40])? {
            Ok(Outcome::Lock(latchkey_core::lock::LockOutcome::SessionOpened {
                session,
                secret,
                ..
            })) => (session, secret),
            other => return Err(format!("open session: {other:?}").into()),
        };
        assert_ne!(secret.0, [0; 16], "the replica drew a secret");
        let keep_alive = |id, session, secret: Vec<u8>| {
            call(
                id,
                Req::KeepAlive(latchkey_proto::v1::KeepAliveRequest {
                    session,
                    session_secret: secret,
                }),
            )
        };
        let mut wrong = secret.0.to_vec();
        wrong[0] ^= 1;
        frames
            .send(frame(vec![
                keep_alive(41, session.0, secret.0.to_vec()),
                keep_alive(42, 999_999, secret.0.to_vec()),
                keep_alive(43, session.0, wrong),
                keep_alive(44, session.0, Vec::new()),
            ]))
            .await?;
        let got = replies(&mut answers, 4).await?;
        assert!(
            result(&got[&41])?.is_ok(),
            "a live session's keep-alive succeeds: {:?}",
            got[&41]
        );
        assert!(
            matches!(
                result(&got[&42])?,
                Err(latchkey_core::CommandError::SessionEnded { session })
                    if session.0 == 999_999
            ),
            "a keep-alive of a session that is not live is refused as ended: {:?}",
            got[&42]
        );
        assert!(
            matches!(
                result(&got[&43])?,
                Err(latchkey_core::CommandError::WrongSessionSecret { session: s })
                    if s == session
            ),
            "a keep-alive with another secret is refused: {:?}",
            got[&43]
        );
        assert!(invalid(&got[&44]), "{:?}", got[&44]);

        // A frame above the limit runs none of its calls.
        let too_many = (0..=latchkey_proto::MAX_FRAME_CALLS as u64)
            .map(|i| put_call(100 + i, format!("over/{i}").as_bytes(), b"x"))
            .collect::<Result<Vec<_>, _>>()?;
        let n = too_many.len();
        frames.send(frame(too_many)).await?;
        let got = replies(&mut answers, n).await?;
        assert!(got.values().all(invalid));

        // The stream still serves, and nothing of that frame was applied.
        frames.send(frame(vec![get_call(5, b"over/0")?])).await?;
        let got = replies(&mut answers, 1).await?;
        assert!(matches!(
            result(&got[&5])?,
            Ok(Outcome::Value { value: None, .. })
        ));

        // Ending our side ends the stream once every call is answered.
        frames
            .send(frame(vec![put_call(6, b"last", b"v")?]))
            .await?;
        drop(frames);
        let got = replies(&mut answers, 1).await?;
        assert!(matches!(result(&got[&6])?, Ok(Outcome::Written { .. })));
        assert!(answers.message().await?.is_none());
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// A `Kv.Calls` frame that is not a `CallFrame` at all: the calls before it
/// are answered, then the stream ends with INVALID_ARGUMENT, and the replica
/// keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_call_frame_ends_the_stream_with_invalid_argument() -> TestResult {
    use prost::bytes::Buf;
    use prost::Message;
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    use tonic::codegen::http::uri::PathAndQuery;

    /// Frames as raw bytes, both ways.
    struct Raw;
    impl Encoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
            use prost::bytes::BufMut;
            dst.put_slice(&item);
            Ok(())
        }
    }
    impl Decoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Self::Error> {
            Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
        }
    }
    struct RawCodec;
    impl Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = Raw;
        type Decoder = Raw;
        fn encoder(&mut self) -> Raw {
            Raw
        }
        fn decoder(&mut self) -> Raw {
            Raw
        }
    }

    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 1).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let channel = tonic::transport::Channel::from_shared(format!(
            "http://{}",
            nodes[&1].advertise_addr()
        ))?
        .connect()
        .await?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await?;
        let good = frame(vec![put_call(1, b"before", b"v")?]).encode_to_vec();
        // Field 1 (calls) as a length-delimited record longer than the frame.
        let garbage = vec![0x0a, 0xff, 0x01, 0x00];
        let outgoing = tokio_stream::iter(vec![good, garbage]);
        let mut answers = grpc
            .streaming(
                tonic::Request::new(outgoing),
                PathAndQuery::from_static("/latchkey.v1.Pipeline/Calls"),
                RawCodec,
            )
            .await?
            .into_inner();
        let mut answered = Vec::new();
        let end = loop {
            match answers.message().await {
                Ok(Some(bytes)) => {
                    let replies = latchkey_proto::v1::CallReplies::decode(bytes.as_slice())?;
                    answered.extend(replies.replies.into_iter().map(|r| r.id));
                }
                Ok(None) => break None,
                Err(status) => break Some(status),
            }
        };
        assert_eq!(
            answered,
            vec![1],
            "the call before the bad frame is answered"
        );
        let status = end.ok_or("the stream ended without an error")?;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        // The replica still serves, and the good call was applied.
        let client = nodes[&1].client();
        assert_eq!(client.get("before").await?, Some(b"v".to_vec()));
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// Every replica serves the standard gRPC health service (SERVING once it
/// is a member that knows a leader, for the replica and each latchkey
/// service) and server reflection, which lists latchkey's services and the
/// health service, as `grpcurl list` would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() -> TestResult {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        for addr in &common::client_addrs(&nodes) {
            let channel = latchkey_proto::channel(addr, Duration::from_secs(1), None)?;
            let mut health = HealthClient::new(channel.clone());
            for service in [
                "",
                "latchkey.v1.Kv",
                "latchkey.v1.Lock",
                "latchkey.v1.Pipeline",
            ] {
                let start = Instant::now();
                loop {
                    let status = health
                        .check(HealthCheckRequest {
                            service: service.to_string(),
                        })
                        .await?
                        .into_inner()
                        .status;
                    if status == ServingStatus::Serving as i32 {
                        break;
                    }
                    if start.elapsed() > Duration::from_secs(30) {
                        return Err(format!("{addr} {service:?}: health {status}").into());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            let request = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut answers = ServerReflectionClient::new(channel)
                .server_reflection_info(tokio_stream::iter([request]))
                .await?
                .into_inner();
            let answer = answers.message().await?.ok_or("no reflection answer")?;
            let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
                return Err(format!("unexpected reflection answer {answer:?}").into());
            };
            let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            for wanted in [
                "latchkey.v1.Kv",
                "latchkey.v1.Lock",
                "latchkey.v1.Pipeline",
                "latchkey.v1.Admin",
                "grpc.health.v1.Health",
            ] {
                assert!(
                    names.iter().any(|n| n == wanted),
                    "{addr}: {names:?} lacks {wanted}"
                );
            }
            // The peer services are not on the client listener.
            for peer_only in ["latchkey.v1.Raft", "latchkey.v1.Membership"] {
                assert!(
                    !names.iter().any(|n| n == peer_only),
                    "{addr}: {names:?} advertises {peer_only}"
                );
            }
        }
        // A replica that shuts down tells whoever watches its health that
        // it no longer serves, and an open Watch does not hold the shutdown.
        let mut nodes = nodes;
        let node = nodes.remove(&3).ok_or("no node 3")?;
        let channel = latchkey_proto::channel(node.advertise_addr(), Duration::from_secs(1), None)?;
        let mut watch = HealthClient::new(channel)
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await?
            .into_inner();
        let first = watch.message().await?.ok_or("watch ended at once")?;
        assert_eq!(first.status, ServingStatus::Serving as i32);
        let started = Instant::now();
        node.shutdown().await;
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "shutdown took {:?} with a health watch open",
            started.elapsed()
        );
        let last = tokio::time::timeout(Duration::from_secs(5), watch.message()).await?;
        if let Ok(Some(update)) = last {
            assert_eq!(
                update.status,
                ServingStatus::NotServing as i32,
                "{update:?}"
            );
        }
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// An embedded node's own client watches its own replica in process: the
/// changes come in order, and a watch the wire would refuse (an empty
/// prefix, a progress interval out of range) is refused in process too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_process_watch_sees_changes_and_is_checked_like_a_remote_one() -> TestResult {
    use futures::StreamExt;
    use latchkey::{Selection, WatchMessage};
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let kv = nodes[&2].client();
        let first = kv.put("cfg/a", "1").await?;
        let mut watch = kv.watch(Selection::prefix("cfg/")).from_revision(first);
        let second = kv.put("cfg/b", "2").await?;
        let mut seen = Vec::new();
        while seen.len() < 2 {
            match watch.next().await {
                Some(Ok(WatchMessage::Changes { revision, .. })) => seen.push(revision),
                Some(Ok(WatchMessage::Progress { .. })) => {}
                other => return Err(format!("the watch answered {other:?}").into()),
            }
        }
        assert_eq!(seen, [first, second]);
        let mut empty = kv.watch(Selection::prefix(""));
        assert!(
            matches!(empty.next().await, Some(Err(Error::InvalidArgument(_)))),
            "an empty prefix was not refused"
        );
        let mut forever = kv
            .watch(Selection::key("cfg/a"))
            .progress_every(Duration::MAX);
        assert!(
            matches!(forever.next().await, Some(Err(Error::InvalidArgument(_)))),
            "a progress interval of Duration::MAX was not refused"
        );
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// `Client::close`, `Session::close` and the releases of `LockGuard` and
/// `MultiLockGuard` are cancel-safe: a caller that stops waiting once the
/// call has begun (a timeout around it) does not leave the session to
/// expire or the lock held until then; the call finishes on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closes_and_releases_given_up_on_still_finish() -> TestResult {
    use futures::FutureExt;
    use latchkey::SessionId;
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let kv = nodes[&1].client();
        kv.put("warm", "up").await?;
        kv.close().await?;
        // Sessions opened between two probes: only the write session.
        let before = kv.session(Duration::from_secs(30)).await?;
        before.close().await?;
        kv.put("k", "v").await?;
        let after = kv.session(Duration::from_secs(30)).await?;
        after.close().await?;
        let writer_sessions: Vec<u64> = (before.id().0 + 1..after.id().0).collect();
        assert_eq!(writer_sessions.len(), 1, "{writer_sessions:?}");

        // Polled once, then dropped: it has taken the session and sent
        // nothing yet.
        assert!(
            kv.close().now_or_never().is_none(),
            "the close did not wait"
        );
        // The close runs in a task of its own: give it time to land.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let ended = kv.end_session(SessionId(writer_sessions[0])).await?;
        assert!(
            ended.is_none(),
            "the write session outlived a close given up on: {ended:?}"
        );

        // The same for a lock's release, a multi-lock's release and a
        // session's close: each polled once, then dropped. The holder's
        // session lives 60 s, so only the releases can free the locks in
        // time.
        let holder = kv.session(Duration::from_secs(60)).await?;
        let one = holder.lock("given-up/one").acquire().await?;
        assert!(
            one.release().now_or_never().is_none(),
            "the release did not wait"
        );
        let both = holder
            .lock_all(["given-up/a", "given-up/b"])
            .acquire()
            .await?;
        assert!(
            both.release().now_or_never().is_none(),
            "the release did not wait"
        );
        let doomed = kv.session(Duration::from_secs(60)).await?;
        assert!(
            doomed.close().now_or_never().is_none(),
            "the close did not wait"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let other = kv.session(Duration::from_secs(30)).await?;
        let freed = other.lock("given-up/one").try_acquire().await?;
        assert!(freed.is_some(), "a lock outlived a release given up on");
        let freed = other
            .lock_all(["given-up/a", "given-up/b"])
            .try_acquire()
            .await?;
        assert!(
            freed.is_some(),
            "a multi-lock outlived a release given up on"
        );
        let ended = kv.end_session(doomed.id()).await?;
        assert!(
            ended.is_none(),
            "a session outlived a close given up on: {ended:?}"
        );
        other.close().await?;
        holder.close().await?;
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
