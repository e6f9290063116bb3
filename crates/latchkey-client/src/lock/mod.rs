//! The lock service's room: sessions, their leases and watchdog, lock
//! handles and guards, fenced writes and the lock table. The files, each
//! importing only those before it (and the layers below: `kv`'s
//! [`Client`](crate::Client), the router through it, `error`):
//!
//! - `lease_clock`: the clock every lease is judged on (`Instant` moved
//!   forward by the time the machine spent suspended); imports nothing;
//! - `detached`: finishing a release or close in a task of its own, so a
//!   caller that stops waiting does not leave it half done; imports
//!   nothing;
//! - `watchdog`: a session's lease state and the task renewing it with
//!   keep-alives; imports `lease_clock`;
//! - `session`: [`Session`], opening and closing one; imports
//!   `lease_clock`, `detached`, `watchdog`;
//! - `guard`: [`LockGuard`], a held grant and its release; imports
//!   `lease_clock`, `detached`, `session`;
//! - `handle`: [`Lock`], one owner's handle and acquiring it (and
//!   [`Session::lock`], which makes one); imports `lease_clock`, `session`,
//!   `guard`;
//! - `jeopardy`: [`Session::at_risk`], warning before a session is lost,
//!   and [`LockGuard::while_held`]; imports `lease_clock`, `session`,
//!   `guard`;
//! - `election`: [`Election`], [`Leadership`], [`Client::leader`](crate::Client::leader)
//!   and [`Client::observe_leader`](crate::Client::observe_leader): fenced
//!   leader election on an election's lock; imports `session`, `guard`,
//!   `handle`;
//! - `semaphore`: [`Semaphore`], at most N holders of a name, each
//!   permit fenced by its own token; imports `session`, `guard`, `handle`;
//! - `multi_lock`: [`MultiLock`] and [`MultiLockGuard`], several locks
//!   taken in one step or none and released together; imports `detached`,
//!   `session`, `guard`, `handle`;
//! - `fenced`: [`Client::put_fenced`](crate::Client::put_fenced) and the
//!   other writes fenced by a sequencer; imports no sibling;
//! - `table`: [`Client::locks`](crate::Client::locks) and
//!   [`Client::check_sequencer`](crate::Client::check_sequencer), the lock
//!   table read without a session; imports no sibling;
//! - `operator`: [`Client::end_session`](crate::Client::end_session), an
//!   operator ending someone else's session; imports no sibling.
//!
//! Nothing outside this folder imports it but `lib.rs`, which re-exports
//! [`Session`], [`Lock`], [`LockGuard`] and [`EndedSession`] at the crate
//! root.

mod detached;
mod election;
mod fenced;
mod guard;
mod handle;
mod jeopardy;
mod lease_clock;
mod multi_lock;
mod operator;
mod semaphore;
mod session;
mod table;
mod watchdog;

pub use election::{Election, LeaderChange, LeaderStream, Leadership};
pub use guard::LockGuard;
pub use handle::Lock;
pub use multi_lock::{MultiLock, MultiLockGuard};
pub use operator::EndedSession;
pub use semaphore::Semaphore;
pub use session::Session;
