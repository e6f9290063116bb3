//! The history model: what a workload recorded, event by event.
//!
//! A recorder (the nemesis harness) writes one [`Event`] per line of JSON:
//! an [`EventKind::Invoke`] when a client starts an operation, then one
//! completion of the same process: [`EventKind::Ok`] (it took effect, with
//! its result), [`EventKind::Fail`] (it certainly did not take effect) or
//! [`EventKind::Unknown`] (indeterminate: a timeout, a lost connection, a
//! crash; it may or may not have taken effect, now or later). An invocation
//! still open at the end of the history counts as unknown.
//!
//! A few operations are instants, observations with no duration and no
//! pairing: [`LockOp::HoldStart`] and [`LockOp::HoldEnd`], recorded as a
//! single [`EventKind::Ok`] event.
//!
//! [`History::new`] sorts events by index, checks that the history is well
//! formed (see [`HistoryError`]) and pairs invocations with completions by
//! process: each process has at most one operation in flight.
//!
//! Real-time order: operation A precedes B when A completed definitely (ok
//! or fail) at a `time_ns` strictly lower than B's invocation. Equal
//! timestamps count as concurrent, the cautious reading.
//!
//! The JSON form of an event:
//!
//! ```json
//! {"index":7,"process":2,"time_ns":1500,"kind":"ok",
//!  "op":{"workload":"register","type":"cas","key":"x","expected":"1","new":"2","succeeded":true}}
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

mod display;
pub mod ops;
#[cfg(test)]
pub(crate) mod testing;

/// A key of the register, sequence or durability workloads.
pub type Key = String;
/// A value written to or read from a key.
pub type Value = String;

/// What an event says about its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The client started the operation; its `op` carries the inputs.
    Invoke,
    /// The operation took effect; its `op` carries inputs and results.
    Ok,
    /// The operation certainly did not take effect.
    Fail,
    /// Indeterminate: the operation may or may not have taken effect, at any
    /// time after its invocation.
    Unknown,
}

/// One line of a history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the history, unique, assigned by the recorder in the
    /// order events happened.
    pub index: u64,
    /// The client (thread, task) that performed the operation. A process has
    /// at most one operation in flight.
    pub process: u64,
    /// Monotonic timestamp in nanoseconds, taken by the recorder; never
    /// decreases along `index`.
    pub time_ns: u64,
    /// Invocation or completion.
    pub kind: EventKind,
    /// The operation, with its results on an ok completion.
    pub op: Op,
}

/// An operation of one of the workloads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "workload", rename_all = "snake_case")]
pub enum Op {
    /// Register workload (linearizability).
    Register(RegisterOp),
    /// Lock and fencing workload (lock safety).
    Lock(LockOp),
    /// Sequence workload (`next_sequence`).
    Sequence(SequenceOp),
    /// Durability workload (acknowledged puts survive a full restart).
    Durability(DurabilityOp),
    /// Watch workload (every watcher sees exactly the committed changes).
    Watch(WatchOp),
    /// Semaphore workload (never more accepted fenced writers than permits).
    Semaphore(SemaphoreOp),
    /// Election observers (terms in order, none skipped).
    Election(ElectionOp),
    /// The leader-churn phase: a dead holder's lock is freed within its
    /// TTL plus a bounded margin while the leader keeps moving.
    Churn(ChurnOp),
}

/// Register operations on independent keys. A key that was never written
/// is absent (`None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RegisterOp {
    /// Linearizable read. `value` is the result: ignored on the invocation;
    /// on ok, the value read (`None`: the key is absent).
    Read {
        /// The key read.
        key: Key,
        /// The value read (ok completion only).
        #[serde(default)]
        value: Option<Value>,
    },
    /// Unconditional write.
    Write {
        /// The key written.
        key: Key,
        /// The value written.
        value: Value,
    },
    /// Compare-and-put: write `new` only if the current value equals
    /// `expected` (`None`: the key must be absent).
    Cas {
        /// The key.
        key: Key,
        /// The value the key must hold.
        expected: Option<Value>,
        /// The value written on success.
        new: Value,
        /// The result: `None` on the invocation, required on ok. An ok with
        /// `false` means the comparison failed and nothing was written.
        #[serde(default)]
        succeeded: Option<bool>,
    },
}

/// Where a fenced write goes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "store", rename_all = "snake_case")]
pub enum FenceTarget {
    /// External storage guarded by a client-side fence gate: it accepts a
    /// token not lower than the highest it has seen.
    Gate,
    /// latchkey's own KV: a fenced put applied only while the sequencer is
    /// the lock's current exclusive holder.
    Kv {
        /// The KV key written.
        key: Key,
    },
}

/// Lock service operations. `holder` names the session and owner that asked
/// (any string the recorder finds useful, e.g. `"s7/c2"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LockOp {
    /// An exclusive acquire; its ok completion is the grant, with the
    /// fencing token (`None` on the invocation, required on ok).
    Acquire {
        /// The lock name.
        resource: String,
        /// Who asked.
        holder: String,
        /// The fencing token granted.
        #[serde(default)]
        token: Option<u64>,
    },
    /// Instant: from here the client believes it holds the lock with `token`.
    HoldStart {
        /// The lock name.
        resource: String,
        /// Who believes it holds the lock.
        holder: String,
        /// The token of that grant.
        token: u64,
    },
    /// Instant: from here the client no longer believes it holds the lock
    /// (released, lease lost, watchdog gave up).
    HoldEnd {
        /// The lock name.
        resource: String,
        /// Who held it.
        holder: String,
        /// The token of that grant.
        token: u64,
    },
    /// A write carrying a fencing token, to a resource guarded by lock
    /// `resource`. `accepted` is `None` on the invocation, required on ok:
    /// `Some(false)` is a refusal (a stale token). A fail completion also
    /// means not accepted.
    FencedWrite {
        /// The lock that guards the target.
        resource: String,
        /// The store written.
        target: FenceTarget,
        /// Who wrote.
        holder: String,
        /// The token the write carried.
        token: u64,
        /// Whether the store accepted the write.
        #[serde(default)]
        accepted: Option<bool>,
    },
}

/// Semaphore operations: permits of a semaphore, each a grant with a token
/// of its own, and the fenced writes a permit holder makes with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SemaphoreOp {
    /// An acquire of one permit; its ok completion is the grant, with the
    /// permit's token (`None` on the invocation, required on ok).
    Acquire {
        /// The semaphore's name.
        semaphore: String,
        /// The permit count the acquire named.
        permits: u32,
        /// Who asked.
        holder: String,
        /// The permit's fencing token.
        #[serde(default)]
        token: Option<u64>,
    },
    /// A KV write fenced by a permit: the store applies it only while the
    /// permit is held. `accepted` is `None` on the invocation, required on
    /// ok (`Some(false)`: refused as stale).
    FencedWrite {
        /// The semaphore whose permit fences the write.
        semaphore: String,
        /// The KV key written.
        key: Key,
        /// Who wrote.
        holder: String,
        /// The permit's token.
        token: u64,
        /// Whether the store accepted the write.
        #[serde(default)]
        accepted: Option<bool>,
    },
}

/// What an election's observer was told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ElectionOp {
    /// Instant: from here on the observer (the event's process) was told
    /// that `term` leads `election` (`None`: nobody leads).
    Observed {
        /// The election.
        election: String,
        /// The leader's term; `None` while nobody leads.
        #[serde(default)]
        term: Option<u64>,
        /// True when changes before this one may have been missed (the
        /// cluster's history no longer held them and the observer read the
        /// leader again): no gap is judged across it.
        #[serde(default)]
        skipped: bool,
    },
}

/// Whom an acquire of the leader-churn phase is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChurnRole {
    /// The client that takes the lock, then is SIGKILLed holding it.
    Holder,
    /// The client queued for the lock behind the holder.
    Waiter,
}

/// The leader-churn phase of a run: a holder takes a lock in a session
/// with a short TTL and is SIGKILLed; a waiter is queued for the lock; the
/// harness kills the leader again and again while the holder is dead.
/// Every time is the recorder's clock (the events' `time_ns`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChurnOp {
    /// An exclusive acquire of `resource` by `role`, in a session whose
    /// TTL is `ttl_ms`; its ok completion is the grant, with the fencing
    /// token (`None` on the invocation, required on ok).
    Acquire {
        /// The lock name.
        resource: String,
        /// Who asked.
        holder: String,
        /// The holder or the waiter.
        role: ChurnRole,
        /// The TTL of the session the acquire was made in, in ms.
        ttl_ms: u64,
        /// The fencing token granted.
        #[serde(default)]
        token: Option<u64>,
    },
    /// Instant: the holder's client vouches for its lease until `until_ns`
    /// (the send of its last acknowledged keep-alive plus the TTL, less the
    /// client's margin). The cluster must not free the lock before.
    Vouched {
        /// The lock name.
        resource: String,
        /// The holder.
        holder: String,
        /// Until when (the recorder's clock, ns).
        until_ns: u64,
    },
    /// Instant: the holder's process was SIGKILLed (recorded once it was
    /// reaped: it is dead from here).
    HolderKilled {
        /// The lock name.
        resource: String,
        /// The holder.
        holder: String,
    },
    /// Instant: the harness SIGKILLed replica `node` (its id), which said
    /// it led in `term`.
    LeaderKilled {
        /// The killed replica's id.
        node: u64,
        /// The term it led in.
        term: u64,
    },
    /// Instant: replica `node` says it leads in `term`, above the killed
    /// leader's, and a linearizable read succeeded: the cluster has a
    /// ready leader again.
    LeaderReady {
        /// The new leader's id.
        node: u64,
        /// Its term.
        term: u64,
    },
    /// Instant: the phase could not be carried out, and why.
    Skipped {
        /// Why.
        reason: String,
    },
}

/// A half-open range `[start, end)` of sequence numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SeqRange {
    /// First number allocated.
    pub start: u64,
    /// One past the last number allocated.
    pub end: u64,
}

/// Sequence operations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SequenceOp {
    /// `next_sequence(key, step)`: allocates `[start, start + step)`.
    /// `range` is `None` on the invocation, required on ok.
    Alloc {
        /// The sequence key.
        key: Key,
        /// How many numbers were asked for (0 reads the next start).
        step: u64,
        /// The numbers allocated.
        #[serde(default)]
        range: Option<SeqRange>,
    },
}

/// Durability operations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DurabilityOp {
    /// A put; an ok completion is an acknowledgement.
    Put {
        /// The key written.
        key: Key,
        /// The value written; unique per put for the checker to be exact.
        value: Value,
    },
    /// The final observation after every replica was killed and restarted:
    /// every key of the workload and its value; a key missing from `values`
    /// is absent. `None` on the invocation, required on ok.
    ReadAll {
        /// What was read.
        #[serde(default)]
        values: Option<BTreeMap<Key, Value>>,
    },
}

/// One key's change in a watch message: its value after the change, or
/// `None` when the change deleted it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WatchChange {
    /// The key.
    pub key: Key,
    /// The value after the change; `None`: deleted.
    #[serde(default)]
    pub value: Option<Value>,
}

/// Watch workload operations: writers put and delete keys under one
/// prefix; watchers list the prefix, then watch it, recording what they
/// receive as instants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WatchOp {
    /// A write of watched keys in one command (a batch): puts (`Some`
    /// value, unique per put) and deletes (`None`). `revision` is the
    /// revision it was applied at (`None` on the invocation, required on
    /// ok).
    Write {
        /// The keys written, in order.
        changes: Vec<WatchChange>,
        /// The revision of the write.
        #[serde(default)]
        revision: Option<u64>,
        /// The session the written keys are bound to (their puts go when it
        /// ends); `None`: plain keys.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<u64>,
    },
    /// A linearizable read of `key`, bound to `session`, made after the
    /// client's close of that session was acknowledged. `present` is the
    /// result (`None` on the invocation, required on ok): it must be
    /// `false`, the close took the key with it.
    Gone {
        /// The key.
        key: Key,
        /// The closed session it was bound to.
        session: u64,
        /// Whether the key was still there.
        #[serde(default)]
        present: Option<bool>,
    },
    /// The last read of the run, made once every session can only have
    /// ended (no client left to keep one alive, a full restart, then more
    /// than a TTL): the keys still there under the prefix that bound keys
    /// are put under (`None` on the invocation, required on ok). It must
    /// be empty: every session ends, and its keys with it.
    Leftover {
        /// The bound keys' prefix.
        prefix: Key,
        /// The keys found under it.
        #[serde(default)]
        keys: Option<Vec<Key>>,
    },
    /// A linearizable scan of the prefix that starts a watcher's run: the
    /// keys and values at `revision` (both `None` on the invocation,
    /// required on ok).
    List {
        /// The revision the scan read at.
        #[serde(default)]
        revision: Option<u64>,
        /// Every key under the prefix and its value.
        #[serde(default)]
        values: Option<BTreeMap<Key, Value>>,
    },
    /// Instant: the watcher opens a watch whose first revision is `from`.
    Open {
        /// The first revision the watch may deliver.
        from: u64,
    },
    /// Instant: one message of changes, every one at `revision`.
    Changes {
        /// The revision.
        revision: u64,
        /// The changes, in the order the message held them.
        changes: Vec<WatchChange>,
    },
    /// Instant: a progress notice: every change up to `revision` was sent.
    Progress {
        /// The revision.
        revision: u64,
    },
}

impl Op {
    /// True for operations recorded as a single event, not an
    /// invocation-completion pair.
    pub fn is_instant(&self) -> bool {
        matches!(
            self,
            Op::Lock(LockOp::HoldStart { .. } | LockOp::HoldEnd { .. })
                | Op::Watch(
                    WatchOp::Open { .. } | WatchOp::Changes { .. } | WatchOp::Progress { .. }
                )
                | Op::Election(ElectionOp::Observed { .. })
                | Op::Churn(
                    ChurnOp::Vouched { .. }
                        | ChurnOp::HolderKilled { .. }
                        | ChurnOp::LeaderKilled { .. }
                        | ChurnOp::LeaderReady { .. }
                        | ChurnOp::Skipped { .. }
                )
        )
    }

    /// True when `self` and `other` are the same call: same operation, same
    /// inputs (results ignored). A completion must be the same call as its
    /// invocation.
    pub fn same_call(&self, other: &Op) -> bool {
        use DurabilityOp as D;
        use LockOp as L;
        use RegisterOp as R;
        use SequenceOp as S;
        match (self, other) {
            (Op::Register(R::Read { key: a, .. }), Op::Register(R::Read { key: b, .. })) => a == b,
            (Op::Register(a @ R::Write { .. }), Op::Register(b @ R::Write { .. })) => a == b,
            (
                Op::Register(R::Cas {
                    key: k1,
                    expected: e1,
                    new: n1,
                    ..
                }),
                Op::Register(R::Cas {
                    key: k2,
                    expected: e2,
                    new: n2,
                    ..
                }),
            ) => k1 == k2 && e1 == e2 && n1 == n2,
            (
                Op::Lock(L::Acquire {
                    resource: r1,
                    holder: h1,
                    ..
                }),
                Op::Lock(L::Acquire {
                    resource: r2,
                    holder: h2,
                    ..
                }),
            ) => r1 == r2 && h1 == h2,
            (
                Op::Lock(L::FencedWrite {
                    resource: r1,
                    target: t1,
                    holder: h1,
                    token: k1,
                    ..
                }),
                Op::Lock(L::FencedWrite {
                    resource: r2,
                    target: t2,
                    holder: h2,
                    token: k2,
                    ..
                }),
            ) => r1 == r2 && t1 == t2 && h1 == h2 && k1 == k2,
            (
                Op::Sequence(S::Alloc {
                    key: k1, step: s1, ..
                }),
                Op::Sequence(S::Alloc {
                    key: k2, step: s2, ..
                }),
            ) => k1 == k2 && s1 == s2,
            (
                Op::Semaphore(SemaphoreOp::Acquire {
                    semaphore: s1,
                    permits: n1,
                    holder: h1,
                    ..
                }),
                Op::Semaphore(SemaphoreOp::Acquire {
                    semaphore: s2,
                    permits: n2,
                    holder: h2,
                    ..
                }),
            ) => s1 == s2 && n1 == n2 && h1 == h2,
            (
                Op::Semaphore(SemaphoreOp::FencedWrite {
                    semaphore: s1,
                    key: k1,
                    holder: h1,
                    token: t1,
                    ..
                }),
                Op::Semaphore(SemaphoreOp::FencedWrite {
                    semaphore: s2,
                    key: k2,
                    holder: h2,
                    token: t2,
                    ..
                }),
            ) => s1 == s2 && k1 == k2 && h1 == h2 && t1 == t2,
            (Op::Durability(a @ D::Put { .. }), Op::Durability(b @ D::Put { .. })) => a == b,
            (Op::Durability(D::ReadAll { .. }), Op::Durability(D::ReadAll { .. })) => true,
            (
                Op::Watch(WatchOp::Write {
                    changes: c1,
                    session: s1,
                    ..
                }),
                Op::Watch(WatchOp::Write {
                    changes: c2,
                    session: s2,
                    ..
                }),
            ) => c1 == c2 && s1 == s2,
            (
                Op::Watch(WatchOp::Gone {
                    key: k1,
                    session: s1,
                    ..
                }),
                Op::Watch(WatchOp::Gone {
                    key: k2,
                    session: s2,
                    ..
                }),
            ) => k1 == k2 && s1 == s2,
            (Op::Watch(WatchOp::List { .. }), Op::Watch(WatchOp::List { .. })) => true,
            (
                Op::Watch(WatchOp::Leftover { prefix: p1, .. }),
                Op::Watch(WatchOp::Leftover { prefix: p2, .. }),
            ) => p1 == p2,
            (
                Op::Churn(ChurnOp::Acquire {
                    resource: r1,
                    holder: h1,
                    role: o1,
                    ttl_ms: t1,
                    ..
                }),
                Op::Churn(ChurnOp::Acquire {
                    resource: r2,
                    holder: h2,
                    role: o2,
                    ttl_ms: t2,
                    ..
                }),
            ) => r1 == r2 && h1 == h2 && o1 == o2 && t1 == t2,
            (a, b) if a.is_instant() && b.is_instant() => a == b,
            _ => false,
        }
    }

    /// True unless this is an ok completion's op that lacks a required
    /// result (a CAS without `succeeded`, an acquire without `token`, ...).
    fn has_required_result(&self) -> bool {
        match self {
            Op::Register(RegisterOp::Cas { succeeded, .. }) => succeeded.is_some(),
            Op::Lock(LockOp::Acquire { token, .. }) => token.is_some(),
            Op::Lock(LockOp::FencedWrite { accepted, .. }) => accepted.is_some(),
            Op::Semaphore(SemaphoreOp::Acquire { token, .. }) => token.is_some(),
            Op::Churn(ChurnOp::Acquire { token, .. }) => token.is_some(),
            Op::Semaphore(SemaphoreOp::FencedWrite { accepted, .. }) => accepted.is_some(),
            Op::Sequence(SequenceOp::Alloc { range, .. }) => range.is_some(),
            Op::Durability(DurabilityOp::ReadAll { values }) => values.is_some(),
            Op::Watch(WatchOp::Write { revision, .. }) => revision.is_some(),
            Op::Watch(WatchOp::Gone { present, .. }) => present.is_some(),
            Op::Watch(WatchOp::Leftover { keys, .. }) => keys.is_some(),
            Op::Watch(WatchOp::List { revision, values }) => revision.is_some() && values.is_some(),
            _ => true,
        }
    }
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Took effect, results known.
    Ok,
    /// Did not take effect.
    Fail,
    /// May or may not have taken effect, at any time after the invocation
    /// (an unknown completion, or no completion before the history ended).
    Unknown,
}

/// An invocation paired with its completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// The process that performed it.
    pub process: u64,
    /// The invocation event.
    pub invoke: Event,
    /// The completion event; `None` if the history ended first.
    pub completion: Option<Event>,
}

impl Operation {
    /// How the operation ended.
    pub fn outcome(&self) -> Outcome {
        match self.completion.as_ref().map(|c| c.kind) {
            Some(EventKind::Ok) => Outcome::Ok,
            Some(EventKind::Fail) => Outcome::Fail,
            _ => Outcome::Unknown,
        }
    }

    /// The operation with its results: the completion's op when it is ok,
    /// the invocation's otherwise.
    pub fn op(&self) -> &Op {
        match &self.completion {
            Some(c) if c.kind == EventKind::Ok => &c.op,
            _ => &self.invoke.op,
        }
    }

    /// When the operation was invoked.
    pub fn invoke_ns(&self) -> u64 {
        self.invoke.time_ns
    }

    /// When the operation definitely ended (ok or fail); `None` when its
    /// outcome is unknown, i.e. it may take effect arbitrarily late.
    pub fn definite_end_ns(&self) -> Option<u64> {
        match (&self.completion, self.outcome()) {
            (Some(c), Outcome::Ok | Outcome::Fail) => Some(c.time_ns),
            _ => None,
        }
    }

    /// True when `self` definitely ended before `later` was invoked, so any
    /// effect of `self` precedes any effect of `later`.
    pub fn precedes(&self, later: &Operation) -> bool {
        self.definite_end_ns()
            .is_some_and(|end| end < later.invoke_ns())
    }

    /// The operation's events: the invocation and, if any, the completion.
    pub fn events(&self) -> Vec<Event> {
        let mut v = vec![self.invoke.clone()];
        v.extend(self.completion.iter().cloned());
        v
    }
}

/// Why a sequence of events is not a well-formed history.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HistoryError {
    /// A line of JSON could not be parsed.
    Json {
        /// 1-based line number.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// Two events share an index.
    DuplicateIndex(u64),
    /// `time_ns` decreases along `index`.
    TimeWentBackwards {
        /// The event whose time is lower than its predecessor's.
        index: u64,
    },
    /// A process invoked an operation while another of its operations was
    /// still in flight.
    OverlappingInvoke {
        /// The second invocation.
        index: u64,
        /// Its process.
        process: u64,
    },
    /// A completion with no invocation in flight on its process.
    OrphanCompletion {
        /// The completion.
        index: u64,
    },
    /// A completion whose op is not the call its invocation made.
    MismatchedCompletion {
        /// The completion.
        index: u64,
    },
    /// An ok completion without the result its operation must return.
    MissingResult {
        /// The completion.
        index: u64,
    },
    /// An instant (hold-start, hold-end) recorded with a kind other than ok.
    InstantNotOk {
        /// The event.
        index: u64,
    },
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistoryError::Json { line, message } => write!(f, "line {line}: bad JSON: {message}"),
            HistoryError::DuplicateIndex(i) => write!(f, "two events have index {i}"),
            HistoryError::TimeWentBackwards { index } => {
                write!(f, "event #{index}: time_ns lower than the previous event's")
            }
            HistoryError::OverlappingInvoke { index, process } => write!(
                f,
                "event #{index}: process {process} invoked while another of its operations was in flight"
            ),
            HistoryError::OrphanCompletion { index } => {
                write!(f, "event #{index}: completion with no invocation in flight")
            }
            HistoryError::MismatchedCompletion { index } => {
                write!(f, "event #{index}: completion of a different call than the one invoked")
            }
            HistoryError::MissingResult { index } => {
                write!(f, "event #{index}: ok completion without its result")
            }
            HistoryError::InstantNotOk { index } => {
                write!(f, "event #{index}: an instant must be recorded as ok")
            }
        }
    }
}

impl std::error::Error for HistoryError {}

/// A well-formed history: events in index order, operations paired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    events: Vec<Event>,
    operations: Vec<Operation>,
    instants: Vec<Event>,
}

impl History {
    /// Sorts `events` by index, validates them and pairs invocations with
    /// completions by process.
    pub fn new(mut events: Vec<Event>) -> Result<History, HistoryError> {
        events.sort_by_key(|e| e.index);
        for w in events.windows(2) {
            if w[0].index == w[1].index {
                return Err(HistoryError::DuplicateIndex(w[1].index));
            }
            if w[1].time_ns < w[0].time_ns {
                return Err(HistoryError::TimeWentBackwards { index: w[1].index });
            }
        }
        // In-flight operations by process: position in `operations`.
        let mut in_flight: BTreeMap<u64, usize> = BTreeMap::new();
        let mut operations: Vec<Operation> = Vec::new();
        let mut instants = Vec::new();
        for e in &events {
            if e.op.is_instant() {
                if e.kind != EventKind::Ok {
                    return Err(HistoryError::InstantNotOk { index: e.index });
                }
                instants.push(e.clone());
                continue;
            }
            match e.kind {
                EventKind::Invoke => {
                    if in_flight.contains_key(&e.process) {
                        return Err(HistoryError::OverlappingInvoke {
                            index: e.index,
                            process: e.process,
                        });
                    }
                    in_flight.insert(e.process, operations.len());
                    operations.push(Operation {
                        process: e.process,
                        invoke: e.clone(),
                        completion: None,
                    });
                }
                EventKind::Ok | EventKind::Fail | EventKind::Unknown => {
                    let Some(pos) = in_flight.remove(&e.process) else {
                        return Err(HistoryError::OrphanCompletion { index: e.index });
                    };
                    let Some(operation) = operations.get_mut(pos) else {
                        return Err(HistoryError::OrphanCompletion { index: e.index });
                    };
                    if !operation.invoke.op.same_call(&e.op) {
                        return Err(HistoryError::MismatchedCompletion { index: e.index });
                    }
                    if e.kind == EventKind::Ok && !e.op.has_required_result() {
                        return Err(HistoryError::MissingResult { index: e.index });
                    }
                    operation.completion = Some(e.clone());
                }
            }
        }
        Ok(History {
            events,
            operations,
            instants,
        })
    }

    /// Parses one JSON [`Event`] per non-blank line, then [`History::new`].
    pub fn from_json_lines(text: &str) -> Result<History, HistoryError> {
        let mut events = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let event = serde_json::from_str(line).map_err(|e| HistoryError::Json {
                line: i + 1,
                message: e.to_string(),
            })?;
            events.push(event);
        }
        History::new(events)
    }

    /// The history as JSON lines, one event per line, in index order.
    pub fn to_json_lines(&self) -> String {
        let mut out = String::new();
        for e in &self.events {
            // Serializing these plain types cannot fail (string keys only).
            if let Ok(line) = serde_json::to_string(e) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }

    /// Every event, in index order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Every paired operation, in invocation order.
    pub fn operations(&self) -> &[Operation] {
        &self.operations
    }

    /// The instants (hold-start, hold-end, a watcher's opens, changes and
    /// progress notices), in index order.
    pub fn instants(&self) -> &[Event] {
        &self.instants
    }
}

/// Builds a history in memory, numbering events in the order they are
/// pushed. The caller supplies the (monotonic) timestamps.
#[derive(Debug, Clone, Default)]
pub struct HistoryBuilder {
    events: Vec<Event>,
}

impl HistoryBuilder {
    /// An empty history.
    pub fn new() -> HistoryBuilder {
        HistoryBuilder::default()
    }

    /// Appends an event and returns its index.
    pub fn push(&mut self, process: u64, time_ns: u64, kind: EventKind, op: Op) -> u64 {
        let index = self.events.len() as u64;
        self.events.push(Event {
            index,
            process,
            time_ns,
            kind,
            op,
        });
        index
    }

    /// Appends an invocation.
    pub fn invoke(&mut self, process: u64, time_ns: u64, op: Op) -> u64 {
        self.push(process, time_ns, EventKind::Invoke, op)
    }

    /// Appends an ok completion (or an instant).
    pub fn ok(&mut self, process: u64, time_ns: u64, op: Op) -> u64 {
        self.push(process, time_ns, EventKind::Ok, op)
    }

    /// Appends a fail completion.
    pub fn fail(&mut self, process: u64, time_ns: u64, op: Op) -> u64 {
        self.push(process, time_ns, EventKind::Fail, op)
    }

    /// Appends an unknown completion.
    pub fn unknown(&mut self, process: u64, time_ns: u64, op: Op) -> u64 {
        self.push(process, time_ns, EventKind::Unknown, op)
    }

    /// The events pushed so far.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Validates and pairs the events: [`History::new`].
    pub fn build(self) -> Result<History, HistoryError> {
        History::new(self.events)
    }
}

#[cfg(test)]
mod tests;
