//! A stranger on the network: forged Raft calls against a running cluster.
//!
//! The cluster runs with a cluster secret (every in-process test cluster
//! does, see `common`). From a connection that is not a peer, forged Vote
//! and PreVote (a higher term, which would make the leader step down),
//! AppendEntries (a higher term with a log entry, which would install a fake
//! leader and write to the log), InstallSnapshot and TransferLeader (which
//! would make the leader hand over to a made-up node) calls are refused:
//! - without the secret, or with a wrong one: UNAUTHENTICATED, before the
//!   message is read;
//! - with the right secret but from a node id the membership does not hold:
//!   PERMISSION_DENIED.
//!
//! Afterwards every replica has the same leader, the same term and the same
//! last log index as before, and the cluster serves. Each guard is tested on
//! its own: removing the secret check lets the first group through to the
//! member check (different code); removing the member check lets the second
//! group's higher term through, and the term assertion fails.
//!
//! A member (with the secret) sending a snapshot, AppendEntries, hand-over
//! or vote request no leader or candidate could send is refused too, before
//! openraft's assertions on it.

use std::collections::BTreeMap;
use std::time::Duration;

use latchkey::{Node, NodeStatus};
use latchkey_proto::v1::RaftMessage;
use latchkey_storage::types::{StoredMembership, Vote, VoteWire};
use latchkey_storage::TypeConfig;
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest};
use openraft_legacy::network_v1::{InstallSnapshotRequest, SnapshotMeta};

mod common;

use common::{raft_client, start_cluster, SECRET};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(120);

/// A node id no member has.
const STRANGER: u64 = 9;

fn to(node: &Node, payload: Vec<u8>) -> RaftMessage {
    RaftMessage {
        payload: payload.into(),
        to_id: node.id(),
        to_incarnation: node.incarnation(),
        from_id: STRANGER,
        from_incarnation: 1,
        leadership_transfer: false,
    }
}

/// The forged calls' payloads, each claiming a term far above the
/// cluster's.
struct Forged {
    vote: Vec<u8>,
    append: Vec<u8>,
    snapshot: Vec<u8>,
    transfer: Vec<u8>,
}

fn forged(term: u64, last_index: u64) -> Result<Forged, Box<dyn std::error::Error>> {
    let high = term + 100;
    let log_id = latchkey_storage::types::log_id(high, STRANGER, last_index + 10);
    let vote = VoteWire {
        vote: Vote::new(high, STRANGER),
        last_log_id: Some(log_id),
    };
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(high, STRANGER),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: Some(log_id),
    };
    let snapshot = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(high, STRANGER),
        meta: SnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: StoredMembership::default(),
            snapshot_id: "forged".into(),
        },
        offset: 0,
        data: b"not a snapshot".to_vec(),
        done: true,
    };
    let transfer = TransferLeaderRequest::<TypeConfig>::new(
        Vote::new_committed(high, STRANGER),
        STRANGER,
        Some(log_id),
    );
    Ok(Forged {
        transfer: latchkey_core::codec::encode(&transfer)?,
        vote: latchkey_core::codec::encode(&vote)?,
        append: latchkey_core::codec::encode(&append)?,
        snapshot: latchkey_core::codec::encode(&snapshot)?,
    })
}

/// Send every forged call to `node` with `secret`; each must fail with
/// `code`.
async fn attack(
    node: &Node,
    addr: &str,
    secret: Option<&'static str>,
    forged: &Forged,
    code: tonic::Code,
) -> TestResult {
    let what = format!("node {} with secret {secret:?}", node.id());
    let mut raft = raft_client(addr, secret).await?;
    let vote = raft.vote(to(node, forged.vote.clone())).await;
    match vote {
        Err(status) => assert_eq!(status.code(), code, "{what}: vote: {status}"),
        Ok(reply) => return Err(format!("{what}: a forged vote was answered: {reply:?}").into()),
    }
    match raft.pre_vote(to(node, forged.vote.clone())).await {
        Err(status) => assert_eq!(status.code(), code, "{what}: pre-vote: {status}"),
        Ok(reply) => {
            return Err(format!("{what}: a forged pre-vote was answered: {reply:?}").into())
        }
    }
    match raft
        .transfer_leader(to(node, forged.transfer.clone()))
        .await
    {
        Err(status) => assert_eq!(status.code(), code, "{what}: transfer: {status}"),
        Ok(reply) => {
            return Err(format!("{what}: a forged transfer was answered: {reply:?}").into())
        }
    }
    let stream = raft
        .append_entries_stream(tokio_stream::iter([to(node, forged.append.clone())]))
        .await;
    let appended = match stream {
        Ok(replies) => replies.into_inner().message().await,
        Err(status) => Err(status),
    };
    match appended {
        Err(status) => assert_eq!(status.code(), code, "{what}: append: {status}"),
        Ok(reply) => return Err(format!("{what}: a forged append was answered: {reply:?}").into()),
    }
    let snapshot = raft
        .install_snapshot(to(node, forged.snapshot.clone()))
        .await;
    match snapshot {
        Err(status) => assert_eq!(status.code(), code, "{what}: snapshot: {status}"),
        Ok(reply) => {
            return Err(format!("{what}: a forged snapshot was answered: {reply:?}").into())
        }
    }
    if code != tonic::Code::PermissionDenied {
        // Not even who a replica is may be asked without the secret (or on
        // the client listener).
        let identify = raft
            .identify(latchkey_proto::v1::IdentifyRequest {
                from_id: STRANGER,
                from_incarnation: 1,
            })
            .await;
        match identify {
            Err(status) => assert_eq!(status.code(), code, "{what}: identify: {status}"),
            Ok(reply) => return Err(format!("{what}: identify answered: {reply:?}").into()),
        }
    }
    Ok(())
}

/// Leader, term and last log index of every node.
fn view(statuses: &BTreeMap<u64, NodeStatus>) -> BTreeMap<u64, (Option<u64>, u64, u64)> {
    statuses
        .iter()
        .map(|(id, s)| (*id, (s.leader_id, s.term, s.last_log_index)))
        .collect()
}

async fn statuses(nodes: &BTreeMap<u64, Node>) -> BTreeMap<u64, NodeStatus> {
    nodes.iter().map(|(id, n)| (*id, n.status())).collect()
}

/// Every node agrees on a leader and has applied everything in its log.
async fn settled(nodes: &BTreeMap<u64, Node>) -> BTreeMap<u64, NodeStatus> {
    loop {
        let all = statuses(nodes).await;
        let leaders: Vec<Option<u64>> = all.values().map(|s| s.leader_id).collect();
        let index: Vec<u64> = all.values().map(|s| s.last_log_index).collect();
        let applied = all.values().all(|s| s.last_applied == s.last_log_index);
        if leaders.iter().all(|l| l.is_some() && *l == leaders[0])
            && index.iter().all(|i| *i == index[0])
            && applied
        {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_raft_calls_are_refused_and_change_nothing() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, members) = start_cluster(dir.path(), 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let client = nodes[&leader].client();
        client.put("before", "v").await?;
        let before = settled(&nodes).await;
        let any = before.values().next().ok_or("no status")?;
        let forged = forged(any.term, any.last_log_index)?;

        for (id, addr) in &members {
            let node = &nodes[id];
            attack(node, addr, None, &forged, tonic::Code::Unauthenticated).await?;
            let wrong = Some("latchkey-not-the-cluster-secret");
            attack(node, addr, wrong, &forged, tonic::Code::Unauthenticated).await?;
            attack(
                node,
                addr,
                Some(SECRET),
                &forged,
                tonic::Code::PermissionDenied,
            )
            .await?;
            // The client listener serves neither Raft nor membership, even
            // to a caller with the secret.
            let client_port = node.advertise_addr();
            let unimplemented = tonic::Code::Unimplemented;
            attack(node, client_port, Some(SECRET), &forged, unimplemented).await?;
            let channel = tonic::transport::Channel::from_shared(format!("http://{client_port}"))?
                .connect()
                .await?;
            let mut membership =
                latchkey_proto::v1::membership_client::MembershipClient::with_interceptor(
                    channel,
                    common::SecretHeader(Some(SECRET)),
                );
            let change = membership
                .change_voters(latchkey_proto::v1::ChangeVotersRequest {
                    voters: vec![1],
                    force: false,
                })
                .await;
            match change {
                Err(status) => assert_eq!(status.code(), unimplemented, "{status}"),
                Ok(reply) => return Err(format!("membership on the client port: {reply:?}").into()),
            }
            let moved = membership
                .move_leader(latchkey_proto::v1::MoveLeaderRequest {
                    to: None,
                    away_from: None,
                })
                .await;
            match moved {
                Err(status) => assert_eq!(status.code(), unimplemented, "{status}"),
                Ok(reply) => {
                    return Err(format!("move-leader on the client port: {reply:?}").into())
                }
            }
        }

        // Nothing moved: same leader, term and log everywhere, and the
        // cluster serves.
        let after = view(&statuses(&nodes).await);
        assert_eq!(after, view(&before), "the forged calls changed the cluster");
        client.put("after", "v").await?;
        assert_eq!(client.get("before").await?, Some(b"v".to_vec()));
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// A member's snapshots and AppendEntries that no leader of the cluster
/// could send: a snapshot whose last entry is of a later leadership than
/// the sender's vote, or newer than an entry the receiver committed but at
/// no higher index; either message under an uncommitted vote, or naming the
/// receiver as leader; entries that do not follow on from the previous log
/// id, a commit index beyond the vote, a membership with a voter that has
/// no address; vote and pre-vote requests under a committed vote or a term
/// near `u64::MAX`; a hand-over under a vote that is not a leader's.
/// openraft asserts these away or overflows on them (a panic in its core
/// would stop the replica), or would make the receiver lead without an
/// election; the replica refuses them as INVALID_ARGUMENT first, changes
/// nothing and serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_impossible_messages_are_refused_and_change_nothing() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, members) = start_cluster(dir.path(), 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let client = nodes[&leader].client();
        for i in 0..5 {
            client.put(format!("before-{i}"), "v").await?;
        }
        let before = settled(&nodes).await;
        let status = &before[&leader];
        let (term, last) = (status.term, status.last_log_index);
        let follower = *nodes
            .keys()
            .find(|id| **id != leader)
            .ok_or("no follower")?;
        let target = &nodes[&follower];
        // From the leader itself (a member, with the secret), to a follower.
        let from = |payload: Vec<u8>| RaftMessage {
            payload: payload.into(),
            to_id: target.id(),
            to_incarnation: target.incarnation(),
            from_id: leader,
            from_incarnation: nodes[&leader].incarnation(),
            leadership_transfer: false,
        };
        let snapshot = |vote: Vote, last_log_id| InstallSnapshotRequest::<TypeConfig> {
            vote,
            meta: SnapshotMeta {
                last_log_id: Some(last_log_id),
                last_membership: StoredMembership::default(),
                snapshot_id: String::new(),
            },
            offset: 0,
            data: Vec::new(),
            done: true,
        };
        let beyond_vote = snapshot(
            Vote::new_committed(term, leader),
            latchkey_storage::types::log_id(term + 1, leader, last + 10),
        );
        // A later term's vote (which would be accepted), and a last entry
        // of that term at index 1, below what the follower committed.
        let contradicts = snapshot(
            Vote::new_committed(term + 100, leader),
            latchkey_storage::types::log_id(term + 100, leader, 1),
        );
        let address = &members
            .iter()
            .find(|(id, _)| *id == follower)
            .ok_or("no follower address")?
            .1;
        // A higher vote that is not committed (a leader's always is).
        let mut uncommitted = snapshot(
            Vote::new(term + 1, leader),
            latchkey_storage::types::log_id(term, leader, last),
        );
        uncommitted.meta.last_log_id = None;
        let mut raft = raft_client(address, Some(SECRET)).await?;
        // At the last index a u64 holds (openraft adds one to it).
        let at_the_end = snapshot(
            Vote::new_committed(term, leader),
            latchkey_storage::types::log_id(term, leader, u64::MAX),
        );
        for (what, rpc) in [
            ("beyond its vote", beyond_vote),
            ("contradicting", contradicts),
            ("under an uncommitted vote", uncommitted),
            ("at the last index", at_the_end),
        ] {
            let reply = raft
                .install_snapshot(from(latchkey_core::codec::encode(&rpc)?))
                .await;
            match reply {
                Err(status) => assert_eq!(
                    status.code(),
                    tonic::Code::InvalidArgument,
                    "snapshot {what}: {status}"
                ),
                Ok(reply) => {
                    return Err(format!("a snapshot {what} was answered: {reply:?}").into())
                }
            }
        }
        // AppendEntries no leader sends: under an uncommitted vote; with a
        // vote naming the receiver, from the receiver's own id; with an
        // entry that does not follow on from the previous log id.
        let append =
            |vote: Vote, entries: Vec<latchkey_storage::types::Entry>| AppendEntriesRequest::<
                TypeConfig,
            > {
                vote,
                prev_log_id: None,
                entries,
                leader_commit: None,
            };
        let gap = vec![latchkey_storage::types::Entry {
            log_id: latchkey_storage::types::log_id(term, leader, 5),
            payload: openraft::EntryPayload::Blank,
        }];
        let mut beyond_commit = append(Vote::new_committed(term, leader), Vec::new());
        beyond_commit.leader_commit = Some(latchkey_storage::types::log_id(term + 5, leader, 1));
        // A membership entry naming a voter it gives no node for (openraft
        // builds memberships checked, but decodes them unchecked).
        let mut broken =
            serde_json::to_value(latchkey_storage::types::Membership::new_with_defaults(
                vec![[leader, follower, STRANGER].into_iter().collect()],
                [],
            ))?;
        broken["nodes"] = serde_json::json!({});
        let mut unaddressed = append(
            Vote::new_committed(term, leader),
            vec![latchkey_storage::types::Entry {
                log_id: latchkey_storage::types::log_id(term, leader, last + 1),
                payload: openraft::EntryPayload::Membership(serde_json::from_value(broken)?),
            }],
        );
        unaddressed.prev_log_id = Some(latchkey_storage::types::log_id(term, leader, last));
        let appends = [
            (
                "under an uncommitted vote",
                leader,
                append(Vote::new(term + 1, leader), Vec::new()),
            ),
            ("with a commit index beyond its vote", leader, beyond_commit),
            (
                "contradicting a committed entry",
                leader,
                AppendEntriesRequest::<TypeConfig> {
                    vote: Vote::new_committed(term + 100, leader),
                    prev_log_id: Some(latchkey_storage::types::log_id(term + 100, leader, 1)),
                    entries: Vec::new(),
                    leader_commit: None,
                },
            ),
            ("with a voter that has no address", leader, unaddressed),
            (
                "from the receiver itself",
                follower,
                append(Vote::new_committed(term + 1, follower), Vec::new()),
            ),
            (
                "with a gap",
                leader,
                append(Vote::new_committed(term, leader), gap),
            ),
        ];
        for (what, sender, rpc) in appends {
            let mut message = from(latchkey_core::codec::encode(&rpc)?);
            message.from_id = sender;
            message.from_incarnation = nodes[&sender].incarnation();
            let appended = match raft
                .append_entries_stream(tokio_stream::iter([message]))
                .await
            {
                Ok(replies) => replies.into_inner().message().await,
                Err(status) => Err(status),
            };
            match appended {
                Err(status) => assert_eq!(
                    status.code(),
                    tonic::Code::InvalidArgument,
                    "append {what}: {status}"
                ),
                Ok(reply) => return Err(format!("an append {what} was answered: {reply:?}").into()),
            }
        }
        // On one stream, a heartbeat the leader could send and then an
        // impossible message: the heartbeat is answered (the follower
        // takes requests in without waiting), and the refusal comes after
        // its answer.
        let heartbeat = append(Vote::new_committed(term, leader), Vec::new());
        let impossible = append(Vote::new(term + 1, leader), Vec::new());
        let messages = [
            from(latchkey_core::codec::encode(&heartbeat)?),
            from(latchkey_core::codec::encode(&impossible)?),
        ];
        let mut replies = raft
            .append_entries_stream(tokio_stream::iter(messages))
            .await?
            .into_inner();
        let first = replies
            .message()
            .await?
            .ok_or("no reply to the heartbeat")?;
        let answered: Result<
            openraft::raft::AppendEntriesResponse<TypeConfig>,
            openraft::error::RaftError<TypeConfig>,
        > = latchkey_core::codec::decode(&first.payload)?;
        assert!(
            matches!(answered, Ok(openraft::raft::AppendEntriesResponse::Success)),
            "{answered:?}"
        );
        match replies.message().await {
            Err(status) => assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}"),
            Ok(reply) => {
                return Err(format!("the impossible append was answered: {reply:?}").into())
            }
        }
        // Vote and pre-vote requests no candidate sends: a committed vote
        // naming the receiver (it would lead without an election), a term
        // no cluster reaches (openraft adds one to it).
        let votes = [
            (
                "with a committed vote naming the receiver",
                VoteWire {
                    vote: Vote::new_committed(term + 100, follower),
                    last_log_id: Some(latchkey_storage::types::log_id(term, leader, last + 1000)),
                },
            ),
            (
                "beyond the largest term",
                VoteWire {
                    vote: Vote::new(u64::MAX, leader),
                    last_log_id: None,
                },
            ),
        ];
        for (what, wire) in votes {
            let message = from(latchkey_core::codec::encode(&wire)?);
            let answers = [
                ("vote", raft.vote(message.clone()).await),
                ("pre-vote", raft.pre_vote(message).await),
            ];
            for (kind, answer) in answers {
                match answer {
                    Err(status) => assert_eq!(
                        status.code(),
                        tonic::Code::InvalidArgument,
                        "{kind} {what}: {status}"
                    ),
                    Ok(reply) => {
                        return Err(format!("a {kind} {what} was answered: {reply:?}").into())
                    }
                }
            }
        }
        // A hand-over under a vote that is not a leader's.
        let transfer =
            TransferLeaderRequest::<TypeConfig>::new(Vote::new(term + 1, leader), follower, None);
        match raft
            .transfer_leader(from(latchkey_core::codec::encode(&transfer)?))
            .await
        {
            Err(status) => assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}"),
            Ok(reply) => return Err(format!("a forged hand-over was answered: {reply:?}").into()),
        }
        // Every replica, the target too, applies a write made afterwards
        // (a stopped Raft core never would: the test's limit would fail it),
        // under the same leader and term.
        client.put("after", "v").await?;
        let after = settled(&nodes).await;
        let leadership = |all: &BTreeMap<u64, NodeStatus>| {
            all.iter()
                .map(|(id, s)| (*id, (s.leader_id, s.term)))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            leadership(&after),
            leadership(&before),
            "the snapshots moved leadership"
        );
        for (id, node) in &nodes {
            assert_eq!(node.failure(), None, "node {id} failed");
        }
        assert_eq!(client.get("before-4").await?, Some(b"v".to_vec()));
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// A one-replica cluster in `dir` holding at most `cap` connections, each
/// given `handshake` to speak; with its address, once it leads.
async fn single(
    dir: &std::path::Path,
    cap: usize,
    handshake: Duration,
) -> Result<(Node, String), Box<dyn std::error::Error>> {
    let ports = common::Ports::bind()?;
    let addr = ports.client.local_addr()?.to_string();
    let node = Node::builder(1)
        .initial_members([(1, ports.peer_addr()?)])
        .listener(ports.client)
        .peer_listener(ports.peer)
        .data_dir(dir.join("node-1"))
        .cluster_secret(common::secret())
        .max_connections(cap)
        .handshake_timeout(handshake)
        .start()
        .await?;
    node.wait_for_leader(Duration::from_secs(30)).await?;
    Ok((node, addr))
}

/// Idle connections beyond `max_connections` are closed on accept, the ones
/// held are not, and a closed one frees its place for a real client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed() -> TestResult {
    use tokio::io::AsyncReadExt;

    const CAP: usize = 4;
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        // Long enough that the idle connections are held throughout.
        let (node, addr) = single(dir.path(), CAP, Duration::from_secs(120)).await?;
        // A stranger's idle connections take every place...
        let mut idle = Vec::new();
        for _ in 0..CAP {
            idle.push(tokio::net::TcpStream::connect(&addr).await?);
        }
        // ... so the next ones are closed at once (end of file, or a reset).
        for _ in 0..3 {
            let mut extra = tokio::net::TcpStream::connect(&addr).await?;
            let mut buf = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_secs(10), extra.read(&mut buf)).await?;
            assert!(matches!(read, Ok(0) | Err(_)), "over the cap: {read:?}");
        }
        // The idle ones are still held, the replica still serves in process,
        // and once one closes, a real client gets its place.
        node.client().put("k", "v").await?;
        drop(idle.pop());
        let remote = latchkey::Client::with_options(
            [addr.as_str()],
            latchkey::ClientOptions::default().with_request_timeout(Duration::from_secs(20)),
        )?;
        let got = get_through_a_freed_place(&remote).await?;
        assert_eq!(got, Some(b"v".to_vec()));
        drop(idle);
        node.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// A get through `client`, retried while the replica's freed place is not
/// yet seen (the server notices a closed connection asynchronously).
async fn get_through_a_freed_place(
    client: &latchkey::Client,
) -> Result<Option<Vec<u8>>, Box<dyn std::error::Error>> {
    let mut last = None;
    for _ in 0..50 {
        match client.get("k").await {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("no get through the freed place: {last:?}").into())
}

/// A client without the cluster secret cannot change the membership: both
/// membership calls are refused and the membership is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_need_the_cluster_secret() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, members) = start_cluster(dir.path(), 3).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let stranger = latchkey::Client::connect(common::client_addrs(&nodes))?;
        // Who the members are (not how far each has replicated).
        let membership = || {
            let mut members = nodes[&1].status().members;
            for m in &mut members {
                m.matched_index = None;
            }
            members
        };
        let before = membership();
        match stranger.change_voters([1, 2]).await {
            Err(latchkey::Error::InvalidArgument(why)) => {
                assert!(why.contains("cluster secret"), "{why}")
            }
            other => return Err(format!("change_voters without the secret: {other:?}").into()),
        }
        match stranger.add_member(9, &members[0].1, false).await {
            Err(latchkey::Error::InvalidArgument(why)) => {
                assert!(why.contains("cluster secret"), "{why}")
            }
            other => return Err(format!("add_member without the secret: {other:?}").into()),
        }
        let leader = nodes[&1].status().leader_id;
        match stranger.transfer_leader(None).await {
            Err(latchkey::Error::InvalidArgument(why)) => {
                assert!(why.contains("cluster secret"), "{why}")
            }
            other => return Err(format!("transfer_leader without the secret: {other:?}").into()),
        }
        assert_eq!(nodes[&1].status().leader_id, leader);
        assert_eq!(membership(), before);
        // The node's own client carries the secret: the same change goes.
        nodes[&1].client().change_voters([1, 2, 3]).await?;
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// Connections that never send a byte are closed at the handshake timeout,
/// so a stranger cannot hold every place for long: a real client gets in
/// while the silent connections are still open on the stranger's side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_at_the_handshake_timeout() -> TestResult {
    use tokio::io::AsyncReadExt;

    const CAP: usize = 4;
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (node, addr) = single(dir.path(), CAP, Duration::from_millis(300)).await?;
        node.client().put("k", "v").await?;
        let mut silent = Vec::new();
        for _ in 0..CAP {
            silent.push(tokio::net::TcpStream::connect(&addr).await?);
        }
        // Each is closed by the replica (it may first send its own HTTP/2
        // settings): reading to the end finishes, with end of file or a
        // reset.
        for s in &mut silent {
            let mut sink = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut sink)).await;
            assert!(read.is_ok(), "a silent connection stayed open for 30 s");
        }
        let remote = latchkey::Client::with_options(
            [addr.as_str()],
            latchkey::ClientOptions::default().with_request_timeout(Duration::from_secs(20)),
        )?;
        assert_eq!(
            get_through_a_freed_place(&remote).await?,
            Some(b"v".to_vec())
        );
        drop(silent);
        node.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
