//! The typed client API (`latchkey.v1`) and the core's types, converted
//! both ways.
//!
//! A client hands an [`Operation`] (a core [`Command`] or [`Query`], an
//! acquire that may wait, or a keep-alive) to [`request_to_wire`]; the
//! replica turns the typed request back with [`request_from_wire`], runs it,
//! and answers with [`reply_to_wire`], shaped by the [`Rpc`] that was
//! called; the client reads the reply with [`reply_from_wire`]. The unary
//! RPCs and the `Pipeline.Calls` stream carry the very same messages, so one
//! conversion serves both.
//!
//! Conversions are exact: a command or result that goes to the wire and
//! back is unchanged (tested in `tests/`). Only what a client may send has
//! a wire form: commands the leader proposes itself (session expiry,
//! lock-lease and lock-delay ends), the leader's packing of writes into one
//! entry, and the timer query stay internal, and [`request_to_wire`] refuses
//! them.
//!
//! A request that the typed schema accepts but that breaks a rule the schema
//! cannot state (a required message missing, an unknown enum value) is
//! refused here with a [`ReplicaFailure::InvalidArgument`] naming the field;
//! the limits of [`latchkey_core::limits`] are checked afterwards by the
//! replica, as for every command.
//!
//! # Rooms
//!
//! Each room holds one kind of message, its encoding beside its decoding:
//!
//! - `operation.rs`: [`Operation`], what a call asks for;
//! - `rpc.rs`: [`Rpc`], which RPC a call travels as;
//! - `request.rs`: operations to typed requests and back (key-value
//!   requests), handing lock requests to `lock_request.rs`;
//! - `reply.rs`: command results to typed replies and back (key-value
//!   replies, and a reply that is an error alone), handing lock replies to
//!   `lock_reply.rs`;
//! - `batch.rs`: a conditional write's conditions, puts and deletes;
//! - `lock_parts.rs`: lock modes, sequencers and holders, which requests,
//!   replies and errors all carry;
//! - `error.rs`: [`CommandError`] and [`ReplicaFailure`] to the typed
//!   `Error` and back;
//! - `grant.rs`: access-control grants;
//! - `status.rs`: a replica's [`NodeStatus`](crate::NodeStatus) and the
//!   typed `StatusReply` of `Admin.Status`;
//! - `watch.rs`: a watch's request, its messages and why it ends (a
//!   stream of its own, not an [`Operation`]);
//! - `fault.rs`: how a conversion refuses its input.
//!
//! Imports run one way, from the entry points down, never back up:
//! `request` imports `lock_request`, `batch`, `operation` and `rpc`;
//! `reply` imports `lock_reply`, `error` and `rpc`; `lock_request` imports
//! `batch`, `lock_parts` and `operation`; `lock_reply` imports `lock_parts`
//! and `rpc`; `error` imports `lock_parts`; `lock_parts` and `batch` import
//! only `fault`. `watch` imports `batch`, `error` and `fault`.
//! `operation`, `rpc`, `fault`, `grant` and `status` import
//! no other room, and no room imports this module: it only declares the
//! rooms and re-exports their public items.
//!
//! [`Command`]: latchkey_core::Command
//! [`Query`]: latchkey_core::Query
//! [`CommandError`]: latchkey_core::CommandError
//! [`ReplicaFailure`]: crate::ReplicaFailure
//! [`ReplicaFailure::InvalidArgument`]: crate::ReplicaFailure::InvalidArgument

mod batch;
mod error;
mod fault;
mod grant;
mod lock_parts;
mod lock_reply;
mod lock_request;
mod operation;
mod reply;
mod request;
mod rpc;
mod status;
#[cfg(test)]
mod tests;
mod watch;

pub use error::{command_error_to_wire, error_from_wire};
pub use grant::{grant_from_wire, grant_to_wire};
pub use lock_request::DEFAULT_ACQUIRE_HOLD;
pub use operation::Operation;
pub use reply::{error_reply, reply_from_wire, reply_to_wire};
pub use request::{request_from_wire, request_to_wire};
pub use rpc::Rpc;
pub use watch::{
    watch_error_to_wire, watch_message_to_wire, watch_reply_from_wire, watch_request_from_wire,
    watch_request_to_wire, WatchError, WatchMessage, WatchSpec, DEFAULT_PROGRESS, MAX_PROGRESS,
    MIN_PROGRESS,
};
