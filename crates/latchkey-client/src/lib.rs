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
//! It must not decide semantics (that is `latchkey-core`'s job) and must
//! never resend a write that could be applied twice: a key-value write is
//! resent only under its request id, which the replicas remember
//! (retry-safe writes, see [`Client::execute`]); any other write whose
//! outcome is unknown ends with [`Error::UnknownOutcome`].
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
//!
//! # Public paths
//!
//! Each public type is reachable one way: the everyday API ([`Client`],
//! [`Error`], [`ClientOptions`], [`Batch`], [`Session`], [`Lock`],
//! [`LockGuard`], ... and the core's types they take and
//! answer, such as [`Command`], [`ScanRange`] or [`Sequencer`]) at the crate
//! root; the types only an application embedding a replica needs
//! ([`LocalReplica`](local::LocalReplica) and its operation, future and
//! failure types) in [`local`]. Every other module is private.
//!
//! # Inside: layers, imports pointing down
//!
//! Bottom to top:
//!
//! 1. `error` ([`Error`]) and `options` ([`ClientOptions`]), read by every
//!    layer; they import no other module.
//! 2. The transport (`transport/`): how one attempt of a request reaches
//!    one remote replica and what it came to: the attempt's answer and its
//!    classification (`attempt`), call credentials, a replica's
//!    `Pipeline.Calls` stream (`call_stream`), and the endpoint that sends
//!    on it or as unary RPCs (`endpoint`).
//! 3. The router (`router`): leader discovery, retries with backoff, and
//!    the targets an attempt goes to (the in-process replica, or a
//!    transport endpoint); above it `writer`, retry-safe writes (a write
//!    tagged with a session and a request id, resent until answered) and
//!    the session a client opens for its own writes, whose request ids
//!    come from `request_window` (which imports nothing of the crate).
//! 4. The API rooms, each adding calls to [`Client`]: `kv` (the `Client`
//!    itself and its key-value calls; every other room that needs a
//!    `Client` imports it), `lock/` (sessions with their lease clock and
//!    watchdog, lock handles and guards, fenced writes, the lock table),
//!    `admin` (status, membership, backups), `auth` (access control) and
//!    `watch` (watches that resume by themselves). The storage side of
//!    fencing (the gates) is not here but in `latchkey-fence`: it runs in
//!    the storage service and needs no cluster.
//! 5. `lib.rs` and `local`, which only re-export.
//!
//! A module imports only modules of lower layers and, inside its layer or
//! folder, modules it does not import back: no import points upward and no
//! two modules import each other, directly or in a circle. The rooms
//! import each other only through `kv`; `lock/mod.rs` and
//! `transport/mod.rs` list which sibling each of their files imports.
//!

#![warn(missing_docs)]

mod admin;
mod auth;
mod error;
mod kv;
pub mod local;
mod lock;
mod options;
mod request_window;
mod router;
mod transport;
mod watch;
mod writer;

pub use admin::Backup;
pub use auth::UserInfo;
pub use error::Error;
pub use kv::{Batch, Client, Consistency, KeyRead, ScanPage, Swap};
pub use lock::{
    Election, EndedSession, LeaderChange, LeaderStream, Leadership, Lock, LockGuard, MultiLock,
    MultiLockGuard, Semaphore, Session,
};
pub use options::{ClientOptions, UserCredentials, MAX_CLIENT_DURATION};
pub use transport::{channel, TransportStats};
pub use watch::Watch;
// The core's and the contract crate's types that the API above takes or
// answers; the in-process ones are in `local`.
pub use latchkey_core::auth::Permission;
pub use latchkey_core::history::KeyChange;
pub use latchkey_core::lock::{
    HeldLock, HolderInfo, Leader, LockInfo, LockMode, Sequencer, SessionId, SessionListing,
    SessionSecret, Token,
};
pub use latchkey_core::watch::Selection;
pub use latchkey_core::{
    Command, CommandError, Compare, Outcome, Query, RevisionField, ScanRange, Test, Versioned,
};
pub use latchkey_proto::wire::WatchMessage;
pub use latchkey_proto::{Identity, MemberInfo, NodeStatus, TlsError, TlsOptions};
