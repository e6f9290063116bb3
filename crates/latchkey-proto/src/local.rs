//! [`LocalReplica`]: how a client reaches a replica in its own process
//! without gRPC.

use std::future::Future;
use std::pin::Pin;

use latchkey_core::CommandResult;

use crate::{NodeStatus, Operation, ReplicaFailure};

/// A boxed future, for the object-safe [`LocalReplica`] trait.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A replica in this process, called directly instead of over gRPC.
///
/// Implemented by latchkey-server's `Replica`; a client built with
/// `Client::with_local` sends requests here first while this replica is (or
/// may be) the leader, and over gRPC to the leader otherwise. A call behaves
/// exactly as the operation's RPC does: the replica serves both through the
/// same code.
pub trait LocalReplica: Send + Sync + 'static {
    /// Run `op`: writes, linearizable reads, acquires and keep-alives answer
    /// `NotLeader` without running on a replica that is not the leader.
    fn call(&self, op: Operation) -> BoxFuture<'_, Result<CommandResult, ReplicaFailure>>;

    /// This replica's view of itself and the cluster, as `Admin.Status`
    /// answers it.
    fn status(&self) -> NodeStatus;
}
