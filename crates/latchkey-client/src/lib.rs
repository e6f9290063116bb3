//! # latchkey-client
//!
//! The client of a latchkey cluster: finds the leader, follows its hints,
//! retries across leader changes with bounded backoff, and ends with a clear
//! [`Error`] when the cluster cannot answer in time. The same [`Client`]
//! serves remote programs (over gRPC, [`Client::connect`]) and the
//! application that embeds a replica (in-process, [`Client::with_local`]).
//!
//! Every request is a typed `latchkey.v1` call (the same API a Python or Go
//! program uses, see `proto/latchkey.proto`). Requests to one replica share
//! one long-lived `Pipeline.Calls` stream: each is sent at once, requests at
//! hand together share a frame, and the replica answers each by id as soon
//! as it is done. Nothing waits on a timer, so a lone caller sees no added
//! latency. [`Client::transport_stats`] counts requests and the frames that
//! carried them.
//!
//! Inside, imports point one way: the API rooms ([`Client`]'s key-value
//! calls in `kv`, sessions and locks in `lock`, fences in `fence`, `admin`)
//! build an operation and hand it to the `router` (leader discovery,
//! retries), which sends each attempt through a target: the in-process
//! replica, or a remote endpoint (`transport`, `call_stream`).
//!
//! It must not decide semantics (that is `latchkey-core`'s job) and must
//! never retry a write whose outcome is unknown: such a call ends with
//! [`Error::UnknownOutcome`] so nothing is applied twice behind the caller's
//! back.
//!
//! ```no_run
//! # async fn demo() -> Result<(), latchkey_client::Error> {
//! use latchkey_client::{Batch, Client, ScanRange};
//! let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
//! client.put("user/1", "ada").await?;
//! client.batch(Batch::new().put("user/2", "grace").put("user/3", "barbara")).await?;
//! let page = client.scan(ScanRange::prefix("user/", 100)).await?;
//! assert_eq!(page.entries.len(), 3);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod admin;
pub mod auth;
mod call_stream;
mod error;
pub mod fence;
mod kv;
mod lease_clock;
mod lock;
mod router;
pub mod session;
mod transport;

pub use admin::Backup;
pub use error::Error;
pub use fence::{Admission, FenceError, FenceGate, FileFenceGate, MemoryFenceGate};
pub use kv::{Batch, Client, Consistency, ScanPage};
// The contract shared with replicas lives in latchkey-proto; re-exported
// here because client users meet these types.
pub use auth::UserInfo;
pub use latchkey_core::auth::Permission;
pub use latchkey_core::lock::{
    HolderInfo, LockInfo, LockMode, Sequencer, SessionId, SessionSecret, Token,
};
pub use latchkey_core::{Command, CommandError, CommandResult, Outcome, Query, ScanRange};
pub use latchkey_proto::{
    BoxFuture, Identity, LocalReplica, MemberInfo, NodeStatus, Operation, ReplicaFailure, TlsError,
    TlsOptions, MAX_FRAME_CALLS, MAX_MESSAGE_BYTES,
};
pub use lock::{Lock, LockGuard};
pub use router::{channel, ClientOptions, UserCredentials, MAX_CLIENT_DURATION};
pub use session::Session;
pub use transport::TransportStats;
