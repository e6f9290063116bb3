//! [`LockHost`]: what the lock task needs of its replica, and nothing more.

use std::future::Future;

use latchkey_core::lock::{LockCommand, SessionId, SessionTimer, TimerState};
use latchkey_core::CommandResult;
use latchkey_proto::ReplicaFailure;
use latchkey_storage::TypeConfig;
use openraft::metrics::RaftServerMetrics;
use openraft::type_config::alias::WatchReceiverOf;

use crate::metrics::Metrics;

use super::shared::LockShared;

/// The replica as its lock task sees it: who leads, the leader's own
/// proposals and reads, and where grants, holds and keep-alives are
/// counted. The replica's request path implements it; the lock task holds
/// nothing else of the replica.
pub(crate) trait LockHost: Send + Sync + 'static {
    /// Raft's vote, state and leader, as they change.
    fn server_metrics(&self) -> WatchReceiverOf<TypeConfig, RaftServerMetrics<TypeConfig>>;

    /// The leader this replica knows (for `NotLeader` answers).
    fn leader(&self) -> Option<(u64, String)>;

    /// What the request handlers share with the lock task.
    fn shared(&self) -> &LockShared;

    /// Where the lock task counts waits, holds and keep-alive margins.
    fn metrics(&self) -> &Metrics;

    /// A session's TTL and secret from the replica's applied state, `None`
    /// if it is not live.
    fn local_session(&self, session: SessionId) -> Result<Option<SessionTimer>, ReplicaFailure>;

    /// The countdowns a new leader restarts, read once everything committed
    /// before now is applied.
    fn timer_state(&self) -> impl Future<Output = Result<TimerState, String>> + Send;

    /// One leadership confirmation round (for keep-alives).
    fn confirm_leadership(&self) -> impl Future<Output = Result<(), ReplicaFailure>> + Send;

    /// Propose one of the leader's own commands (an expiry or a countdown
    /// checkpoint).
    fn propose_own(
        &self,
        command: LockCommand,
    ) -> impl Future<Output = Result<CommandResult, ReplicaFailure>> + Send;
}
