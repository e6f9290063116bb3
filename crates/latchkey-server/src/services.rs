//! The gRPC services a replica serves: Raft transport, KV, admin.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;

use futures::future::join_all;
use futures::Stream;
use latchkey_core::codec;
use latchkey_core::lock::SessionId;
use latchkey_proto::v1::{
    admin_server::Admin, kv_server::Kv, lock_server::Lock, raft_server::Raft as RaftRpc,
    AcquireRequest, AddMemberRequest, AdminReply, CallFrame, ChangeVotersRequest, IdentifyReply,
    IdentifyRequest, KeepAliveRequest, Member, RaftMessage, ReadBatch, ReadRequest, Replies, Reply,
    StatusReply, StatusRequest, WriteBatch, WriteRequest,
};
use latchkey_proto::{ReplicaFailure, MAX_BATCH_ITEMS};
use prost::Message;
use serde::Serialize;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

use crate::replica::Replica;
use crate::MAX_MESSAGE_BYTES;

fn encode_or_status<T: Serialize>(value: &T) -> Result<Vec<u8>, Status> {
    codec::encode(value).map_err(|e| Status::internal(e.to_string()))
}

fn bad_payload(e: codec::CodecError) -> Status {
    Status::invalid_argument(format!("malformed payload: {e}"))
}

/// Replica-to-replica Raft RPCs.
pub struct RaftService {
    pub(crate) replica: Arc<Replica>,
    /// Becomes `true` (or is dropped) when the node stops: open
    /// `AppendEntriesStream`s end then, so they do not hold up the server's
    /// graceful shutdown, which waits for open streams.
    pub(crate) stopping: watch::Receiver<bool>,
}

/// Refuse a Raft message that is not addressed to this very replica: another
/// node id, or another incarnation of this node's data directory (this
/// directory was wiped or replaced since the sender's membership recorded
/// it). Also refuse everything once this replica has failed.
fn check_addressee(replica: &Replica, message: &RaftMessage) -> Result<(), Status> {
    if let Some(cause) = replica.health().failure() {
        return Err(Status::unavailable(format!(
            "this replica has failed: {cause}"
        )));
    }
    if message.to_id != replica.id() || message.to_incarnation != replica.incarnation() {
        return Err(Status::failed_precondition(format!(
            "the message is addressed to node {} incarnation {}, but this is node {} \
             incarnation {}: its data directory is not the member the sender knows \
             (wiped or replaced); add it again with `latchkey members add`",
            message.to_id,
            message.to_incarnation,
            replica.id(),
            replica.incarnation()
        )));
    }
    Ok(())
}

/// A reply message carrying `payload`.
fn raft_reply(payload: Vec<u8>) -> RaftMessage {
    RaftMessage {
        payload: payload.into(),
        ..RaftMessage::default()
    }
}

/// Answer one AppendEntries message of a stream.
async fn append_reply(replica: &Replica, message: &RaftMessage) -> Result<RaftMessage, Status> {
    check_addressee(replica, message)?;
    let rpc = codec::decode(&message.payload).map_err(bad_payload)?;
    let result = replica.raft().append_entries(rpc).await;
    Ok(raft_reply(encode_or_status(&result)?))
}

/// The replies of one `AppendEntriesStream`.
type AppendReplies = Pin<Box<dyn Stream<Item = Result<RaftMessage, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl RaftRpc for RaftService {
    type AppendEntriesStreamStream = AppendReplies;

    /// Requests are answered one at a time, in order. A malformed or
    /// misaddressed request gets its error and
    /// ends the stream (the sender opens a new one); a broken incoming
    /// stream ends it quietly, and so does the node stopping.
    async fn append_entries_stream(
        &self,
        request: Request<Streaming<RaftMessage>>,
    ) -> Result<Response<AppendReplies>, Status> {
        let replica = Arc::clone(&self.replica);
        let start = Some((request.into_inner(), self.stopping.clone()));
        let replies = futures::stream::unfold(start, move |state| {
            let replica = Arc::clone(&replica);
            async move {
                let (mut incoming, mut stopping) = state?;
                let next = tokio::select! {
                    biased;
                    // Ends the stream whether the flag was set or its
                    // sender is gone.
                    _ = stopping.wait_for(|stop| *stop) => return None,
                    next = incoming.message() => next,
                };
                match next {
                    Ok(Some(message)) => {
                        let reply = append_reply(&replica, &message).await;
                        let next = reply.is_ok().then_some((incoming, stopping));
                        Some((reply, next))
                    }
                    Ok(None) => None,
                    Err(status) => {
                        tracing::debug!(%status, "append-entries stream from the leader ended");
                        None
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(replies)))
    }

    /// A vote request is also refused when this replica's membership knows
    /// the candidate's node id with another incarnation: the candidate's
    /// data directory is not the member this replica knows.
    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let message = request.into_inner();
        check_addressee(&self.replica, &message)?;
        if self
            .replica
            .knows(message.from_id, message.from_incarnation)
            == Some(false)
        {
            return Err(Status::failed_precondition(format!(
                "candidate node {} incarnation {} is not the member this replica knows by that id",
                message.from_id, message.from_incarnation
            )));
        }
        let rpc = codec::decode(&message.payload).map_err(bad_payload)?;
        let result = self.replica.raft().vote(rpc).await;
        Ok(Response::new(raft_reply(encode_or_status(&result)?)))
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let message = request.into_inner();
        check_addressee(&self.replica, &message)?;
        let rpc = codec::decode(&message.payload).map_err(bad_payload)?;
        let result = self.replica.raft().install_snapshot(rpc).await;
        Ok(Response::new(raft_reply(encode_or_status(&result)?)))
    }

    async fn identify(
        &self,
        request: Request<IdentifyRequest>,
    ) -> Result<Response<IdentifyReply>, Status> {
        let asker = request.into_inner();
        if let Some(cause) = self.replica.health().failure() {
            return Err(Status::unavailable(format!(
                "this replica has failed: {cause}"
            )));
        }
        Ok(Response::new(IdentifyReply {
            node_id: self.replica.id(),
            incarnation: self.replica.incarnation(),
            // A membership, not merely a vote: a replica that granted a vote
            // to a leader who never replicated anything is not in a cluster
            // (nothing can have been committed without a majority holding
            // the membership entry).
            initialized: self.replica.has_membership(),
            knows_you: self
                .replica
                .knows(asker.from_id, asker.from_incarnation)
                .unwrap_or(false),
        }))
    }
}

/// Client-facing key-value service.
pub struct KvService {
    pub(crate) replica: Arc<Replica>,
    /// As [`RaftService::stopping`], for open `Calls` streams.
    pub(crate) stopping: watch::Receiver<bool>,
}

fn reply(result: Result<latchkey_core::CommandResult, ReplicaFailure>) -> Result<Reply, Status> {
    Ok(match result {
        Ok(r) => Reply {
            payload: encode_or_status(&r)?,
            failure: None,
        },
        Err(f) => Reply {
            payload: Vec::new(),
            failure: Some(f.into()),
        },
    })
}

fn invalid(e: codec::CodecError) -> Reply {
    Reply {
        payload: Vec::new(),
        failure: Some(ReplicaFailure::InvalidArgument(format!("malformed request: {e}")).into()),
    }
}

/// A batch item's reply, or `failure` in its place if the result cannot be
/// encoded (the item was still executed when `failure` says so).
fn item_reply(
    result: Result<latchkey_core::CommandResult, ReplicaFailure>,
    failure: fn(String) -> ReplicaFailure,
) -> Reply {
    match reply(result) {
        Ok(r) => r,
        Err(status) => Reply {
            payload: Vec::new(),
            failure: Some(
                failure(format!("cannot encode the result: {}", status.message())).into(),
            ),
        },
    }
}

/// The reply of a batch or stream item whose call ended with `status`.
pub(crate) fn status_reply(status: &Status, failure: fn(String) -> ReplicaFailure) -> Reply {
    item_reply(Err(failure(status.message().to_string())), failure)
}

/// Run every item of a batch call as its own unary call would run,
/// concurrently (so writes reach the queue together and reads share a
/// ReadIndex round), and answer each: an item whose call ends with a status
/// gets it as a `failure` reply, and replies beyond the message size become
/// `failure(too_big)`. A batch above [`MAX_BATCH_ITEMS`] runs nothing.
async fn answer_batch<T, F, Fut>(
    items: Vec<T>,
    one: F,
    failure: fn(String) -> ReplicaFailure,
    too_big: &str,
) -> Result<Response<Replies>, Status>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<Reply, Status>>,
{
    check_batch_len(items.len())?;
    let replies = join_all(items.into_iter().map(|item| {
        let call = one(item);
        async move {
            match call.await {
                Ok(r) => r,
                Err(status) => status_reply(&status, failure),
            }
        }
    }))
    .await;
    Ok(Response::new(fit_replies(replies, || {
        failure(too_big.to_string())
    })))
}

fn check_batch_len(items: usize) -> Result<(), Status> {
    if items > MAX_BATCH_ITEMS {
        return Err(Status::invalid_argument(format!(
            "batch has {items} items, the limit is {MAX_BATCH_ITEMS}; nothing was executed"
        )));
    }
    Ok(())
}

/// Room left for the replies of a batch below the message limit, keeping a
/// margin for the framing of `Replies` itself.
pub(crate) const REPLIES_BUDGET: usize = MAX_MESSAGE_BYTES - 64 * 1024;

/// Keep the replies within the message limit: each reply that would push
/// the total past it is replaced by `failure` (in item order, so the
/// earlier items keep theirs).
fn fit_replies(replies: Vec<Reply>, failure: impl Fn() -> ReplicaFailure) -> Replies {
    let mut total = 0usize;
    let replies = replies
        .into_iter()
        .map(|r| {
            // Field tag + length prefix: at most 1 + 10 bytes per item.
            let size = r.encoded_len() + 11;
            if total + size <= REPLIES_BUDGET {
                total += size;
                return r;
            }
            let replaced = Reply {
                payload: Vec::new(),
                failure: Some(failure().into()),
            };
            total += replaced.encoded_len() + 11;
            replaced
        })
        .collect();
    Replies { replies }
}

/// One write, exactly as the `Write` RPC runs it.
pub(crate) async fn write_one(replica: &Replica, command: &[u8]) -> Result<Reply, Status> {
    let command = match codec::decode(command) {
        Ok(c) => c,
        Err(e) => return Ok(invalid(e)),
    };
    reply(replica.write(command).await)
}

/// One read, exactly as the `Read` RPC runs it.
pub(crate) async fn read_one(
    replica: &Replica,
    query: &[u8],
    stale: bool,
) -> Result<Reply, Status> {
    let query = match codec::decode(query) {
        Ok(q) => q,
        Err(e) => return Ok(invalid(e)),
    };
    reply(replica.read(query, stale).await)
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn write(&self, request: Request<WriteRequest>) -> Result<Response<Reply>, Status> {
        Ok(Response::new(
            write_one(&self.replica, &request.into_inner().command).await?,
        ))
    }

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<Reply>, Status> {
        let ReadRequest { query, stale } = request.into_inner();
        Ok(Response::new(read_one(&self.replica, &query, stale).await?))
    }

    async fn write_many(&self, request: Request<WriteBatch>) -> Result<Response<Replies>, Status> {
        // Polled in order, each item reaches the write queue in item order
        // (decoding and validation do not wait), and all of them are queued
        // before the first is proposed, so the queue packs them.
        answer_batch(
            request.into_inner().items,
            |item| async move { write_one(&self.replica, &item.command).await },
            ReplicaFailure::UnknownOutcome,
            "the write was executed but its reply does not fit in this batch's message; \
             send fewer writes per batch",
        )
        .await
    }

    async fn read_many(&self, request: Request<ReadBatch>) -> Result<Response<Replies>, Status> {
        answer_batch(
            request.into_inner().items,
            |item| async move { read_one(&self.replica, &item.query, item.stale).await },
            ReplicaFailure::Unavailable,
            "the reply does not fit in this batch's message; read fewer keys per batch",
        )
        .await
    }

    type CallsStream = crate::calls::CallStream;

    async fn calls(
        &self,
        request: Request<Streaming<CallFrame>>,
    ) -> Result<Response<crate::calls::CallStream>, Status> {
        Ok(Response::new(crate::calls::CallStream::new(
            Arc::clone(&self.replica),
            request.into_inner(),
            self.stopping.clone(),
        )))
    }
}

/// Longest time a replica holds an `Acquire` call while it waits.
pub const MAX_ACQUIRE_HOLD: std::time::Duration = std::time::Duration::from_secs(300);

/// Client-facing lock calls that are not plain writes.
pub struct LockService {
    pub(crate) replica: Arc<Replica>,
}

/// One acquire, exactly as the `Acquire` RPC runs it.
pub(crate) async fn acquire_one(
    replica: &Replica,
    request: AcquireRequest,
) -> Result<Reply, Status> {
    let AcquireRequest { command, hold_ms } = request;
    let command = match codec::decode(&command) {
        Ok(c) => c,
        Err(e) => return Ok(invalid(e)),
    };
    let hold = std::time::Duration::from_millis(hold_ms).min(MAX_ACQUIRE_HOLD);
    reply(replica.acquire(command, hold).await)
}

/// One keep-alive, exactly as the `KeepAlive` RPC runs it.
pub(crate) async fn keep_alive_one(replica: &Replica, session: u64) -> Result<Reply, Status> {
    reply(replica.keep_alive(SessionId(session)).await)
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn acquire(&self, request: Request<AcquireRequest>) -> Result<Response<Reply>, Status> {
        Ok(Response::new(
            acquire_one(&self.replica, request.into_inner()).await?,
        ))
    }

    async fn keep_alive(
        &self,
        request: Request<KeepAliveRequest>,
    ) -> Result<Response<Reply>, Status> {
        Ok(Response::new(
            keep_alive_one(&self.replica, request.into_inner().session).await?,
        ))
    }
}

/// Cluster status and membership changes.
pub struct AdminService {
    pub(crate) replica: Arc<Replica>,
}

fn admin_reply(result: Result<(), ReplicaFailure>) -> Response<AdminReply> {
    Response::new(AdminReply {
        failure: result.err().map(Into::into),
    })
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        let s = self.replica.status();
        Ok(Response::new(StatusReply {
            id: s.id,
            leader_id: s.leader_id.unwrap_or(0),
            leader_addr: s.leader_addr.unwrap_or_default(),
            term: s.term,
            last_applied: s.last_applied,
            last_log_index: s.last_log_index,
            state: s.state,
            members: s
                .members
                .into_iter()
                .map(|m| Member {
                    id: m.id,
                    addr: m.addr,
                    voter: m.voter,
                    incarnation: m.incarnation,
                })
                .collect(),
            snapshot_index: s.snapshot_index,
            detail: s.detail.unwrap_or_default(),
            incarnation: s.incarnation,
            peer_problems: s.peer_problems,
        }))
    }

    async fn add_member(
        &self,
        request: Request<AddMemberRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let AddMemberRequest { id, addr, voter } = request.into_inner();
        let result = crate::membership::add_member(&self.replica, id, &addr, voter).await;
        Ok(admin_reply(result))
    }

    async fn change_voters(
        &self,
        request: Request<ChangeVotersRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let voters: BTreeSet<u64> = request.into_inner().voters.into_iter().collect();
        if voters.is_empty() {
            return Ok(admin_reply(Err(ReplicaFailure::InvalidArgument(
                "the voter set must not be empty".into(),
            ))));
        }
        let result = self
            .replica
            .raft()
            .change_membership(voters, false)
            .await
            .map(|_| ())
            .map_err(|e| crate::membership::failure(&self.replica, e));
        Ok(admin_reply(result))
    }
}
