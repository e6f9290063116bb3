//! One replica's request handling: propose writes, serve reads, report status.
//!
//! Both the gRPC services and the in-process client path call [`Replica`], so
//! a request behaves the same whichever way it arrives.

use std::sync::RwLock;
use std::time::Duration;

use latchkey_core::auth::{AuthOutcome, AuthQuery};
use latchkey_core::lock::{
    LockCommand, LockInfo, LockOutcome, LockQuery, Proposer, SessionId, SessionSecret,
    SessionTimer, TimerState, WaitEnd,
};
use latchkey_core::{
    validate_command, validate_query, Command, CommandError, CommandResult, Outcome, Query,
};
use latchkey_proto::{BoxFuture, LocalReplica, MemberInfo, NodeStatus, Operation, ReplicaFailure};
use latchkey_storage::backup::BackupMeta;
use latchkey_storage::{StateReader, TypeConfig};
use openraft::{Raft, ServerState};

use crate::auth::{Caller, Certificates, Verified};
use crate::health::{Condition, Health};
use crate::locks::{KeepAlive, LockShared, WaitOutcome};
use crate::network::PeerNetwork;
use crate::read_gate::ReadGate;
use crate::write_queue::{Origin, WriteQueue};

/// The status page's last answer and when it was made.
pub(crate) type StatusCache = tokio::sync::Mutex<Option<(std::time::Instant, String)>>;

/// A running replica's request path.
pub struct Replica {
    id: u64,
    /// This replica's data-directory incarnation.
    incarnation: u64,
    /// The seed of the backup its data directory was restored from, 0 if
    /// none (see `latchkey_storage::backup`).
    restore_seed: u64,
    /// Held while a backup is taken (one at a time).
    backups: tokio::sync::Mutex<()>,
    /// Held while the membership changes (one change at a time).
    membership_changes: tokio::sync::Mutex<()>,
    /// The status page's last answer (`crate::status_page`).
    status_cache: StatusCache,
    /// The last lock census and when it was taken (see
    /// [`Replica::lock_census`]).
    census: std::sync::Mutex<Option<(std::time::Instant, latchkey_core::lock::LockCensus)>>,
    /// Where this replica serves clients (see [`Replica::client_addr`]).
    client_addr: String,
    /// Passwords this replica has checked (see `crate::auth`).
    verified: std::sync::Arc<Verified>,
    /// Whether a client certificate's common name names the caller (see
    /// `crate::auth`; [`crate::ServerTls::certificate_users`]).
    certificate_users: bool,
    /// What this replica measures (see `crate::metrics`).
    metrics: crate::metrics::Metrics,
    raft: Raft<TypeConfig>,
    health: Health,
    /// The Raft transport, for the peer problems it reports.
    peers: PeerNetwork,
    /// Taken away at shutdown so the RocksDB instance closes even while
    /// clients of this replica are still alive.
    reader: RwLock<Option<StateReader>>,
    write_timeout: Duration,
    read_timeout: Duration,
    locks: LockShared,
    writes: WriteQueue,
    reads: ReadGate,
}

/// How long one lock census answers (`/metrics` and the status page).
pub(crate) const CENSUS_FRESH_FOR: Duration = Duration::from_secs(1);

impl Replica {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        incarnation: u64,
        client_addr: String,
        raft: Raft<TypeConfig>,
        peers: PeerNetwork,
        reader: StateReader,
        write_timeout: Duration,
        read_timeout: Duration,
        locks: LockShared,
        certificate_users: bool,
        restore_seed: u64,
        metrics: crate::metrics::Metrics,
    ) -> Self {
        let writes = WriteQueue::start(raft.clone(), write_timeout);
        let reads = ReadGate::start(raft.clone());
        Replica {
            id,
            incarnation,
            restore_seed,
            backups: tokio::sync::Mutex::new(()),
            membership_changes: tokio::sync::Mutex::new(()),
            status_cache: StatusCache::default(),
            census: std::sync::Mutex::new(None),
            client_addr,
            verified: std::sync::Arc::default(),
            certificate_users,
            metrics,
            raft,
            health: Health::new(),
            peers,
            writes,
            reads,
            reader: RwLock::new(Some(reader)),
            write_timeout,
            read_timeout,
            locks,
        }
    }

    /// Taken by each change of the membership (one at a time).
    pub(crate) fn membership_changes(&self) -> &tokio::sync::Mutex<()> {
        &self.membership_changes
    }

    /// The leader's write path.
    pub(crate) fn writes(&self) -> &WriteQueue {
        &self.writes
    }

    pub(crate) fn locks(&self) -> &LockShared {
        &self.locks
    }

    /// This replica's node id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// This replica's data-directory incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The status page's last answer and when it was made.
    pub(crate) fn status_cache(&self) -> &StatusCache {
        &self.status_cache
    }

    /// A storage figure read through the state reader (0 once shut down).
    fn storage_figure(&self, figure: fn(&StateReader) -> u64) -> u64 {
        self.reader
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or(0, figure)
    }

    /// Bytes of the live SST files (0 once shut down).
    pub(crate) fn disk_bytes(&self) -> u64 {
        self.storage_figure(StateReader::disk_bytes)
    }

    /// Bytes the state machine holds in memory for the lock rooms
    /// ([`StateReader::lock_rooms_bytes`]; 0 once shut down).
    pub(crate) fn lock_rooms_bytes(&self) -> u64 {
        self.storage_figure(StateReader::lock_rooms_bytes)
    }

    /// RocksDB flushes and compactions running or pending
    /// ([`StateReader::background_jobs`]; 0 once shut down).
    pub(crate) fn storage_background_jobs(&self) -> u64 {
        self.storage_figure(StateReader::background_jobs)
    }

    /// Whether this data directory was seeded from a backup (its log does
    /// not hold the restored rows; see `crate::membership`).
    pub(crate) fn was_restored(&self) -> bool {
        self.restore_seed != 0
    }

    /// The seed of the backup this data directory was restored from while
    /// it holds no membership yet (what `Raft.Identify` reports; the
    /// bootstrap forms a cluster only from members with equal seeds), else 0.
    pub(crate) fn restore_seed(&self) -> u64 {
        if self.has_membership() {
            0
        } else {
            self.restore_seed
        }
    }

    /// The address this replica serves clients at, as it reports it to
    /// peers (`Raft.Identify`) for the membership to record.
    pub fn client_addr(&self) -> &str {
        &self.client_addr
    }

    pub(crate) fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// Whether this replica's membership lists it, as this incarnation.
    pub(crate) fn is_member(&self) -> bool {
        self.knows(self.id, self.incarnation) == Some(true)
    }

    /// Whether this replica holds a membership (it belongs to a cluster).
    pub(crate) fn has_membership(&self) -> bool {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .next()
            .is_some()
    }

    /// Whether the membership this replica knows lists node `id` with
    /// incarnation `incarnation`; `None` when it does not list `id` at all.
    pub(crate) fn knows(&self, id: u64, incarnation: u64) -> Option<bool> {
        // Borrowed, not cloned: the health watch asks on every metrics change.
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.incarnation == incarnation)
    }

    /// Refuse every request once this replica has failed: nothing is
    /// proposed, so the caller may retry on another replica.
    fn check_serving(&self) -> Result<(), ReplicaFailure> {
        match self.health.failure() {
            Some(cause) => Err(ReplicaFailure::Unavailable(format!(
                "this replica has failed and serves nothing ({cause}); ask another replica"
            ))),
            None => Ok(()),
        }
    }

    /// A Raft client to the peer at `addr`, over TLS if this replica has
    /// it, its calls carrying the cluster secret.
    pub(crate) fn peer_client(
        &self,
        addr: &str,
    ) -> Result<crate::peer_auth::PeerClient, latchkey_proto::ChannelError> {
        let credentials = self.peers.credentials();
        Ok(credentials.client(credentials.channel(addr)?))
    }

    /// The openraft handle.
    pub(crate) fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    /// The leader as this replica knows it: id and client address. Never
    /// itself unless it leads: a leader that removed itself keeps its vote
    /// (and openraft's `current_leader`) but leads no longer.
    pub fn leader(&self) -> Option<(u64, String)> {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader?;
        if leader == self.id && m.state != ServerState::Leader {
            return None;
        }
        let node = m.membership_config.membership().get_node(&leader)?;
        Some((leader, node.client_addr.clone()))
    }

    pub(crate) fn is_leader(&self) -> bool {
        self.health.failure().is_none() && {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.state == ServerState::Leader && m.current_leader == Some(self.id)
        }
    }

    fn not_leader(&self) -> ReplicaFailure {
        ReplicaFailure::NotLeader {
            leader: self.leader(),
        }
    }

    /// Propose a client's `command` if this replica leads; otherwise refuse
    /// without proposing. Answers once the entry is applied here. The
    /// leader's own lock commands (expiries) are refused: only its timers
    /// propose them.
    pub(crate) async fn write(
        &self,
        command: Command,
        caller: &Caller,
    ) -> Result<CommandResult, ReplicaFailure> {
        if let Command::Group { .. } | Command::As { .. } = &command {
            return Err(ReplicaFailure::InvalidArgument(
                "command groups and `As` are formed by the replica only; send the commands one \
                 by one"
                    .into(),
            ));
        }
        let mut command = command;
        if let Command::Lock(lock) = &mut command {
            if lock.proposer() == Proposer::Leader {
                return Err(ReplicaFailure::InvalidArgument(
                    "expiry commands are proposed by the leader's timers only".into(),
                ));
            }
            if let LockCommand::OpenSession { secret, .. } = lock {
                *secret = draw_session_secret()?;
            }
        }
        let command = match caller {
            Caller::User(user) => Command::As {
                user: user.clone(),
                command: Box::new(command),
            },
            // The application in this process acts as root while access
            // control is on (root exists then: it cannot be deleted).
            Caller::Internal if self.auth_enabled()? => Command::As {
                user: latchkey_core::auth::ROOT.to_string(),
                command: Box::new(command),
            },
            // Refused here if access control is on as this replica knows
            // it (no log entry for it), and where it is applied if it was
            // turned on meanwhile.
            Caller::Anonymous if self.auth_enabled()? => {
                return Ok(Err(CommandError::AuthRequired))
            }
            Caller::Internal | Caller::Anonymous => command,
        };
        self.propose(command, Origin::Client).await
    }

    /// The first `limit` locks in use, from this replica's applied state
    /// (not linearizable), and whether there are more.
    pub(crate) fn local_locks(&self, limit: u32) -> Result<(Vec<LockInfo>, bool), ReplicaFailure> {
        let query = Query::Lock(LockQuery::Locks {
            prefix: String::new(),
            start_after: None,
            limit,
        });
        match self.local_query(&query)? {
            Ok(Outcome::Lock(LockOutcome::Locks { locks, more })) => Ok((locks, more)),
            other => Err(ReplicaFailure::Unavailable(format!(
                "unexpected lock list answer: {other:?}"
            ))),
        }
    }

    /// The counts of sessions, locks, grants and waiters in this replica's
    /// applied state, at most [`CENSUS_FRESH_FOR`] old. Taking one scans
    /// every session and lock (call it off the async workers); one caller
    /// takes it while the others wait for its answer.
    pub(crate) fn lock_census(&self) -> Result<latchkey_core::lock::LockCensus, ReplicaFailure> {
        let mut cached = self.census.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, census)) = *cached {
            if at.elapsed() < CENSUS_FRESH_FOR {
                return Ok(census);
            }
        }
        let census = match self.local_query(&Query::Lock(LockQuery::Census))? {
            Ok(Outcome::Lock(LockOutcome::Census(census))) => census,
            other => {
                return Err(ReplicaFailure::Unavailable(format!(
                    "unexpected lock census answer: {other:?}"
                )))
            }
        };
        *cached = Some((std::time::Instant::now(), census));
        Ok(census)
    }

    /// Whether access control is enabled, as this replica has applied it.
    pub(crate) fn auth_enabled(&self) -> Result<bool, ReplicaFailure> {
        match self.local_query(&Query::Auth(AuthQuery::Status))? {
            Ok(Outcome::Auth(AuthOutcome::Status(enabled))) => Ok(enabled),
            other => Err(ReplicaFailure::Unavailable(format!(
                "cannot read whether access control is enabled: {other:?}"
            ))),
        }
    }

    /// Who a call with `metadata`, over a connection whose verified client
    /// certificates are `certs`, comes from: the user it names if the
    /// password matches, the replica's own application if it carries the
    /// cluster secret, the user its client certificate names, or else
    /// anonymous (see `crate::auth`).
    pub(crate) async fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        certs: Option<Certificates>,
    ) -> Result<Caller, tonic::Status> {
        let named = crate::auth::credentials(metadata)?;
        if let (None, Some(offered)) = (&named, metadata.get(latchkey_proto::CLUSTER_SECRET_HEADER))
        {
            // The cluster's own credential: a replica's in-process client
            // forwarding to the leader, or an operator holding the file.
            return match &self.peers.credentials().secret {
                Some(secret) if secret.matches(offered.as_bytes()) => Ok(Caller::Internal),
                _ => {
                    crate::auth::log_refusal("(cluster secret)");
                    Err(tonic::Status::unauthenticated(
                        "the call carries a cluster secret that is not this cluster's",
                    ))
                }
            };
        }
        let Some((user, password)) = named else {
            return self.certificate_caller(certs);
        };
        let stored = self.stored_credentials(&user)?;
        // An unknown user (or one without a password) costs the same work
        // as a wrong password, so timing does not tell which users exist.
        let (hash, known) = match stored {
            Some(Some(hash)) => (hash, true),
            _ => (crate::auth::decoy_hash().to_string(), false),
        };
        let verified = {
            let cache = std::sync::Arc::clone(&self.verified);
            let who = user.clone();
            // Password checks are expensive on purpose: at most a few at a
            // time, so a flood of logins cannot take every core.
            let _permit = crate::auth::LOGINS.acquire().await;
            tokio::task::spawn_blocking(move || cache.check(&who, &hash, &password))
                .await
                .unwrap_or(false)
                && known
        };
        if verified {
            Ok(Caller::User(user))
        } else {
            crate::auth::log_refusal(&user);
            Err(tonic::Status::unauthenticated(format!(
                "wrong user or password for {user:?} (or the user has no password, or this \
                 replica has not applied it yet)"
            )))
        }
    }

    /// What this replica's state holds for `user`: `None` if no such user,
    /// `Some(None)` if it has no password, else its password hash.
    fn stored_credentials(&self, user: &str) -> Result<Option<Option<String>>, tonic::Status> {
        let query = Query::Auth(AuthQuery::Credentials {
            name: user.to_string(),
        });
        validate_query(&query).map_err(|e| tonic::Status::unauthenticated(e.to_string()))?;
        match self.local_query(&query) {
            Ok(Ok(Outcome::Auth(AuthOutcome::Credentials(stored)))) => Ok(stored),
            Ok(other) => Err(tonic::Status::internal(format!(
                "credentials answered with {other:?}"
            ))),
            Err(failure) => Err(tonic::Status::unavailable(failure.to_string())),
        }
    }

    /// The user a verified client certificate names, if this replica's
    /// state has that user; else anonymous.
    fn certificate_caller(&self, certs: Option<Certificates>) -> Result<Caller, tonic::Status> {
        if !self.certificate_users {
            return Ok(Caller::Anonymous);
        }
        let Some(user) = crate::auth::certificate_user(certs.as_deref().map(Vec::as_slice)) else {
            return Ok(Caller::Anonymous);
        };
        if validate_query(&Query::Auth(AuthQuery::Credentials { name: user.clone() })).is_err() {
            return Ok(Caller::Anonymous);
        }
        Ok(match self.stored_credentials(&user)? {
            Some(_) => Caller::User(user),
            None => Caller::Anonymous,
        })
    }

    /// Propose one of the leader's expiry commands.
    pub(crate) async fn propose_expiry(
        &self,
        command: LockCommand,
    ) -> Result<CommandResult, ReplicaFailure> {
        let kind = match &command {
            LockCommand::ExpireSession { .. } => "session",
            LockCommand::ExpireWait { .. } => "wait",
            LockCommand::ExpireLockLease { .. } => "lock_lease",
            LockCommand::EndLockDelay { .. } => "lock_delay",
            _ => "other",
        };
        let result = self.propose(Command::Lock(command), Origin::Leader).await;
        if matches!(result, Ok(Ok(_))) {
            self.metrics.expiry(kind);
        }
        result
    }

    async fn propose(
        &self,
        command: Command,
        origin: Origin,
    ) -> Result<CommandResult, ReplicaFailure> {
        validate_command(&command).map_err(ReplicaFailure::invalid)?;
        self.check_serving()?;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        // Bounded here as a whole, including the wait in the queue.
        match tokio::time::timeout(self.write_timeout, self.writes.propose(command, origin)).await {
            Ok(result) => result,
            Err(_) => Err(ReplicaFailure::UnknownOutcome(format!(
                "the write did not commit within {:?}",
                self.write_timeout
            ))),
        }
    }

    /// Serve `query`: linearizable (leader only, after a ReadIndex round)
    /// unless `stale`, in which case from this replica's applied state.
    pub(crate) async fn read(
        &self,
        query: Query,
        stale: bool,
        caller: &Caller,
    ) -> Result<CommandResult, ReplicaFailure> {
        validate_query(&query).map_err(ReplicaFailure::invalid)?;
        // The leader's own reads: they carry session secrets (and password
        // hashes). The replica reads them with `local_query`; no caller,
        // in-process or remote, may.
        if let Query::Lock(
            LockQuery::TimerState | LockQuery::SessionTimer { .. } | LockQuery::Census,
        )
        | Query::Auth(AuthQuery::Credentials { .. })
        | Query::As { .. } = &query
        {
            return Err(ReplicaFailure::InvalidArgument(
                "the timer state, the lock census and stored credentials are read by the replica \
                 itself, not by clients"
                    .into(),
            ));
        }
        self.check_serving()?;
        let anonymous_status_only = matches!(caller, Caller::Anonymous)
            && !matches!(query, Query::Auth(AuthQuery::Status))
            && self.auth_enabled()?;
        if anonymous_status_only {
            // Refused before the leadership round: no work for strangers.
            return Ok(Err(CommandError::AuthRequired));
        }
        if !stale {
            self.confirm(true).await?;
        } else if self.has_membership() && !self.is_member() {
            // Removed from the cluster: its state no longer moves on.
            return Err(ReplicaFailure::Unavailable(
                "this replica is not a member of the cluster (it was removed, or waits to be \
                 added): ask another replica"
                    .into(),
            ));
        }
        match caller {
            Caller::User(user) => self.local_query(&Query::As {
                user: user.clone(),
                query: Box::new(query),
            }),
            Caller::Internal => self.local_query(&query),
            Caller::Anonymous => {
                // Enabled meanwhile (during the round): still refused.
                if !matches!(query, Query::Auth(AuthQuery::Status)) && self.auth_enabled()? {
                    return Ok(Err(CommandError::AuthRequired));
                }
                self.local_query(&query)
            }
        }
    }

    /// Confirm leadership with a quorum round begun after this call (shared
    /// with concurrent reads, see [`ReadGate`]); with `wait_applied`, also
    /// wait until everything committed before the round is applied here
    /// (ReadIndex).
    async fn confirm(&self, wait_applied: bool) -> Result<(), ReplicaFailure> {
        self.check_serving()?;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let confirmed = async {
            let read_index = self.reads.confirm().await?;
            if wait_applied {
                self.wait_applied(read_index).await?;
            }
            Ok(())
        };
        match tokio::time::timeout(self.read_timeout, confirmed).await {
            Ok(result) => result,
            Err(_) => Err(ReplicaFailure::Unavailable(format!(
                "could not confirm leadership within {:?}",
                self.read_timeout
            ))),
        }
    }

    /// Wait until the entry at `read_index` is applied and visible to reads.
    async fn wait_applied(&self, read_index: Option<u64>) -> Result<(), ReplicaFailure> {
        let Some(index) = read_index else {
            return Ok(());
        };
        let visible = {
            let reader = self.reader.read().unwrap_or_else(|p| p.into_inner());
            reader.as_ref().and_then(StateReader::last_applied_index)
        };
        if visible.is_some_and(|applied| applied >= index) {
            return Ok(());
        }
        // openraft publishes the applied index after the state machine has
        // committed it, so this is never earlier than the reader's index.
        self.raft
            .wait(None)
            .applied_index_at_least(Some(index), "linearizable read")
            .await
            .map(|_| ())
            .map_err(|e| ReplicaFailure::Unavailable(format!("replica stopped: {e}")))
    }

    /// One leadership confirmation round (for keep-alives).
    pub(crate) async fn confirm_leadership(&self) -> Result<(), ReplicaFailure> {
        self.confirm(false).await
    }

    /// The countdowns a new leader restarts, read once everything committed
    /// before now is applied here.
    pub(crate) async fn timer_state(&self) -> Result<TimerState, String> {
        self.confirm(true).await.map_err(|f| f.to_string())?;
        match self.local_query(&crate::locks::timer_query()) {
            Ok(Ok(Outcome::Lock(LockOutcome::Timers(state)))) => Ok(state),
            other => Err(format!("unexpected timer state answer: {other:?}")),
        }
    }

    /// A session's TTL from this replica's applied state, `None` if it is
    /// not live.
    pub(crate) fn local_session(
        &self,
        session: SessionId,
    ) -> Result<Option<SessionTimer>, ReplicaFailure> {
        match self.local_query(&Query::Lock(LockQuery::SessionTimer { session }))? {
            Ok(Outcome::Lock(LockOutcome::SessionTimer(info))) => Ok(info),
            other => Err(ReplicaFailure::Unavailable(format!(
                "unexpected session answer: {other:?}"
            ))),
        }
    }

    fn local_query(&self, query: &Query) -> Result<CommandResult, ReplicaFailure> {
        let reader = self.reader.read().unwrap_or_else(|p| p.into_inner());
        match reader.as_ref() {
            Some(r) => r
                .query(query)
                .map_err(|e| ReplicaFailure::Unavailable(e.to_string())),
            None => Err(ReplicaFailure::Unavailable(
                "this replica has shut down".into(),
            )),
        }
    }

    /// Propose a client's acquire; if it queues, wait here until its grant
    /// or cancel is applied on this replica, or `hold` passes (then answer
    /// the `Queued` outcome: the client asks again with the same request id,
    /// which the session's memory answers without a second grant).
    ///
    /// The waiter is registered before the acquire is proposed, so a grant
    /// applied at any moment after the proposal is seen.
    pub(crate) async fn acquire(
        &self,
        command: Command,
        hold: Duration,
        caller: &Caller,
    ) -> Result<CommandResult, ReplicaFailure> {
        let Command::Lock(LockCommand::Acquire {
            session,
            owner,
            request_id,
            wait_ms: Some(_),
            ..
        }) = &command
        else {
            return self.write(command, caller).await;
        };
        let (session, owner, id) = (*session, *owner, *request_id);
        self.check_serving()?;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let waiting = self.locks.waiters.register(session, owner, id);
        let result = self.write(command.clone(), caller).await;
        let Ok(Ok(Outcome::Lock(LockOutcome::Queued {
            name, request_id, ..
        }))) = &result
        else {
            // Not queued (granted, refused, not leader): nobody waits.
            drop(waiting);
            self.locks.waiters.forget(session, owner, id);
            return result;
        };
        let waited = tokio::time::timeout(hold, waiting).await;
        self.locks.waiters.forget(session, owner, id);
        match waited {
            Ok(Ok(WaitOutcome::Granted(sequencer))) => {
                Ok(Ok(Outcome::Lock(LockOutcome::Granted {
                    sequencer,
                    hold_count: 1,
                })))
            }
            Ok(Ok(WaitOutcome::Cancelled(WaitEnd::SessionEnded(_)))) => {
                Ok(Err(CommandError::SessionEnded { session }))
            }
            Ok(Ok(WaitOutcome::Cancelled(_))) => Ok(Err(CommandError::WaitCancelled {
                name: name.clone(),
                request_id: *request_id,
            })),
            // Timed out, lost track (snapshot), or shutting down: still
            // queued as far as this call knows.
            Ok(Ok(WaitOutcome::Unknown)) | Ok(Err(_)) | Err(_) => result,
        }
    }

    /// Extend `session`'s lease (leader only). Acknowledged after a
    /// leadership confirmation round begun after this call; writes nothing.
    pub(crate) async fn keep_alive(
        &self,
        session: SessionId,
        secret: SessionSecret,
        caller: &Caller,
    ) -> Result<CommandResult, ReplicaFailure> {
        self.check_serving()?;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        // While access control is on, only the session's owner (who must
        // still exist) keeps it alive: a deleted user's sessions expire and
        // free their locks. The leader checks its own applied state; a
        // keep-alive is not in the log.
        let may = match caller {
            Caller::Internal => Ok(()),
            Caller::Anonymous if self.auth_enabled()? => Err(CommandError::AuthRequired),
            Caller::Anonymous => Ok(()),
            Caller::User(user) => {
                let check = Query::As {
                    user: user.clone(),
                    query: Box::new(Query::Lock(LockQuery::Session { session })),
                };
                self.local_query(&check)?.map(|_| ())
            }
        };
        if let Err(refused) = may {
            return Ok(Err(refused));
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let ka = KeepAlive {
            session,
            secret,
            received: std::time::Instant::now(),
            reply,
        };
        if !self.locks.keep_alive(ka) {
            return Err(ReplicaFailure::Unavailable(
                "this replica is shutting down".into(),
            ));
        }
        match tokio::time::timeout(self.read_timeout * 2, answer).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(ReplicaFailure::Unavailable(
                "this replica is shutting down".into(),
            )),
            Err(_) => Err(ReplicaFailure::Unavailable(format!(
                "keep-alive not confirmed within {:?}",
                self.read_timeout * 2
            ))),
        }
    }

    /// A backup of the whole state (`latchkey_storage::backup`), as of an
    /// index at or after every write acknowledged before the call: the
    /// leader only, after a linearizable read's barrier; `caller` needs the
    /// admin permission while access control is on (a backup holds every
    /// session's secret and every user's password hash).
    pub(crate) async fn backup(
        &self,
        caller: &Caller,
    ) -> Result<Result<(BackupMeta, Vec<u8>), CommandError>, ReplicaFailure> {
        if matches!(caller, Caller::Anonymous) {
            return Err(ReplicaFailure::InvalidArgument(
                "a backup holds every session's secret and every user's password hash: it needs \
                 the cluster secret (--cluster-secret-file) or, with access control on, an admin \
                 user"
                    .into(),
            ));
        }
        // One at a time: each holds a copy of the whole state in memory.
        let _one = self.backups.try_lock().map_err(|_| {
            ReplicaFailure::Unavailable(
                "another backup is being taken on this replica; try again when it is done".into(),
            )
        })?;
        if let Err(refused) = self
            .read(Query::Auth(AuthQuery::List), false, caller)
            .await?
        {
            return Ok(Err(refused));
        }
        let reader = self
            .reader
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| ReplicaFailure::Unavailable("this replica has shut down".into()))?;
        tokio::task::spawn_blocking(move || reader.backup())
            .await
            .map_err(|e| ReplicaFailure::Unavailable(format!("the backup task failed: {e}")))?
            .map(Ok)
            .map_err(|e| ReplicaFailure::Unavailable(format!("cannot take a backup: {e}")))
    }

    /// Drop this replica's handle on the state (called at shutdown, after
    /// Raft has stopped), so its data directory can be opened again.
    pub(crate) fn close(&self) {
        self.reader
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// This replica's view of itself and the cluster.
    pub fn status(&self) -> NodeStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| MemberInfo {
                id: *id,
                peer_addr: node.peer_addr.clone(),
                client_addr: node.client_addr.clone(),
                voter: voters.contains(id),
                incarnation: node.incarnation,
                matched_index: m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id).cloned().flatten())
                    .map(|l| l.index),
            })
            .collect();
        // Never itself unless it leads (see `Replica::leader`).
        let leader_id = m
            .current_leader
            .filter(|l| *l != self.id || m.state == ServerState::Leader);
        let leader_addr =
            leader_id.and_then(|l| membership.get_node(&l).map(|n| n.client_addr.clone()));
        let raft_state = match m.state {
            ServerState::Leader => "Leader",
            ServerState::Follower => "Follower",
            ServerState::Candidate => "Candidate",
            ServerState::Learner => "Learner",
            ServerState::Shutdown => "Shutdown",
        };
        let (state, detail) = match self.health.condition() {
            Condition::Serving => (raft_state, None),
            Condition::Waiting(why) => ("Waiting", Some(why)),
            Condition::Failed(cause) => ("Failed", Some(cause)),
        };
        let failed = detail.is_some() && state == "Failed";
        NodeStatus {
            id: self.id,
            // A failed replica names no leader: it may be stale, and must
            // never be listed as one.
            leader_id: leader_id.filter(|_| !failed),
            leader_addr: leader_addr.filter(|_| !failed),
            term: m.current_term,
            last_applied: m.last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            state: state.to_string(),
            members,
            detail,
            incarnation: self.incarnation,
            peer_problems: self.peers.problems(),
        }
    }
}

impl Replica {
    /// Run one client operation: the one entry point of the unary RPCs, the
    /// call stream and the in-process path alike. An acquire's hold is
    /// capped at `MAX_ACQUIRE_HOLD` (five minutes).
    pub async fn call(&self, op: Operation) -> Result<CommandResult, ReplicaFailure> {
        self.call_as(op, &Caller::Internal).await
    }

    /// [`Replica::call`] for `caller`.
    pub(crate) async fn call_as(
        &self,
        op: Operation,
        caller: &Caller,
    ) -> Result<CommandResult, ReplicaFailure> {
        match op {
            Operation::Write(command) => self.write(command, caller).await,
            Operation::Read { query, stale } => self.read(query, stale, caller).await,
            Operation::Acquire { command, hold } => {
                self.acquire(command, hold.min(MAX_ACQUIRE_HOLD), caller)
                    .await
            }
            Operation::KeepAlive { session, secret } => {
                self.keep_alive(session, secret, caller).await
            }
        }
    }
}

/// A new session's secret: 128 bits from the operating system's generator.
/// The replica that proposes the open draws it, so a client cannot choose a
/// weak one, and the log carries it to every replica.
fn draw_session_secret() -> Result<SessionSecret, ReplicaFailure> {
    let mut bytes = [0u8; SessionSecret::LEN];
    getrandom::fill(&mut bytes).map_err(|e| {
        ReplicaFailure::Unavailable(format!(
            "cannot draw a session secret from the operating system: {e}"
        ))
    })?;
    Ok(SessionSecret(bytes))
}

/// Longest time a replica holds an acquire call while it waits.
pub const MAX_ACQUIRE_HOLD: Duration = Duration::from_secs(300);

impl LocalReplica for Replica {
    /// Counted in the request metrics like the operation's RPC (see
    /// `crate::metrics`).
    fn call(&self, op: Operation) -> BoxFuture<'_, Result<CommandResult, ReplicaFailure>> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            // The RPC this operation travels as over gRPC, for its label;
            // none for what only the replica itself asks.
            let rpc = latchkey_proto::wire::request_to_wire(&op)
                .ok()
                .map(|request| latchkey_proto::Rpc::of(&request));
            let result = Replica::call(self, op).await;
            if let Some(rpc) = rpc {
                self.metrics.request(
                    rpc.name(),
                    crate::services::outcome(&result),
                    started.elapsed(),
                );
            }
            result
        })
    }

    fn status(&self) -> NodeStatus {
        Replica::status(self)
    }
}
