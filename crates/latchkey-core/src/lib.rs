//! # latchkey-core
//!
//! The deterministic heart of latchkey: what every command *does*. Given the
//! same store contents and the same log entry, every replica computes the same
//! result and the same writes.
//!
//! What lives here: command, query and outcome types ([`command`]), their
//! limits ([`limits`]), the keyspace layout ([`keyspace`]), the watch
//! history of every change ([`history`]) and which keys a watch names
//! ([`watch`]), the one codec
//! ([`codec`]), the lock service's semantics ([`lock`]: sessions, fencing
//! tokens, sequencers, FIFO waiting, lock-delay, fenced writes), access
//! control ([`auth`]: users, roles, permissions on prefixes), what a backup
//! holds and how a restore moves counters on ([`backup`]), and
//! [`apply`] / [`apply_with_events`] / [`query`] over any [`Store`].
//!
//! What must never live here: I/O, clocks, randomness, threads, async, or
//! iteration over a `HashMap`. Time arrives as [`Millis`] stamped by the
//! leader on each entry.
//!
//! ```
//! use latchkey_core::{apply, query, Command, MemStore, Outcome, Query, Request, Versioned};
//!
//! let mut store = MemStore::default();
//! let put = Request { now: 1, command: Command::Put { key: b"k".to_vec(), value: b"v".to_vec() } };
//! // The first change of a key makes revision 1.
//! assert_eq!(apply(&mut store, &put).unwrap(), Ok(Outcome::Written { revision: 1 }));
//! let got = query(&store, &Query::Get { key: b"k".to_vec() }).unwrap();
//! let v = Versioned { value: b"v".to_vec(), create_revision: 1, mod_revision: 1, version: 1 };
//! assert_eq!(got, Ok(Outcome::Value { value: Some(v), revision: 1 }));
//! ```

#![warn(missing_docs)]

pub mod auth;
pub mod backup;
pub mod codec;
pub mod command;
pub mod data;
mod error;
pub mod history;
pub mod keyspace;
mod kv;
pub mod limits;
pub mod lock;
pub mod overlay;
mod staged;
pub mod store;
mod validate;
pub mod watch;

pub use command::{
    BatchOp, Command, CommandResult, Compare, Condition, Millis, Outcome, Query, Request,
    RevisionField, ScanRange, Test, Versioned,
};
pub use error::{CommandError, StoreError};
pub use kv::{apply, apply_with_events, query};
pub use lock::Event;
pub use store::{MemStore, Store};
pub use validate::{validate_command, validate_query};
