//! Raft transport to peers over gRPC: one cached HTTP/2 channel per peer,
//! and on it a few long-lived streams that carry AppendEntries.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use latchkey_client::ClientOptions;
use latchkey_core::codec;
use latchkey_proto::v1::raft_client::RaftClient;
use latchkey_proto::v1::RaftMessage;
use latchkey_storage::{DurableLog, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use prost::bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

use crate::MAX_MESSAGE_BYTES;

/// Above this encoded size an AppendEntries with several entries is split.
const SPLIT_ABOVE_BYTES: usize = 16 * 1024 * 1024;

/// Idle AppendEntries streams kept per peer. openraft has at most a few
/// AppendEntries out to one follower at a time (its replication task's
/// call, and a leadership check's heartbeat); a stream beyond this is
/// closed after its call.
const MAX_IDLE_STREAMS: usize = 4;

/// After a peer answered UNIMPLEMENTED to the stream (an older replica),
/// AppendEntries to it are unary calls for this long, then the stream is
/// tried again (the peer may have been upgraded).
const UNARY_FOR: Duration = Duration::from_secs(60);

type PeerMap = BTreeMap<(u64, String), Arc<Peer>>;

/// Longest a message carrying only a commit index waits for the leader's
/// own log sync before it is sent with the commit index capped. The sync
/// usually finished before the follower's acknowledgement arrived (it began
/// earlier), so the wait is usually nothing; the bound keeps a slow leader
/// disk from holding up the next entries to this follower (openraft sends
/// them one message at a time). A capped commit index reaches the follower
/// with the next message or heartbeat.
const COMMIT_NOTICE_WAIT: Duration = Duration::from_millis(2);

/// Creates [`PeerLink`]s, sharing one channel and one pool of AppendEntries
/// streams per (node id, address).
#[derive(Clone, Default)]
pub struct PeerNetwork {
    peers: Arc<Mutex<PeerMap>>,
    options: ClientOptions,
    /// The local log's durability: the commit index sent to followers is
    /// capped at it (see `latchkey_storage::durable`). `None` only in tests
    /// of the network alone.
    durable: Option<DurableLog>,
}

impl PeerNetwork {
    /// A network whose AppendEntries tell followers no commit index beyond
    /// what `durable` (the local log) holds on disk. Required when the log
    /// store acknowledges a leader's appends before syncing them.
    pub fn new(durable: DurableLog) -> Self {
        PeerNetwork {
            durable: Some(durable),
            ..PeerNetwork::default()
        }
    }

    fn peer(&self, target: u64, addr: &str) -> Arc<Peer> {
        let mut map = lock(&self.peers);
        let key = (target, addr.to_string());
        if let Some(peer) = map.get(&key) {
            return Arc::clone(peer);
        }
        let peer = Arc::new(Peer {
            target,
            channel: latchkey_client::channel(addr, &self.options).map_err(|e| e.to_string()),
            idle: Mutex::new(Vec::new()),
            unary_until: Mutex::new(None),
        });
        map.insert(key, Arc::clone(&peer));
        peer
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerLink;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerLink {
        PeerLink {
            peer: self.peer(target, &node.addr),
            durable: self.durable.clone(),
        }
    }
}

/// The Raft transport to one peer.
///
/// AppendEntries (most of a leader's RPCs: replication, heartbeats and
/// leadership checks) go as messages on long-lived `AppendEntriesStream`s,
/// shared by every link to the peer: a call takes an idle stream (or opens
/// one), sends one message, waits for its one reply and gives the stream
/// back. That costs one HTTP/2 DATA frame each way instead of a new HTTP/2
/// stream per call (headers, a body task, a second write). A stream that
/// fails or times out is dropped, so a late reply can never answer a later
/// call; a call that finds its idle stream dead (the peer restarted) tries
/// the next one, then a new one, within its deadline. Votes and snapshots
/// are unary calls.
pub struct PeerLink {
    peer: Arc<Peer>,
    durable: Option<DurableLog>,
}

/// What every link to one peer shares.
struct Peer {
    target: u64,
    channel: Result<Channel, String>,
    idle: Mutex<Vec<AppendStream>>,
    /// Set when the peer answered UNIMPLEMENTED to the stream.
    unary_until: Mutex<Option<Instant>>,
}

/// An open `AppendEntriesStream`, used by one call at a time, so the next
/// reply always answers the last request.
struct AppendStream {
    requests: mpsc::Sender<RaftMessage>,
    replies: Streaming<RaftMessage>,
}

/// Why a stream gave no reply.
enum StreamFailure {
    /// The peer does not implement the stream: use unary calls.
    Unsupported,
    /// The stream is gone (dropped by the caller).
    Failed(Box<RPCError<u64, BasicNode, RaftError<u64>>>),
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct LinkError(String);

type RpcResult<T, E> = Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

fn status_error<E: std::error::Error>(
    target: u64,
    status: &tonic::Status,
) -> RPCError<u64, BasicNode, RaftError<u64, E>> {
    let e = LinkError(format!("node {target}: {}", status.message()));
    if status.code() == tonic::Code::Unavailable {
        RPCError::Unreachable(Unreachable::new(&e))
    } else {
        RPCError::Network(NetworkError::new(&e))
    }
}

impl Peer {
    fn client(&self) -> Result<RaftClient<Channel>, Unreachable> {
        match &self.channel {
            Ok(c) => Ok(RaftClient::new(c.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)),
            Err(e) => Err(Unreachable::new(&LinkError(format!(
                "bad address for node {}: {e}",
                self.target
            )))),
        }
    }

    fn unary_for_now(&self) -> bool {
        // A passed deadline simply reads as false; the next UNIMPLEMENTED
        // sets a new one.
        matches!(*lock(&self.unary_until), Some(t) if Instant::now() < t)
    }

    fn take_idle(&self) -> Option<AppendStream> {
        lock(&self.idle).pop()
    }

    fn give_back(&self, stream: AppendStream) {
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE_STREAMS {
            idle.push(stream);
        }
    }

    async fn open_stream(&self) -> Result<AppendStream, StreamFailure> {
        let mut client = self
            .client()
            .map_err(|e| StreamFailure::Failed(Box::new(RPCError::Unreachable(e))))?;
        let (requests, outgoing) = mpsc::channel(1);
        match client
            .append_entries_stream(ReceiverStream::new(outgoing))
            .await
        {
            Ok(response) => Ok(AppendStream {
                requests,
                replies: response.into_inner(),
            }),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                Err(StreamFailure::Unsupported)
            }
            Err(status) => Err(StreamFailure::Failed(Box::new(status_error(
                self.target,
                &status,
            )))),
        }
    }

    /// One request and its reply on `stream`.
    async fn round(
        &self,
        stream: &mut AppendStream,
        payload: Bytes,
    ) -> Result<Bytes, StreamFailure> {
        let outcome = match stream.requests.send(RaftMessage { payload }).await {
            Ok(()) => stream.replies.message().await,
            // The stream's sending side is gone: the stream is dead.
            Err(_) => Ok(None),
        };
        match outcome {
            Ok(Some(reply)) => Ok(reply.payload),
            Ok(None) => Err(StreamFailure::Failed(Box::new(RPCError::Unreachable(
                Unreachable::new(&LinkError(format!(
                    "node {}: append-entries stream closed",
                    self.target
                ))),
            )))),
            Err(status) => Err(StreamFailure::Failed(Box::new(status_error(
                self.target,
                &status,
            )))),
        }
    }

    /// One call: on an idle stream, else on a new one. A failed idle
    /// stream may have died with an old connection, so the call moves on
    /// to the next; a failed new stream ends the call.
    async fn call_on_stream(&self, payload: Bytes) -> Result<Bytes, StreamFailure> {
        loop {
            let (mut stream, reused) = match self.take_idle() {
                Some(s) => (s, true),
                None => (self.open_stream().await?, false),
            };
            match self.round(&mut stream, payload.clone()).await {
                Ok(reply) => {
                    self.give_back(stream);
                    return Ok(reply);
                }
                Err(failure) if !reused => return Err(failure),
                Err(_) => continue,
            }
        }
    }
}

impl PeerLink {
    async fn call<Req, Resp, E>(
        &self,
        kind: Rpc,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload =
            codec::encode(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = self.peer.client()?;
        let mut req = tonic::Request::new(RaftMessage {
            payload: payload.into(),
        });
        req.set_timeout(option.hard_ttl());
        let reply = match kind {
            Rpc::Append => client.append_entries(req).await,
            Rpc::Vote => client.vote(req).await,
            Rpc::Snapshot => client.install_snapshot(req).await,
        };
        let reply = reply.map_err(|status| status_error(self.peer.target, &status))?;
        self.decode_reply(&reply.into_inner().payload)
    }

    // The error type is openraft's, as `RaftNetwork` returns it.
    #[allow(clippy::result_large_err)]
    fn decode_reply<Resp, E>(&self, payload: &[u8]) -> RpcResult<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let result: Result<Resp, RaftError<u64, E>> =
            codec::decode(payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.peer.target, e)))
    }

    /// AppendEntries on a stream; `None` when the peer does not implement
    /// it (the caller then makes a unary call).
    async fn append_on_stream(
        &self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> Option<RpcResult<AppendEntriesResponse<u64>, openraft::error::Infallible>> {
        let payload: Bytes = match codec::encode(rpc) {
            Ok(p) => p.into(),
            Err(e) => return Some(Err(RPCError::Network(NetworkError::new(&e)))),
        };
        // Dropping the call at its deadline drops the stream it holds.
        let call = tokio::time::timeout(option.hard_ttl(), self.peer.call_on_stream(payload));
        match call.await {
            Ok(Ok(reply)) => Some(self.decode_reply(&reply)),
            Ok(Err(StreamFailure::Failed(error))) => Some(Err(*error)),
            Ok(Err(StreamFailure::Unsupported)) => {
                tracing::info!(
                    target = self.peer.target,
                    "peer has no append-entries stream; using unary calls"
                );
                *lock(&self.peer.unary_until) = Some(Instant::now() + UNARY_FOR);
                None
            }
            Err(_elapsed) => Some(Err(RPCError::Network(NetworkError::new(&LinkError(
                format!(
                    "node {}: append-entries timed out after {:?}",
                    self.peer.target,
                    option.hard_ttl()
                ),
            ))))),
        }
    }
}

enum Rpc {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>, openraft::error::Infallible> {
        // The commit clamp: followers must not apply what this leader may
        // still lose (it acknowledges its own appends before syncing them).
        // A message with no entries only carries the commit index: wait for
        // the leader's own sync (bounded) so it carries the real one.
        if let Some(durable) = self.durable.as_mut() {
            if let (true, Some(commit)) = (rpc.entries.is_empty(), rpc.leader_commit) {
                let limit = option.soft_ttl().min(COMMIT_NOTICE_WAIT);
                durable.wait_durable(commit.index, limit).await;
            }
            rpc.leader_commit = durable.clamp_commit(rpc.leader_commit);
        }
        if rpc.entries.len() > 1 {
            let size: usize = rpc
                .entries
                .iter()
                .map(|e| match &e.payload {
                    openraft::EntryPayload::Normal(r) => r.command.payload_len(),
                    _ => 64,
                })
                .sum();
            if size > SPLIT_ABOVE_BYTES {
                let hint = (rpc.entries.len() / 2).max(1) as u64;
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(hint),
                ));
            }
        }
        if !self.peer.unary_for_now() {
            if let Some(result) = self.append_on_stream(&rpc, &option).await {
                return result;
            }
        }
        self.call(Rpc::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.call(Rpc::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>, openraft::error::Infallible> {
        self.call(Rpc::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    //! The link's stream against a fake peer: order, reuse, fallback to
    //! unary calls, recovery after a broken stream, and a late reply never
    //! answering a later call.

    use std::net::SocketAddr;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::Stream;
    use latchkey_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
    use openraft::Vote;
    use tokio::net::TcpListener;
    use tonic::{Request, Response, Status};

    use super::*;

    type Reply = Result<AppendEntriesResponse<u64>, RaftError<u64>>;

    /// How the fake peer behaves.
    #[derive(Default)]
    struct FakePeer {
        /// Answer `AppendEntriesStream` with UNIMPLEMENTED (an old replica).
        no_stream: bool,
        /// End each stream after this many replies (0: never).
        close_after: usize,
        /// Hold the first stream request for 2 s, then answer it `Conflict`.
        slow_first: bool,
        opens: AtomicUsize,
        unary: AtomicUsize,
        streamed: AtomicUsize,
        /// The commit index of every streamed request, in order.
        commits: Mutex<Vec<Option<u64>>>,
    }

    fn encode_reply(reply: &Reply) -> Result<RaftMessage, Status> {
        codec::encode(reply)
            .map(|p| RaftMessage { payload: p.into() })
            .map_err(|e| Status::internal(e.to_string()))
    }

    /// The gRPC service of a [`FakePeer`].
    struct Fake(Arc<FakePeer>);

    #[tonic::async_trait]
    impl RaftRpc for Fake {
        async fn append_entries(
            &self,
            _request: Request<RaftMessage>,
        ) -> Result<Response<RaftMessage>, Status> {
            self.0.unary.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(encode_reply(&Ok(
                AppendEntriesResponse::Success,
            ))?))
        }

        type AppendEntriesStreamStream =
            Pin<Box<dyn Stream<Item = Result<RaftMessage, Status>> + Send + 'static>>;

        async fn append_entries_stream(
            &self,
            request: Request<tonic::Streaming<RaftMessage>>,
        ) -> Result<Response<Self::AppendEntriesStreamStream>, Status> {
            if self.0.no_stream {
                return Err(Status::unimplemented("no stream here"));
            }
            let opened = self.0.opens.fetch_add(1, Ordering::SeqCst);
            let peer = Arc::clone(&self.0);
            let replies = futures::stream::unfold(
                (request.into_inner(), 0usize),
                move |(mut incoming, answered)| {
                    let peer = Arc::clone(&peer);
                    async move {
                        if peer.close_after > 0 && answered == peer.close_after {
                            return None;
                        }
                        let message = incoming.message().await.ok()??;
                        let rpc: AppendEntriesRequest<TypeConfig> =
                            codec::decode(&message.payload).ok()?;
                        assert!(rpc.entries.is_empty());
                        lock(&peer.commits).push(rpc.leader_commit.map(|c| c.index));
                        let n = peer.streamed.fetch_add(1, Ordering::SeqCst);
                        let reply = if peer.slow_first && opened == 0 && n == 0 {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            Ok(AppendEntriesResponse::Conflict)
                        } else {
                            Ok(AppendEntriesResponse::Success)
                        };
                        Some((encode_reply(&reply), (incoming, answered + 1)))
                    }
                },
            );
            Ok(Response::new(Box::pin(replies)))
        }

        async fn vote(&self, _: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
            Err(Status::unimplemented("vote"))
        }

        async fn install_snapshot(
            &self,
            _: Request<RaftMessage>,
        ) -> Result<Response<RaftMessage>, Status> {
            Err(Status::unimplemented("install_snapshot"))
        }
    }

    async fn serve(peer: Arc<FakePeer>) -> Result<SocketAddr, Box<dyn std::error::Error>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftServer::new(Fake(peer)))
                .serve_with_incoming(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                ),
        );
        Ok(addr)
    }

    async fn link_to(addr: SocketAddr) -> PeerLink {
        PeerNetwork::default()
            .new_client(2, &BasicNode::new(addr.to_string()))
            .await
    }

    /// Serve `peer` and make a link to it.
    async fn linked(
        peer: FakePeer,
    ) -> Result<(Arc<FakePeer>, PeerLink), Box<dyn std::error::Error>> {
        let peer = Arc::new(peer);
        let link = link_to(serve(Arc::clone(&peer)).await?).await;
        Ok((peer, link))
    }

    fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        }
    }

    async fn append(
        link: &mut PeerLink,
        ttl: Duration,
    ) -> RpcResult<AppendEntriesResponse<u64>, openraft::error::Infallible> {
        link.append_entries(heartbeat(), RPCOption::new(ttl)).await
    }

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// `n` calls on `link`, each answered `Success`.
    async fn all_succeed(link: &mut PeerLink, n: usize) -> TestResult {
        for i in 0..n {
            let reply = append(link, TTL).await?;
            if !matches!(reply, AppendEntriesResponse::Success) {
                return Err(format!("call {i} got {reply:?}").into());
            }
        }
        Ok(())
    }
    const LIMIT: Duration = Duration::from_secs(30);
    const TTL: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn calls_share_one_stream() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let (peer, mut link) = linked(FakePeer::default()).await?;
            all_succeed(&mut link, 50).await?;
            assert_eq!(peer.opens.load(Ordering::SeqCst), 1);
            assert_eq!(peer.streamed.load(Ordering::SeqCst), 50);
            assert_eq!(peer.unary.load(Ordering::SeqCst), 0);
            Ok(())
        })
        .await?
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_links_share_the_pool() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let peer = Arc::new(FakePeer::default());
            let addr = serve(Arc::clone(&peer)).await?;
            let mut network = PeerNetwork::default();
            let mut tasks = Vec::new();
            for _ in 0..8 {
                // A fresh link per task, as openraft makes for leadership
                // checks: the links share the peer's streams.
                let mut link = network
                    .new_client(2, &BasicNode::new(addr.to_string()))
                    .await;
                tasks.push(tokio::spawn(async move {
                    let mut ok = 0;
                    for _ in 0..10 {
                        if let Ok(AppendEntriesResponse::Success) = append(&mut link, TTL).await {
                            ok += 1;
                        }
                    }
                    ok
                }));
            }
            for task in tasks {
                assert_eq!(task.await?, 10);
            }
            assert_eq!(peer.streamed.load(Ordering::SeqCst), 80);
            let opens = peer.opens.load(Ordering::SeqCst);
            assert!((1..=8).contains(&opens), "{opens} streams opened");
            // Later links reuse the idle streams instead of opening more.
            let mut link = network
                .new_client(2, &BasicNode::new(addr.to_string()))
                .await;
            append(&mut link, TTL).await?;
            assert_eq!(peer.opens.load(Ordering::SeqCst), opens);
            Ok(())
        })
        .await?
    }

    #[tokio::test]
    async fn a_peer_without_the_stream_gets_unary_calls() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let (peer, mut link) = linked(FakePeer {
                no_stream: true,
                ..FakePeer::default()
            })
            .await?;
            all_succeed(&mut link, 5).await?;
            assert_eq!(peer.unary.load(Ordering::SeqCst), 5);
            assert!(
                link.peer.unary_for_now(),
                "links to the peer should stop trying the stream for a while"
            );
            assert_eq!(peer.opens.load(Ordering::SeqCst), 0);
            Ok(())
        })
        .await?
    }

    #[tokio::test]
    async fn a_closed_stream_is_reopened_and_the_call_still_answered() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let (peer, mut link) = linked(FakePeer {
                close_after: 2,
                ..FakePeer::default()
            })
            .await?;
            all_succeed(&mut link, 7).await?;
            // Seven calls, two per stream: the peer closed three streams and
            // each next call opened a new one without failing.
            assert_eq!(peer.opens.load(Ordering::SeqCst), 4);
            assert_eq!(peer.streamed.load(Ordering::SeqCst), 7);
            assert_eq!(peer.unary.load(Ordering::SeqCst), 0);
            Ok(())
        })
        .await?
    }

    #[tokio::test]
    async fn a_late_reply_never_answers_the_next_call() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let (peer, mut link) = linked(FakePeer {
                slow_first: true,
                ..FakePeer::default()
            })
            .await?;
            // The first request's reply (Conflict) comes after 2 s: the call
            // times out first.
            let first = append(&mut link, Duration::from_millis(200)).await;
            assert!(first.is_err(), "expected a timeout, got {first:?}");
            // The next call gets its own reply (Success), on a new stream,
            // even once the late Conflict has been sent.
            tokio::time::sleep(Duration::from_millis(2_200)).await;
            let second = append(&mut link, TTL).await?;
            assert!(
                matches!(second, AppendEntriesResponse::Success),
                "{second:?}"
            );
            assert_eq!(peer.opens.load(Ordering::SeqCst), 2);
            Ok(())
        })
        .await?
    }

    /// The commit clamp is wired into every AppendEntries: a commit-only
    /// message never tells a follower more than the local log holds on disk
    /// (it waits for the sync a bounded time, then is capped).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_index_sent_is_capped_at_the_durable_log() -> TestResult {
        use openraft::storage::RaftLogStorageExt;
        use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

        let dir = tempfile::tempdir()?;
        let (mut log, _sm) = latchkey_storage::open(dir.path(), Default::default())?;
        let id = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
        let entries: Vec<Entry<TypeConfig>> = (1..=3)
            .map(|i| Entry {
                log_id: id(i),
                payload: EntryPayload::Blank,
            })
            .collect();
        log.blocking_append(entries).await?;
        let peer = Arc::new(FakePeer::default());
        let addr = serve(Arc::clone(&peer)).await?;
        let mut link = PeerNetwork::new(log.durable())
            .new_client(2, &BasicNode::new(addr.to_string()))
            .await;
        for commit in [Some(2), Some(3), Some(5), None] {
            let rpc = AppendEntriesRequest {
                leader_commit: commit.map(id),
                ..heartbeat()
            };
            let reply = link.append_entries(rpc, RPCOption::new(TTL)).await?;
            assert!(matches!(reply, AppendEntriesResponse::Success));
        }
        assert_eq!(*lock(&peer.commits), vec![Some(2), Some(3), Some(3), None]);
        Ok(())
    }
}
