//! What only an application embedding a replica needs: the contract by
//! which [`Client::with_local`](crate::Client::with_local) calls a replica
//! in the same process instead of over gRPC. latchkey's `Node` is such an
//! application; a program that only talks to a cluster never meets these.
//!
//! [`LocalReplica`], [`BoxFuture`], [`Operation`] and [`ReplicaFailure`]
//! are the contract crate's (`latchkey-proto`), [`CommandResult`] (what
//! [`LocalReplica::call`] answers) the core's; this crate re-exports them
//! here and nowhere else.

pub use latchkey_core::CommandResult;
pub use latchkey_proto::wire::{WatchError, WatchSpec};
pub use latchkey_proto::{BoxFuture, LocalReplica, Operation, ReplicaFailure, WatchStream};
