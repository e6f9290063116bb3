//! Countdown checkpoints (`LockCommand::Checkpoint`): the rules, each
//! asserted. A checkpoint's number for a live session or a leased grant
//! shows in `TimerState` (and `SessionTimer`) until the next one replaces
//! it; one at or above the full length clears it; items for sessions or
//! grants that are gone are skipped and counted out of `recorded`; too
//! many items, token 0 or a bad lock name are refused with nothing
//! written; clients cannot send one. And a checkpoint changes nothing
//! else: no event, no revision, no row but the records it names, and every
//! later command behaves exactly as without it, which a property test
//! checks over random sequences against a twin store that never saw one.

use std::collections::{BTreeMap, BTreeSet};

use latchkey_core::auth::{AuthCommand, ROOT};
use latchkey_core::keyspace::{self, META_NOW, META_REVISION};
use latchkey_core::limits::{MAX_CHECKPOINT_ITEMS, MAX_LOCK_NAME_LEN};
use latchkey_core::lock::{
    Event, LeaseLeft, LeaseTimer, LockCensus, LockCommand, LockInfo, LockMode, LockOutcome,
    LockQuery, Proposer, Sequencer, SessionId, SessionLeft, SessionTimer, TimerState, Token,
};
use latchkey_core::{
    apply_with_events, query, validate_command, Command, CommandError, CommandResult, MemStore,
    Outcome, Query, Request,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

mod state;
use state::{secret, Cluster};

const TTL_MS: u64 = 10_000;
const LEASE_MS: u64 = 5_000;

impl Cluster {
    /// The id the next `OpenSession` gets.
    fn next_session(&self) -> SessionId {
        let last = self
            .store
            .map
            .get(keyspace::META_LAST_SESSION)
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_be_bytes);
        SessionId(last + 1)
    }

    /// Open a session of [`TTL_MS`] with the secret [`secret`] of its id.
    fn open(&mut self) -> SessionId {
        let expected = self.next_session();
        let opened = self.lock(LockCommand::OpenSession {
            ttl_ms: TTL_MS,
            secret: secret(expected.0),
            name: String::new(),
        });
        match opened {
            Ok(LockOutcome::SessionOpened { session, .. }) if session == expected => session,
            other => panic!("open: {other:?}"),
        }
    }

    fn acquire_command(
        &mut self,
        session: SessionId,
        name: &str,
        mode: LockMode,
        lease_ms: Option<u64>,
        lock_delay_ms: Option<u64>,
        wait: bool,
    ) -> LockCommand {
        self.next_request += 1;
        LockCommand::Acquire {
            session,
            secret: secret(session.0),
            owner: 0,
            request_id: self.next_request,
            name: name.to_string(),
            mode,
            wait_ms: wait.then_some(60_000),
            lease_ms,
            lock_delay_ms,
            value: Vec::new(),
            permits: None,
        }
    }

    /// An exclusive acquire that must be granted at once: its token.
    fn grant(&mut self, session: SessionId, name: &str, lease_ms: Option<u64>) -> Token {
        let command =
            self.acquire_command(session, name, LockMode::Exclusive, lease_ms, None, false);
        match self.succeed(command).0 {
            LockOutcome::Granted { sequencer, .. } => sequencer.token,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    fn release_command(
        &mut self,
        session: SessionId,
        owner: u64,
        name: &str,
        token: Token,
    ) -> LockCommand {
        self.next_request += 1;
        LockCommand::Release {
            session,
            secret: secret(session.0),
            owner,
            request_id: self.next_request,
            name: name.to_string(),
            token,
        }
    }

    /// A checkpoint, which must succeed without an event: how many of its
    /// items it recorded.
    fn checkpoint(&mut self, sessions: Vec<SessionLeft>, leases: Vec<LeaseLeft>) -> u32 {
        match self.succeed(LockCommand::Checkpoint { sessions, leases }) {
            (LockOutcome::Checkpointed { recorded }, events) => {
                assert!(events.is_empty(), "a checkpoint reported {events:?}");
                recorded
            }
            (other, _) => panic!("expected Checkpointed, got {other:?}"),
        }
    }

    fn ask(&self, q: LockQuery) -> LockOutcome {
        ask(&self.store, q)
    }

    fn timers(&self) -> TimerState {
        timers(&self.store)
    }

    fn session_timer(&self, session: SessionId) -> Option<SessionTimer> {
        match self.ask(LockQuery::SessionTimer { session }) {
            LockOutcome::SessionTimer(t) => t,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn census(&self) -> LockCensus {
        match self.ask(LockQuery::Census) {
            LockOutcome::Census(c) => c,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn locks(&self) -> Vec<LockInfo> {
        locks(&self.store)
    }

    /// The left of `session` in `TimerState` (which must list it).
    fn session_left(&self, session: SessionId) -> SessionTimer {
        self.timers()
            .sessions
            .into_iter()
            .find(|t| t.session == session)
            .expect("a live session is in TimerState")
    }

    /// The revision (absent: 0).
    fn revision(&self) -> Option<Vec<u8>> {
        self.store.map.get(META_REVISION).cloned()
    }
}

fn ask(store: &MemStore, q: LockQuery) -> LockOutcome {
    match query(store, &Query::Lock(q)).expect("MemStore never fails") {
        Ok(Outcome::Lock(o)) => o,
        other => panic!("unexpected {other:?}"),
    }
}

fn timers(store: &MemStore) -> TimerState {
    match ask(store, LockQuery::TimerState) {
        LockOutcome::Timers(t) => t,
        other => panic!("unexpected {other:?}"),
    }
}

fn locks(store: &MemStore) -> Vec<LockInfo> {
    match ask(
        store,
        LockQuery::Locks {
            prefix: String::new(),
            start_after: None,
            limit: 0,
        },
    ) {
        LockOutcome::Locks { locks, more } => {
            assert!(!more, "the tests use few locks");
            locks
        }
        other => panic!("unexpected {other:?}"),
    }
}

fn census(store: &MemStore) -> LockCensus {
    match ask(store, LockQuery::Census) {
        LockOutcome::Census(c) => c,
        other => panic!("unexpected {other:?}"),
    }
}

/// `t` with every recorded number set back to the full length: what a
/// store that never saw a checkpoint answers.
fn unrecorded(mut t: TimerState) -> TimerState {
    for s in &mut t.sessions {
        s.left_ms = s.ttl_ms;
    }
    for l in &mut t.leases {
        l.left_ms = l.lease_ms;
    }
    t
}

fn session_left(session: SessionId, left_ms: u64) -> SessionLeft {
    SessionLeft { session, left_ms }
}

fn lease_left(name: &str, token: Token, left_ms: u64) -> LeaseLeft {
    LeaseLeft {
        name: name.to_string(),
        token,
        left_ms,
    }
}

fn lease_timer(name: &str, token: Token, left_ms: u64) -> LeaseTimer {
    LeaseTimer {
        name: name.to_string(),
        token,
        lease_ms: LEASE_MS,
        left_ms,
    }
}

/// The keys whose rows differ between `a` and `b` (present in one only,
/// or with other values).
fn changed_rows(a: &MemStore, b: &MemStore) -> BTreeSet<Vec<u8>> {
    let keys: BTreeSet<&Vec<u8>> = a.map.keys().chain(b.map.keys()).collect();
    keys.into_iter()
        .filter(|k| a.map.get(*k) != b.map.get(*k))
        .cloned()
        .collect()
}

// ---------------------------------------------------------------- sessions

#[test]
fn a_session_left_shows_until_replaced_and_clears_at_the_ttl() {
    let mut c = Cluster::new();
    let a = c.open();
    let b = c.open();
    let unrecorded_row = c.store.map.get(&keyspace::session_key(a.0)).cloned();
    let fresh = c.session_left(a);
    assert_eq!((fresh.ttl_ms, fresh.left_ms), (TTL_MS, TTL_MS));
    assert!(!fresh.is_recorded(), "nothing recorded yet");

    assert_eq!(c.checkpoint(vec![session_left(a, 7_000)], vec![]), 1);
    let t = c.session_left(a);
    assert_eq!(
        (t.ttl_ms, t.left_ms, t.secret),
        (TTL_MS, 7_000, secret(a.0))
    );
    assert!(t.is_recorded());
    assert_eq!(c.session_timer(a), Some(t), "SessionTimer answers the same");
    assert!(
        !c.session_left(b).is_recorded(),
        "only the session named is recorded"
    );

    // A later checkpoint replaces the number, lower or higher.
    assert_eq!(c.checkpoint(vec![session_left(a, 4_000)], vec![]), 1);
    assert_eq!(c.session_left(a).left_ms, 4_000);
    assert_eq!(c.checkpoint(vec![session_left(a, 9_999)], vec![]), 1);
    assert_eq!(c.session_left(a).left_ms, 9_999);
    assert_eq!(
        c.session_timer(a).map(|t| t.left_ms),
        Some(9_999),
        "SessionTimer follows"
    );
    // 0 left is a number like any other.
    assert_eq!(c.checkpoint(vec![session_left(a, 0)], vec![]), 1);
    assert_eq!(c.session_left(a).left_ms, 0);
    assert!(c.session_left(a).is_recorded());

    // At the TTL: cleared (and still counted as recorded: the session is live).
    assert_eq!(c.checkpoint(vec![session_left(a, TTL_MS)], vec![]), 1);
    let cleared = c.session_left(a);
    assert_eq!(cleared.left_ms, TTL_MS);
    assert!(!cleared.is_recorded());
    assert_eq!(c.session_timer(a), Some(cleared));
    assert_eq!(
        c.store.map.get(&keyspace::session_key(a.0)).cloned(),
        unrecorded_row,
        "a cleared record is stored as if never recorded"
    );

    // Above it: cleared too, never shown above the TTL.
    assert_eq!(c.checkpoint(vec![session_left(a, 3_000)], vec![]), 1);
    assert_eq!(c.checkpoint(vec![session_left(a, u64::MAX)], vec![]), 1);
    let cleared = c.session_left(a);
    assert_eq!(cleared.left_ms, TTL_MS);
    assert!(!cleared.is_recorded());

    // Several items: the last one of a session wins, each is counted.
    let items = vec![
        session_left(a, 1_000),
        session_left(b, 2_000),
        session_left(a, 3_000),
    ];
    assert_eq!(c.checkpoint(items, vec![]), 3);
    assert_eq!(c.session_left(a).left_ms, 3_000);
    assert_eq!(c.session_left(b).left_ms, 2_000);
}

#[test]
fn ended_and_unknown_sessions_are_skipped_and_never_resurrected() {
    let mut c = Cluster::new();
    let closed = c.open();
    let expired = c.open();
    let live = c.open();
    c.succeed(LockCommand::CloseSession {
        session: closed,
        secret: secret(closed.0),
    });
    c.succeed(LockCommand::ExpireSession { session: expired });
    let live_before = c.census().sessions;
    assert_eq!(live_before, 1);
    let live_row = c.store.map.get(keyspace::META_LIVE_SESSIONS).cloned();

    let items = vec![
        session_left(closed, 1_000),
        session_left(expired, 2_000),
        session_left(SessionId(99), 3_000),
        session_left(SessionId(0), 3_000),
        session_left(live, 4_000),
    ];
    assert_eq!(
        c.checkpoint(items, vec![]),
        1,
        "only the live session counts"
    );

    for gone in [closed, expired, SessionId(99), SessionId(0)] {
        assert_eq!(c.session_timer(gone), None, "{gone:?} came back");
        assert_eq!(
            c.ask(LockQuery::Session { session: gone }),
            LockOutcome::Session(None)
        );
        assert!(
            !c.store.map.contains_key(&keyspace::session_key(gone.0)),
            "a session row for {gone:?}"
        );
    }
    assert_eq!(c.census().sessions, live_before);
    assert_eq!(
        c.store.map.get(keyspace::META_LIVE_SESSIONS).cloned(),
        live_row,
        "the live-session count moved"
    );
    let timers = c.timers();
    assert_eq!(timers.sessions.len(), 1);
    assert_eq!(
        (timers.sessions[0].session, timers.sessions[0].left_ms),
        (live, 4_000)
    );
    // An ended session stays ended for every command.
    let command = c.acquire_command(closed, "x", LockMode::Exclusive, None, None, false);
    assert_eq!(
        c.refused(command),
        CommandError::SessionEnded { session: closed }
    );
}

// ---------------------------------------------------------------- leases

#[test]
fn a_lease_left_is_recorded_for_its_own_grant_only() {
    let mut c = Cluster::new();
    let a = c.open();
    let b = c.open();
    let leased = c.grant(a, "leased", Some(LEASE_MS));
    let plain = c.grant(b, "plain", None);
    let released = c.grant(a, "gone", Some(LEASE_MS));
    let release = c.release_command(a, 0, "gone", released);
    c.succeed(release);
    // A semaphore of two leased permits: each grant has its own lease.
    let permit = |c: &mut Cluster, session: SessionId| -> Token {
        let mut command = c.acquire_command(
            session,
            "pool",
            LockMode::Shared,
            Some(LEASE_MS),
            None,
            false,
        );
        if let LockCommand::Acquire { permits, .. } = &mut command {
            *permits = Some(2);
        }
        match c.succeed(command).0 {
            LockOutcome::Granted { sequencer, .. } => sequencer.token,
            other => panic!("expected a permit, got {other:?}"),
        }
    };
    let first = permit(&mut c, a);
    let second = permit(&mut c, b);
    let locks_before = c.locks();
    let unrecorded_row = c.store.map.get(&keyspace::lock_key("leased")).cloned();

    let items = vec![
        lease_left("leased", leased, 3_000),
        lease_left("leased", Token(leased.0 + 100), 1_000), // wrong token
        lease_left("leased", plain, 1_000),                 // another lock's token
        lease_left("plain", plain, 1_000),                  // a grant without a lease
        lease_left("gone", released, 1_000),                // released
        lease_left("free", leased, 1_000),                  // a lock not in use
        lease_left("pool", second, 2_500),
    ];
    assert_eq!(c.checkpoint(vec![], items), 2);
    assert_eq!(
        c.timers().leases,
        vec![
            lease_timer("leased", leased, 3_000),
            lease_timer("pool", first, LEASE_MS),
            lease_timer("pool", second, 2_500),
        ]
    );
    assert_eq!(c.locks(), locks_before, "no lock moved, none appeared");
    for name in ["free", "gone"] {
        assert!(
            !c.store.map.contains_key(&keyspace::lock_key(name)),
            "a lock row for {name:?}"
        );
    }

    // Replaced, then cleared at or above the lease.
    assert_eq!(
        c.checkpoint(vec![], vec![lease_left("leased", leased, 500)]),
        1
    );
    assert_eq!(c.timers().leases[0], lease_timer("leased", leased, 500));
    assert_eq!(
        c.checkpoint(vec![], vec![lease_left("leased", leased, LEASE_MS)]),
        1
    );
    assert_eq!(
        c.timers().leases[0],
        lease_timer("leased", leased, LEASE_MS)
    );
    assert_eq!(
        c.store.map.get(&keyspace::lock_key("leased")).cloned(),
        unrecorded_row,
        "a cleared lease is stored as if never recorded"
    );
    assert_eq!(
        c.checkpoint(
            vec![session_left(a, 1), session_left(SessionId(42), 1)],
            vec![
                lease_left("pool", second, LEASE_MS + 1),
                lease_left("pool", first, 0)
            ]
        ),
        3
    );
    assert_eq!(
        c.timers().leases,
        vec![
            lease_timer("leased", leased, LEASE_MS),
            lease_timer("pool", first, 0),
            lease_timer("pool", second, LEASE_MS),
        ]
    );
}

#[test]
fn ends_after_a_checkpoint_are_the_same_as_without_and_a_new_grant_starts_unrecorded() {
    // The same script on two stores; `with` also gets checkpoints.
    let mut with = Cluster::new();
    let mut without = Cluster::new();
    let script = |c: &mut Cluster, checkpoints: bool| -> Vec<(CommandResult, Vec<Event>)> {
        let mut seen = Vec::new();
        let mut run = |c: &mut Cluster, command: LockCommand| {
            let r = c.step(Command::Lock(command));
            seen.push(r);
        };
        let a = c.open();
        let b = c.open();
        let x = c.grant(a, "x", Some(LEASE_MS));
        let waits = c.acquire_command(b, "x", LockMode::Exclusive, Some(LEASE_MS), None, true);
        run(c, waits);
        let y = c.grant(a, "y", Some(LEASE_MS));
        let delayed = c.acquire_command(
            a,
            "d",
            LockMode::Exclusive,
            Some(LEASE_MS),
            Some(100),
            false,
        );
        run(c, delayed);
        if checkpoints {
            let recorded = c.checkpoint(
                vec![session_left(a, 3_000), session_left(b, 1)],
                vec![
                    lease_left("x", x, 1_000),
                    lease_left("y", y, 2_000),
                    lease_left("d", Token(y.0 + 1), 10),
                ],
            );
            assert_eq!(recorded, 5);
        }
        // The lease of x runs out: b is granted x.
        run(
            c,
            LockCommand::ExpireLockLease {
                name: "x".into(),
                token: x,
            },
        );
        let new_x = c
            .locks()
            .iter()
            .find(|l| l.name == "x")
            .and_then(|l| l.holders.first().map(|h| (h.session, h.token)))
            .expect("b was granted x");
        assert_eq!(new_x.0, b);
        assert!(new_x.1 > x);
        // ... and its lease starts unrecorded, on both stores.
        assert!(
            c.timers()
                .leases
                .contains(&lease_timer("x", new_x.1, LEASE_MS)),
            "{:?}",
            c.timers()
        );
        // a releases y and takes it again: a new grant, unrecorded.
        let release = c.release_command(a, 0, "y", y);
        run(c, release);
        let again = c.acquire_command(a, "y", LockMode::Exclusive, Some(LEASE_MS), None, false);
        run(c, again);
        let new_y = c
            .timers()
            .leases
            .into_iter()
            .find(|l| l.name == "y")
            .expect("y is leased again");
        assert!(new_y.token > y);
        assert_eq!(
            new_y.left_ms, LEASE_MS,
            "a new grant's lease starts unrecorded"
        );
        // a's TTL runs out: its holds go, d in lock-delay.
        run(c, LockCommand::ExpireSession { session: a });
        let delay = c.timers().lock_delays;
        run(
            c,
            LockCommand::EndLockDelay {
                name: "d".into(),
                token: delay.first().expect("d in lock-delay").token,
            },
        );
        run(
            c,
            LockCommand::CloseSession {
                session: b,
                secret: secret(b.0),
            },
        );
        seen
    };
    let with_seen = script(&mut with, true);
    let without_seen = script(&mut without, false);
    assert_eq!(with_seen, without_seen, "outcomes and events");
    assert!(
        with_seen.iter().any(|(_, events)| events
            .iter()
            .any(|e| matches!(e, Event::Released { name, .. } if name == "x"))),
        "the lease expiry released x"
    );
    assert_eq!(with.locks(), without.locks());
    assert_eq!(with.timers(), without.timers());
    assert_eq!(with.census(), without.census());
    // Once everything has ended, only the clock can tell them apart.
    let mut differ = changed_rows(&with.store, &without.store);
    differ.remove(META_NOW);
    assert_eq!(differ, BTreeSet::new());
}

// ---------------------------------------------------------------- nothing else

#[test]
fn a_checkpoint_changes_nothing_but_the_records_it_names() {
    let mut c = Cluster::new();
    let a = c.open();
    let b = c.open();
    let w = c.open();
    let e = c.open();
    // a holds x (leased, with lock-delay) and w waits for it; b holds y
    // shared and leased; e's expiry leaves d in lock-delay.
    let x = {
        let command = c.acquire_command(
            a,
            "x",
            LockMode::Exclusive,
            Some(LEASE_MS),
            Some(100),
            false,
        );
        match c.succeed(command).0 {
            LockOutcome::Granted { sequencer, .. } => sequencer,
            other => panic!("{other:?}"),
        }
    };
    let waits = c.acquire_command(w, "x", LockMode::Exclusive, None, None, true);
    c.succeed(waits);
    let y = {
        let command = c.acquire_command(b, "y", LockMode::Shared, Some(LEASE_MS), None, false);
        match c.succeed(command).0 {
            LockOutcome::Granted { sequencer, .. } => sequencer,
            other => panic!("{other:?}"),
        }
    };
    let delayed = c.acquire_command(e, "d", LockMode::Exclusive, None, Some(60_000), false);
    c.succeed(delayed);
    c.succeed(LockCommand::ExpireSession { session: e });
    for command in [
        Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        },
        Command::PutBound {
            key: b"bound".to_vec(),
            value: b"v".to_vec(),
            session: a,
            secret: secret(a.0),
        },
    ] {
        assert!(c.run(command).is_ok());
    }
    let delay = c.timers().lock_delays;
    assert_eq!(delay.len(), 1, "d is in lock-delay");
    assert_eq!(c.census().waiters, 1);

    let before = c.store.clone();
    let revision = c.revision();
    let locks = c.locks();
    let census = c.census();
    let timers = c.timers();
    let stale = Sequencer {
        token: Token(x.token.0 + 1_000),
        ..x.clone()
    };
    let sequencers = [x.clone(), y.clone(), stale];
    let checks = |c: &Cluster| -> Vec<LockOutcome> {
        let mut answers: Vec<LockOutcome> = sequencers
            .iter()
            .map(|s| c.ask(LockQuery::CheckSequencer(s.clone())))
            .collect();
        for s in [a, b, w, e] {
            answers.push(c.ask(LockQuery::Session { session: s }));
        }
        answers
    };
    let answers = checks(&c);

    let recorded = c.checkpoint(
        vec![
            session_left(a, 1_234),
            session_left(b, 5_678),
            session_left(w, TTL_MS), // clears what was never set: no write
            session_left(e, 1),
        ],
        vec![
            lease_left("x", x.token, 100),
            lease_left("y", y.token, 200),
            lease_left("d", delay[0].token, 1),
        ],
    );
    assert_eq!(recorded, 5);

    let mut changed = changed_rows(&before, &c.store);
    assert!(changed.remove(META_NOW), "the clock moves as for any entry");
    let expected: BTreeSet<Vec<u8>> = [
        keyspace::session_key(a.0),
        keyspace::session_key(b.0),
        keyspace::lock_key("x"),
        keyspace::lock_key("y"),
    ]
    .into_iter()
    .collect();
    assert_eq!(changed, expected, "only the records named changed");
    assert_eq!(c.revision(), revision, "no revision");
    assert_eq!(c.locks(), locks);
    assert_eq!(c.census(), census);
    assert_eq!(checks(&c), answers);
    assert_eq!(unrecorded(c.timers()), timers, "nothing but the numbers");
    assert_eq!(c.session_left(a).left_ms, 1_234);
    assert_eq!(c.session_left(b).left_ms, 5_678);
    assert!(!c.session_left(w).is_recorded());
    assert_eq!(
        c.timers().leases,
        vec![
            lease_timer("x", x.token, 100),
            lease_timer("y", y.token, 200)
        ]
    );
    assert_eq!(c.timers().lock_delays, delay, "the lock-delay is untouched");

    // The same checkpoint again writes nothing but the clock.
    let again = c.store.clone();
    let recorded = c.checkpoint(
        vec![session_left(a, 1_234), session_left(b, 5_678)],
        vec![lease_left("x", x.token, 100), lease_left("y", y.token, 200)],
    );
    assert_eq!(recorded, 4);
    let mut changed = changed_rows(&again, &c.store);
    changed.remove(META_NOW);
    assert_eq!(changed, BTreeSet::new());
}

// ---------------------------------------------------------------- validation

#[test]
fn more_than_the_most_items_are_refused_with_nothing_written() {
    let mut c = Cluster::new();
    let a = c.open();
    let t = c.grant(a, "x", Some(LEASE_MS));
    let sessions = |n: usize| -> Vec<SessionLeft> { vec![session_left(a, 1_000); n] };
    let leases = |n: usize| -> Vec<LeaseLeft> { vec![lease_left("x", t, 1_000); n] };
    for (s, l) in [
        (MAX_CHECKPOINT_ITEMS + 1, 0),
        (0, MAX_CHECKPOINT_ITEMS + 1),
        (MAX_CHECKPOINT_ITEMS / 2, MAX_CHECKPOINT_ITEMS / 2 + 1),
    ] {
        let command = LockCommand::Checkpoint {
            sessions: sessions(s),
            leases: leases(l),
        };
        assert!(
            matches!(
                validate_command(&Command::Lock(command.clone())),
                Err(CommandError::InvalidArgument(_))
            ),
            "{s} + {l} items"
        );
        assert!(
            matches!(c.refused(command), CommandError::InvalidArgument(_)),
            "{s} + {l} items"
        );
    }
    assert!(!c.session_left(a).is_recorded());
    assert_eq!(c.timers().leases[0].left_ms, LEASE_MS);
    // Exactly the most is fine.
    let n = MAX_CHECKPOINT_ITEMS / 2;
    assert_eq!(
        c.checkpoint(sessions(n), leases(MAX_CHECKPOINT_ITEMS - n)),
        MAX_CHECKPOINT_ITEMS as u32
    );
    assert_eq!(c.session_left(a).left_ms, 1_000);
}

#[test]
fn token_zero_and_bad_lock_names_are_refused_with_nothing_written() {
    let mut c = Cluster::new();
    let a = c.open();
    let t = c.grant(a, "x", Some(LEASE_MS));
    let long = "n".repeat(MAX_LOCK_NAME_LEN + 1);
    let bad = [
        lease_left("x", Token(0), 1_000),
        lease_left("", t, 1_000),
        lease_left(&long, t, 1_000),
    ];
    for item in bad {
        // With good items around it, so that a partial write would show.
        let command = LockCommand::Checkpoint {
            sessions: vec![session_left(a, 1_000)],
            leases: vec![lease_left("x", t, 1_000), item.clone()],
        };
        let refused = c.refused(command);
        if item.token == Token(0) {
            assert!(
                matches!(refused, CommandError::InvalidArgument(_)),
                "{refused:?}"
            );
        } else {
            assert_eq!(
                refused,
                CommandError::InvalidLockName {
                    len: item.name.len(),
                    max: MAX_LOCK_NAME_LEN
                }
            );
        }
    }
    assert!(!c.session_left(a).is_recorded());
    assert_eq!(c.timers().leases[0].left_ms, LEASE_MS);
    // The longest name is fine (and, unused, skipped).
    let longest = "n".repeat(MAX_LOCK_NAME_LEN);
    assert_eq!(c.checkpoint(vec![], vec![lease_left(&longest, t, 1)]), 0);
}

#[test]
fn clients_cannot_send_a_checkpoint() {
    let command = LockCommand::Checkpoint {
        sessions: vec![],
        leases: vec![],
    };
    assert_eq!(command.proposer(), Proposer::Leader);
    // With access control on, not even root may run it as a user; the
    // leader's own entry (naming nobody) still applies.
    let mut c = Cluster::new();
    let a = c.open();
    let setup = [
        Command::Auth(AuthCommand::AddUser {
            name: ROOT.into(),
            password: Some("a stored hash".into()),
        }),
        Command::As {
            user: ROOT.into(),
            command: Box::new(Command::Auth(AuthCommand::Enable)),
        },
    ];
    for command in setup {
        assert!(c.run(command).is_ok());
    }
    let checkpoint = LockCommand::Checkpoint {
        sessions: vec![session_left(a, 1_000)],
        leases: vec![],
    };
    let before = c.store.clone();
    let (result, events) = c.step(Command::As {
        user: ROOT.into(),
        command: Box::new(Command::Lock(checkpoint.clone())),
    });
    assert!(
        matches!(result, Err(CommandError::InvalidArgument(_))),
        "{result:?}"
    );
    assert!(events.is_empty());
    assert_eq!(c.store, before, "the refusal wrote something");
    assert_eq!(
        c.step(Command::Lock(checkpoint)).0,
        Ok(Outcome::Lock(LockOutcome::Checkpointed { recorded: 1 }))
    );
    assert_eq!(c.session_left(a).left_ms, 1_000);
}

// ---------------------------------------------------------------- property

const SLOTS: usize = 3;
const NAMES: [&str; 3] = ["a", "b", "c"];

/// An abstract step, resolved against the state of the store that never
/// sees a checkpoint.
#[derive(Debug, Clone)]
enum Step {
    Open {
        slot: usize,
    },
    Acquire {
        slot: usize,
        owner: u64,
        name: usize,
        shared: bool,
        lease: bool,
        wait: bool,
    },
    Release {
        slot: usize,
        owner: u64,
        name: usize,
    },
    End {
        slot: usize,
        expire: bool,
    },
    /// The leader's expiry of the `pick`th lease (or a stale token).
    ExpireLease {
        pick: usize,
    },
    EndLockDelay {
        pick: usize,
    },
    ExpireWait {
        pick: usize,
    },
    /// Only on the store with checkpoints.
    Checkpoint {
        sessions: Vec<(SessionPick, Left)>,
        leases: Vec<(LeasePick, Left)>,
    },
}

/// Which session a checkpoint item names.
#[derive(Debug, Clone)]
enum SessionPick {
    /// The `n`th live session.
    Live(usize),
    /// Any id up to two past the last issued (ended, live or unknown).
    Any(u64),
}

/// Which grant a checkpoint item names.
#[derive(Debug, Clone)]
enum LeasePick {
    /// The `n`th leased grant.
    Live(usize),
    /// A lock name and any token up to two past the last issued.
    Any(usize, u64),
}

/// How much is left, relative to the full length.
#[derive(Debug, Clone, Copy)]
enum Left {
    /// A fraction (0..=100 percent) of the full length, below or at it.
    Percent(u64),
    /// Just below the full length.
    JustBelow,
    /// The full length or more.
    Above(u64),
    /// Any number.
    Raw(u64),
}

impl Left {
    fn of(self, full: u64) -> u64 {
        match self {
            Left::Percent(p) => full * p / 100,
            Left::JustBelow => full - 1,
            Left::Above(extra) => full.saturating_add(extra),
            Left::Raw(n) => n,
        }
    }
}

fn left() -> impl Strategy<Value = Left> {
    prop_oneof![
        4 => (0..=100u64).prop_map(Left::Percent),
        1 => Just(Left::JustBelow),
        2 => prop_oneof![Just(0u64), 1..10_000u64, Just(u64::MAX - 1)].prop_map(Left::Above),
        1 => any::<u64>().prop_map(Left::Raw),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let slot = 0..SLOTS;
    let owner = 0..2u64;
    let name = 0..NAMES.len();
    let session_pick = prop_oneof![
        3 => (0..4usize).prop_map(SessionPick::Live),
        1 => (0..16u64).prop_map(SessionPick::Any),
    ];
    let lease_pick = prop_oneof![
        3 => (0..4usize).prop_map(LeasePick::Live),
        1 => (0..NAMES.len(), 0..24u64).prop_map(|(n, t)| LeasePick::Any(n, t)),
    ];
    let checkpoint = (
        prop::collection::vec((session_pick, left()), 0..4),
        prop::collection::vec((lease_pick, left()), 0..4),
    )
        .prop_map(|(sessions, leases)| Step::Checkpoint { sessions, leases });
    prop_oneof![
        2 => slot.clone().prop_map(|slot| Step::Open { slot }),
        5 => (slot.clone(), owner.clone(), name.clone(), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(slot, owner, name, shared, lease, wait)| Step::Acquire {
                slot, owner, name, shared, lease, wait,
            }),
        3 => (slot.clone(), owner, name).prop_map(|(slot, owner, name)| Step::Release { slot, owner, name }),
        1 => (slot, any::<bool>()).prop_map(|(slot, expire)| Step::End { slot, expire }),
        1 => (0..5usize).prop_map(|pick| Step::ExpireLease { pick }),
        1 => (0..3usize).prop_map(|pick| Step::EndLockDelay { pick }),
        1 => (0..3usize).prop_map(|pick| Step::ExpireWait { pick }),
        4 => checkpoint,
    ]
}

/// Two stores driven alike but for the checkpoints, and the model of the
/// numbers the checkpoints recorded.
struct Twins {
    /// Gets the checkpoints.
    with: MemStore,
    /// Never sees one.
    without: MemStore,
    now: u64,
    next_request: u64,
    /// The session of each slot, if it opened one.
    slots: [Option<SessionId>; SLOTS],
    /// Recorded session numbers, below the TTL.
    session_left: BTreeMap<SessionId, u64>,
    /// Recorded lease numbers by (lock, token), below the lease.
    lease_left: BTreeMap<(String, Token), u64>,
}

impl Twins {
    fn new() -> Self {
        Twins {
            with: MemStore::default(),
            without: MemStore::default(),
            now: 1,
            next_request: 1,
            slots: [None; SLOTS],
            session_left: BTreeMap::new(),
            lease_left: BTreeMap::new(),
        }
    }

    fn apply(store: &mut MemStore, now: u64, command: &LockCommand) -> (CommandResult, Vec<Event>) {
        let request = Request {
            now,
            command: Command::Lock(command.clone()),
        };
        apply_with_events(store, &request).expect("MemStore never fails")
    }

    /// The last id and token issued (from the store without checkpoints).
    fn last(&self, key: &[u8]) -> u64 {
        self.without
            .map
            .get(key)
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_be_bytes)
    }

    /// The command `step` stands for, if any, resolved against the store
    /// without checkpoints.
    fn resolve(&mut self, step: &Step) -> Option<LockCommand> {
        let timers = timers(&self.without);
        let mut request = || {
            self.next_request += 1;
            self.next_request
        };
        let command = match step {
            Step::Open { slot } => {
                if self.slots[*slot].is_some() {
                    return None;
                }
                let id = self.last(keyspace::META_LAST_SESSION) + 1;
                LockCommand::OpenSession {
                    ttl_ms: TTL_MS + 1_000 * *slot as u64,
                    secret: secret(id),
                    name: String::new(),
                }
            }
            Step::Acquire {
                slot,
                owner,
                name,
                shared,
                lease,
                wait,
            } => {
                let session = self.slots[*slot]?;
                LockCommand::Acquire {
                    session,
                    secret: secret(session.0),
                    owner: *owner,
                    request_id: request(),
                    name: NAMES[*name].to_string(),
                    mode: if *shared {
                        LockMode::Shared
                    } else {
                        LockMode::Exclusive
                    },
                    wait_ms: wait.then_some(60_000),
                    lease_ms: lease.then_some(LEASE_MS + 100 * *name as u64),
                    lock_delay_ms: (*name == 2).then_some(50),
                    value: Vec::new(),
                    permits: None,
                }
            }
            Step::Release { slot, owner, name } => {
                let session = self.slots[*slot]?;
                let name = NAMES[*name];
                let token = locks(&self.without)
                    .into_iter()
                    .filter(|l| l.name == name)
                    .flat_map(|l| l.holders)
                    .find(|h| h.session == session && h.owner == *owner)
                    .map_or(Token(1), |h| h.token);
                LockCommand::Release {
                    session,
                    secret: secret(session.0),
                    owner: *owner,
                    request_id: request(),
                    name: name.to_string(),
                    token,
                }
            }
            Step::End { slot, expire } => {
                let session = self.slots[*slot].take()?;
                if *expire {
                    LockCommand::ExpireSession { session }
                } else {
                    LockCommand::CloseSession {
                        session,
                        secret: secret(session.0),
                    }
                }
            }
            Step::ExpireLease { pick } => match timers.leases.get(*pick) {
                Some(l) => LockCommand::ExpireLockLease {
                    name: l.name.clone(),
                    token: l.token,
                },
                None => LockCommand::ExpireLockLease {
                    name: NAMES[pick % NAMES.len()].to_string(),
                    token: Token(self.last(keyspace::META_LAST_TOKEN) + 1),
                },
            },
            Step::EndLockDelay { pick } => {
                let d = timers.lock_delays.get(*pick)?;
                LockCommand::EndLockDelay {
                    name: d.name.clone(),
                    token: d.token,
                }
            }
            Step::ExpireWait { pick } => {
                let w = timers.waits.get(*pick)?;
                LockCommand::ExpireWait {
                    session: w.session,
                    owner: w.owner,
                    name: w.name.clone(),
                    request_id: w.request_id,
                }
            }
            Step::Checkpoint { sessions, leases } => {
                let last_session = self.last(keyspace::META_LAST_SESSION);
                let last_token = self.last(keyspace::META_LAST_TOKEN);
                let sessions = sessions
                    .iter()
                    .map(|(pick, left)| {
                        let (session, full) = match pick {
                            SessionPick::Live(n) if !timers.sessions.is_empty() => {
                                let t = &timers.sessions[n % timers.sessions.len()];
                                (t.session, t.ttl_ms)
                            }
                            SessionPick::Live(n) => (SessionId(*n as u64), TTL_MS),
                            SessionPick::Any(id) => (SessionId(id % (last_session + 3)), TTL_MS),
                        };
                        SessionLeft {
                            session,
                            left_ms: left.of(full),
                        }
                    })
                    .collect();
                let leases = leases
                    .iter()
                    .map(|(pick, left)| {
                        let (name, token, full) = match pick {
                            LeasePick::Live(n) if !timers.leases.is_empty() => {
                                let t = &timers.leases[n % timers.leases.len()];
                                (t.name.clone(), t.token, t.lease_ms)
                            }
                            LeasePick::Live(n) => {
                                (NAMES[n % NAMES.len()].to_string(), Token(1), LEASE_MS)
                            }
                            LeasePick::Any(n, t) => (
                                NAMES[*n].to_string(),
                                Token(1 + t % (last_token + 2)),
                                LEASE_MS,
                            ),
                        };
                        LeaseLeft {
                            name,
                            token,
                            left_ms: left.of(full),
                        }
                    })
                    .collect();
                LockCommand::Checkpoint { sessions, leases }
            }
        };
        Some(command)
    }

    /// What a checkpoint must record on top of `timers` (the state before
    /// it), into the model: how many of its items it counts.
    fn record(&mut self, timers: &TimerState, command: &LockCommand) -> u32 {
        let LockCommand::Checkpoint { sessions, leases } = command else {
            return 0;
        };
        let mut recorded = 0;
        for s in sessions {
            let Some(t) = timers.sessions.iter().find(|t| t.session == s.session) else {
                continue;
            };
            recorded += 1;
            if s.left_ms < t.ttl_ms {
                self.session_left.insert(s.session, s.left_ms);
            } else {
                self.session_left.remove(&s.session);
            }
        }
        for l in leases {
            let Some(t) = timers
                .leases
                .iter()
                .find(|t| t.name == l.name && t.token == l.token)
            else {
                continue;
            };
            recorded += 1;
            let key = (l.name.clone(), l.token);
            if l.left_ms < t.lease_ms {
                self.lease_left.insert(key, l.left_ms);
            } else {
                self.lease_left.remove(&key);
            }
        }
        recorded
    }

    /// The timer state the store with checkpoints must answer, from the
    /// one without them and the model.
    fn expected_timers(&self, mut t: TimerState) -> TimerState {
        for s in &mut t.sessions {
            s.left_ms = self
                .session_left
                .get(&s.session)
                .copied()
                .unwrap_or(s.ttl_ms);
        }
        for l in &mut t.leases {
            l.left_ms = self
                .lease_left
                .get(&(l.name.clone(), l.token))
                .copied()
                .unwrap_or(l.lease_ms);
        }
        t
    }

    /// Run one step on both stores (a checkpoint on one only) and check
    /// them against each other and the model.
    fn run(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let Some(command) = self.resolve(step) else {
            return Ok(());
        };
        self.now += 1;
        if matches!(command, LockCommand::Checkpoint { .. }) {
            let before = timers(&self.without);
            let expected = self.record(&before, &command);
            let (result, events) = Self::apply(&mut self.with, self.now, &command);
            prop_assert_eq!(
                result,
                Ok(Outcome::Lock(LockOutcome::Checkpointed {
                    recorded: expected
                })),
                "{:?}",
                command
            );
            prop_assert!(events.is_empty(), "a checkpoint reported {:?}", events);
        } else {
            let with = Self::apply(&mut self.with, self.now, &command);
            let without = Self::apply(&mut self.without, self.now, &command);
            prop_assert_eq!(&with, &without, "{:?}", command);
            if let (Ok(Outcome::Lock(LockOutcome::SessionOpened { session, .. })), _) = &without {
                if let Step::Open { slot } = step {
                    self.slots[*slot] = Some(*session);
                }
            }
        }
        // Forget the numbers of what is gone (a gone session or grant never
        // comes back: ids and tokens are never reused).
        let reference = timers(&self.without);
        self.session_left
            .retain(|s, _| reference.sessions.iter().any(|t| t.session == *s));
        self.lease_left.retain(|(name, token), _| {
            reference
                .leases
                .iter()
                .any(|t| t.name == *name && t.token == *token)
        });
        prop_assert_eq!(
            unrecorded(reference.clone()),
            reference.clone(),
            "the store without checkpoints records nothing"
        );
        let with_timers = timers(&self.with);
        prop_assert_eq!(unrecorded(with_timers.clone()), reference.clone());
        prop_assert_eq!(with_timers, self.expected_timers(reference));
        for t in timers(&self.with).sessions {
            prop_assert_eq!(
                ask(&self.with, LockQuery::SessionTimer { session: t.session }),
                LockOutcome::SessionTimer(Some(t))
            );
        }
        prop_assert_eq!(locks(&self.with), locks(&self.without));
        prop_assert_eq!(census(&self.with), census(&self.without));
        // Row by row: the same keys everywhere, the same values but the
        // clock and the records of sessions and locks with a number
        // recorded (one cleared is as if never recorded).
        for key in changed_rows(&self.with, &self.without) {
            let recorded = match key.split_first() {
                Some((&keyspace::SESSION, id)) => <[u8; 8]>::try_from(id).is_ok_and(|id| {
                    self.session_left
                        .contains_key(&SessionId(u64::from_be_bytes(id)))
                }),
                Some((&keyspace::LOCK, name)) => {
                    self.lease_left.keys().any(|(n, _)| n.as_bytes() == name)
                }
                _ => false,
            };
            prop_assert!(
                key.as_slice() == META_NOW
                    || (recorded
                        && self.with.map.contains_key(&key)
                        && self.without.map.contains_key(&key)),
                "row {:?} differs",
                String::from_utf8_lossy(&key)
            );
        }
        Ok(())
    }
}

fn config(cases: u32) -> Config {
    fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
        std::env::var(name).ok().and_then(|s| s.parse().ok())
    }
    Config {
        cases: env("LATCHKEY_CASES").unwrap_or(cases),
        rng_seed: RngSeed::Fixed(env("LATCHKEY_SEED").unwrap_or(0xc4ec_4b01)),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Checkpoints change nothing but the numbers they record: every other
    /// command has the same outcome and events with them as without, the
    /// lock list, census and timer state (numbers aside) stay the same,
    /// and each number is the last one checkpointed below the full length
    /// (the full length if none, or if cleared).
    #[test]
    fn checkpoints_change_nothing_but_the_numbers(steps in prop::collection::vec(step(), 1..80)) {
        let mut twins = Twins::new();
        for step in &steps {
            twins.run(step)?;
        }
    }
}
