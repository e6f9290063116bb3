//! Raft transport to peers over gRPC: one cached HTTP/2 channel per peer,
//! and on it a few long-lived streams that carry AppendEntries.
//!
//! Every request names its addressee (node id and the data-directory
//! incarnation the membership records, see `latchkey_storage::Member`) and
//! its sender; the peer refuses one addressed to another incarnation of
//! itself. Such a refusal reads as "unreachable" to openraft (it backs off)
//! and is reported in status as a peer problem.
//!
//! Replication and heartbeats go through openraft 0.10's `stream_append`,
//! pipelined on a stream taken from the peer's pool
//! ([`crate::append_pipeline`]); the follower serves every stream the same
//! way (`crate::append_stream`). Votes, pre-votes, hand-overs and
//! snapshots (in chunks) speak openraft's v1 network protocol, wrapped by
//! `openraft_legacy`'s `Adapter`. Vote requests travel as
//! [`latchkey_storage::types::VoteWire`] plus the message's
//! `leadership_transfer` flag, so their payload keeps its pinned bytes.
//!
//! **A follower whose log went backwards is refused, never followed.**
//! openraft asserts (and so, in a debug build, panics the leader's core)
//! when a follower that had acknowledged entries up to some index later
//! reports a conflict at or below it: that follower lost acknowledged state
//! (a restored backup, a disk that lied). Each peer therefore remembers,
//! per leader vote, the highest log id it acknowledged; such a conflict is
//! turned into an "unreachable" error, logged, reported in status, and
//! every later call to that incarnation is refused the same way. The leader
//! keeps serving with the others; the operator repairs the follower
//! (README: "Replacing a failed disk or node").

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{FutureExt, StreamExt};

use latchkey_core::codec;
use latchkey_proto::v1::RaftMessage;
use latchkey_storage::types::{LogId, Vote, VoteWire};
use latchkey_storage::Member;
use latchkey_storage::TypeConfig;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::decompose::DecomposeResult;
use openraft::error::{
    NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendError,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft_legacy::network_v1::{
    Adapter, InstallSnapshotError, InstallSnapshotRequest, InstallSnapshotResponse, RaftNetwork,
};
use prost::bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

use crate::append_pipeline::{self, AppendStream, Lane, Sent};
use crate::peer_auth::{PeerClient, PeerCredentials, SharedCredentials};

/// Idle AppendEntries streams kept per peer. openraft has at most a few
/// AppendEntries out to one follower at a time (its replication task's
/// call, and a leadership check's heartbeat); a stream beyond this is
/// closed after its call.
const MAX_IDLE_STREAMS: usize = 4;

type PeerMap = BTreeMap<(u64, String, u64), Arc<Peer>>;

/// Creates [`PeerLink`]s, sharing one channel and one pool of AppendEntries
/// streams per (node id, address).
#[derive(Clone, Default)]
pub struct PeerNetwork {
    peers: Arc<Mutex<PeerMap>>,
    /// This replica's node id and incarnation, sent with every request.
    me: u64,
    my_incarnation: u64,
    /// Sent with every peer call (see [`crate::peer_auth`]).
    credentials: SharedCredentials,
}

impl PeerNetwork {
    /// The network of replica `me` (of data directory `my_incarnation`),
    /// calling its peers with `credentials`.
    pub fn new(me: u64, my_incarnation: u64, credentials: PeerCredentials) -> Self {
        PeerNetwork {
            me,
            my_incarnation,
            credentials: Arc::new(credentials),
            ..PeerNetwork::default()
        }
    }

    /// What this replica calls its peers with.
    pub(crate) fn credentials(&self) -> &PeerCredentials {
        &self.credentials
    }

    fn peer(&self, target: u64, node: &Member) -> Arc<Peer> {
        let mut map = lock(&self.peers);
        let key = (target, node.peer_addr.clone(), node.incarnation);
        if let Some(peer) = map.get(&key) {
            return Arc::clone(peer);
        }
        let peer = Arc::new(Peer {
            target,
            incarnation: node.incarnation,
            me: self.me,
            my_incarnation: self.my_incarnation,
            channel: self
                .credentials
                .channel(&node.peer_addr)
                .map_err(|e| e.to_string()),
            credentials: Arc::clone(&self.credentials),
            idle: Mutex::new(Vec::new()),
            matched: Mutex::new(None),
            problem: Mutex::new(None),
        });
        map.insert(key, Arc::clone(&peer));
        peer
    }

    /// One line per peer this replica refuses (its log went backwards) or
    /// that refuses this replica (addressed with a stale incarnation).
    pub(crate) fn problems(&self) -> Vec<String> {
        lock(&self.peers)
            .values()
            .filter_map(|p| lock(&p.problem).as_ref().map(|why| why.text()))
            .collect()
    }
}

/// Why a peer is not replicated to.
#[derive(Debug, Clone)]
enum Problem {
    /// Its log went backwards: refused until it is re-added.
    Reverted(String),
    /// It refused our last message; cleared by its next answer.
    Refuses(String),
}

impl Problem {
    fn text(&self) -> String {
        match self {
            Problem::Reverted(t) | Problem::Refuses(t) => t.clone(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What openraft calls a peer through: a [`PeerLink`] (openraft's v1
/// network protocol) behind `openraft_legacy`'s adapter, which sends
/// snapshots, read from their files, in chunks; pre-votes, which the v1
/// protocol lacks, go to the link directly.
pub struct PeerConnection {
    adapter: Adapter<TypeConfig, PeerLink, tokio::fs::File>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: u64, node: &Member) -> PeerConnection {
        PeerConnection {
            adapter: Adapter::new(PeerLink {
                peer: self.peer(target, node),
            }),
        }
    }
}

impl PeerConnection {
    /// The link to the peer (tests of the link alone).
    #[cfg(test)]
    fn into_inner(self) -> PeerLink {
        self.adapter.into_inner()
    }
}

impl RaftNetworkV2<TypeConfig> for PeerConnection {
    type SnapshotData = tokio::fs::File;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.adapter.append_entries(rpc, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.adapter.vote(rpc, option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.adapter.inner_mut().pre_vote(rpc, option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: latchkey_storage::types::Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.adapter
            .full_snapshot(vote, snapshot, cancel, option)
            .await
    }

    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.adapter.transfer_leader(rpc, option).await
    }

    fn backoff(&self) -> Option<Backoff> {
        self.adapter.backoff()
    }

    /// Replication and heartbeats, pipelined on a pooled stream
    /// ([`crate::append_pipeline`]).
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, AppendReply>, RPCError<TypeConfig>>>
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        let peer = Arc::clone(&self.adapter.inner_mut().peer);
        Box::pin(async move {
            let (pipeline, _reused) = Peer::pipeline(&peer, input, option.hard_ttl()).await?;
            let replies: BoxStream<'s, AppendReply> = Box::pin(pipeline);
            Ok(replies)
        })
    }
}

/// One reply of a pipelined replication stream, as openraft reads it.
type AppendReply = append_pipeline::Reply;

/// An error of openraft's v2 network API as its v1 API returns it.
fn widen(e: RPCError<TypeConfig>) -> RPCError<TypeConfig, RaftError<TypeConfig>> {
    match e {
        RPCError::Timeout(e) => RPCError::Timeout(e),
        RPCError::Unreachable(e) => RPCError::Unreachable(e),
        RPCError::Network(e) => RPCError::Network(e),
        RPCError::RemoteError(e) => match e.source {},
    }
}

impl Lane for Peer {
    fn address(&self, payload: Bytes) -> RaftMessage {
        self.message(payload)
    }

    fn settle(
        &self,
        sent: &Sent,
        reply: &[u8],
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        // Found reverted meanwhile (by another call): refused from now on.
        self.refuse_if_reverted::<openraft::error::Infallible>()
            .decompose_infallible()?;
        self.answered();
        let response = self
            .decode_reply::<AppendEntriesResponse<TypeConfig>, openraft::error::Infallible>(reply)
            .decompose_infallible()?;
        match self.guard(sent, &response) {
            Some(why) => Err(RPCError::Unreachable(Unreachable::new(&LinkError(why)))),
            None => Ok(response),
        }
    }

    fn stream_error(&self, status: &tonic::Status) -> RPCError<TypeConfig> {
        Err::<(), _>(status_error::<openraft::error::Infallible>(self, status))
            .decompose_infallible()
            .err()
            .unwrap_or_else(|| self.broken(status.message()))
    }

    fn broken(&self, why: &str) -> RPCError<TypeConfig> {
        RPCError::Network(NetworkError::new(&LinkError(format!(
            "node {}: {why}",
            self.target
        ))))
    }

    fn misbehaved(&self, why: &str) -> RPCError<TypeConfig> {
        let why = format!("node {}: {why}", self.target);
        tracing::warn!("{why}");
        RPCError::Unreachable(Unreachable::new(&LinkError(why)))
    }

    fn give_back(&self, stream: AppendStream) {
        Peer::give_back(self, stream);
    }
}

/// The Raft transport to one peer.
///
/// AppendEntries go as messages on long-lived `AppendEntriesStream`s,
/// shared by every link to the peer: a pipeline (openraft's
/// `stream_append`: replication, heartbeats; or a single `append_entries`)
/// takes an idle stream (or opens one), holds it while it runs, and gives
/// it back once every request it sent was answered. A heartbeat so costs
/// one HTTP/2 DATA frame each way instead of a new HTTP/2 stream (headers,
/// a body task, a second write). A stream that fails or times out is
/// dropped, so a late reply can never answer a later request; an idle
/// stream whose end already arrived is not taken, and a single call whose
/// idle stream turns out dead tries the next one, then a new one, within
/// its deadline. Votes and snapshots are unary calls.
pub struct PeerLink {
    peer: Arc<Peer>,
}

/// What every link to one peer shares.
struct Peer {
    target: u64,
    /// The peer's incarnation as the membership records it.
    incarnation: u64,
    /// This replica, as the sender of every request.
    me: u64,
    my_incarnation: u64,
    channel: Result<Channel, String>,
    credentials: SharedCredentials,
    idle: Mutex<Vec<AppendStream>>,
    /// The highest log id the peer acknowledged, under which leader vote.
    matched: Mutex<Option<(Vote, LogId)>>,
    problem: Mutex<Option<Problem>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct LinkError(String);

type RpcResult<T, E> = Result<T, RPCError<TypeConfig, RaftError<TypeConfig, E>>>;

fn status_error<E: std::error::Error>(
    peer: &Peer,
    status: &tonic::Status,
) -> RPCError<TypeConfig, RaftError<TypeConfig, E>> {
    let target = peer.target;
    let e = LinkError(format!("node {target}: {}", status.message()));
    match status.code() {
        // Unreachable makes openraft back off; a peer without the stream
        // (UNIMPLEMENTED) would otherwise be asked again at every heartbeat.
        tonic::Code::Unavailable | tonic::Code::Unimplemented => {
            RPCError::Unreachable(Unreachable::new(&e))
        }
        // The peer is not the incarnation we address: back off, report.
        tonic::Code::FailedPrecondition => {
            let text = format!("node {target} refuses this replica: {}", status.message());
            let mut problem = lock(&peer.problem);
            if !matches!(&*problem, Some(Problem::Refuses(t)) if *t == text) {
                tracing::warn!("{text}");
            }
            *problem = Some(Problem::Refuses(text));
            RPCError::Unreachable(Unreachable::new(&e))
        }
        _ => RPCError::Network(NetworkError::new(&e)),
    }
}

impl Peer {
    /// A request message addressed to this peer.
    fn message(&self, payload: Bytes) -> RaftMessage {
        RaftMessage {
            payload,
            to_id: self.target,
            to_incarnation: self.incarnation,
            from_id: self.me,
            from_incarnation: self.my_incarnation,
            leadership_transfer: false,
        }
    }

    /// The peer answered: whatever it refused before, it takes us now.
    fn answered(&self) {
        let mut problem = lock(&self.problem);
        if matches!(&*problem, Some(Problem::Refuses(_))) {
            *problem = None;
        }
    }

    /// Refuse calls to a peer whose log went backwards.
    // The error type is openraft's, as `RaftNetwork` returns it.
    #[allow(clippy::result_large_err)]
    fn refuse_if_reverted<E: std::error::Error>(&self) -> RpcResult<(), E> {
        match &*lock(&self.problem) {
            Some(Problem::Reverted(why)) => Err(RPCError::Unreachable(Unreachable::new(
                &LinkError(why.clone()),
            ))),
            _ => Ok(()),
        }
    }

    /// Record that the peer acknowledged everything up to `upto` under the
    /// leader `vote`.
    fn acknowledged(&self, vote: &Vote, upto: Option<LogId>) {
        let Some(upto) = upto else { return };
        let mut matched = lock(&self.matched);
        match &mut *matched {
            Some((v, m)) if v == vote => {
                if upto > *m {
                    *m = upto;
                }
            }
            _ => *matched = Some((*vote, upto)),
        }
    }

    /// Whether a conflict at `prev` under `vote` means the peer lost
    /// entries it had acknowledged to this leader; if so, refuse it from now
    /// on and say why.
    fn reverted(&self, vote: &Vote, prev: Option<LogId>) -> Option<String> {
        let matched = *lock(&self.matched);
        let (v, m) = matched?;
        if v != *vote || prev.is_some_and(|p| p.index > m.index) {
            return None;
        }
        let why = format!(
            "node {} (incarnation {}) lost log entries it had acknowledged: it matched up to \
             {m} and now lacks {}. It is refused until it is repaired (README: \"Replacing a \
             failed disk or node\")",
            self.target,
            self.incarnation,
            prev.map_or("the start of the log".to_string(), |p| p.to_string()),
        );
        tracing::error!("{why}");
        *lock(&self.problem) = Some(Problem::Reverted(why.clone()));
        Some(why)
    }

    /// Keep the reversion guard's books for the peer's `response` to
    /// `sent`; `Some(why)` when the response shows the peer lost entries it
    /// had acknowledged (it is refused from now on).
    fn guard(&self, sent: &Sent, response: &AppendEntriesResponse<TypeConfig>) -> Option<String> {
        match response {
            AppendEntriesResponse::Success => self.acknowledged(&sent.vote, sent.last),
            AppendEntriesResponse::PartialSuccess(upto) => {
                // Only a prefix of what was sent can be acknowledged.
                if !sent.covers(*upto) {
                    return Some(format!(
                        "node {} acknowledged {upto:?} of entries {:?}..={:?}",
                        self.target, sent.prev, sent.last
                    ));
                }
                self.acknowledged(&sent.vote, *upto)
            }
            AppendEntriesResponse::Conflict => return self.reverted(&sent.vote, sent.prev),
            AppendEntriesResponse::HigherVote(_) => {}
        }
        None
    }

    /// The peer's reply `payload`: openraft's result, encoded.
    // The error type is openraft's, as `RaftNetwork` returns it.
    #[allow(clippy::result_large_err)]
    fn decode_reply<Resp, E>(&self, payload: &[u8]) -> RpcResult<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let result: Result<Resp, RaftError<TypeConfig, E>> =
            codec::decode(payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }

    fn client(&self) -> Result<PeerClient, Unreachable<TypeConfig>> {
        match &self.channel {
            Ok(c) => Ok(self.credentials.client(c.clone())),
            Err(e) => Err(Unreachable::new(&LinkError(format!(
                "bad address for node {}: {e}",
                self.target
            )))),
        }
    }

    /// An idle stream whose HTTP/2 stream is still open, if any. A stream
    /// the peer ended (it restarted, or refused a request) has its end
    /// waiting in its replies, or its sending side closed.
    fn take_idle(&self) -> Option<AppendStream> {
        let mut idle = lock(&self.idle);
        while let Some(mut stream) = idle.pop() {
            let ended = stream.replies.next().now_or_never().is_some();
            if !ended && !stream.requests.is_closed() {
                return Some(stream);
            }
        }
        None
    }

    fn give_back(&self, stream: AppendStream) {
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE_STREAMS {
            idle.push(stream);
        }
    }

    async fn open_stream(&self) -> Result<AppendStream, RPCError<TypeConfig>> {
        let mut client = self.client().map_err(RPCError::Unreachable)?;
        let (requests, outgoing) = mpsc::unbounded_channel();
        match client
            .append_entries_stream(UnboundedReceiverStream::new(outgoing))
            .await
        {
            Ok(response) => Ok(AppendStream {
                requests,
                replies: response.into_inner(),
            }),
            Err(status) => Err(self.stream_error(&status)),
        }
    }

    /// A pipeline of `input` to `peer` on an idle stream (reused: true) or
    /// a new one, opened within `ttl`.
    async fn pipeline<S>(
        peer: &Arc<Peer>,
        input: S,
        ttl: Duration,
    ) -> Result<(append_pipeline::Pipeline<Peer, S>, bool), RPCError<TypeConfig>>
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        peer.refuse_if_reverted::<openraft::error::Infallible>()
            .decompose_infallible()?;
        let (stream, reused) = match peer.take_idle() {
            Some(stream) => (stream, true),
            None => match tokio::time::timeout(ttl, peer.open_stream()).await {
                Ok(opened) => (opened?, false),
                Err(_elapsed) => return Err(peer.broken("append-entries stream did not open")),
            },
        };
        let pipeline = append_pipeline::stream_append(Arc::clone(peer), stream, input, ttl);
        Ok((pipeline, reused))
    }
}

impl PeerLink {
    /// A unary call: `request` encoded as the payload; `leadership_transfer`
    /// set on the message (vote requests only).
    async fn call<Req, Resp, E>(
        &self,
        kind: Rpc,
        request: &Req,
        leadership_transfer: bool,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let reply = self
            .unary(kind, request, leadership_transfer, option)
            .await?
            .map_err(|status| status_error(&self.peer, &status))?;
        self.peer.answered();
        self.decode_reply(&reply.payload)
    }

    /// Send one unary call and return the peer's reply message or its gRPC
    /// status; the outer error: the call could not be sent.
    async fn unary<Req: Serialize, E: std::error::Error>(
        &self,
        kind: Rpc,
        request: &Req,
        leadership_transfer: bool,
        option: &RPCOption,
    ) -> RpcResult<Result<RaftMessage, tonic::Status>, E> {
        let payload =
            codec::encode(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = self.peer.client()?;
        let mut message = self.peer.message(payload.into());
        message.leadership_transfer = leadership_transfer;
        let mut req = tonic::Request::new(message);
        req.set_timeout(option.hard_ttl());
        let reply = match kind {
            Rpc::Vote => client.vote(req).await,
            Rpc::PreVote => client.pre_vote(req).await,
            Rpc::Snapshot => client.install_snapshot(req).await,
            Rpc::TransferLeader => client.transfer_leader(req).await,
        };
        Ok(reply.map(tonic::Response::into_inner))
    }

    /// Would the peer grant `rpc` (openraft's pre-vote; see the proto's
    /// `Raft.PreVote`)? Only its answer is a grant: a peer that cannot be
    /// reached, or does not know the call (UNIMPLEMENTED: a member address
    /// that points at some other gRPC server), is an error, so a replica
    /// cut off from the others never starts an election it could not win.
    /// Every build of this protocol answers the call; a cluster is upgraded
    /// all at once (docs/decisions/openraft-0.10.md), so no peer without it
    /// is waited for.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let (wire, leadership_transfer) = VoteWire::split(rpc);
        let reply = self
            .unary::<_, openraft::error::Infallible>(
                Rpc::PreVote,
                &wire,
                leadership_transfer,
                &option,
            )
            .await
            .decompose_infallible()?;
        match reply {
            Ok(reply) => {
                self.peer.answered();
                self.decode_reply::<_, openraft::error::Infallible>(&reply.payload)
                    .decompose_infallible()
            }
            Err(status) => Err(status_error::<openraft::error::Infallible>(
                &self.peer, &status,
            ))
            .decompose_infallible(),
        }
    }

    // The error type is openraft's, as `RaftNetwork` returns it.
    #[allow(clippy::result_large_err)]
    fn decode_reply<Resp, E>(&self, payload: &[u8]) -> RpcResult<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        self.peer.decode_reply(payload)
    }
}

/// The unary Raft RPCs (AppendEntries travels on streams only).
enum Rpc {
    Vote,
    PreVote,
    Snapshot,
    TransferLeader,
}

impl RaftNetwork<TypeConfig> for PeerLink {
    /// One AppendEntries as a pipeline of one request. A stream taken from
    /// the pool may have been ended by the peer (a replica stopping ends
    /// its streams) without the end having arrived yet: if it ends before
    /// its reply, or the request cannot be sent on it, the call moves on
    /// to the next one, then to a new one, within its time (at most the
    /// pool's streams and one new one: a new stream's failure is the
    /// answer). A stream that fails with an error status (a reset
    /// connection among them) is the call's answer, as a refusal is.
    /// Resending is safe: an AppendEntries a follower already took is
    /// taken again the same way.
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<TypeConfig>, openraft::error::Infallible> {
        let ttl = option.hard_ttl();
        let deadline = tokio::time::Instant::now() + ttl;
        let last = rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id);
        let call = async {
            loop {
                let input = futures::stream::iter([rpc.clone()]);
                let (mut pipeline, reused) = Peer::pipeline(&self.peer, input, ttl).await?;
                match pipeline.next().await {
                    Some(Ok(result)) => {
                        // Lets the pipeline give its stream back.
                        let _ = pipeline.next().await;
                        return Ok(match result {
                            Ok(upto) if upto == last => AppendEntriesResponse::Success,
                            Ok(upto) => AppendEntriesResponse::PartialSuccess(upto),
                            Err(StreamAppendError::Conflict(_)) => AppendEntriesResponse::Conflict,
                            Err(StreamAppendError::HigherVote(v)) => {
                                AppendEntriesResponse::HigherVote(v)
                            }
                        });
                    }
                    // Only a closed stream is tried again: a refusal, a bad
                    // reply or a late one is the call's answer.
                    Some(Err(_)) if reused && pipeline.closed() => continue,
                    Some(Err(e)) => return Err(e),
                    None => return Err(self.peer.broken("append-entries stream ended")),
                }
            }
        };
        match tokio::time::timeout_at(deadline, call).await {
            Ok(result) => result.map_err(widen),
            Err(_elapsed) => Err(RPCError::Network(NetworkError::new(&LinkError(format!(
                "node {}: append-entries timed out after {ttl:?}",
                self.peer.target
            ))))),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<TypeConfig>, InstallSnapshotError> {
        self.peer.refuse_if_reverted()?;
        let result = self.call(Rpc::Snapshot, &rpc, false, &option).await;
        if rpc.done && result.is_ok() {
            self.peer.acknowledged(&rpc.vote, rpc.meta.last_log_id);
        }
        result
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<TypeConfig>, openraft::error::Infallible> {
        let (wire, leadership_transfer) = VoteWire::split(rpc);
        self.call(Rpc::Vote, &wire, leadership_transfer, &option)
            .await
    }

    /// Sent to every member when this leader hands leadership over; a peer
    /// that does not know the call (UNIMPLEMENTED) is unreachable for it.
    async fn transfer_leader(
        &mut self,
        rpc: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.peer
            .refuse_if_reverted::<openraft::error::Infallible>()
            .decompose_infallible()?;
        self.call::<_, _, openraft::error::Infallible>(Rpc::TransferLeader, &rpc, false, &option)
            .await
            .decompose_infallible()
    }
}

#[cfg(test)]
mod tests {
    //! The link's stream against a fake peer: order, reuse, recovery after
    //! a broken stream, a late reply never answering a later call, a peer
    //! without the stream refused cleanly, and the reversion guard.

    use std::net::SocketAddr;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::Stream;
    use latchkey_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
    use tokio::net::TcpListener;
    use tonic::{Request, Response, Status};

    use super::*;

    type Reply = Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>;

    /// How the fake peer behaves.
    #[derive(Default)]
    struct FakePeer {
        /// Answer `AppendEntriesStream` with UNIMPLEMENTED.
        no_stream: bool,
        /// End each stream after this many replies (0: never).
        close_after: usize,
        /// End each stream when request number this (from 1) arrives,
        /// without answering it, as a stopping replica does (0: never).
        end_unanswered_at: usize,
        /// Hold the first stream request for 2 s, then answer it `Conflict`.
        slow_first: bool,
        /// Answer `Conflict` to every streamed request whose previous log
        /// index is at or above this (a follower whose log ends below it);
        /// 0: never.
        lacks_from: AtomicU64,
        /// Answer `Conflict` to a request from the log's start (no
        /// follower does).
        conflict_at_start: bool,
        /// On each stream, read this many requests before answering any
        /// (then answer them in order): only a pipelined sender gets
        /// replies.
        hold_first: usize,
        /// Wait this long before each reply.
        reply_delay: Duration,
        /// Answer every request `PartialSuccess` up to this log id.
        partial: Option<LogId>,
        /// Answer with a payload that is no reply.
        garbage: AtomicBool,
        opens: AtomicUsize,
        streamed: AtomicUsize,
    }

    fn encode_reply(reply: &Reply) -> Result<RaftMessage, Status> {
        codec::encode(reply)
            .map(|p| RaftMessage {
                payload: p.into(),
                ..RaftMessage::default()
            })
            .map_err(|e| Status::internal(e.to_string()))
    }

    /// The gRPC service of a [`FakePeer`].
    struct Fake(Arc<FakePeer>);

    #[tonic::async_trait]
    impl RaftRpc for Fake {
        async fn append_entries_stream(
            &self,
            request: Request<tonic::Streaming<RaftMessage>>,
        ) -> Result<
            Response<Pin<Box<dyn Stream<Item = Result<RaftMessage, Status>> + Send + 'static>>>,
            Status,
        > {
            if self.0.no_stream {
                return Err(Status::unimplemented("no stream here"));
            }
            let opened = self.0.opens.fetch_add(1, Ordering::SeqCst);
            let peer = Arc::clone(&self.0);
            let held = std::collections::VecDeque::new();
            let replies = futures::stream::unfold(
                (request.into_inner(), 0usize, held),
                move |(mut incoming, answered, mut held)| {
                    let peer = Arc::clone(&peer);
                    async move {
                        if peer.close_after > 0 && answered == peer.close_after {
                            return None;
                        }
                        if answered == 0 && held.is_empty() {
                            for _ in 0..peer.hold_first {
                                held.push_back(incoming.message().await.ok()??);
                            }
                        }
                        let message = match held.pop_front() {
                            Some(message) => message,
                            None => incoming.message().await.ok()??,
                        };
                        if answered + 1 == peer.end_unanswered_at {
                            return None;
                        }
                        let rpc: AppendEntriesRequest<TypeConfig> =
                            codec::decode(&message.payload).ok()?;
                        let n = peer.streamed.fetch_add(1, Ordering::SeqCst);
                        let from = peer.lacks_from.load(Ordering::SeqCst);
                        let lacks = from > 0 && rpc.prev_log_id.is_some_and(|p| p.index >= from);
                        tokio::time::sleep(peer.reply_delay).await;
                        let reply = if let Some(upto) = peer.partial {
                            Ok(AppendEntriesResponse::PartialSuccess(Some(upto)))
                        } else if peer.slow_first && opened == 0 && n == 0 {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            Ok(AppendEntriesResponse::Conflict)
                        } else if lacks || (peer.conflict_at_start && rpc.prev_log_id.is_none()) {
                            Ok(AppendEntriesResponse::Conflict)
                        } else {
                            Ok(AppendEntriesResponse::Success)
                        };
                        let message = if peer.garbage.load(Ordering::SeqCst) {
                            Ok(RaftMessage {
                                payload: vec![0xff; 3].into(),
                                ..RaftMessage::default()
                            })
                        } else {
                            encode_reply(&reply)
                        };
                        Some((message, (incoming, answered + 1, held)))
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

        async fn transfer_leader(
            &self,
            _: Request<RaftMessage>,
        ) -> Result<Response<RaftMessage>, Status> {
            Err(Status::unimplemented("transfer_leader"))
        }
        async fn pre_vote(&self, _: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
            Err(Status::unimplemented("pre_vote"))
        }

        async fn identify(
            &self,
            _: Request<latchkey_proto::v1::IdentifyRequest>,
        ) -> Result<Response<latchkey_proto::v1::IdentifyReply>, Status> {
            Err(Status::unimplemented("identify"))
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
            .new_client(2, &Member::new(addr.to_string(), "", 0))
            .await
            .into_inner()
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
    ) -> RpcResult<AppendEntriesResponse<TypeConfig>, openraft::error::Infallible> {
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
                    .new_client(2, &Member::new(addr.to_string(), "", 0))
                    .await
                    .into_inner();
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
                .new_client(2, &Member::new(addr.to_string(), "", 0))
                .await
                .into_inner();
            append(&mut link, TTL).await?;
            assert_eq!(peer.opens.load(Ordering::SeqCst), opens);
            Ok(())
        })
        .await?
    }

    #[tokio::test]
    async fn a_pre_vote_is_granted_only_by_a_peer_that_answers_it() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let rpc = VoteRequest::<TypeConfig>::new(Vote::new(5, 1), None);
            // The fake peer answers UNIMPLEMENTED, as any gRPC server
            // without the call does: no grant.
            let (_peer, mut link) = linked(FakePeer::default()).await?;
            let unknown = link.pre_vote(rpc.clone(), RPCOption::new(TTL)).await;
            assert!(
                matches!(unknown, Err(RPCError::Unreachable(_))),
                "{unknown:?}"
            );
            // Nobody at the address: an error, never a grant (or a node
            // alone would grant itself a majority).
            let nobody = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = nobody.local_addr()?;
            drop(nobody);
            let mut gone = link_to(addr).await;
            let refused = gone.pre_vote(rpc, RPCOption::new(TTL)).await;
            assert!(refused.is_err(), "{refused:?}");
            Ok(())
        })
        .await?
    }

    #[tokio::test]
    async fn a_peer_without_the_stream_is_an_error_not_a_fallback() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let (peer, mut link) = linked(FakePeer {
                no_stream: true,
                ..FakePeer::default()
            })
            .await?;
            // AppendEntries has one transport: nothing else is tried, and
            // openraft backs off (unreachable).
            let refused = append(&mut link, TTL).await;
            assert!(
                matches!(refused, Err(RPCError::Unreachable(_))),
                "{refused:?}"
            );
            assert_eq!(peer.opens.load(Ordering::SeqCst), 0);
            assert_eq!(peer.streamed.load(Ordering::SeqCst), 0);
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
            Ok(())
        })
        .await?
    }

    /// A pooled stream that looked alive but ends at the call's request,
    /// unanswered, is left for a new one, and the call is answered.
    #[tokio::test]
    async fn a_pooled_stream_that_ends_unanswered_is_left_for_a_new_one() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let (peer, mut link) = linked(FakePeer {
                end_unanswered_at: 2,
                ..FakePeer::default()
            })
            .await?;
            // Each call after the first takes the stream the call before it
            // used from the pool; the peer ends it at that request, and the
            // call goes on a new one.
            all_succeed(&mut link, 3).await?;
            assert_eq!(peer.opens.load(Ordering::SeqCst), 3);
            assert_eq!(peer.streamed.load(Ordering::SeqCst), 3);
            Ok(())
        })
        .await?
    }

    /// Only a pooled stream that closed is left for another: a reply that
    /// is no reply is the call's answer, and the request is not sent again.
    #[tokio::test]
    async fn a_bad_reply_on_a_pooled_stream_is_not_sent_again() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let (peer, mut link) = linked(FakePeer::default()).await?;
            all_succeed(&mut link, 1).await?;
            peer.garbage.store(true, Ordering::SeqCst);
            let bad = append(&mut link, TTL).await;
            assert!(matches!(bad, Err(RPCError::Network(_))), "{bad:?}");
            assert_eq!(peer.opens.load(Ordering::SeqCst), 1);
            assert_eq!(peer.streamed.load(Ordering::SeqCst), 2);
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

    /// A follower that acknowledged entries up to index 5 to this leader and
    /// then reports a conflict at or below 5 lost acknowledged state: the
    /// link refuses it (no Conflict reaches openraft, whose core would
    /// assert), reports it, and refuses every later call without sending.
    /// A conflict above what it acknowledged is ordinary backing-up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_whose_log_went_backwards_is_refused_not_followed() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let network = PeerNetwork::default();
            let peer = Arc::new(FakePeer {
                lacks_from: AtomicU64::new(9),
                ..FakePeer::default()
            });
            let addr = serve(Arc::clone(&peer)).await?;
            let mut link = network
                .clone()
                .new_client(2, &Member::new(addr.to_string(), "", 7))
                .await
                .into_inner();
            let at = |prev| AppendEntriesRequest {
                prev_log_id: Some(latchkey_storage::types::log_id(1, 1, prev)),
                ..heartbeat()
            };
            let mut send = async |prev| link.append_entries(at(prev), RPCOption::new(TTL)).await;
            // Before it acknowledged anything, a conflict is backing up.
            assert!(matches!(send(9).await?, AppendEntriesResponse::Conflict));
            assert!(matches!(send(5).await?, AppendEntriesResponse::Success));
            // Above what it acknowledged: still backing up.
            assert!(matches!(send(9).await?, AppendEntriesResponse::Conflict));
            assert!(network.problems().is_empty());
            // It loses everything from index 3 on (a disk that lied).
            peer.lacks_from.store(3, Ordering::SeqCst);
            let refused = send(5).await;
            assert!(
                matches!(refused, Err(RPCError::Unreachable(_))),
                "{refused:?}"
            );
            let problems = network.problems();
            assert!(
                problems.len() == 1 && problems[0].contains("lost log entries"),
                "{problems:?}"
            );
            // From now on it is refused without being asked.
            let asked = peer.streamed.load(Ordering::SeqCst);
            let refused = send(1).await;
            assert!(matches!(refused, Err(RPCError::Unreachable(_))));
            assert_eq!(peer.streamed.load(Ordering::SeqCst), asked);
            // A new incarnation of node 2 (re-added after repair) is a new
            // peer, with nothing held against it.
            let mut fresh = network
                .clone()
                .new_client(2, &Member::new(addr.to_string(), "", 8))
                .await
                .into_inner();
            peer.lacks_from.store(9, Ordering::SeqCst);
            let reply = fresh.append_entries(at(1), RPCOption::new(TTL)).await?;
            assert!(matches!(reply, AppendEntriesResponse::Success));
            Ok::<_, Box<dyn std::error::Error>>(())
        })
        .await?
    }

    /// Requests at `prevs` (no entries), as openraft's replication task
    /// hands them over.
    fn requests_at(
        prevs: impl IntoIterator<Item = u64>,
    ) -> impl futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static
    {
        let requests: Vec<_> = prevs
            .into_iter()
            .map(|prev| AppendEntriesRequest {
                prev_log_id: (prev > 0).then(|| latchkey_storage::types::log_id(1, 1, prev)),
                ..heartbeat()
            })
            .collect();
        futures::stream::iter(requests)
    }

    /// Every result of a pipeline over `input`, until it ends.
    async fn pipeline(
        connection: &mut PeerConnection,
        input: impl futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
        ttl: Duration,
    ) -> Result<Vec<AppendReply>, Box<dyn std::error::Error>> {
        use futures::StreamExt;
        let replies = connection.stream_append(input, RPCOption::new(ttl)).await?;
        Ok(replies.collect().await)
    }

    async fn connect(peer: &Arc<FakePeer>) -> Result<PeerConnection, Box<dyn std::error::Error>> {
        let addr = serve(Arc::clone(peer)).await?;
        Ok(PeerNetwork::default()
            .new_client(2, &Member::new(addr.to_string(), "", 0))
            .await)
    }

    /// The peer answers nothing until it has eight requests: a sender that
    /// waits for each reply before the next (openraft's default) would get
    /// none and time out. Each result answers its request, in order.
    #[tokio::test]
    async fn replication_sends_ahead_of_the_replies_and_reads_them_in_order() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let peer = Arc::new(FakePeer {
                hold_first: 8,
                ..FakePeer::default()
            });
            let mut connection = connect(&peer).await?;
            let results = pipeline(&mut connection, requests_at(1..=8), TTL).await?;
            let acked: Vec<_> = results
                .into_iter()
                .map(|r| match r {
                    Ok(Ok(Some(id))) => Ok(id.index),
                    other => Err(format!("{other:?}")),
                })
                .collect::<Result<_, _>>()?;
            assert_eq!(acked, (1..=8).collect::<Vec<_>>());
            // All answered: the stream went back to the pool, and the next
            // pipeline (a heartbeat is one) takes it instead of opening one.
            let results = pipeline(&mut connection, requests_at([8]), TTL).await?;
            assert!(
                matches!(results.as_slice(), [Ok(Ok(Some(_)))]),
                "{results:?}"
            );
            assert_eq!(peer.opens.load(Ordering::SeqCst), 1);
            Ok(())
        })
        .await?
    }

    /// A conflict is the pipeline's last result; the requests after it
    /// are not reported.
    #[tokio::test]
    async fn a_pipeline_ends_at_a_conflict() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let peer = Arc::new(FakePeer {
                lacks_from: AtomicU64::new(5),
                ..FakePeer::default()
            });
            let mut connection = connect(&peer).await?;
            let results = pipeline(&mut connection, requests_at(1..=8), TTL).await?;
            assert_eq!(results.len(), 5, "{results:?}");
            assert!(results[..4].iter().all(|r| matches!(r, Ok(Ok(Some(_))))));
            assert!(
                matches!(&results[4], Ok(Err(openraft::raft::StreamAppendError::Conflict(id))) if id.index == 5),
                "{:?}",
                results[4]
            );
            Ok(())
        })
        .await?
    }

    /// openraft would panic on a conflict at the log's start; a peer
    /// answering one gets an error instead.
    #[tokio::test]
    async fn a_conflict_at_the_log_start_is_an_error_not_a_panic() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let peer = Arc::new(FakePeer {
                conflict_at_start: true,
                ..FakePeer::default()
            });
            let mut connection = connect(&peer).await?;
            let results = pipeline(&mut connection, requests_at([0, 1]), TTL).await?;
            assert!(
                matches!(results.as_slice(), [Err(RPCError::Unreachable(_))]),
                "{results:?}"
            );
            Ok(())
        })
        .await?
    }

    /// A reply later than the call's time ends the pipeline with an error.
    #[tokio::test]
    async fn a_late_reply_ends_the_pipeline() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let peer = Arc::new(FakePeer {
                slow_first: true,
                ..FakePeer::default()
            });
            let mut connection = connect(&peer).await?;
            let ttl = Duration::from_millis(200);
            let results = pipeline(&mut connection, requests_at(1..=3), ttl).await?;
            assert!(
                matches!(results.as_slice(), [Err(RPCError::Network(_))]),
                "{results:?}"
            );
            Ok(())
        })
        .await?
    }

    /// The reversion guard holds on the pipeline as on single calls.
    #[tokio::test]
    async fn a_follower_whose_log_went_backwards_is_refused_on_the_pipeline() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let peer = Arc::new(FakePeer {
                lacks_from: AtomicU64::new(9),
                ..FakePeer::default()
            });
            let addr = serve(Arc::clone(&peer)).await?;
            let mut network = PeerNetwork::default();
            let mut connection = network
                .new_client(2, &Member::new(addr.to_string(), "", 7))
                .await;
            let results = pipeline(&mut connection, requests_at(1..=5), TTL).await?;
            assert!(results.iter().all(|r| matches!(r, Ok(Ok(Some(_))))));
            peer.lacks_from.store(3, Ordering::SeqCst);
            let results = pipeline(&mut connection, requests_at([4]), TTL).await?;
            assert!(
                matches!(results.as_slice(), [Err(RPCError::Unreachable(_))]),
                "{results:?}"
            );
            assert!(network
                .problems()
                .iter()
                .any(|p| p.contains("lost log entries")));
            // Refused from now on without being asked.
            let refused = connection
                .stream_append(requests_at([1]), RPCOption::new(TTL))
                .await;
            assert!(refused.is_err());
            Ok(())
        })
        .await?
    }

    /// Each reply is due a call's time after the reply before it, not
    /// after its own sending: four requests sent at once, answered 150 ms
    /// apart with 200 ms to answer, all succeed (the fourth comes 600 ms
    /// after it was sent).
    #[tokio::test]
    async fn a_request_queued_behind_others_is_not_charged_for_their_time() -> TestResult {
        tokio::time::timeout(LIMIT, async {
            let peer = Arc::new(FakePeer {
                reply_delay: Duration::from_millis(150),
                ..FakePeer::default()
            });
            let mut connection = connect(&peer).await?;
            let ttl = Duration::from_millis(200);
            let results = pipeline(&mut connection, requests_at(1..=4), ttl).await?;
            assert_eq!(results.len(), 4, "{results:?}");
            assert!(
                results.iter().all(|r| matches!(r, Ok(Ok(Some(_))))),
                "{results:?}"
            );
            Ok(())
        })
        .await?
    }

    /// A partial acknowledgement ends the pipeline (the follower lacks what
    /// the later requests build on); one beyond what was sent is refused.
    #[tokio::test]
    async fn a_partial_acknowledgement_ends_the_pipeline_and_must_be_of_what_was_sent() -> TestResult
    {
        tokio::time::timeout(LIMIT, async {
            let peer = Arc::new(FakePeer {
                partial: Some(latchkey_storage::types::log_id(1, 1, 5)),
                ..FakePeer::default()
            });
            let mut connection = connect(&peer).await?;
            let results = pipeline(&mut connection, requests_at([5, 6, 7]), TTL).await?;
            assert!(
                matches!(results.as_slice(), [Ok(Ok(Some(id)))] if id.index == 5),
                "{results:?}"
            );
            let results = pipeline(&mut connection, requests_at([3]), TTL).await?;
            assert!(
                matches!(results.as_slice(), [Err(RPCError::Unreachable(_))]),
                "{results:?}"
            );
            Ok(())
        })
        .await?
    }

    /// A partial acknowledgement names one of the entries sent (or the one
    /// they follow): a log id between them in order but of another leader
    /// is no prefix of them, and is refused, not recorded as matched.
    #[tokio::test]
    async fn a_partial_acknowledgement_must_name_an_entry_that_was_sent() -> TestResult {
        use latchkey_storage::types::{log_id, Entry};
        let carrying = || {
            let entry = |term, index| Entry {
                log_id: log_id(term, 1, index),
                payload: openraft::EntryPayload::Blank,
            };
            futures::stream::iter([AppendEntriesRequest {
                vote: Vote::new_committed(2, 1),
                prev_log_id: Some(log_id(1, 1, 3)),
                entries: vec![entry(1, 4), entry(2, 5)],
                ..heartbeat()
            }])
        };
        tokio::time::timeout(LIMIT, async {
            // Term 1's entry 7 orders between (1, 4) and (2, 5), but was
            // never sent.
            for (upto, taken) in [(log_id(1, 1, 4), true), (log_id(1, 1, 7), false)] {
                let peer = Arc::new(FakePeer {
                    partial: Some(upto),
                    ..FakePeer::default()
                });
                let mut connection = connect(&peer).await?;
                let results = pipeline(&mut connection, carrying(), TTL).await?;
                if taken {
                    assert!(
                        matches!(results.as_slice(), [Ok(Ok(Some(id)))] if *id == upto),
                        "{results:?}"
                    );
                } else {
                    assert!(
                        matches!(results.as_slice(), [Err(RPCError::Unreachable(_))]),
                        "{results:?}"
                    );
                }
            }
            Ok(())
        })
        .await?
    }
}
