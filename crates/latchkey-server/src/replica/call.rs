//! One client operation through the replica: the one entry point of the
//! unary RPCs, the call stream and the in-process path
//! ([`LocalReplica`]) alike.

use std::time::Duration;

use futures::StreamExt;

use latchkey_core::CommandResult;
use latchkey_proto::wire::{WatchError, WatchSpec};
use latchkey_proto::{BoxFuture, LocalReplica, NodeStatus, Operation, ReplicaFailure, WatchStream};

use crate::auth::Caller;
use crate::watch::Delivery;

use super::Replica;

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

/// Longest time a replica holds an acquire call while it waits.
const MAX_ACQUIRE_HOLD: Duration = Duration::from_secs(300);

impl LocalReplica for Replica {
    /// Counted in the request metrics like the operation's RPC (see
    /// `crate::metrics`).
    fn call(&self, op: Operation) -> BoxFuture<'_, Result<CommandResult, ReplicaFailure>> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            // The RPC this operation travels as over gRPC, for its label;
            // none for what only the replica itself asks.
            let rpc = latchkey_proto::Rpc::of_operation(&op);
            let result = Replica::call(self, op).await;
            if let Some(rpc) = rpc {
                self.metrics.request(
                    rpc.name(),
                    crate::metrics::outcome(&result),
                    started.elapsed(),
                );
            }
            result
        })
    }

    /// As the internal caller: the application embedding the replica.
    fn watch(&self, spec: WatchSpec) -> BoxFuture<'_, Result<WatchStream, WatchError>> {
        Box::pin(async move {
            let deliveries = self.open_watch(spec, &Caller::Internal, None, None).await?;
            let messages: WatchStream =
                Box::pin(deliveries.map(|item| item.map(Delivery::into_message)));
            Ok(messages)
        })
    }

    fn status(&self) -> NodeStatus {
        Replica::status(self)
    }
}
