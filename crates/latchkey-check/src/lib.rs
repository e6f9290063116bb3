//! # latchkey-check
//!
//! Checkers for the histories the nemesis harness records: each reads a
//! [`History`] of invoke / ok / fail / unknown events and returns a
//! [`Verdict`]: pass, fail or inconclusive, and on failure the shortest
//! slice of history it found that shows the violation.
//!
//! - [`lock_safety`]: fencing tokens belong to one holder and only go up;
//!   stores never accept a stale token (and, reported only, client-side
//!   hold windows that overlapped);
//! - [`linearizable`]: the register workload (read, write, compare-and-put)
//!   is linearizable, key by key, with indeterminate operations handled;
//! - [`sequences`]: `next_sequence` never hands out a number twice and
//!   never goes back;
//! - [`durability`]: no acknowledged put is missing after a full restart;
//! - [`watch`]: every watcher receives exactly the committed changes of its
//!   prefix, in revision order, with no gap or duplicate across reconnects;
//! - [`semaphores`]: never more permits proven held at once (by writes the
//!   store accepted) than the semaphore has;
//! - [`elections`]: every election observer is told the terms in increasing
//!   order, none granted in between left out;
//! - [`abandoned`]: a dead holder's lock, across leader churn, is freed
//!   neither before its lease ran out nor long after the documented
//!   failover bound (the measured extension is reported, never judged
//!   on its own).
//!
//! [`check_all`] runs the eight. A history may hold several workloads at
//! once: each checker reads only its own operations.
//!
//! What must never live here: I/O, clocks, randomness, threads. Time comes
//! in the events (`time_ns`, monotonic, stamped by the recorder); every
//! iteration that reaches the output is in a deterministic order, so the
//! same history always gets the same verdict and the same witness. Parsing
//! and printing JSON lines works on strings: reading the file is the
//! harness's job.
//!
//! ```
//! use latchkey_check::history::{ops, HistoryBuilder};
//! use latchkey_check::{linearizable, Status};
//!
//! let mut h = HistoryBuilder::new();
//! h.invoke(1, 0, ops::write("x", "1"));
//! h.ok(1, 10, ops::write("x", "1"));
//! h.invoke(1, 20, ops::write("x", "2"));
//! h.ok(1, 30, ops::write("x", "2"));
//! // A read that starts after both writes completed returns the old value.
//! h.invoke(2, 40, ops::read("x", None));
//! h.ok(2, 50, ops::read("x", Some("1")));
//! let history = h.build().unwrap();
//!
//! let verdict = linearizable::check(&history);
//! assert_eq!(verdict.status, Status::Fail);
//! // The witness: the second write and the stale read.
//! let witness: Vec<u64> = verdict.witness.iter().map(|e| e.index).collect();
//! assert_eq!(witness, vec![2, 3, 4, 5]);
//! println!("{verdict}");
//! ```

#![warn(missing_docs)]

pub mod abandoned;
mod claim;
pub mod durability;
pub mod elections;
pub mod history;
pub mod linearizable;
pub mod lock_safety;
mod order;
pub mod semaphores;
pub mod sequences;
mod verdict;
pub mod watch;

pub use history::{
    Event, EventKind, History, HistoryBuilder, HistoryError, Op, Operation, Outcome,
};
pub use verdict::{Status, Verdict};

/// A checker: a history in, a verdict out.
pub type Checker = fn(&History) -> Verdict;

/// Every checker with its defaults, by name: lock safety,
/// linearizability, sequences, durability, watch, semaphores, election
/// observers, the abandoned lock, in that order.
pub const CHECKERS: [(&str, Checker); 8] = [
    (lock_safety::NAME, lock_safety::check),
    (linearizable::NAME, linearizable::check),
    (sequences::NAME, sequences::check),
    (durability::NAME, durability::check),
    (watch::NAME, watch::check),
    (semaphores::NAME, semaphores::check),
    (elections::NAME, elections::check),
    (abandoned::NAME, abandoned::check),
];

/// Runs every checker of [`CHECKERS`], in that order.
pub fn check_all(history: &History) -> Vec<Verdict> {
    CHECKERS.iter().map(|(_, check)| check(history)).collect()
}
