//! [`LocalReplica`]: how a client reaches a replica in its own process
//! without gRPC.

use std::future::Future;
use std::pin::Pin;

use latchkey_core::CommandResult;

use crate::wire::{WatchError, WatchMessage, WatchSpec};
use crate::{NodeStatus, Operation, ReplicaFailure};

/// A boxed future, for the object-safe [`LocalReplica`] trait.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A watch's messages, then, if it ended with one, why it ended.
pub type WatchStream =
    Pin<Box<dyn futures::Stream<Item = Result<WatchMessage, WatchError>> + Send + 'static>>;

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

    /// Open a watch on this replica, as the `Watch` RPC opens one: its
    /// messages, ended by an error (the replica stopping ends it with
    /// `Unavailable`).
    fn watch(&self, spec: WatchSpec) -> BoxFuture<'_, Result<WatchStream, WatchError>>;

    /// This replica's view of itself and the cluster, as `Admin.Status`
    /// answers it.
    fn status(&self) -> NodeStatus;
}
