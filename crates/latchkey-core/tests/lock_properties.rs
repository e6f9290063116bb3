//! Property tests of the lock service: seeded random command sequences over
//! a few sessions, owners and lock names, with the invariants of LOCKS.md
//! checked after every step:
//!
//! - at most one exclusive holder, or only shared holders; no grant during a
//!   lock-delay; no waiter left behind by a free lock;
//! - fencing tokens strictly increase over grants and match the counter;
//! - grants follow the queue in FIFO order (checked against a model queue
//!   built from the events alone, and against the state's own wait list);
//! - a fenced write commits exactly when its sequencer is the current
//!   exclusive holder;
//! - a retried request never grants twice and returns its first outcome;
//! - a refused command writes nothing and reports nothing;
//! - the session index matches the lock records;
//! - a replica restored from a copy of the store, and a replica decoding its
//!   own copy of each entry, stay identical to the original.
//!
//! Set `LATCHKEY_SEED` to run other seeds and `LATCHKEY_CASES` to run more
//! cases; failures print the seed.

use std::collections::{BTreeMap, BTreeSet};

use latchkey_core::keyspace::{self, META_LAST_TOKEN, SESSION_LOCKS};
use latchkey_core::lock::{
    Event, LockCommand, LockInfo, LockMode, LockOutcome, LockQuery, Sequencer, SessionId,
    SessionSecret, TimerState, Token, WaitEnd,
};
use latchkey_core::{
    apply_with_events, codec, query, BatchOp, Command, CommandError, CommandResult, MemStore,
    Outcome, Query, Request,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngSeed};

const NAMES: [&str; 3] = ["a", "b", "c"];
const SLOTS: usize = 3;
const OWNERS: u64 = 2;
const WAIT_MS: u64 = 50;
const LEASE_MS: u64 = 1_000;
const DELAY_MS: u64 = 100;

fn seed() -> u64 {
    std::env::var("LATCHKEY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1a7c_4b3e)
}

/// `cases` unless `LATCHKEY_CASES` asks for more (or fewer).
fn config(cases: u32) -> Config {
    let cases = std::env::var("LATCHKEY_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed()),
        ..Config::default()
    }
}

// ---------------------------------------------------------------- generated ops

/// An abstract step, resolved into a concrete command against the current
/// state, so that most commands are meaningful (right ids, live tokens).
#[derive(Debug, Clone)]
enum Op {
    Open {
        slot: usize,
    },
    Close {
        slot: usize,
    },
    /// The leader's expiry, or an operator's end of the session: the same
    /// forced end.
    Expire {
        slot: usize,
        by_operator: bool,
    },
    Acquire {
        slot: usize,
        owner: u64,
        name: usize,
        shared: bool,
        wait: bool,
        lease: bool,
        delay: bool,
    },
    Release {
        slot: usize,
        owner: u64,
        name: usize,
        token: TokenPick,
    },
    /// Send an earlier acquire or release again, unchanged.
    Retry {
        pick: Index,
    },
    Cancel {
        slot: usize,
        owner: u64,
        name: usize,
        pick: Index,
    },
    ExpireLease {
        pick: Index,
        stale: bool,
    },
    EndDelay {
        pick: Index,
        stale: bool,
    },
    /// `how`: 0 the current holder, 1 an earlier grant, 2 the current
    /// holder's token under another session (a forgery), 3 the current
    /// holder's sequencer with a wrong secret (a forgery by whoever read it
    /// from a lock list).
    Fenced {
        name: usize,
        pick: Index,
        how: u8,
    },
    Bogus {
        kind: u8,
        slot: usize,
    },
    /// An operator's forced release: `how` 0 or 1 a current holder's grant,
    /// 2 an earlier grant (most likely gone).
    Force {
        name: usize,
        pick: Index,
        how: u8,
    },
}

#[derive(Debug, Clone)]
enum TokenPick {
    /// The token this owner holds the lock under, if any.
    Held,
    /// The token of some earlier grant.
    Old(Index),
    Any(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    let owner = 0..OWNERS;
    // Mostly "a", so that requests collide and queues grow.
    let name = prop_oneof![4 => Just(0usize), 2 => Just(1usize), 1 => Just(2usize)];
    prop_oneof![
        1 => slot.clone().prop_map(|slot| Op::Open { slot }),
        1 => slot.clone().prop_map(|slot| Op::Close { slot }),
        1 => (slot.clone(), any::<bool>()).prop_map(|(slot, by_operator)| Op::Expire { slot, by_operator }),
        8 => (slot.clone(), owner.clone(), name.clone(), any::<bool>(), prop::bool::weighted(0.7), prop::bool::weighted(0.3), prop::bool::weighted(0.3))
            .prop_map(|(slot, owner, name, shared, wait, lease, delay)| Op::Acquire { slot, owner, name, shared, wait, lease, delay }),
        6 => (slot.clone(), owner.clone(), name.clone(), prop_oneof![6 => Just(TokenPick::Held), 2 => any::<Index>().prop_map(TokenPick::Old), 1 => (0u64..8).prop_map(TokenPick::Any)])
            .prop_map(|(slot, owner, name, token)| Op::Release { slot, owner, name, token }),
        2 => any::<Index>().prop_map(|pick| Op::Retry { pick }),
        2 => (slot.clone(), owner, name.clone(), any::<Index>())
            .prop_map(|(slot, owner, name, pick)| Op::Cancel { slot, owner, name, pick }),
        1 => (any::<Index>(), prop::bool::weighted(0.3)).prop_map(|(pick, stale)| Op::ExpireLease { pick, stale }),
        2 => (any::<Index>(), prop::bool::weighted(0.3)).prop_map(|(pick, stale)| Op::EndDelay { pick, stale }),
        3 => (name, any::<Index>(), 0u8..4).prop_map(|(name, pick, how)| Op::Fenced { name, pick, how }),
        1 => (0u8..4, slot).prop_map(|(kind, slot)| Op::Bogus { kind, slot }),
        1 => (0usize..NAMES.len(), any::<Index>(), 0u8..3).prop_map(|(name, pick, how)| Op::Force { name, pick, how }),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..80)
}

// ---------------------------------------------------------------- harness

/// A store, what the test knows about it, and the checker's models.
#[derive(Clone, Default)]
struct Harness {
    store: MemStore,
    now: u64,
    // What the generator resolves ops against.
    slots: [Option<SessionId>; SLOTS],
    /// The slot an `OpenSession` in flight will fill.
    opening: Option<usize>,
    /// How many `OpenSession`s were sent: each gets its own secret.
    opens: u8,
    /// The secret of every session opened, from its outcome.
    secrets: BTreeMap<SessionId, SessionSecret>,
    next_rid: BTreeMap<SessionId, u64>,
    sent: Vec<LockCommand>,
    seen_grants: Vec<Sequencer>,
    fence_value: u64,
    /// The cluster's revision: fenced writes that committed (lock commands
    /// raise none).
    revision: u64,
    // The checker's models, built from events and outcomes only.
    max_token: Token,
    queues: BTreeMap<String, Vec<(SessionId, u64, u64, LockMode)>>,
    granted: BTreeSet<(SessionId, u64)>,
    cancelled: BTreeSet<(SessionId, u64)>,
    first_ok: BTreeMap<(SessionId, u64), LockOutcome>,
    /// How often each interesting case happened (see
    /// `the_generator_reaches_every_case`).
    seen: BTreeMap<&'static str, u32>,
}

/// The interesting cases a run should reach, by name.
fn classify(
    command: &LockCommand,
    result: &CommandResult,
    events: &[Event],
    retried: bool,
) -> Vec<&'static str> {
    let mut out = Vec::new();
    if retried {
        out.push("retry of a success");
    }
    match result {
        Ok(Outcome::Lock(o)) => out.push(match o {
            LockOutcome::SessionOpened { .. } => "session opened",
            LockOutcome::SessionEnded { .. } => match command {
                LockCommand::CloseSession { .. } => "session closed",
                _ => "session expired",
            },
            LockOutcome::Granted { hold_count: 1, .. } => "granted",
            LockOutcome::Granted { .. } => "re-entrant grant",
            LockOutcome::Queued { .. } => "queued",
            LockOutcome::Released { remaining: 0, .. } => "released",
            LockOutcome::Released { .. } => "re-entrant release",
            LockOutcome::WaitCancel(latchkey_core::lock::WaitCancel::Cancelled) => "wait cancelled",
            LockOutcome::WaitCancel(latchkey_core::lock::WaitCancel::AlreadyGranted(_)) => {
                "cancel after grant"
            }
            LockOutcome::WaitCancel(_) => "cancel of nothing",
            LockOutcome::LeaseExpired { released: true } => "lease expired",
            LockOutcome::LeaseExpired { .. } => "stale lease expiry",
            LockOutcome::LockDelayEnded { ended: true } => "lock-delay ended",
            LockOutcome::LockDelayEnded { .. } => "stale lock-delay end",
            _ => "query outcome",
        }),
        Ok(Outcome::Batch { .. }) => out.push("fenced write"),
        Ok(_) => out.push("other outcome"),
        Err(e) => out.push(match e {
            CommandError::Busy {
                lock_delay: true, ..
            } => "busy in lock-delay",
            CommandError::Busy { .. } => "busy",
            CommandError::NotHolder { .. } => "not holder",
            CommandError::StaleToken { .. } => "stale token",
            CommandError::StaleFence { .. } => "stale fence",
            CommandError::UpgradeNotAllowed { .. } => "upgrade refused",
            CommandError::DowngradeNotAllowed { .. } => "downgrade refused",
            CommandError::AlreadyWaiting { .. } => "already waiting",
            CommandError::SessionEnded { .. } => "session ended",
            CommandError::UnknownSession { .. } => "unknown session",
            CommandError::WaitCancelled { .. } => "retry of a cancelled wait",
            CommandError::WrongSessionSecret { .. } => "wrong session secret",
            CommandError::InvalidArgument(_)
            | CommandError::InvalidLockName { .. }
            | CommandError::TtlOutOfRange { .. } => "invalid",
            _ => "other refusal",
        }),
    }
    for e in events {
        match e {
            Event::Granted { waited: true, .. } => out.push("waiter granted"),
            Event::LockDelayStarted { .. } => out.push("lock-delay started"),
            Event::LockFreed { .. } => out.push("lock freed"),
            _ => {}
        }
    }
    if events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Granted {
                    waited: true,
                    mode: LockMode::Shared,
                    ..
                }
            )
        })
        .count()
        > 1
    {
        out.push("shared run granted");
    }
    out
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(format!("{msg} (LATCHKEY_SEED={})", seed()))
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(fail(format!($($fmt)*)));
        }
    };
}

/// (session, request id) of an acquire or release.
fn request_of(command: &LockCommand) -> Option<(SessionId, u64)> {
    match command {
        LockCommand::Acquire {
            session,
            secret: _,
            request_id,
            ..
        }
        | LockCommand::Release {
            session,
            secret: _,
            request_id,
            ..
        } => Some((*session, *request_id)),
        _ => None,
    }
}

impl Harness {
    /// A harness whose slots hold three fresh sessions.
    fn started() -> Result<Self, TestCaseError> {
        let mut h = Harness::default();
        for slot in 0..SLOTS {
            let command = h.open(slot);
            let _ = h.step(command)?;
        }
        Ok(h)
    }

    /// Open a session for `slot`; [`Harness::record`] fills the slot from
    /// the outcome. The session it replaces (if any) stays open, abandoned.
    fn open(&mut self, slot: usize) -> LockCommand {
        self.opening = Some(slot);
        self.opens = self.opens.wrapping_add(1);
        LockCommand::OpenSession {
            ttl_ms: 5_000,
            secret: SessionSecret([self.opens; 16]),
            name: String::new(),
        }
    }

    /// The secret `session` was opened with (a wrong one if it never was).
    fn secret(&self, session: SessionId) -> SessionSecret {
        self.secrets.get(&session).copied().unwrap_or_default()
    }

    fn session(&self, slot: usize) -> Option<SessionId> {
        self.slots[slot]
    }

    fn rid(&mut self, session: SessionId) -> u64 {
        let r = self.next_rid.entry(session).or_insert(1);
        *r += 1;
        *r
    }

    fn ask(&self, q: LockQuery) -> LockOutcome {
        match query(&self.store, &Query::Lock(q)) {
            Ok(Ok(Outcome::Lock(o))) => o,
            other => panic!("lock query failed: {other:?}"),
        }
    }

    fn locks(&self) -> BTreeMap<String, LockInfo> {
        match self.ask(LockQuery::Locks {
            prefix: String::new(),
            start_after: None,
            limit: 0,
        }) {
            LockOutcome::Locks { locks, more: false } => {
                locks.into_iter().map(|l| (l.name.clone(), l)).collect()
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn timers(&self) -> TimerState {
        match self.ask(LockQuery::TimerState) {
            LockOutcome::Timers(t) => t,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn live(&self, session: SessionId) -> bool {
        matches!(
            self.ask(LockQuery::Session { session }),
            LockOutcome::Session(Some(_))
        )
    }

    fn holder_token(&self, session: SessionId, owner: u64, name: &str) -> Option<Token> {
        self.locks().get(name).and_then(|l| {
            l.holders
                .iter()
                .find(|h| h.session == session && h.owner == owner)
                .map(|h| h.token)
        })
    }

    /// Some (session, owner, lock, token) held by `session`, or else by
    /// another session in a slot.
    fn any_hold(&self, session: SessionId) -> Option<(SessionId, u64, String, Token)> {
        let locks = self.locks();
        let mut sessions = vec![session];
        sessions.extend(self.slots.iter().flatten().copied());
        sessions.into_iter().find_map(|s| {
            locks.values().find_map(|l| {
                l.holders
                    .iter()
                    .find(|h| h.session == s)
                    .map(|h| (s, h.owner, l.name.clone(), h.token))
            })
        })
    }

    /// Turn an abstract op into a command.
    fn resolve(&mut self, op: &Op) -> LockCommand {
        let live_or_open = |h: &mut Self, slot: usize| h.session(slot).ok_or(slot);
        match op {
            Op::Open { slot } => self.open(*slot),
            Op::Close { slot } | Op::Expire { slot, .. } => match live_or_open(self, *slot) {
                Ok(session) if matches!(op, Op::Close { .. }) => LockCommand::CloseSession {
                    session,
                    secret: self.secret(session),
                },
                Ok(session)
                    if matches!(
                        op,
                        Op::Expire {
                            by_operator: true,
                            ..
                        }
                    ) =>
                {
                    LockCommand::EndSession { session }
                }
                Ok(session) => LockCommand::ExpireSession { session },
                Err(slot) => self.open(slot),
            },
            Op::Acquire {
                slot,
                owner,
                name,
                shared,
                wait,
                lease,
                delay,
            } => match live_or_open(self, *slot) {
                Ok(session) => LockCommand::Acquire {
                    session,
                    secret: self.secret(session),
                    owner: *owner,
                    request_id: self.rid(session),
                    name: NAMES[*name].to_string(),
                    mode: if *shared {
                        LockMode::Shared
                    } else {
                        LockMode::Exclusive
                    },
                    wait_ms: wait.then_some(WAIT_MS),
                    lease_ms: lease.then_some(LEASE_MS),
                    lock_delay_ms: delay.then_some(DELAY_MS),
                    value: Vec::new(),
                    permits: None,
                },
                Err(slot) => self.open(slot),
            },
            Op::Release {
                slot,
                owner,
                name,
                token,
            } => match live_or_open(self, *slot) {
                Ok(session) => {
                    let (mut session, mut owner, mut name) =
                        (session, *owner, NAMES[*name].to_string());
                    let token = match token {
                        TokenPick::Held => match self.holder_token(session, owner, &name) {
                            Some(t) => t,
                            // Release something a live slot holds, if anything:
                            // this session's first.
                            None => match self.any_hold(session) {
                                Some((s, o, n, t)) => {
                                    (session, owner, name) = (s, o, n);
                                    t
                                }
                                None => Token(1),
                            },
                        },
                        TokenPick::Old(i) if !self.seen_grants.is_empty() => {
                            i.get(&self.seen_grants).token
                        }
                        TokenPick::Old(_) => Token(1),
                        TokenPick::Any(t) => Token((*t).max(1)),
                    };
                    LockCommand::Release {
                        session,
                        secret: self.secret(session),
                        owner,
                        request_id: self.rid(session),
                        name,
                        token,
                    }
                }
                Err(slot) => self.open(slot),
            },
            Op::Retry { pick } => {
                // Mostly recent requests: those whose fate is still moving.
                let recent = &self.sent[self.sent.len().saturating_sub(8)..];
                if recent.is_empty() {
                    self.open(0)
                } else {
                    pick.get(recent).clone()
                }
            }
            Op::Cancel {
                slot,
                owner,
                name,
                pick,
            } => {
                let waits = self.timers().waits;
                if waits.is_empty() {
                    match live_or_open(self, *slot) {
                        Ok(session) => LockCommand::CancelWait {
                            session,
                            secret: self.secret(session),
                            owner: *owner,
                            name: NAMES[*name].to_string(),
                            request_id: pick.index(4) as u64,
                        },
                        Err(slot) => self.open(slot),
                    }
                } else {
                    // The client's cancel, or the leader's wait timeout.
                    let w = pick.get(&waits);
                    if pick.index(2) == 0 {
                        LockCommand::CancelWait {
                            session: w.session,
                            secret: self.secret(w.session),
                            owner: w.owner,
                            name: w.name.clone(),
                            request_id: w.request_id,
                        }
                    } else {
                        LockCommand::ExpireWait {
                            session: w.session,
                            owner: w.owner,
                            name: w.name.clone(),
                            request_id: w.request_id,
                        }
                    }
                }
            }
            Op::ExpireLease { pick, stale } => {
                let leases = self.timers().leases;
                if *stale || leases.is_empty() {
                    self.stale_target(pick, |name, token| LockCommand::ExpireLockLease {
                        name,
                        token,
                    })
                } else {
                    let l = pick.get(&leases);
                    LockCommand::ExpireLockLease {
                        name: l.name.clone(),
                        token: l.token,
                    }
                }
            }
            Op::Force { name, pick, how } => {
                let holders = self
                    .locks()
                    .get(NAMES[*name])
                    .map(|l| l.holders.clone())
                    .unwrap_or_default();
                match how {
                    0 | 1 if !holders.is_empty() => LockCommand::ForceRelease {
                        name: NAMES[*name].to_string(),
                        token: pick.get(&holders).token,
                    },
                    _ => self.stale_target(pick, |name, token| LockCommand::ForceRelease {
                        name,
                        token,
                    }),
                }
            }
            Op::EndDelay { pick, stale } => {
                let delays = self.timers().lock_delays;
                if *stale || delays.is_empty() {
                    self.stale_target(pick, |name, token| LockCommand::EndLockDelay {
                        name,
                        token,
                    })
                } else {
                    let d = pick.get(&delays);
                    LockCommand::EndLockDelay {
                        name: d.name.clone(),
                        token: d.token,
                    }
                }
            }
            Op::Fenced { name, pick, how } => {
                let holder = self.locks().get(NAMES[*name]).and_then(|l| {
                    l.holders.first().map(|h| Sequencer {
                        name: l.name.clone(),
                        mode: LockMode::Exclusive,
                        token: h.token,
                        session: h.session,
                    })
                });
                let other_session = |s: SessionId| SessionId(if s.0 == 1 { 2 } else { s.0 - 1 });
                let sequencer = match holder {
                    Some(s) if *how == 2 => Sequencer {
                        session: other_session(s.session),
                        ..s
                    },
                    Some(s) if *how == 0 || self.seen_grants.is_empty() => s,
                    _ if !self.seen_grants.is_empty() => Sequencer {
                        mode: LockMode::Exclusive,
                        ..pick.get(&self.seen_grants).clone()
                    },
                    _ => Sequencer {
                        name: NAMES[*name].to_string(),
                        mode: LockMode::Exclusive,
                        token: Token(1),
                        session: SessionId(1),
                    },
                };
                self.fence_value += 1;
                // how 3: the right sequencer with a forged secret.
                let secret = if *how == 3 {
                    SessionSecret([0xee; 16])
                } else {
                    self.secret(sequencer.session)
                };
                LockCommand::Fenced {
                    sequencer,
                    secret,
                    conditions: vec![],
                    ops: vec![BatchOp::Put {
                        key: b"fenced".to_vec(),
                        value: self.fence_value.to_be_bytes().to_vec(),
                    }],
                }
            }
            Op::Bogus { kind, slot } => {
                let session = self.session(*slot).unwrap_or(SessionId(0));
                match kind {
                    0 => LockCommand::Acquire {
                        session,
                        secret: self.secret(session),
                        owner: 0,
                        request_id: 0,
                        name: String::new(),
                        mode: LockMode::Exclusive,
                        wait_ms: None,
                        lease_ms: None,
                        lock_delay_ms: None,
                        value: Vec::new(),
                        permits: None,
                    },
                    1 => LockCommand::Acquire {
                        session: SessionId(1_000),
                        secret: SessionSecret::default(),
                        owner: 0,
                        request_id: 1,
                        name: "a".into(),
                        mode: LockMode::Shared,
                        wait_ms: Some(WAIT_MS),
                        lease_ms: None,
                        lock_delay_ms: None,
                        value: Vec::new(),
                        permits: None,
                    },
                    2 => LockCommand::OpenSession {
                        ttl_ms: 0,
                        secret: SessionSecret::default(),
                        name: String::new(),
                    },
                    _ => LockCommand::Release {
                        session,
                        secret: self.secret(session),
                        owner: 0,
                        request_id: 1,
                        name: "a".into(),
                        token: Token(0),
                    },
                }
            }
        }
    }

    /// A lease or delay command aimed at an earlier grant (likely stale).
    fn stale_target(
        &self,
        pick: &Index,
        make: impl Fn(String, Token) -> LockCommand,
    ) -> LockCommand {
        if self.seen_grants.is_empty() {
            make("a".into(), Token(1))
        } else {
            let g = pick.get(&self.seen_grants);
            make(g.name.clone(), g.token)
        }
    }

    fn apply(&mut self, command: &LockCommand) -> (CommandResult, Vec<Event>) {
        self.now += 1;
        let request = Request {
            now: self.now,
            command: Command::Lock(command.clone()),
        };
        apply_with_events(&mut self.store, &request).expect("MemStore never fails")
    }

    /// Apply `command` and check every invariant.
    fn step(&mut self, command: LockCommand) -> Result<(CommandResult, Vec<Event>), TestCaseError> {
        let before = self.store.map.clone();
        let locks_before = self.locks();
        let request = request_of(&command);
        let retried = request.is_some_and(|r| self.first_ok.contains_key(&r) && self.live(r.0));
        // A fenced write with a forged secret for a live session.
        let forged_secret = match &command {
            LockCommand::Fenced {
                sequencer, secret, ..
            } => *secret != self.secret(sequencer.session) && self.live(sequencer.session),
            _ => false,
        };
        let fence_expected = match &command {
            LockCommand::Fenced { sequencer, .. } => Some(
                !forged_secret
                    && locks_before.get(&sequencer.name).is_some_and(|l| {
                        l.mode == Some(LockMode::Exclusive)
                            && l.holders.iter().any(|h| {
                                h.token == sequencer.token && h.session == sequencer.session
                            })
                    }),
            ),
            _ => None,
        };
        let fenced_before = self.data(b"fenced");

        let (result, events) = self.apply(&command);
        let shown = format!("{command:?} -> {result:?}, events {events:?}");

        // No grant while a lock-delay is in force (an operator's forced
        // release may leave holders in it, but nobody new joins them).
        for e in &events {
            if let Event::Granted { name, .. } = e {
                let delayed = locks_before
                    .get(name)
                    .is_some_and(|l| l.lock_delay.is_some());
                let ended = events
                    .iter()
                    .any(|e| matches!(e, Event::LockDelayEnded { name: n, .. } if n == name));
                check!(
                    !delayed || ended,
                    "a grant during lock-delay on {name}: {shown}"
                );
            }
        }

        // A refusal writes nothing and reports nothing.
        if result.is_err() {
            check!(self.store.map == before, "a refusal wrote: {shown}");
            check!(events.is_empty(), "a refusal reported events: {shown}");
        }

        // A fenced write commits exactly under the current exclusive holder.
        if let (Some(expected), LockCommand::Fenced { ops, .. }) = (fence_expected, &command) {
            match &result {
                Ok(Outcome::Batch {
                    failed_condition: None,
                    revision,
                }) => {
                    check!(expected, "a stale fence committed: {shown}");
                    self.revision += 1;
                    check!(
                        *revision == self.revision,
                        "a fenced write made revision {revision}, not {}: {shown}",
                        self.revision
                    );
                    let BatchOp::Put { value, .. } = &ops[0] else {
                        unreachable!()
                    };
                    check!(
                        self.data(b"fenced").as_ref() == Some(value),
                        "fenced write lost: {shown}"
                    );
                }
                Err(CommandError::WrongSessionSecret { .. }) => {
                    check!(
                        forged_secret,
                        "the holder's own secret was refused: {shown}"
                    );
                }
                Err(CommandError::StaleFence { .. }) => {
                    check!(!forged_secret, "a forged secret was not refused: {shown}");
                    check!(!expected, "the current holder was fenced off: {shown}");
                    check!(
                        self.data(b"fenced") == fenced_before,
                        "stale fence wrote: {shown}"
                    );
                }
                other => check!(false, "unexpected fenced result {other:?}: {shown}"),
            }
        }

        // Only a committed fenced write raises the cluster's revision.
        let (_, revision) = self.data_at(b"fenced");
        check!(
            revision == self.revision,
            "the revision is {revision}, the model says {}: {shown}",
            self.revision
        );

        // A retry of a request that succeeded does nothing new.
        if retried {
            let key = request.unwrap_or_default();
            check!(events.is_empty(), "a retry had effects: {shown}");
            let first = &self.first_ok[&key];
            match (&result, first) {
                (
                    Ok(Outcome::Lock(LockOutcome::Granted {
                        hold_count: 1,
                        sequencer,
                    })),
                    LockOutcome::Queued { .. },
                ) => {
                    *self.seen.entry("retry returns a later grant").or_default() += 1;
                    check!(
                        self.granted.contains(&key),
                        "a retry reported a grant that never happened: {shown}"
                    );
                    check!(
                        self.seen_grants.contains(sequencer),
                        "unknown grant {sequencer:?}: {shown}"
                    );
                }
                (Ok(Outcome::Lock(o)), first) => {
                    check!(
                        o == first,
                        "a retry changed its answer from {first:?}: {shown}"
                    )
                }
                (Err(CommandError::WaitCancelled { .. }), _) => {
                    check!(
                        self.cancelled.contains(&key),
                        "cancelled what was not: {shown}"
                    )
                }
                (Err(CommandError::RequestTooOld { .. }), _) => {}
                (other, _) => check!(false, "unexpected retry answer {other:?}: {shown}"),
            }
        }

        // Hold counts move by one on fresh acquires and releases.
        if !retried {
            let hold_before = |session: SessionId, owner: u64, name: &str| {
                locks_before.get(name).and_then(|l| {
                    l.holders
                        .iter()
                        .find(|h| h.session == session && h.owner == owner)
                        .map(|h| h.hold_count)
                })
            };
            match (&command, &result) {
                (
                    LockCommand::Acquire {
                        session,
                        secret: _,
                        owner,
                        name,
                        ..
                    },
                    Ok(Outcome::Lock(LockOutcome::Granted { hold_count, .. })),
                ) => {
                    let before = hold_before(*session, *owner, name).unwrap_or(0);
                    check!(
                        *hold_count == before + 1,
                        "hold count {before} -> {hold_count}: {shown}"
                    );
                }
                (
                    LockCommand::Acquire { name, .. },
                    Ok(Outcome::Lock(LockOutcome::Queued { position, .. })),
                ) => {
                    let len = self.queues.get(name).map_or(0, Vec::len);
                    check!(
                        *position as usize == len,
                        "queued at {position}, queue had {len}: {shown}"
                    );
                }
                (
                    LockCommand::Release {
                        session,
                        secret: _,
                        owner,
                        name,
                        ..
                    },
                    Ok(Outcome::Lock(LockOutcome::Released { remaining, .. })),
                ) => {
                    let before = hold_before(*session, *owner, name).unwrap_or(0);
                    check!(
                        *remaining + 1 == before,
                        "released {before} -> {remaining}: {shown}"
                    );
                }
                _ => {}
            }
        }

        // Events against the models: tokens, FIFO, no double grant.
        for e in &events {
            match e {
                Event::Queued {
                    session,
                    owner,
                    request_id,
                    name,
                    mode,
                    ..
                } => {
                    let q = self.queues.entry(name.clone()).or_default();
                    check!(
                        !q.iter().any(|w| w.0 == *session && w.1 == *owner),
                        "an owner queued twice: {shown}"
                    );
                    q.push((*session, *owner, *request_id, *mode));
                }
                Event::WaitCancelled {
                    session,
                    owner,
                    request_id,
                    name,
                    why,
                } => {
                    let q = self.queues.entry(name.clone()).or_default();
                    let at = q
                        .iter()
                        .position(|w| (w.0, w.1, w.2) == (*session, *owner, *request_id));
                    check!(
                        at.is_some(),
                        "cancelled a wait that was not queued: {shown}"
                    );
                    if let Some(at) = at {
                        q.remove(at);
                    }
                    if *why == WaitEnd::Cancelled {
                        self.cancelled.insert((*session, *request_id));
                    }
                }
                Event::Granted {
                    session,
                    owner,
                    request_id,
                    name,
                    mode,
                    token,
                    waited,
                    ..
                } => {
                    check!(
                        *token > self.max_token,
                        "token {token} after {}: {shown}",
                        self.max_token
                    );
                    self.max_token = *token;
                    check!(
                        self.granted.insert((*session, *request_id)),
                        "request {request_id} of session {session} granted twice: {shown}"
                    );
                    let q = self.queues.entry(name.clone()).or_default();
                    if *waited {
                        check!(
                            q.first() == Some(&(*session, *owner, *request_id, *mode)),
                            "grant out of FIFO order, queue {q:?}: {shown}"
                        );
                        q.remove(0);
                    } else {
                        check!(q.is_empty(), "an acquire overtook the queue {q:?}: {shown}");
                    }
                    self.seen_grants.push(Sequencer {
                        name: name.clone(),
                        mode: *mode,
                        token: *token,
                        session: *session,
                    });
                }
                _ => {}
            }
        }

        self.record(&command, &result, retried);
        for case in classify(&command, &result, &events, retried) {
            *self.seen.entry(case).or_default() += 1;
        }
        self.check_state(&shown)?;
        Ok((result, events))
    }

    /// What the resolver and the retry checks remember of a step.
    fn record(&mut self, command: &LockCommand, result: &CommandResult, retried: bool) {
        if let (
            LockCommand::OpenSession { .. },
            Ok(Outcome::Lock(LockOutcome::SessionOpened {
                session, secret, ..
            })),
        ) = (command, result)
        {
            self.secrets.insert(*session, *secret);
            if let Some(slot) = self.opening.take() {
                self.slots[slot] = Some(*session);
            }
        }
        // An ended session leaves its slot: the next op there opens a new one
        // (retries still reach the ended session).
        if let (
            LockCommand::CloseSession { session, .. }
            | LockCommand::ExpireSession { session }
            | LockCommand::EndSession { session },
            Ok(_),
        ) = (command, result)
        {
            for slot in self.slots.iter_mut() {
                if *slot == Some(*session) {
                    *slot = None;
                }
            }
        }
        if let Some(key) = request_of(command) {
            if !self.sent.contains(command) {
                self.sent.push(command.clone());
            }
            if let (false, Ok(Outcome::Lock(o))) = (retried, result) {
                self.first_ok.insert(key, o.clone());
            }
        }
    }

    fn data(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.data_at(key).0
    }

    /// `key`'s value and the cluster's revision.
    fn data_at(&self, key: &[u8]) -> (Option<Vec<u8>>, u64) {
        match query(&self.store, &Query::Get { key: key.to_vec() }) {
            Ok(Ok(Outcome::Value { value, revision })) => (value.map(|v| v.value), revision),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Invariants of the state itself, after every step.
    fn check_state(&self, shown: &str) -> Result<(), TestCaseError> {
        let locks = self.locks();
        let timers = self.timers();
        let mut parties: BTreeSet<(SessionId, String)> = BTreeSet::new();
        for (name, l) in &locks {
            match l.mode {
                Some(LockMode::Exclusive) => {
                    check!(
                        l.holders.len() == 1,
                        "{} exclusive holders of {name}: {shown}",
                        l.holders.len()
                    )
                }
                Some(LockMode::Shared) => {}
                None => check!(l.holders.is_empty(), "holders without a mode: {shown}"),
            }
            check!(
                l.holders
                    .iter()
                    .all(|h| Some(h.mode) == l.mode && h.hold_count >= 1),
                "mixed modes or empty holds on {name}: {shown}"
            );
            check!(
                !(l.holders.is_empty() && l.lock_delay.is_none() && l.waiters > 0),
                "a free lock {name} with waiters: {shown}"
            );
            let model = self.queues.get(name).cloned().unwrap_or_default();
            check!(
                l.waiters as usize == model.len(),
                "queue of {name} is {} long, model {model:?}: {shown}",
                l.waiters
            );
            if l.mode == Some(LockMode::Shared) && l.lock_delay.is_none() {
                check!(
                    model.first().is_none_or(|w| w.3 == LockMode::Exclusive),
                    "a shared waiter waits behind shared holders of {name}: {shown}"
                );
            }
            for h in &l.holders {
                check!(
                    self.live(h.session),
                    "a holder of {name} has no live session: {shown}"
                );
                check!(
                    h.token <= self.max_token,
                    "token {} was never reported: {shown}",
                    h.token
                );
                parties.insert((h.session, name.clone()));
                let seq = Sequencer {
                    name: name.clone(),
                    mode: h.mode,
                    token: h.token,
                    session: h.session,
                };
                check!(
                    self.ask(LockQuery::CheckSequencer(seq))
                        == LockOutcome::SequencerCheck { current: true },
                    "a holder's sequencer is not current: {shown}"
                );
            }
        }
        // The state's own wait list matches the model queues, in order.
        let mut waits: BTreeMap<String, Vec<(SessionId, u64, u64)>> = BTreeMap::new();
        for w in &timers.waits {
            waits
                .entry(w.name.clone())
                .or_default()
                .push((w.session, w.owner, w.request_id));
            parties.insert((w.session, w.name.clone()));
        }
        let model: BTreeMap<String, Vec<(SessionId, u64, u64)>> = self
            .queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(n, q)| (n.clone(), q.iter().map(|w| (w.0, w.1, w.2)).collect()))
            .collect();
        check!(
            waits == model,
            "queues {waits:?} differ from the model {model:?}: {shown}"
        );
        // The session index lists exactly the (session, lock) pairs in use.
        let index: BTreeSet<(SessionId, String)> = self
            .store
            .map
            .keys()
            .filter(|k| k[0] == SESSION_LOCKS)
            .map(|k| {
                let id = keyspace::read_u64(&k[1..9]).unwrap_or_default();
                (SessionId(id), String::from_utf8_lossy(&k[9..]).into_owned())
            })
            .collect();
        check!(
            index == parties,
            "session index {index:?} differs from {parties:?}: {shown}"
        );
        // The live-session count is the number of session records.
        let records = self
            .store
            .map
            .keys()
            .filter(|k| k[0] == keyspace::SESSION)
            .count() as u64;
        let live = self
            .store
            .map
            .get(keyspace::META_LIVE_SESSIONS)
            .and_then(|v| keyspace::read_u64(v))
            .unwrap_or(0);
        check!(
            live == records,
            "{live} sessions counted live, {records} session records: {shown}"
        );
        // The token counter is the last token reported.
        let counter = self
            .store
            .map
            .get(META_LAST_TOKEN)
            .and_then(|v| keyspace::read_u64(v))
            .unwrap_or(0);
        check!(
            counter == self.max_token.0,
            "token counter {counter} vs {}: {shown}",
            self.max_token
        );
        // Every earlier grant that no longer holds is not current.
        for g in &self.seen_grants {
            let holds = locks
                .get(&g.name)
                .is_some_and(|l| l.holders.iter().any(|h| h.token == g.token));
            let current = self.ask(LockQuery::CheckSequencer(g.clone()));
            check!(
                current == LockOutcome::SequencerCheck { current: holds },
                "check of {g:?} says {current:?}: {shown}"
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- properties

/// The generator is not vacuous: over as many sequences as the properties
/// run, every
/// interesting case (grants from the queue, shared runs, stale fences,
/// retries, lock-delays...) happens, so the properties below check them.
#[test]
fn the_generator_reaches_every_case() {
    use proptest::test_runner::TestRunner;
    use std::cell::RefCell;

    let seen: RefCell<BTreeMap<&'static str, u32>> = RefCell::default();
    let mut runner = TestRunner::new(config(256));
    let result = runner.run(&ops(), |ops| {
        let mut h = Harness::started()?;
        for op in &ops {
            let command = h.resolve(op);
            let _ = h.step(command)?;
        }
        for (case, n) in h.seen {
            *seen.borrow_mut().entry(case).or_default() += n;
        }
        Ok(())
    });
    assert!(result.is_ok(), "{result:?}");
    let seen = seen.into_inner();
    let wanted = [
        "session opened",
        "session closed",
        "session expired",
        "granted",
        "re-entrant grant",
        "queued",
        "released",
        "re-entrant release",
        "wait cancelled",
        "cancel after grant",
        "lease expired",
        "stale lease expiry",
        "lock-delay ended",
        "stale lock-delay end",
        "fenced write",
        "busy",
        "busy in lock-delay",
        "not holder",
        "stale token",
        "stale fence",
        "wrong session secret",
        "upgrade refused",
        "downgrade refused",
        "already waiting",
        "session ended",
        "unknown session",
        "invalid",
        "retry of a success",
        "waiter granted",
        "lock-delay started",
        "lock freed",
        "shared run granted",
        "retry returns a later grant",
        "retry of a cancelled wait",
    ];
    let missing: Vec<_> = wanted.iter().filter(|c| !seen.contains_key(*c)).collect();
    assert!(
        missing.is_empty(),
        "never reached {missing:?}; reached {seen:?}"
    );
}

proptest! {
    #![proptest_config(config(256))]

    /// Every invariant holds after every step of a random sequence.
    #[test]
    fn invariants_hold_after_every_step(ops in ops()) {
        let mut h = Harness::started()?;
        for op in &ops {
            let command = h.resolve(op);
            let _ = h.step(command)?;
        }
    }

    /// A replica restored from a copy of the store at any point, and one that
    /// decodes its own copy of each entry, stay identical to the original:
    /// same results, same events, same bytes.
    #[test]
    fn snapshot_restore_and_replicas_stay_identical(ops in ops(), at in any::<Index>()) {
        let mut original = Harness::started()?;
        let mut replica = original.store.clone();
        let split = at.index(ops.len() + 1);
        let mut restored: Option<MemStore> = None;
        for (i, op) in ops.iter().enumerate() {
            if i == split {
                restored = Some(MemStore { map: original.store.map.clone() });
            }
            let command = original.resolve(op);
            let now = original.now + 1;
            let (result, events) = original.step(command.clone())?;
            let request = Request { now, command: Command::Lock(command) };
            let copy: Request = codec::decode(&codec::encode(&request).expect("encodes")).expect("decodes");
            let got = apply_with_events(&mut replica, &copy).expect("MemStore never fails");
            prop_assert_eq!(&got, &(result.clone(), events.clone()), "replica at step {}", i);
            prop_assert_eq!(&replica, &original.store, "replica bytes at step {}", i);
            if let Some(r) = restored.as_mut() {
                let got = apply_with_events(r, &request).expect("MemStore never fails");
                prop_assert_eq!(got, (result, events), "restored replica at step {}", i);
                prop_assert_eq!(&*r, &original.store, "restored bytes at step {}", i);
            }
        }
        // The restored copy answers every query like the original.
        if let Some(r) = restored {
            for q in [
                LockQuery::TimerState,
                LockQuery::Locks { prefix: String::new(), start_after: None, limit: 0 },
            ] {
                let q = Query::Lock(q);
                prop_assert_eq!(query(&r, &q), query(&original.store, &q));
            }
        }
    }
}
