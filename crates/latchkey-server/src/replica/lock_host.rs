//! The replica as its lock task sees it ([`LockHost`]).

use std::future::Future;

use latchkey_core::lock::{LockCommand, SessionId, SessionTimer, TimerState};
use latchkey_core::CommandResult;
use latchkey_proto::ReplicaFailure;
use latchkey_storage::TypeConfig;
use openraft::metrics::RaftServerMetrics;
use openraft::type_config::alias::WatchReceiverOf;

use crate::locks::{LockHost, LockShared};
use crate::metrics::Metrics;

use super::Replica;

impl LockHost for Replica {
    fn server_metrics(&self) -> WatchReceiverOf<TypeConfig, RaftServerMetrics<TypeConfig>> {
        self.raft().server_metrics()
    }

    fn leader(&self) -> Option<(u64, String)> {
        Replica::leader(self)
    }

    fn shared(&self) -> &LockShared {
        &self.locks
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn local_session(&self, session: SessionId) -> Result<Option<SessionTimer>, ReplicaFailure> {
        Replica::local_session(self, session)
    }

    fn timer_state(&self) -> impl Future<Output = Result<TimerState, String>> + Send {
        Replica::timer_state(self)
    }

    fn confirm_leadership(&self) -> impl Future<Output = Result<(), ReplicaFailure>> + Send {
        Replica::confirm_leadership(self)
    }

    fn propose_own(
        &self,
        command: LockCommand,
    ) -> impl Future<Output = Result<CommandResult, ReplicaFailure>> + Send {
        Replica::propose_own(self, command)
    }
}
