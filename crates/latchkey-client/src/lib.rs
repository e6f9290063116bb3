//! # latchkey-client
//!
//! The client of a latchkey cluster: finds the leader, follows its hints,
//! retries across leader changes with bounded backoff, and ends with a clear
//! [`Error`] when the cluster cannot answer in time. The same [`Client`]
//! serves remote programs (over gRPC, [`Client::connect`]) and the
//! application that embeds a replica (in-process, [`Client::with_local`]).
//!
//! Requests to one replica (writes, reads, acquires, session keep-alives)
//! share one long-lived `Kv.Calls` stream: each is sent at once, requests at hand together share
//! a frame, and the replica answers each by id as soon as it is done.
//! Against a replica without that stream, concurrent requests share gRPC
//! calls instead: a request that finds a free call slot (at most
//! [`ClientOptions::max_batch_in_flight`] per replica, for writes and for
//! reads each) is sent at once on its own; those that arrive while every
//! slot is busy are packed into one `WriteMany` or `ReadMany` call, sent the
//! moment a slot frees. Nothing waits on a timer, so a lone caller sees no
//! added latency. Each request keeps its own result and its own retry
//! rules, exactly as if it had been sent alone. [`Client::packing_stats`]
//! counts requests and the calls and frames that carried them.
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

mod admin;
mod call_stream;
mod coalesce;
mod error;
mod fence;
mod kv;
mod lease_clock;
mod lock;
mod router;

pub use coalesce::PackingStats;
pub use error::Error;
pub use fence::{Admission, FenceError, FenceGate, FileFenceGate, MemoryFenceGate};
pub use kv::{Batch, Client, Consistency, ScanPage};
// The contract shared with replicas lives in latchkey-proto; re-exported
// here because client users meet these types.
pub use latchkey_core::lock::{HolderInfo, LockInfo, LockMode, Sequencer, SessionId, Token};
pub use latchkey_core::{Command, CommandError, CommandResult, Outcome, Query, ScanRange};
pub use latchkey_proto::{
    BoxFuture, LocalReplica, MemberInfo, NodeStatus, ReplicaFailure, MAX_BATCH_ITEMS,
    MAX_MESSAGE_BYTES, UNKNOWN_CALL,
};
pub use lock::{Lock, LockGuard, Session};
pub use router::{channel, ClientOptions};
