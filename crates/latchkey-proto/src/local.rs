//! [`LocalReplica`]: how a client reaches a replica in its own process
//! without gRPC.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use latchkey_core::lock::SessionId;
use latchkey_core::{Command, CommandResult, Query};

use crate::ReplicaFailure;

/// A boxed future, for the object-safe [`LocalReplica`] trait.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A replica in this process, called directly instead of over gRPC.
///
/// Implemented by latchkey-server's `Replica`; a client built with
/// `Client::with_local` sends requests here first while this replica is (or
/// may be) the leader, and over gRPC to the leader otherwise. Each method
/// behaves exactly as its RPC does.
pub trait LocalReplica: Send + Sync + 'static {
    /// Propose a write; answers `NotLeader` without proposing if not leader.
    fn write(&self, command: Command) -> BoxFuture<'_, Result<CommandResult, ReplicaFailure>>;
    /// Serve a read, linearizable unless `stale`.
    fn read(
        &self,
        query: Query,
        stale: bool,
    ) -> BoxFuture<'_, Result<CommandResult, ReplicaFailure>>;
    /// Propose an acquire and, if it queues, wait up to `hold` for its grant
    /// or cancel (see the `Lock.Acquire` RPC).
    fn acquire(
        &self,
        command: Command,
        hold: Duration,
    ) -> BoxFuture<'_, Result<CommandResult, ReplicaFailure>>;
    /// Extend a session's lease (see the `Lock.KeepAlive` RPC).
    fn keep_alive(
        &self,
        session: SessionId,
    ) -> BoxFuture<'_, Result<CommandResult, ReplicaFailure>>;
}
