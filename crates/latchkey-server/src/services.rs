//! The gRPC services a replica serves: the client API (`Kv`, `Lock`, and
//! `Pipeline`, which carries the same calls on one stream, all answered by
//! [`crate::answer::answer`]) and `Admin` (status) on the client listener; the replicas'
//! own `Raft` transport and `Membership` changes on the peer listener.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use latchkey_core::auth::{AuthCommand, AuthOutcome, AuthQuery};
use latchkey_core::codec;
use latchkey_core::{Command, CommandResult, Outcome, Query};
use latchkey_proto::v1::auth_server::Auth as AuthRpc;
use latchkey_proto::v1::{
    self, admin_server::Admin, call::Request as Req, call_reply::Reply as Rep, kv_server::Kv,
    lock_server::Lock, membership_server::Membership, pipeline_server::Pipeline,
    raft_server::Raft as RaftRpc, AddMemberRequest, AdminReply, ChangeVotersRequest, IdentifyReply,
    IdentifyRequest, RaftMessage, StatusReply, StatusRequest,
};
use latchkey_proto::{wire, ReplicaFailure};
use latchkey_storage::TypeConfig;
use openraft::async_runtime::WatchReceiver;
use openraft_legacy::network_v1::{ChunkedSnapshotReceiver, InstallSnapshotRequest};
use serde::Serialize;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

use crate::answer::answer;
use crate::auth::Caller;
use crate::peer_input::candidate::check_candidate_vote;
use crate::peer_input::leader::{
    check_append, check_append_against, check_sender, check_snapshot, check_transfer,
};
use crate::replica::Replica;

fn encode_or_status<T: Serialize>(value: &T) -> Result<Vec<u8>, Status> {
    codec::encode(value).map_err(|e| Status::internal(e.to_string()))
}

/// Refuse a peer's Raft message that failed a `peer_input` check, and say
/// so in the log: a refusal is either a broken member or a check that is
/// wrong, and both need an operator's eye.
fn refuse(message: &RaftMessage, why: String) -> Status {
    tracing::warn!(
        from = message.from_id,
        "{}: {why}",
        crate::REFUSED_PEER_MESSAGE
    );
    Status::invalid_argument(why)
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
    /// TLS is on: every call's certificate must name the node it says it
    /// comes from (see `peer_auth::check_certificate_names`).
    pub(crate) tls: bool,
}

impl RaftService {
    /// A unary message only a leader sends (a snapshot chunk):
    /// its certificate, addressee and sender checked.
    fn leader_message(&self, request: Request<RaftMessage>) -> Result<RaftMessage, Status> {
        self.check_certificate(&request, request.get_ref().from_id)?;
        let message = request.into_inner();
        check_addressee(&self.replica, &message)?;
        check_leader(&self.replica, &message)?;
        Ok(message)
    }

    /// A vote or pre-vote request: its certificate, addressee and
    /// candidate checked ([`check_candidate`]), and openraft's request.
    fn candidate_message(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<openraft::raft::VoteRequest<latchkey_storage::TypeConfig>, Status> {
        self.check_certificate(&request, request.get_ref().from_id)?;
        let message = request.into_inner();
        check_addressee(&self.replica, &message)?;
        check_candidate(&self.replica, &message)?;
        let wire: latchkey_storage::types::VoteWire =
            codec::decode(&message.payload).map_err(bad_payload)?;
        check_candidate_vote(
            &wire.vote,
            wire.last_log_id.as_ref(),
            message.from_id,
            self.replica.id(),
        )
        .map_err(|why| refuse(&message, why))?;
        Ok(wire.join(message.leadership_transfer))
    }

    /// With TLS, refuse a call from `from_id` whose certificate is not
    /// node `from_id`'s.
    fn check_certificate<T>(&self, request: &Request<T>, from_id: u64) -> Result<(), Status> {
        if !self.tls {
            return Ok(());
        }
        let certs = request.peer_certs();
        crate::peer_auth::check_certificate_names(certs.as_deref().map(Vec::as_slice), from_id)
    }
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

/// Refuse a vote request whose candidate is not a member (voter or
/// learner) of this replica's membership with the incarnation the
/// membership records: a forged message from a made-up node, or a wiped
/// replica that is not the member it was and must not gather votes. A
/// replica that holds no membership yet (new, waiting to be added) accepts
/// any sender; the cluster secret still applies.
fn check_candidate(replica: &Replica, message: &RaftMessage) -> Result<(), Status> {
    if !replica.has_membership() {
        return Ok(());
    }
    match replica
        .view()
        .knows(message.from_id, message.from_incarnation)
    {
        Some(true) => Ok(()),
        Some(false) => Err(Status::failed_precondition(format!(
            "node {} incarnation {} is not the member this replica knows by that id \
             (its data directory was wiped or replaced)",
            message.from_id, message.from_incarnation
        ))),
        None => Err(not_a_member(message)),
    }
}

/// Refuse an AppendEntries or InstallSnapshot message from a node id this
/// replica's membership does not list: a forged message from a made-up
/// node, or a leader that removed itself (the followers that hold the
/// removal refuse it and elect a new leader among the members, which is
/// what the removal asked for). A replica that holds no membership yet
/// accepts any sender; the cluster secret still applies.
///
/// A known id with another incarnation than the membership records is let
/// through: only a leader sends these messages, a leader was elected by
/// voters that checked its incarnation ([`check_candidate`]), so this
/// replica's membership is the older one. That is the case of a replica
/// catching up from a snapshot built before the leader's own disk was
/// replaced: the snapshot's membership lists the leader's former
/// incarnation, and the entries that follow it (which record the new one)
/// can only come from that leader. Refusing it would stall the replica for
/// good.
///
/// For the same reason a replica whose membership does not list this very
/// incarnation of itself accepts any sender: it is being added back (its
/// data directory was replaced) and catching up from a snapshot older than
/// its addition, whose membership can even lack the leader altogether (a
/// snapshot built while the leader itself was being replaced, between the
/// removal of its former incarnation and the addition of its new one). The
/// leader's later entries, which only it can send, bring the membership up
/// to date; votes keep the full check ([`check_candidate`]).
fn check_leader(replica: &Replica, message: &RaftMessage) -> Result<(), Status> {
    if !replica.has_membership() {
        return Ok(());
    }
    let view = replica.view();
    if view.knows(replica.id(), replica.incarnation()) != Some(true) {
        return Ok(());
    }
    match view.knows(message.from_id, message.from_incarnation) {
        Some(_) => Ok(()),
        None => Err(not_a_member(message)),
    }
}

fn not_a_member(message: &RaftMessage) -> Status {
    Status::permission_denied(format!(
        "node {} is not a member of this replica's cluster",
        message.from_id
    ))
}

/// A reply message carrying `payload`.
fn raft_reply(payload: Vec<u8>) -> RaftMessage {
    RaftMessage {
        payload: payload.into(),
        ..RaftMessage::default()
    }
}

/// One AppendEntries message of a stream, checked: addressee, sender,
/// payload, and the request against this replica's vote and commit.
fn append_request(
    replica: &Replica,
    message: &RaftMessage,
) -> Result<openraft::raft::AppendEntriesRequest<TypeConfig>, Status> {
    check_addressee(replica, message)?;
    check_leader(replica, message)?;
    let rpc: openraft::raft::AppendEntriesRequest<TypeConfig> =
        codec::decode(&message.payload).map_err(bad_payload)?;
    check_append(&rpc, message.from_id, replica.id()).map_err(|why| refuse(message, why))?;
    let (vote, committed) = {
        let metrics = replica.raft().metrics();
        let m = metrics.borrow_watched();
        (m.vote, m.local_committed)
    };
    // A vote below this replica's is answered by openraft itself with the
    // higher vote (a deposed leader learns of it so).
    if rpc.vote.partial_cmp(&vote) != Some(std::cmp::Ordering::Less) {
        check_append_against(&rpc, committed).map_err(|why| refuse(message, why))?;
    }
    Ok(rpc)
}

/// The replies of a streaming RPC.
type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl RaftRpc for RaftService {
    /// Requests are taken into openraft as they arrive and answered in
    /// order (`crate::append_stream`). A malformed or misaddressed request
    /// gets its error after the replies before it and ends the stream (the
    /// sender opens a new one); a broken incoming stream ends it quietly,
    /// and so does the node stopping.
    async fn append_entries_stream(
        &self,
        request: Request<Streaming<RaftMessage>>,
    ) -> Result<Response<BoxStream<RaftMessage>>, Status> {
        let replica = Arc::clone(&self.replica);
        // The stream's certificate, checked against each message's sender.
        let certs = if self.tls {
            Some(request.peer_certs())
        } else {
            None
        };
        let checked = Arc::clone(&replica);
        let check = move |message: &RaftMessage| {
            if let Some(certs) = &certs {
                crate::peer_auth::check_certificate_names(
                    certs.as_deref().map(Vec::as_slice),
                    message.from_id,
                )?;
            }
            append_request(&checked, message)
        };
        let replies = crate::append_stream::serve(
            replica,
            request.into_inner(),
            self.stopping.clone(),
            check,
        );
        Ok(Response::new(replies))
    }

    /// A vote request is also refused when this replica's membership knows
    /// the candidate's node id with another incarnation: the candidate's
    /// data directory is not the member this replica knows.
    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let rpc = self.candidate_message(request)?;
        let result = self.replica.raft().vote(rpc).await;
        Ok(Response::new(raft_reply(encode_or_status(&result)?)))
    }

    /// Whether this replica would grant the candidate a vote in the next
    /// term, changing nothing (openraft's pre-vote): refused as a vote is.
    async fn pre_vote(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = self.candidate_message(request)?;
        let result = self.replica.raft().pre_vote(rpc).await;
        Ok(Response::new(raft_reply(encode_or_status(&result)?)))
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let message = self.leader_message(request)?;
        let rpc: InstallSnapshotRequest<TypeConfig> =
            codec::decode(&message.payload).map_err(bad_payload)?;
        check_sender(&rpc.vote, message.from_id, self.replica.id())
            .map_err(|why| refuse(&message, why))?;
        let (vote, committed) = {
            let metrics = self.replica.raft().metrics();
            let m = metrics.borrow_watched();
            (m.vote, m.local_committed)
        };
        // A vote below this replica's is refused by openraft itself, which
        // answers with the higher vote (a deposed leader learns of it so).
        if rpc.vote.partial_cmp(&vote) != Some(std::cmp::Ordering::Less) {
            check_snapshot(
                rpc.meta.last_log_id,
                &rpc.meta.last_membership,
                &rpc.vote,
                committed,
            )
            .map_err(|why| refuse(&message, why))?;
        }
        // openraft's v1 chunked receiver: chunks go to the file the state
        // machine gives; the last one installs the snapshot.
        let result = ChunkedSnapshotReceiver::install_snapshot(self.replica.raft(), rpc).await;
        Ok(Response::new(raft_reply(encode_or_status(&result)?)))
    }

    /// Only from the leader, addressed to this incarnation: from a member
    /// of this replica's cluster, or from the leader of the vote this
    /// replica holds. A leader removed from the voters hands leadership
    /// over once its removal is committed (openraft's
    /// `removed_leader_step_down`), when this replica's membership no
    /// longer lists it; openraft itself ignores a hand-over under any other
    /// vote than the one it holds.
    async fn transfer_leader(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.check_certificate(&request, request.get_ref().from_id)?;
        let message = request.into_inner();
        check_addressee(&self.replica, &message)?;
        let rpc: openraft::raft::TransferLeaderRequest<latchkey_storage::TypeConfig> =
            codec::decode(&message.payload).map_err(bad_payload)?;
        check_transfer(
            rpc.from_leader(),
            rpc.last_log_id(),
            message.from_id,
            self.replica.id(),
        )
        .map_err(|why| refuse(&message, why))?;
        let follows_sender = {
            let metrics = self.replica.raft().metrics();
            let m = metrics.borrow_watched();
            m.vote == *rpc.from_leader()
        };
        if !follows_sender {
            check_leader(&self.replica, &message)?;
        }
        let result = self
            .replica
            .raft()
            .handle_transfer_leader(rpc)
            .await
            .map_err(|e| Status::unavailable(format!("this replica has stopped: {e}")))?;
        // Framed as every Raft reply: Ok(response) or a RaftError.
        let reply: Result<_, openraft::error::RaftError<latchkey_storage::TypeConfig>> = Ok(result);
        Ok(Response::new(raft_reply(encode_or_status(&reply)?)))
    }

    async fn identify(
        &self,
        request: Request<IdentifyRequest>,
    ) -> Result<Response<IdentifyReply>, Status> {
        self.check_certificate(&request, request.get_ref().from_id)?;
        let asker = request.into_inner();
        if let Some(cause) = self.replica.health().failure() {
            return Err(Status::unavailable(format!(
                "this replica has failed: {cause}"
            )));
        }
        Ok(Response::new(IdentifyReply {
            client_addr: self.replica.client_addr().to_string(),
            node_id: self.replica.id(),
            incarnation: self.replica.incarnation(),
            // A membership, not merely a vote: a replica that granted a vote
            // to a leader who never replicated anything is not in a cluster
            // (nothing can have been committed without a majority holding
            // the membership entry).
            initialized: self.replica.has_membership(),
            restore_seed: self.replica.restore_seed(),
            knows_you: self
                .replica
                .view()
                .knows(asker.from_id, asker.from_incarnation)
                .unwrap_or(false),
        }))
    }
}

/// `impl $service for $server`, one unary RPC per `method(Request) ->
/// Reply = Variant`, each answered by [`answer`] as the call's `Variant`.
macro_rules! unary_service {
    ($service:ident for $server:ty {
        $($method:ident($req:ty) -> $reply:ty = $variant:ident;)*
    }) => {
        #[tonic::async_trait]
        impl $service for $server {
            $(
                async fn $method(
                    &self,
                    request: Request<$req>,
                ) -> Result<Response<$reply>, Status> {
                    let caller = self.replica.authenticate(request.metadata(), request.peer_certs()).await?;
                    let call = Req::$variant(request.into_inner());
                    match answer(&self.replica, &caller, call).await {
                        (_, Rep::$variant(reply)) => Ok(Response::new(reply)),
                        (rpc, other) => Err(Status::internal(format!(
                            "a {rpc:?} call was answered with {other:?}"
                        ))),
                    }
                }
            )*
        }
    };
}

/// The `Kv` service: one unary RPC per key-value operation.
pub struct KvService {
    pub(crate) replica: Arc<Replica>,
}

unary_service!(Kv for KvService {
    get(v1::GetRequest) -> v1::GetReply = Get;
    multi_get(v1::MultiGetRequest) -> v1::MultiGetReply = MultiGet;
    scan(v1::ScanRequest) -> v1::ScanReply = Scan;
    put(v1::PutRequest) -> v1::PutReply = Put;
    put_if_absent(v1::PutRequest) -> v1::PreviousReply = PutIfAbsent;
    compare_and_put(v1::CompareAndPutRequest) -> v1::CompareAndPutReply = CompareAndPut;
    get_and_put(v1::PutRequest) -> v1::PreviousReply = GetAndPut;
    delete(v1::DeleteRequest) -> v1::DeletedReply = Delete;
    delete_range(v1::DeleteRangeRequest) -> v1::DeletedReply = DeleteRange;
    batch(v1::BatchRequest) -> v1::BatchReply = Batch;
    next_sequence(v1::NextSequenceRequest) -> v1::SequenceReply = NextSequence;
});

/// The `Lock` service: one unary RPC per session and lock operation.
pub struct LockService {
    pub(crate) replica: Arc<Replica>,
}

unary_service!(Lock for LockService {
    open_session(v1::OpenSessionRequest) -> v1::SessionReply = OpenSession;
    keep_alive(v1::KeepAliveRequest) -> v1::SessionReply = KeepAlive;
    close_session(v1::CloseSessionRequest) -> v1::CloseSessionReply = CloseSession;
    end_session(v1::EndSessionRequest) -> v1::CloseSessionReply = EndSession;
    proclaim(v1::ProclaimRequest) -> v1::ProclaimReply = Proclaim;
    get_session(v1::GetSessionRequest) -> v1::SessionReply = GetSession;
    acquire(v1::AcquireRequest) -> v1::AcquireReply = Acquire;
    release(v1::ReleaseRequest) -> v1::ReleaseReply = Release;
    acquire_all(v1::AcquireAllRequest) -> v1::AcquireAllReply = AcquireAll;
    release_all(v1::ReleaseAllRequest) -> v1::ReleaseAllReply = ReleaseAll;
    cancel_wait(v1::CancelWaitRequest) -> v1::CancelWaitReply = CancelWait;
    fenced_write(v1::FencedWriteRequest) -> v1::BatchReply = FencedWrite;
    check_sequencer(v1::CheckSequencerRequest) -> v1::CheckSequencerReply = CheckSequencer;
    list_locks(v1::ListLocksRequest) -> v1::ListLocksReply = ListLocks;
    force_release(v1::ForceReleaseRequest) -> v1::ForceReleaseReply = ForceRelease;
    list_sessions(v1::ListSessionsRequest) -> v1::ListSessionsReply = ListSessions;
});

/// The `Pipeline` service: the same calls, many at once on one stream.
pub struct PipelineService {
    pub(crate) replica: Arc<Replica>,
    /// As [`RaftService::stopping`], for open `Calls` streams.
    pub(crate) stopping: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl Pipeline for PipelineService {
    async fn calls(
        &self,
        request: Request<Streaming<v1::CallFrame>>,
    ) -> Result<Response<BoxStream<v1::CallReplies>>, Status> {
        let caller = self
            .replica
            .authenticate(request.metadata(), request.peer_certs())
            .await?;
        Ok(Response::new(Box::pin(crate::calls::CallStream::new(
            Arc::clone(&self.replica),
            caller,
            request.into_inner(),
            self.stopping.clone(),
        ))))
    }
}

/// Cluster status (client listener).
pub struct AdminService {
    pub(crate) replica: Arc<Replica>,
}

fn admin_reply(result: Result<(), ReplicaFailure>) -> Response<AdminReply> {
    Response::new(AdminReply {
        error: result.err().map(Into::into),
    })
}

/// A backup travels in pieces of this many bytes (far below the message
/// limit).
const BACKUP_CHUNK: usize = 1024 * 1024;

#[tonic::async_trait]
impl Admin for AdminService {
    async fn backup(
        &self,
        request: Request<v1::BackupRequest>,
    ) -> Result<Response<BoxStream<v1::BackupChunk>>, Status> {
        let caller = self
            .replica
            .authenticate(request.metadata(), request.peer_certs())
            .await?;
        let refusal = |error: v1::Error| -> Response<BoxStream<v1::BackupChunk>> {
            let chunk = v1::BackupChunk {
                error: Some(error),
                ..Default::default()
            };
            Response::new(Box::pin(futures::stream::iter([Ok(chunk)])))
        };
        let (meta, blob) = match self.replica.backup(&caller).await {
            Ok(Ok(backup)) => backup,
            Ok(Err(refused)) => return Ok(refusal(wire::command_error_to_wire(&refused))),
            Err(failure) => return Ok(refusal(failure.into())),
        };
        tracing::info!(
            by = ?caller,
            last_index = meta.last_index(),
            bytes = blob.len(),
            checksum = format_args!("{:016x}", meta.checksum),
            "backup taken"
        );
        let total_bytes = blob.len() as u64;
        let blob = tonic::codegen::Bytes::from(blob);
        let mut chunks: Vec<v1::BackupChunk> = (0..blob.len())
            .step_by(BACKUP_CHUNK)
            .map(|start| v1::BackupChunk {
                data: blob.slice(start..(start + BACKUP_CHUNK).min(blob.len())),
                ..Default::default()
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(v1::BackupChunk::default());
        }
        chunks[0].last_index = meta.last_index();
        chunks[0].total_bytes = total_bytes;
        chunks[0].checksum = meta.checksum;
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        Ok(Response::new(StatusReply::from(self.replica.status())))
    }
}

/// Membership changes (peer listener only, behind the peer check: the
/// cluster secret and, with TLS, a client certificate of the cluster's CA).
///
/// While access control is enabled a change also needs a user with the
/// admin permission (its password, or a client certificate naming it): the
/// cluster secret proves only that the caller may talk to peers, so here it
/// does not make the caller root as it does on the client listener. Each
/// change is logged with who made it. This is for accountability, not a
/// wall against holders of the secret: on the client listener the secret
/// is root, which may create an admin. The check is a linearizable read of
/// the access-control state on the leader just before the change (a grant
/// revoked in between is not seen: the change is not a command the log
/// checks at apply time, as others are).
pub struct MembershipService {
    pub(crate) replica: Arc<Replica>,
}

impl MembershipService {
    /// Who makes the change, or the typed refusal for a caller who may not
    /// (see the type's docs); UNAUTHENTICATED for wrong credentials.
    async fn changer(
        &self,
        request: &Request<impl Sync>,
    ) -> Result<Result<String, v1::Error>, Status> {
        let mut metadata = request.metadata().clone();
        metadata.remove(latchkey_proto::CLUSTER_SECRET_HEADER);
        let caller = self
            .replica
            .authenticate(&metadata, request.peer_certs())
            .await?;
        Ok(
            match self
                .replica
                .read(Query::Auth(AuthQuery::List), false, &caller)
                .await
            {
                Ok(Ok(_)) => Ok(match caller {
                    Caller::User(name) => format!("user {name:?}"),
                    Caller::Anonymous | Caller::Internal => {
                        "an anonymous caller with the cluster secret".to_string()
                    }
                }),
                Ok(Err(refused)) => Err(wire::command_error_to_wire(&refused)),
                Err(failure) => Err(failure.into()),
            },
        )
    }
}

#[tonic::async_trait]
impl Membership for MembershipService {
    async fn add_member(
        &self,
        request: Request<AddMemberRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let who = match self.changer(&request).await? {
            Ok(who) => who,
            Err(error) => return Ok(Response::new(AdminReply { error: Some(error) })),
        };
        let AddMemberRequest {
            id,
            peer_addr,
            voter,
            force,
        } = request.into_inner();
        tracing::info!(by = %who, node = id, %peer_addr, voter, force, "membership change: add a member");
        let result =
            crate::membership::add_member(&*self.replica, id, &peer_addr, voter, force).await;
        Ok(admin_reply(result))
    }

    async fn change_voters(
        &self,
        request: Request<ChangeVotersRequest>,
    ) -> Result<Response<AdminReply>, Status> {
        let who = match self.changer(&request).await? {
            Ok(who) => who,
            Err(error) => return Ok(Response::new(AdminReply { error: Some(error) })),
        };
        let ChangeVotersRequest { voters, force } = request.into_inner();
        let voters: BTreeSet<u64> = voters.into_iter().collect();
        tracing::info!(by = %who, ?voters, force, "membership change: set the voters");
        let result =
            crate::membership::change_voters(Arc::clone(&self.replica), voters, force).await;
        Ok(admin_reply(result))
    }

    async fn move_leader(
        &self,
        request: Request<v1::MoveLeaderRequest>,
    ) -> Result<Response<v1::MoveLeaderReply>, Status> {
        let who = match self.changer(&request).await? {
            Ok(who) => who,
            Err(error) => {
                return Ok(Response::new(v1::MoveLeaderReply {
                    error: Some(error),
                    leader_id: 0,
                }))
            }
        };
        let v1::MoveLeaderRequest { to, away_from } = request.into_inner();
        tracing::info!(by = %who, ?to, ?away_from, "leader transfer");
        let moved =
            crate::hand_over::transfer_leader(Arc::clone(&self.replica), to, away_from).await;
        let reply = match moved {
            Ok(leader_id) => v1::MoveLeaderReply {
                error: None,
                leader_id,
            },
            Err(e) => v1::MoveLeaderReply {
                error: Some(e.into()),
                leader_id: 0,
            },
        };
        Ok(Response::new(reply))
    }
}

/// Access control: users, roles and whether it is on (see
/// `latchkey_core::auth`; client listener).
pub struct AuthService {
    pub(crate) replica: Arc<Replica>,
}

/// A command's or read's failure as the typed error.
fn auth_error(result: &Result<CommandResult, ReplicaFailure>) -> Option<v1::Error> {
    match result {
        Ok(Ok(_)) => None,
        Ok(Err(refused)) => Some(wire::command_error_to_wire(refused)),
        Err(failure) => Some(failure.clone().into()),
    }
}

/// A password as stored: hashed here, never in the log (empty: none).
/// Hashing is expensive on purpose: it runs off the async threads, a few
/// at a time.
async fn stored_password(password: String) -> Result<Option<String>, ReplicaFailure> {
    if password.is_empty() {
        return Ok(None);
    }
    if password.len() > 1024 {
        return Err(ReplicaFailure::InvalidArgument(
            "a password is at most 1,024 bytes".into(),
        ));
    }
    if !password.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(ReplicaFailure::InvalidArgument(
            "a password must be printable ASCII: it travels as call metadata".into(),
        ));
    }
    let _permit = crate::auth::LOGINS.acquire().await;
    tokio::task::spawn_blocking(move || crate::auth::hash_password(&password))
        .await
        .map_err(|e| ReplicaFailure::Unavailable(format!("hashing the password failed: {e}")))?
        .map(Some)
}

async fn auth_change(request: v1::AuthChangeRequest) -> Result<AuthCommand, ReplicaFailure> {
    use v1::auth_change_request::Change;
    Ok(match request.change {
        None => {
            return Err(ReplicaFailure::InvalidArgument(
                "an auth change names what to change".into(),
            ))
        }
        Some(Change::Enable(_)) => AuthCommand::Enable,
        Some(Change::Disable(_)) => AuthCommand::Disable,
        Some(Change::AddUser(u)) => AuthCommand::AddUser {
            password: stored_password(u.password).await?,
            name: u.name,
        },
        Some(Change::ChangePassword(u)) => AuthCommand::ChangePassword {
            password: stored_password(u.password).await?,
            name: u.name,
        },
        Some(Change::DeleteUser(name)) => AuthCommand::DeleteUser { name },
        Some(Change::AddRole(name)) => AuthCommand::AddRole { name },
        Some(Change::DeleteRole(name)) => AuthCommand::DeleteRole { name },
        Some(Change::GrantPermission(g)) => AuthCommand::GrantPermission {
            grant: wire::grant_from_wire(g.grant.unwrap_or_default())?,
            role: g.role,
        },
        Some(Change::RevokePermission(g)) => AuthCommand::RevokePermission {
            grant: wire::grant_from_wire(g.grant.unwrap_or_default())?,
            role: g.role,
        },
        Some(Change::GrantRole(r)) => AuthCommand::GrantRole {
            user: r.user,
            role: r.role,
        },
        Some(Change::RevokeRole(r)) => AuthCommand::RevokeRole {
            user: r.user,
            role: r.role,
        },
    })
}

impl AuthService {
    async fn read(
        &self,
        caller: &Caller,
        query: AuthQuery,
    ) -> Result<CommandResult, ReplicaFailure> {
        self.replica.read(Query::Auth(query), false, caller).await
    }
}

#[tonic::async_trait]
impl AuthRpc for AuthService {
    async fn status(
        &self,
        request: Request<v1::AuthStatusRequest>,
    ) -> Result<Response<v1::AuthStatusReply>, Status> {
        let caller = self
            .replica
            .authenticate(request.metadata(), request.peer_certs())
            .await?;
        let user = match &caller {
            Caller::User(user) => user.clone(),
            Caller::Anonymous | Caller::Internal => String::new(),
        };
        let result = self.read(&caller, AuthQuery::Status).await;
        Ok(Response::new(v1::AuthStatusReply {
            error: auth_error(&result),
            enabled: matches!(result, Ok(Ok(Outcome::Auth(AuthOutcome::Status(true))))),
            user,
        }))
    }

    async fn change(
        &self,
        request: Request<v1::AuthChangeRequest>,
    ) -> Result<Response<v1::AuthChangeReply>, Status> {
        let caller = self
            .replica
            .authenticate(request.metadata(), request.peer_certs())
            .await?;
        // Refuse a caller without admin before any password is hashed (the
        // apply-time check still decides).
        let result = match self.read(&caller, AuthQuery::List).await {
            Ok(Ok(_)) => match auth_change(request.into_inner()).await {
                Ok(command) => self.replica.write(Command::Auth(command), &caller).await,
                Err(refused) => Err(refused),
            },
            refused => refused,
        };
        Ok(Response::new(v1::AuthChangeReply {
            error: auth_error(&result),
        }))
    }

    async fn list(
        &self,
        request: Request<v1::AuthListRequest>,
    ) -> Result<Response<v1::AuthListReply>, Status> {
        let caller = self
            .replica
            .authenticate(request.metadata(), request.peer_certs())
            .await?;
        let result = self.read(&caller, AuthQuery::List).await;
        let mut reply = v1::AuthListReply {
            error: auth_error(&result),
            ..Default::default()
        };
        if let Ok(Ok(Outcome::Auth(AuthOutcome::List { users, roles }))) = result {
            reply.users = users;
            reply.roles = roles;
        }
        Ok(Response::new(reply))
    }

    async fn get_user(
        &self,
        request: Request<v1::AuthNameRequest>,
    ) -> Result<Response<v1::AuthUserReply>, Status> {
        let caller = self
            .replica
            .authenticate(request.metadata(), request.peer_certs())
            .await?;
        let name = request.into_inner().name;
        let result = self.read(&caller, AuthQuery::User { name }).await;
        let mut reply = v1::AuthUserReply {
            error: auth_error(&result),
            ..Default::default()
        };
        if let Ok(Ok(Outcome::Auth(AuthOutcome::User(Some(user))))) = result {
            reply.found = true;
            reply.roles = user.roles;
            reply.has_password = user.has_password;
        }
        Ok(Response::new(reply))
    }

    async fn get_role(
        &self,
        request: Request<v1::AuthNameRequest>,
    ) -> Result<Response<v1::AuthRoleReply>, Status> {
        let caller = self
            .replica
            .authenticate(request.metadata(), request.peer_certs())
            .await?;
        let name = request.into_inner().name;
        let result = self.read(&caller, AuthQuery::Role { name }).await;
        let mut reply = v1::AuthRoleReply {
            error: auth_error(&result),
            ..Default::default()
        };
        if let Ok(Ok(Outcome::Auth(AuthOutcome::Role(Some(role))))) = result {
            reply.found = true;
            reply.grants = role.grants.into_iter().map(wire::grant_to_wire).collect();
        }
        Ok(Response::new(reply))
    }
}
