//! Example-based tests of the lock service: every rule of LOCKS.md and of
//! the `latchkey_core::lock` module docs, and every error it names.

use latchkey_core::keyspace::{self, META_LAST_TOKEN, META_NOW};
use latchkey_core::limits::*;
use latchkey_core::lock::{
    Event, ForcedReleases, HoldEnd, LockCensus, LockCommand, LockDelayTimer, LockInfo, LockMode,
    LockOutcome, LockQuery, Proposer, Sequencer, SessionEnd, SessionId, SessionInfo, SessionSecret,
    SessionTimer, TimerKind, TimerState, Token, WaitCancel, WaitEnd, WaitTimer,
};
use latchkey_core::{
    apply_with_events, query, validate_command, BatchOp, Command, CommandError, CommandResult,
    Condition, MemStore, Outcome, Query, Request,
};

use LockMode::{Exclusive, Shared};

// ---------------------------------------------------------------- helpers

/// The secret the tests give `session` (distinct per session).
fn secret_of(session: SessionId) -> SessionSecret {
    let mut bytes = [0x5a; 16];
    bytes[..8].copy_from_slice(&session.0.to_le_bytes());
    SessionSecret(bytes)
}

const WAIT: Option<u64> = Some(5_000);
const TRY: Option<u64> = None;

/// A store and a clock that moves on with every command.
#[derive(Default)]
struct Cluster {
    store: MemStore,
    now: u64,
}

impl Cluster {
    fn run(&mut self, command: LockCommand) -> (CommandResult, Vec<Event>) {
        self.now += 1;
        let request = Request {
            now: self.now,
            command: Command::Lock(command),
        };
        apply_with_events(&mut self.store, &request).expect("MemStore never fails")
    }

    /// Run, expecting success.
    fn ok(&mut self, command: LockCommand) -> (LockOutcome, Vec<Event>) {
        let shown = format!("{command:?}");
        match self.run(command) {
            (Ok(Outcome::Lock(o)), events) => (o, events),
            (other, _) => panic!("{shown}: unexpected {other:?}"),
        }
    }

    /// Run, expecting a refusal that writes nothing at all.
    fn refused(&mut self, command: LockCommand) -> CommandError {
        let before = self.store.clone();
        let shown = format!("{command:?}");
        let (result, events) = self.run(command);
        assert!(events.is_empty(), "{shown}: a refusal reported {events:?}");
        assert_eq!(self.store, before, "{shown}: a refusal wrote something");
        match result {
            Err(e) => e,
            Ok(o) => panic!("{shown}: expected a refusal, got {o:?}"),
        }
    }

    /// The id the next `OpenSession` will get.
    fn next_session(&self) -> SessionId {
        let last = self
            .store
            .map
            .get(keyspace::META_LAST_SESSION)
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_be_bytes);
        SessionId(last + 1)
    }

    /// Open a session with the secret [`secret_of`] its id.
    fn open(&mut self) -> SessionId {
        match self
            .ok(LockCommand::OpenSession {
                ttl_ms: 10_000,
                secret: secret_of(self.next_session()),
                name: String::new(),
            })
            .0
        {
            LockOutcome::SessionOpened { session, .. } => session,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Acquire and expect a grant; returns the sequencer.
    fn grant(&mut self, command: LockCommand) -> Sequencer {
        match self.ok(command) {
            (LockOutcome::Granted { sequencer, .. }, _) => sequencer,
            (other, _) => panic!("expected a grant, got {other:?}"),
        }
    }

    fn ask(&self, q: LockQuery) -> LockOutcome {
        match query(&self.store, &Query::Lock(q)).expect("MemStore never fails") {
            Ok(Outcome::Lock(o)) => o,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn info(&self, name: &str) -> Option<LockInfo> {
        match self.ask(LockQuery::Locks {
            prefix: name.to_string(),
            start_after: None,
            limit: 0,
        }) {
            LockOutcome::Locks { locks, .. } => locks.into_iter().find(|l| l.name == name),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn holders(&self, name: &str) -> Vec<(SessionId, u64, LockMode, Token, u32)> {
        self.info(name)
            .map(|l| {
                l.holders
                    .iter()
                    .map(|h| (h.session, h.owner, h.mode, h.token, h.hold_count))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn current(&self, sequencer: &Sequencer) -> bool {
        match self.ask(LockQuery::CheckSequencer(sequencer.clone())) {
            LockOutcome::SequencerCheck { current } => current,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn timers(&self) -> TimerState {
        match self.ask(LockQuery::TimerState) {
            LockOutcome::Timers(t) => t,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn data(&self, key: &str) -> Option<Vec<u8>> {
        match query(
            &self.store,
            &Query::Get {
                key: key.as_bytes().to_vec(),
            },
        )
        .expect("MemStore never fails")
        {
            Ok(Outcome::Value { value, .. }) => value.map(|v| v.value),
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn acquire(
    session: SessionId,
    owner: u64,
    request_id: u64,
    name: &str,
    mode: LockMode,
    wait_ms: Option<u64>,
) -> LockCommand {
    acquire_with(session, owner, request_id, name, mode, wait_ms, None, None)
}

#[allow(clippy::too_many_arguments)]
fn acquire_with(
    session: SessionId,
    owner: u64,
    request_id: u64,
    name: &str,
    mode: LockMode,
    wait_ms: Option<u64>,
    lease_ms: Option<u64>,
    lock_delay_ms: Option<u64>,
) -> LockCommand {
    LockCommand::Acquire {
        session,
        secret: secret_of(session),
        owner,
        request_id,
        name: name.to_string(),
        mode,
        wait_ms,
        lease_ms,
        lock_delay_ms,
        value: Vec::new(),
        permits: None,
    }
}

fn release(
    session: SessionId,
    owner: u64,
    request_id: u64,
    name: &str,
    token: Token,
) -> LockCommand {
    LockCommand::Release {
        session,
        secret: secret_of(session),
        owner,
        request_id,
        name: name.to_string(),
        token,
    }
}

fn cancel(session: SessionId, owner: u64, name: &str, request_id: u64) -> LockCommand {
    LockCommand::CancelWait {
        session,
        secret: secret_of(session),
        owner,
        name: name.to_string(),
        request_id,
    }
}

fn fenced_put(sequencer: &Sequencer, key: &str, value: &str) -> LockCommand {
    LockCommand::Fenced {
        sequencer: sequencer.clone(),
        secret: secret_of(sequencer.session),
        conditions: vec![],
        ops: vec![BatchOp::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
        }],
    }
}

/// The grants reported by `events`: (session, owner, request id, token, waited).
fn grants(events: &[Event]) -> Vec<(SessionId, u64, u64, Token, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Granted {
                session,
                owner,
                request_id,
                token,
                waited,
                ..
            } => Some((*session, *owner, *request_id, *token, *waited)),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------- sessions

#[test]
fn sessions_are_numbered_from_one_and_never_reused() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    assert_eq!((a, b), (SessionId(1), SessionId(2)));
    c.ok(LockCommand::CloseSession {
        session: b,
        secret: secret_of(b),
    });
    assert_eq!(c.open(), SessionId(3));
    assert_eq!(
        c.ask(LockQuery::Session { session: a }),
        LockOutcome::Session(Some(SessionInfo {
            session: a,
            ttl_ms: 10_000,
            forced: ForcedReleases::default(),
        }))
    );
    assert_eq!(
        c.ask(LockQuery::Session { session: b }),
        LockOutcome::Session(None)
    );
}

#[test]
fn open_session_reports_an_event() {
    let mut c = Cluster::default();
    let (o, events) = c.ok(LockCommand::OpenSession {
        ttl_ms: 4_000,
        secret: secret_of(SessionId(1)),
        name: String::new(),
    });
    assert_eq!(
        o,
        LockOutcome::SessionOpened {
            session: SessionId(1),
            ttl_ms: 4_000,
            secret: secret_of(SessionId(1)),
        }
    );
    assert_eq!(
        events,
        vec![Event::SessionOpened {
            session: SessionId(1),
            ttl_ms: 4_000,
            secret: secret_of(SessionId(1)),
        }]
    );
}

#[test]
fn session_ttl_out_of_range_is_refused() {
    let mut c = Cluster::default();
    for ttl_ms in [
        0,
        1,
        MIN_SESSION_TTL_MS - 1,
        MAX_SESSION_TTL_MS + 1,
        u64::MAX,
    ] {
        assert_eq!(
            c.refused(LockCommand::OpenSession {
                ttl_ms,
                secret: SessionSecret::default(),
                name: String::new(),
            }),
            CommandError::TtlOutOfRange {
                ttl_ms,
                min: MIN_SESSION_TTL_MS,
                max: MAX_SESSION_TTL_MS
            }
        );
    }
    assert!(c.store.map.is_empty());
    for ttl_ms in [MIN_SESSION_TTL_MS, MAX_SESSION_TTL_MS] {
        c.ok(LockCommand::OpenSession {
            ttl_ms,
            secret: SessionSecret::default(),
            name: String::new(),
        });
    }
}

/// Only the client that opened a session (it alone has the secret) may
/// close it, acquire or release in it, cancel its waits or write fenced
/// with its grants. A refusal writes nothing; the leader's expiries need no
/// secret.
#[test]
fn a_session_is_used_only_with_its_secret() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let held = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    // Every command of a's carrying b's secret, and of b's carrying a's.
    let forged = [
        (
            a,
            LockCommand::CloseSession {
                session: a,
                secret: secret_of(b),
            },
        ),
        (
            a,
            LockCommand::Acquire {
                session: a,
                secret: secret_of(b),
                owner: 1,
                request_id: 2,
                name: "m".into(),
                mode: Exclusive,
                wait_ms: None,
                lease_ms: None,
                lock_delay_ms: None,
                value: Vec::new(),
                permits: None,
            },
        ),
        (
            a,
            LockCommand::Release {
                session: a,
                secret: secret_of(b),
                owner: 1,
                request_id: 3,
                name: "l".into(),
                token: held.token,
            },
        ),
        (
            a,
            LockCommand::Fenced {
                sequencer: held.clone(),
                secret: SessionSecret([0; 16]),
                conditions: vec![],
                ops: vec![BatchOp::Put {
                    key: b"k".to_vec(),
                    value: b"forged".to_vec(),
                }],
            },
        ),
        (
            b,
            LockCommand::CancelWait {
                session: b,
                secret: secret_of(a),
                owner: 1,
                name: "l".into(),
                request_id: 1,
            },
        ),
    ];
    for (session, command) in forged {
        assert_eq!(
            c.refused(command),
            CommandError::WrongSessionSecret { session }
        );
    }
    // Nothing moved: a holds, b waits, and their own secrets work.
    assert_eq!(c.holders("l"), vec![(a, 1, Exclusive, held.token, 1)]);
    assert_eq!(c.data("k"), None);
    assert!(c.run(fenced_put(&held, "k", "v")).0.is_ok());
    assert_eq!(c.data("k"), Some(b"v".to_vec()));
    // The leader's wait timeout carries no secret.
    let (o, events) = c.ok(LockCommand::ExpireWait {
        session: b,
        owner: 1,
        name: "l".into(),
        request_id: 1,
    });
    assert_eq!(o, LockOutcome::WaitCancel(WaitCancel::Cancelled));
    assert!(matches!(
        events.as_slice(),
        [Event::WaitCancelled {
            why: WaitEnd::Cancelled,
            ..
        }]
    ));
    c.ok(LockCommand::CloseSession {
        session: a,
        secret: secret_of(a),
    });
    // A session that is not live is refused as such, whatever the secret.
    assert_eq!(
        c.refused(LockCommand::CloseSession {
            session: a,
            secret: secret_of(b),
        }),
        CommandError::SessionEnded { session: a }
    );
    assert_eq!(
        c.refused(fenced_put(&held, "k", "late")),
        CommandError::StaleFence {
            name: "l".into(),
            token: held.token,
            current: None
        }
    );
}

#[test]
fn unknown_and_ended_sessions_are_refused_everywhere() {
    let mut c = Cluster::default();
    let live = c.open();
    let ended = c.open();
    c.ok(LockCommand::CloseSession {
        session: ended,
        secret: secret_of(ended),
    });
    let expired = c.open();
    c.ok(LockCommand::ExpireSession { session: expired });
    let seq = c.grant(acquire(live, 1, 1, "l", Exclusive, TRY));
    for (session, want) in [
        (
            SessionId(0),
            CommandError::UnknownSession {
                session: SessionId(0),
            },
        ),
        (
            SessionId(99),
            CommandError::UnknownSession {
                session: SessionId(99),
            },
        ),
        (ended, CommandError::SessionEnded { session: ended }),
        (expired, CommandError::SessionEnded { session: expired }),
    ] {
        let commands = [
            acquire(session, 1, 1, "l", Exclusive, WAIT),
            release(session, 1, 2, "l", seq.token),
            cancel(session, 1, "l", 1),
            LockCommand::CloseSession {
                session,
                secret: secret_of(session),
            },
            LockCommand::ExpireSession { session },
        ];
        for command in commands {
            assert_eq!(c.refused(command), want);
        }
    }
}

#[test]
fn ended_sessions_forget_everything() {
    let mut c = Cluster::default();
    let a = c.open();
    c.grant(acquire(a, 1, 1, "x", Exclusive, TRY));
    c.grant(acquire(a, 1, 2, "y", Shared, TRY));
    c.ok(LockCommand::CloseSession {
        session: a,
        secret: secret_of(a),
    });
    // Only counters and the clock remain.
    let rooms: Vec<u8> = c.store.map.keys().map(|k| k[0]).collect();
    assert!(
        rooms.iter().all(|&t| t == keyspace::META),
        "{:?}",
        c.store.map
    );
    assert!(c.timers().sessions.is_empty());
}

/// How many sessions the store counts as live.
fn live_sessions(c: &Cluster) -> u64 {
    c.store
        .map
        .get(keyspace::META_LIVE_SESSIONS)
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map_or(0, u64::from_be_bytes)
}

#[test]
fn live_sessions_are_counted_and_capped() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    assert_eq!(live_sessions(&c), 2);
    c.ok(LockCommand::CloseSession {
        session: a,
        secret: secret_of(a),
    });
    c.ok(LockCommand::ExpireSession { session: b });
    assert_eq!(live_sessions(&c), 0, "closing and expiring both count down");

    // At the limit (as if MAX_LIVE_SESSIONS sessions were open), opening
    // one more is refused and changes nothing, not even the id counter.
    c.store.map.insert(
        keyspace::META_LIVE_SESSIONS.to_vec(),
        (MAX_LIVE_SESSIONS - 1).to_be_bytes().to_vec(),
    );
    let last = c.open();
    assert_eq!(live_sessions(&c), MAX_LIVE_SESSIONS);
    let next = c.next_session();
    let refused = c.refused(LockCommand::OpenSession {
        ttl_ms: 10_000,
        secret: secret_of(next),
        name: String::new(),
    });
    assert_eq!(
        refused,
        CommandError::TooManySessions {
            max: MAX_LIVE_SESSIONS
        }
    );
    assert!(refused.to_string().contains("close sessions"), "{refused}");
    assert_eq!(c.next_session(), next, "no id was used");

    // A session that ends frees a place.
    c.ok(LockCommand::CloseSession {
        session: last,
        secret: secret_of(last),
    });
    assert_eq!(c.open(), next);

    // A state written before the count existed: its session records are
    // counted, so every replica arrives at the same number.
    let mut old = Cluster::default();
    old.open();
    let ending = old.open();
    old.store.map.remove(keyspace::META_LIVE_SESSIONS);
    old.ok(LockCommand::CloseSession {
        session: ending,
        secret: secret_of(ending),
    });
    assert_eq!(live_sessions(&old), 1, "counted with the ending session");
    old.store.map.remove(keyspace::META_LIVE_SESSIONS);
    old.open();
    assert_eq!(live_sessions(&old), 2, "counted, then the new one");
}

#[test]
fn close_session_releases_everything_without_lock_delay() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let held = c.grant(acquire_with(
        a,
        1,
        1,
        "x",
        Exclusive,
        TRY,
        None,
        Some(30_000),
    ));
    c.grant(acquire(a, 2, 1_000, "s", Shared, TRY));
    c.ok(acquire(a, 3, 2_000, "busy", Exclusive, TRY));
    c.ok(acquire(b, 1, 1, "busy", Exclusive, WAIT));
    c.ok(acquire(a, 1, 2, "busy", Exclusive, WAIT)); // owner 1 also waits
    let (b_waits, _) = c.ok(acquire(b, 1, 2, "x", Exclusive, WAIT));
    assert!(matches!(b_waits, LockOutcome::Queued { position: 0, .. }));

    let (o, events) = c.ok(LockCommand::CloseSession {
        session: a,
        secret: secret_of(a),
    });
    assert_eq!(
        o,
        LockOutcome::SessionEnded {
            session: a,
            released: 3,
            cancelled: 1
        }
    );
    // Every hold and wait of the session goes first (locks in name order:
    // busy, s, x), then the queues move on, then freed locks are reported.
    assert_eq!(
        events,
        vec![
            Event::Released {
                session: a,
                owner: 3,
                name: "busy".into(),
                token: Token(3),
                why: HoldEnd::SessionEnded(SessionEnd::Closed)
            },
            Event::WaitCancelled {
                session: a,
                owner: 1,
                request_id: 2,
                name: "busy".into(),
                why: WaitEnd::SessionEnded(SessionEnd::Closed)
            },
            Event::Released {
                session: a,
                owner: 2,
                name: "s".into(),
                token: Token(2),
                why: HoldEnd::SessionEnded(SessionEnd::Closed)
            },
            Event::Released {
                session: a,
                owner: 1,
                name: "x".into(),
                token: held.token,
                why: HoldEnd::SessionEnded(SessionEnd::Closed)
            },
            Event::Granted {
                session: b,
                owner: 1,
                request_id: 1,
                name: "busy".into(),
                mode: Exclusive,
                token: Token(4),
                lease_ms: None,
                waited: true
            },
            Event::Granted {
                session: b,
                owner: 1,
                request_id: 2,
                name: "x".into(),
                mode: Exclusive,
                token: Token(5),
                lease_ms: None,
                waited: true
            },
            Event::LockFreed { name: "s".into() },
            Event::SessionEnded {
                session: a,
                how: SessionEnd::Closed
            },
        ]
    );
    assert!(!c.current(&held));
    assert!(
        c.timers().lock_delays.is_empty(),
        "close sets no lock-delay"
    );
}

#[test]
fn expire_session_applies_lock_delay() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let held = c.grant(acquire_with(
        a,
        1,
        1,
        "x",
        Exclusive,
        TRY,
        None,
        Some(30_000),
    ));
    c.grant(acquire(a, 1, 2, "plain", Exclusive, TRY));
    c.ok(acquire(b, 1, 1, "plain", Exclusive, WAIT));

    let (_, events) = c.ok(LockCommand::ExpireSession { session: a });
    assert!(events.contains(&Event::LockDelayStarted {
        name: "x".into(),
        token: held.token,
        delay_ms: 30_000
    }));
    // Without a lock-delay the queue moves on at once.
    assert_eq!(grants(&events), vec![(b, 1, 1, Token(3), true)]);
    assert_eq!(
        events.last(),
        Some(&Event::SessionEnded {
            session: a,
            how: SessionEnd::Expired
        })
    );

    // In lock-delay: nobody holds it, yet it is unavailable.
    let info = c.info("x").expect("the lock is in lock-delay");
    assert!(info.holders.is_empty());
    assert_eq!(
        info.lock_delay,
        Some(LockDelayTimer {
            name: "x".into(),
            token: held.token,
            delay_ms: 30_000
        })
    );
    match c.refused(acquire(b, 2, 2, "x", Shared, TRY)) {
        CommandError::Busy {
            holder: None,
            holders: 0,
            lock_delay: true,
            ..
        } => {}
        other => panic!("unexpected {other:?}"),
    }
    c.ok(acquire(b, 2, 3, "x", Shared, WAIT));
    c.ok(acquire(b, 3, 4, "x", Shared, WAIT));
    assert_eq!(c.timers().lock_delays.len(), 1);

    // A stale guard does nothing; the right one lets the queue move on.
    let (o, events) = c.ok(LockCommand::EndLockDelay {
        name: "x".into(),
        token: Token(held.token.0 + 100),
    });
    assert_eq!(o, LockOutcome::LockDelayEnded { ended: false });
    assert!(events.is_empty());
    let (o, events) = c.ok(LockCommand::EndLockDelay {
        name: "x".into(),
        token: held.token,
    });
    assert_eq!(o, LockOutcome::LockDelayEnded { ended: true });
    assert_eq!(
        grants(&events),
        vec![(b, 2, 3, Token(4), true), (b, 3, 4, Token(5), true)]
    );
    assert!(c.timers().lock_delays.is_empty());
}

#[test]
fn lock_delay_ends_with_a_free_lock() {
    let mut c = Cluster::default();
    let a = c.open();
    let seq = c.grant(acquire_with(
        a,
        1,
        1,
        "x",
        Exclusive,
        TRY,
        None,
        Some(1_000),
    ));
    c.ok(LockCommand::ExpireSession { session: a });
    let (_, events) = c.ok(LockCommand::EndLockDelay {
        name: "x".into(),
        token: seq.token,
    });
    assert_eq!(
        events,
        vec![
            Event::LockDelayEnded {
                name: "x".into(),
                token: seq.token
            },
            Event::LockFreed { name: "x".into() }
        ]
    );
    assert_eq!(c.info("x"), None);
}

// ---------------------------------------------------------------- bad input

#[test]
fn bad_lock_names_are_refused() {
    let mut c = Cluster::default();
    let a = c.open();
    let long = "n".repeat(MAX_LOCK_NAME_LEN + 1);
    // 128 two-byte characters are 256 bytes; one more is over.
    let long_utf8 = "é".repeat(MAX_LOCK_NAME_LEN / 2 + 1);
    for name in ["", long.as_str(), long_utf8.as_str()] {
        let want = CommandError::InvalidLockName {
            len: name.len(),
            max: MAX_LOCK_NAME_LEN,
        };
        assert_eq!(c.refused(acquire(a, 1, 1, name, Exclusive, TRY)), want);
        assert_eq!(c.refused(release(a, 1, 1, name, Token(1))), want);
        assert_eq!(c.refused(cancel(a, 1, name, 1)), want);
        assert_eq!(
            c.refused(LockCommand::ExpireLockLease {
                name: name.into(),
                token: Token(1)
            }),
            want
        );
        assert_eq!(
            c.refused(LockCommand::EndLockDelay {
                name: name.into(),
                token: Token(1)
            }),
            want
        );
    }
    let longest = "é".repeat(MAX_LOCK_NAME_LEN / 2);
    c.grant(acquire(a, 1, 1, &longest, Exclusive, TRY));
    c.grant(acquire(a, 1, 2, "a/b c\u{0}\u{1F512}", Exclusive, TRY));
}

#[test]
fn durations_out_of_range_are_refused() {
    let mut c = Cluster::default();
    let a = c.open();
    let cases = [
        (TimerKind::Wait, 0, MIN_LOCK_WAIT_MS, MAX_LOCK_WAIT_MS),
        (
            TimerKind::Wait,
            MAX_LOCK_WAIT_MS + 1,
            MIN_LOCK_WAIT_MS,
            MAX_LOCK_WAIT_MS,
        ),
        (TimerKind::Lease, 0, MIN_LOCK_LEASE_MS, MAX_LOCK_LEASE_MS),
        (
            TimerKind::Lease,
            MIN_LOCK_LEASE_MS - 1,
            MIN_LOCK_LEASE_MS,
            MAX_LOCK_LEASE_MS,
        ),
        (
            TimerKind::Lease,
            u64::MAX,
            MIN_LOCK_LEASE_MS,
            MAX_LOCK_LEASE_MS,
        ),
        (
            TimerKind::LockDelay,
            0,
            MIN_LOCK_DELAY_MS,
            MAX_LOCK_DELAY_MS,
        ),
        (
            TimerKind::LockDelay,
            MAX_LOCK_DELAY_MS + 1,
            MIN_LOCK_DELAY_MS,
            MAX_LOCK_DELAY_MS,
        ),
    ];
    for (what, value, min, max) in cases {
        let (mut wait, mut lease, mut delay) = (None, None, None);
        match what {
            TimerKind::Wait => wait = Some(value),
            TimerKind::Lease => lease = Some(value),
            TimerKind::LockDelay => delay = Some(value),
        }
        assert_eq!(
            c.refused(acquire_with(a, 1, 1, "l", Exclusive, wait, lease, delay)),
            CommandError::DurationOutOfRange {
                what,
                value,
                min,
                max
            }
        );
    }
    // The bounds themselves are fine.
    c.grant(acquire_with(
        a,
        1,
        1,
        "l",
        Exclusive,
        Some(MAX_LOCK_WAIT_MS),
        Some(MIN_LOCK_LEASE_MS),
        Some(MAX_LOCK_DELAY_MS),
    ));
}

#[test]
fn token_zero_is_refused() {
    let mut c = Cluster::default();
    let a = c.open();
    c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    for command in [
        release(a, 1, 2, "l", Token(0)),
        LockCommand::ExpireLockLease {
            name: "l".into(),
            token: Token(0),
        },
        LockCommand::EndLockDelay {
            name: "l".into(),
            token: Token(0),
        },
        fenced_put(
            &Sequencer {
                name: "l".into(),
                mode: Exclusive,
                token: Token(0),
                session: a,
            },
            "k",
            "v",
        ),
    ] {
        assert!(matches!(
            c.refused(command),
            CommandError::InvalidArgument(_)
        ));
    }
}

#[test]
fn validation_agrees_with_apply() {
    let a = SessionId(1);
    let valid = acquire(a, 1, 1, "l", Exclusive, WAIT);
    assert!(validate_command(&Command::Lock(valid)).is_ok());
    assert_eq!(
        validate_command(&Command::Lock(acquire(a, 1, 1, "", Exclusive, WAIT))),
        Err(CommandError::InvalidLockName {
            len: 0,
            max: MAX_LOCK_NAME_LEN
        })
    );
    assert!(matches!(
        validate_command(&Command::Lock(LockCommand::OpenSession {
            ttl_ms: 0,
            secret: SessionSecret::default(),
            name: String::new(),
        })),
        Err(CommandError::TtlOutOfRange { .. })
    ));
    // Validation knows nothing of state: an unknown session passes it.
    assert!(validate_command(&Command::Lock(LockCommand::CloseSession {
        session: SessionId(9),
        secret: secret_of(SessionId(9)),
    }))
    .is_ok());
    // Fenced writes follow the batch limits.
    let too_many = LockCommand::Fenced {
        sequencer: Sequencer {
            name: "l".into(),
            mode: Exclusive,
            token: Token(1),
            session: a,
        },
        secret: secret_of(a),
        conditions: vec![],
        ops: vec![BatchOp::Delete { key: b"k".to_vec() }; MAX_BATCH_OPS + 1],
    };
    assert!(matches!(
        validate_command(&Command::Lock(too_many)),
        Err(CommandError::InvalidArgument(_))
    ));
}

#[test]
fn bad_lock_queries_are_refused() {
    let c = Cluster::default();
    let refused = |q: LockQuery| query(&c.store, &Query::Lock(q)).expect("MemStore never fails");
    assert!(matches!(
        refused(LockQuery::Locks {
            prefix: String::new(),
            start_after: None,
            limit: MAX_LOCK_LIST_LIMIT + 1
        }),
        Err(CommandError::InvalidArgument(_))
    ));
    assert!(matches!(
        refused(LockQuery::Locks {
            prefix: "p".repeat(MAX_LOCK_NAME_LEN + 1),
            start_after: None,
            limit: 0
        }),
        Err(CommandError::InvalidLockName { .. })
    ));
    assert!(matches!(
        refused(LockQuery::CheckSequencer(Sequencer {
            name: String::new(),
            mode: Shared,
            token: Token(1),
            session: SessionId(1)
        })),
        Err(CommandError::InvalidLockName { .. })
    ));
}

// ---------------------------------------------------------------- acquire

#[test]
fn a_free_lock_is_granted_with_the_next_token() {
    let mut c = Cluster::default();
    let a = c.open();
    let (o, events) = c.ok(acquire_with(
        a,
        7,
        1,
        "l",
        Exclusive,
        TRY,
        Some(2_000),
        None,
    ));
    let seq = Sequencer {
        name: "l".into(),
        mode: Exclusive,
        token: Token(1),
        session: a,
    };
    assert_eq!(
        o,
        LockOutcome::Granted {
            sequencer: seq.clone(),
            hold_count: 1
        }
    );
    assert_eq!(
        events,
        vec![Event::Granted {
            session: a,
            owner: 7,
            request_id: 1,
            name: "l".into(),
            mode: Exclusive,
            token: Token(1),
            lease_ms: Some(2_000),
            waited: false
        }]
    );
    assert!(c.current(&seq));
    assert_eq!(
        c.store.map.get(META_LAST_TOKEN),
        Some(&1u64.to_be_bytes().to_vec())
    );
}

#[test]
fn tokens_increase_over_every_grant_and_are_never_reused() {
    let mut c = Cluster::default();
    let a = c.open();
    let mut last = Token(0);
    for i in 0..20u64 {
        let name = format!("l{}", i % 3);
        let mode = if i % 2 == 0 { Exclusive } else { Shared };
        let seq = c.grant(acquire(a, i, 2 * i, &name, mode, TRY));
        assert!(seq.token > last, "{seq:?} after {last:?}");
        last = seq.token;
        c.ok(release(a, i, 2 * i + 1, &name, seq.token));
    }
    assert_eq!(last, Token(20));
}

#[test]
fn reentrant_acquire_counts_holds_with_the_same_token() {
    let mut c = Cluster::default();
    let a = c.open();
    let first = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    let (o, events) = c.ok(acquire(a, 1, 2, "l", Exclusive, TRY));
    assert_eq!(
        o,
        LockOutcome::Granted {
            sequencer: first.clone(),
            hold_count: 2
        }
    );
    assert!(events.is_empty(), "a re-entrant acquire is not a new grant");
    c.ok(acquire(a, 1, 3, "l", Exclusive, WAIT));
    assert_eq!(c.holders("l"), vec![(a, 1, Exclusive, first.token, 3)]);

    for (rid, remaining) in [(4, 2), (5, 1)] {
        let (o, events) = c.ok(release(a, 1, rid, "l", first.token));
        assert_eq!(
            o,
            LockOutcome::Released {
                name: "l".into(),
                token: first.token,
                remaining
            }
        );
        assert!(events.is_empty());
        assert!(c.current(&first));
    }
    let (_, events) = c.ok(release(a, 1, 6, "l", first.token));
    assert_eq!(
        events,
        vec![
            Event::Released {
                session: a,
                owner: 1,
                name: "l".into(),
                token: first.token,
                why: HoldEnd::Released
            },
            Event::LockFreed { name: "l".into() }
        ]
    );
    assert!(!c.current(&first));
    assert_eq!(c.info("l"), None);
}

#[test]
fn reentrant_acquire_does_not_wait_behind_the_queue() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let s = c.grant(acquire(a, 1, 1, "l", Shared, TRY));
    c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    // A new shared request may not overtake the exclusive waiter...
    assert!(matches!(
        c.refused(acquire(a, 2, 2, "l", Shared, TRY)),
        CommandError::Busy { .. }
    ));
    // ...but the shared holder re-enters.
    let (o, _) = c.ok(acquire(a, 1, 3, "l", Shared, TRY));
    assert_eq!(
        o,
        LockOutcome::Granted {
            sequencer: s,
            hold_count: 2
        }
    );
}

#[test]
fn owners_of_one_session_are_distinct_parties() {
    let mut c = Cluster::default();
    let a = c.open();
    c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    match c.refused(acquire(a, 2, 2, "l", Exclusive, TRY)) {
        CommandError::Busy {
            name,
            holder: Some(h),
            holders: 1,
            waiters: 0,
            lock_delay: false,
        } => {
            assert_eq!(name, "l");
            assert_eq!(
                (h.session, h.owner, h.mode, h.token, h.hold_count),
                (a, 1, Exclusive, Token(1), 1)
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn shared_holders_each_get_their_own_token() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let s1 = c.grant(acquire(a, 1, 1, "l", Shared, TRY));
    let s2 = c.grant(acquire(b, 1, 1, "l", Shared, TRY));
    let s3 = c.grant(acquire(a, 2, 2, "l", Shared, TRY));
    assert_eq!(
        (s1.token, s2.token, s3.token),
        (Token(1), Token(2), Token(3))
    );
    for s in [&s1, &s2, &s3] {
        assert!(c.current(s));
    }
    // A sequencer only matches its own grant: same token, other session or mode.
    assert!(!c.current(&Sequencer {
        session: b,
        ..s1.clone()
    }));
    assert!(!c.current(&Sequencer {
        mode: Exclusive,
        ..s1.clone()
    }));
    assert_eq!(c.info("l").map(|l| l.mode), Some(Some(Shared)));
}

#[test]
fn upgrade_and_downgrade_are_refused() {
    let mut c = Cluster::default();
    let a = c.open();
    c.grant(acquire(a, 1, 1, "s", Shared, TRY));
    assert_eq!(
        c.refused(acquire(a, 1, 2, "s", Exclusive, WAIT)),
        CommandError::UpgradeNotAllowed { name: "s".into() }
    );
    c.grant(acquire(a, 1, 3, "x", Exclusive, TRY));
    assert_eq!(
        c.refused(acquire(a, 1, 4, "x", Shared, WAIT)),
        CommandError::DowngradeNotAllowed { name: "x".into() }
    );
}

#[test]
fn busy_without_wait_reports_the_holder() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    c.grant(acquire_with(
        a,
        1,
        1,
        "l",
        Exclusive,
        TRY,
        Some(5_000),
        None,
    ));
    c.ok(acquire(b, 2, 1, "l", Shared, WAIT));
    let err = c.refused(acquire(b, 1, 2, "l", Shared, TRY));
    match &err {
        CommandError::Busy {
            holder: Some(h),
            holders: 1,
            waiters: 1,
            lock_delay: false,
            ..
        } => {
            assert_eq!((h.session, h.owner, h.lease_ms), (a, 1, Some(5_000)));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "lock \"l\" is busy: held exclusive by session 1 owner 1 (token 1), 1 waiting"
    );
}

#[test]
fn an_owner_waits_for_one_grant_at_a_time() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    assert_eq!(
        c.refused(acquire(b, 1, 2, "l", Exclusive, WAIT)),
        CommandError::AlreadyWaiting {
            name: "l".into(),
            request_id: 1
        }
    );
}

#[test]
fn a_full_queue_refuses_more_waiters() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    c.grant(acquire(a, 0, 0, "l", Exclusive, TRY));
    for owner in 0..MAX_LOCK_WAITERS as u64 {
        // Ids below the memory's bound are forgotten as we go: fine.
        c.ok(acquire(b, owner, owner, "l", Exclusive, WAIT));
    }
    assert_eq!(
        c.refused(acquire(a, 1, 1, "l", Exclusive, WAIT)),
        CommandError::QueueFull {
            name: "l".into(),
            max: MAX_LOCK_WAITERS as u32
        }
    );
    // Trying once is still a plain Busy.
    assert!(matches!(
        c.refused(acquire(a, 1, 1, "l", Exclusive, TRY)),
        CommandError::Busy { .. }
    ));
}

// ---------------------------------------------------------------- FIFO

#[test]
fn waiters_are_granted_in_fifo_order_and_shared_runs_together() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let x = c.grant(acquire(a, 0, 100, "l", Exclusive, TRY));
    let queue = [
        (b, 1, 1, Exclusive),
        (b, 2, 2, Shared),
        (a, 3, 3, Shared),
        (b, 4, 4, Exclusive),
        (a, 5, 5, Shared),
    ];
    for (i, (s, owner, rid, mode)) in queue.iter().enumerate() {
        let (o, events) = c.ok(acquire(*s, *owner, *rid, "l", *mode, WAIT));
        assert_eq!(
            o,
            LockOutcome::Queued {
                name: "l".into(),
                request_id: *rid,
                position: i as u32
            }
        );
        assert_eq!(
            events,
            vec![Event::Queued {
                session: *s,
                owner: *owner,
                request_id: *rid,
                name: "l".into(),
                mode: *mode,
                wait_ms: 5_000
            }]
        );
    }
    // Release: the exclusive head alone, in the same entry.
    let (_, events) = c.ok(release(a, 0, 101, "l", x.token));
    assert_eq!(grants(&events), vec![(b, 1, 1, Token(2), true)]);
    // Release it: the run of two shared waiters, not the one behind the exclusive.
    let (_, events) = c.ok(release(b, 1, 10, "l", Token(2)));
    assert_eq!(
        grants(&events),
        vec![(b, 2, 2, Token(3), true), (a, 3, 3, Token(4), true)]
    );
    let (_, events) = c.ok(release(b, 2, 11, "l", Token(3)));
    assert!(grants(&events).is_empty(), "one shared holder is left");
    let (_, events) = c.ok(release(a, 3, 12, "l", Token(4)));
    assert_eq!(grants(&events), vec![(b, 4, 4, Token(5), true)]);
    let (_, events) = c.ok(release(b, 4, 13, "l", Token(5)));
    assert_eq!(grants(&events), vec![(a, 5, 5, Token(6), true)]);
}

#[test]
fn a_queued_exclusive_blocks_later_shared_requests() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    c.grant(acquire(a, 1, 1, "l", Shared, TRY));
    c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    let (o, _) = c.ok(acquire(b, 2, 2, "l", Shared, WAIT));
    assert!(matches!(o, LockOutcome::Queued { position: 1, .. }));
    assert_eq!(c.holders("l").len(), 1);
}

#[test]
fn shared_holders_are_capped() {
    let mut c = Cluster::default();
    let a = c.open();
    for owner in 0..MAX_LOCK_HOLDERS as u64 {
        c.grant(acquire(a, owner, owner, "l", Shared, TRY));
    }
    let extra = MAX_LOCK_HOLDERS as u64;
    assert!(matches!(
        c.refused(acquire(a, extra, extra, "l", Shared, TRY)),
        CommandError::Busy { .. }
    ));
    c.ok(acquire(a, extra, extra, "l", Shared, WAIT));
    // A holder leaves: the waiter takes its place.
    let (_, events) = c.ok(release(a, 0, extra + 1, "l", Token(1)));
    assert_eq!(grants(&events).len(), 1);
}

// ---------------------------------------------------------------- release

#[test]
fn release_by_a_non_holder_is_refused() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let seq = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    let want = CommandError::NotHolder { name: "l".into() };
    // Another session, even with the right token.
    assert_eq!(c.refused(release(b, 1, 1, "l", seq.token)), want);
    // Another owner of the same session.
    assert_eq!(c.refused(release(a, 2, 2, "l", seq.token)), want);
    // A lock nobody holds.
    assert_eq!(
        c.refused(release(a, 1, 3, "free", seq.token)),
        CommandError::NotHolder {
            name: "free".into()
        }
    );
    // A waiter.
    c.ok(acquire(b, 1, 4, "l", Exclusive, WAIT));
    assert_eq!(c.refused(release(b, 1, 5, "l", seq.token)), want);
}

#[test]
fn release_with_an_old_token_is_refused() {
    let mut c = Cluster::default();
    let a = c.open();
    let old = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    c.ok(release(a, 1, 2, "l", old.token));
    let new = c.grant(acquire(a, 1, 3, "l", Exclusive, TRY));
    assert_eq!(
        c.refused(release(a, 1, 4, "l", old.token)),
        CommandError::StaleToken {
            name: "l".into(),
            token: old.token,
            current: new.token
        }
    );
    // After the old grant was force-released, its holder is simply not a holder.
    let lease = c.grant(acquire_with(
        a,
        1,
        5,
        "m",
        Exclusive,
        TRY,
        Some(1_000),
        None,
    ));
    c.ok(LockCommand::ExpireLockLease {
        name: "m".into(),
        token: lease.token,
    });
    assert_eq!(
        c.refused(release(a, 1, 6, "m", lease.token)),
        CommandError::NotHolder { name: "m".into() }
    );
}

// ---------------------------------------------------------------- waits

#[test]
fn cancel_wait_removes_the_waiter() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let x = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    c.ok(acquire(b, 2, 2, "l", Exclusive, WAIT));
    let (o, events) = c.ok(cancel(b, 1, "l", 1));
    assert_eq!(o, LockOutcome::WaitCancel(WaitCancel::Cancelled));
    assert_eq!(
        events,
        vec![Event::WaitCancelled {
            session: b,
            owner: 1,
            request_id: 1,
            name: "l".into(),
            why: WaitEnd::Cancelled
        }]
    );
    // Cancelling again is harmless and says so.
    let (o, events) = c.ok(cancel(b, 1, "l", 1));
    assert_eq!(o, LockOutcome::WaitCancel(WaitCancel::Cancelled));
    assert!(events.is_empty());
    // A retry of the cancelled acquire does not re-queue it.
    assert_eq!(
        c.refused(acquire(b, 1, 1, "l", Exclusive, WAIT)),
        CommandError::WaitCancelled {
            name: "l".into(),
            request_id: 1
        }
    );
    // The lock goes to the next waiter.
    let (_, events) = c.ok(release(a, 1, 2, "l", x.token));
    assert_eq!(grants(&events), vec![(b, 2, 2, Token(2), true)]);
    assert_eq!(c.timers().waits, Vec::<WaitTimer>::new(), "no wait is left");
}

#[test]
fn cancel_after_grant_keeps_the_grant() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let x = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    c.ok(acquire(b, 1, 7, "l", Exclusive, WAIT));
    c.ok(release(a, 1, 2, "l", x.token));
    let granted = Sequencer {
        name: "l".into(),
        mode: Exclusive,
        token: Token(2),
        session: b,
    };
    let (o, events) = c.ok(cancel(b, 1, "l", 7));
    assert_eq!(
        o,
        LockOutcome::WaitCancel(WaitCancel::AlreadyGranted(granted.clone()))
    );
    assert!(events.is_empty());
    assert!(c.current(&granted));
}

#[test]
fn cancel_of_no_such_wait_is_a_no_op() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    let before = c.store.map.clone();
    for command in [
        cancel(b, 2, "l", 1),     // another owner
        cancel(b, 1, "other", 1), // another lock
        cancel(b, 1, "l", 9),     // another request
    ] {
        let (o, events) = c.ok(command);
        assert_eq!(o, LockOutcome::WaitCancel(WaitCancel::NotWaiting));
        assert!(events.is_empty());
    }
    let changed: Vec<_> = c
        .store
        .map
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(changed, vec![META_NOW.to_vec()], "only the clock moved");
}

#[test]
fn cancel_of_an_acquire_granted_at_once_reports_the_grant() {
    let mut c = Cluster::default();
    let a = c.open();
    let seq = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    let (o, _) = c.ok(cancel(a, 1, "l", 1));
    assert_eq!(
        o,
        LockOutcome::WaitCancel(WaitCancel::AlreadyGranted(seq.clone()))
    );
    assert!(c.current(&seq), "a cancel never releases");
}

#[test]
fn cancelling_the_head_lets_shared_waiters_join() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    c.grant(acquire(a, 1, 1, "l", Shared, TRY));
    c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    c.ok(acquire(b, 2, 2, "l", Shared, WAIT));
    c.ok(acquire(b, 3, 3, "l", Shared, WAIT));
    let (_, events) = c.ok(cancel(b, 1, "l", 1));
    assert_eq!(
        grants(&events),
        vec![(b, 2, 2, Token(2), true), (b, 3, 3, Token(3), true)]
    );
}

// ---------------------------------------------------------------- leases

#[test]
fn lease_expiry_releases_the_whole_grant_with_lock_delay() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let seq = c.grant(acquire_with(
        a,
        1,
        1,
        "l",
        Exclusive,
        TRY,
        Some(2_000),
        Some(500),
    ));
    c.ok(acquire(a, 1, 2, "l", Exclusive, TRY)); // hold count 2
    c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    assert_eq!(c.timers().leases.len(), 1);

    let (o, events) = c.ok(LockCommand::ExpireLockLease {
        name: "l".into(),
        token: seq.token,
    });
    assert_eq!(o, LockOutcome::LeaseExpired { released: true });
    assert_eq!(
        events,
        vec![
            Event::Released {
                session: a,
                owner: 1,
                name: "l".into(),
                token: seq.token,
                why: HoldEnd::LeaseExpired
            },
            Event::LockDelayStarted {
                name: "l".into(),
                token: seq.token,
                delay_ms: 500
            },
        ]
    );
    assert!(!c.current(&seq));
    // Late or repeated expiry is a no-op.
    let (o, events) = c.ok(LockCommand::ExpireLockLease {
        name: "l".into(),
        token: seq.token,
    });
    assert_eq!(o, LockOutcome::LeaseExpired { released: false });
    assert!(events.is_empty());
    let (_, events) = c.ok(LockCommand::EndLockDelay {
        name: "l".into(),
        token: seq.token,
    });
    assert_eq!(grants(&events), vec![(b, 1, 1, Token(2), true)]);
}

#[test]
fn lease_expiry_needs_a_lease() {
    let mut c = Cluster::default();
    let a = c.open();
    let seq = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    let (o, _) = c.ok(LockCommand::ExpireLockLease {
        name: "l".into(),
        token: seq.token,
    });
    assert_eq!(o, LockOutcome::LeaseExpired { released: false });
    assert!(c.current(&seq));
}

#[test]
fn forced_release_leaving_other_shared_holders_sets_no_delay() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let s1 = c.grant(acquire_with(
        a,
        1,
        1,
        "l",
        Shared,
        TRY,
        Some(1_000),
        Some(9_000),
    ));
    c.grant(acquire(b, 1, 1, "l", Shared, TRY));
    let (_, events) = c.ok(LockCommand::ExpireLockLease {
        name: "l".into(),
        token: s1.token,
    });
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(c.info("l").and_then(|l| l.lock_delay), None);
}

// ---------------------------------------------------------------- fencing

#[test]
fn fenced_write_applies_under_the_current_exclusive_holder() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let seq = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    // Sessions and grants raise no revision: the fenced write makes the
    // first.
    assert_eq!(
        c.run(fenced_put(&seq, "k", "v1")).0,
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 1,
        })
    );
    assert_eq!(c.data("k"), Some(b"v1".to_vec()));
    // A failed condition is still a fenced success that writes nothing (and
    // raises no revision).
    let guarded = LockCommand::Fenced {
        sequencer: seq.clone(),
        secret: secret_of(seq.session),
        conditions: vec![Condition::value_is("k", None)],
        ops: vec![BatchOp::Delete { key: b"k".to_vec() }],
    };
    assert_eq!(
        c.run(guarded).0,
        Ok(Outcome::Batch {
            failed_condition: Some(0),
            revision: 1,
        })
    );
    assert_eq!(c.data("k"), Some(b"v1".to_vec()));

    // The lock passes to b: a's sequencer is stale, b's is current.
    c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    c.ok(release(a, 1, 2, "l", seq.token));
    let seq_b = Sequencer {
        name: "l".into(),
        mode: Exclusive,
        token: Token(2),
        session: b,
    };
    assert_eq!(
        c.refused(fenced_put(&seq, "k", "stale")),
        CommandError::StaleFence {
            name: "l".into(),
            token: seq.token,
            current: Some(seq_b.token)
        }
    );
    assert_eq!(c.data("k"), Some(b"v1".to_vec()));
    assert_eq!(
        c.run(fenced_put(&seq_b, "k", "v2")).0,
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 2,
        })
    );
    // Right token, wrong session: stale.
    let forged = Sequencer {
        session: a,
        ..seq_b.clone()
    };
    assert!(matches!(
        c.refused(fenced_put(&forged, "k", "x")),
        CommandError::StaleFence { .. }
    ));
    // Ended session: stale, not unknown.
    c.ok(LockCommand::CloseSession {
        session: b,
        secret: secret_of(b),
    });
    assert_eq!(
        c.refused(fenced_put(&seq_b, "k", "x")),
        CommandError::StaleFence {
            name: "l".into(),
            token: seq_b.token,
            current: None
        }
    );
    assert_eq!(c.data("k"), Some(b"v2".to_vec()));
}

#[test]
fn fenced_write_needs_an_exclusive_sequencer() {
    let mut c = Cluster::default();
    let a = c.open();
    let seq = c.grant(acquire(a, 1, 1, "l", Shared, TRY));
    assert!(matches!(
        c.refused(fenced_put(&seq, "k", "v")),
        CommandError::InvalidArgument(_)
    ));
    // Claiming exclusive with a shared grant's token is stale.
    let claimed = Sequencer {
        mode: Exclusive,
        ..seq
    };
    assert!(matches!(
        c.refused(fenced_put(&claimed, "k", "v")),
        CommandError::StaleFence { current: None, .. }
    ));
}

/// A session that released a lock and took it again holds a new grant with
/// a higher token: a fenced write carrying that session's *first* sequencer
/// (same name, same session, older token) is stale and writes nothing. Here
/// only the token tells the two grants apart, so this is the case that
/// catches a weakened token comparison (in the worked example above the
/// stale sequencer comes from another session, which the session check
/// refuses on its own). A token *above* the current one is stale too: the
/// current holder's token is the only one accepted.
#[test]
fn fenced_write_with_the_same_sessions_older_token_is_stale() {
    let mut c = Cluster::default();
    let a = c.open();
    let first = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    assert_eq!(
        c.run(fenced_put(&first, "k", "v1")).0,
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 1,
        })
    );
    c.ok(release(a, 1, 2, "l", first.token));

    // The same owner of the same session takes the lock again.
    let second = c.grant(acquire(a, 1, 3, "l", Exclusive, TRY));
    assert_eq!(
        (&second.name, second.mode, second.session),
        (&first.name, first.mode, first.session)
    );
    assert!(second.token > first.token, "{second:?} after {first:?}");
    assert!(!c.current(&first));
    assert!(c.current(&second));

    // The first grant's sequencer: refused, for a put, a delete and a
    // conditional batch alike; `refused` checks that nothing was written.
    let stale = CommandError::StaleFence {
        name: "l".into(),
        token: first.token,
        current: Some(second.token),
    };
    assert_eq!(c.refused(fenced_put(&first, "k", "stale")), stale);
    assert_eq!(
        c.refused(LockCommand::Fenced {
            sequencer: first.clone(),
            secret: secret_of(first.session),
            conditions: vec![],
            ops: vec![BatchOp::Delete { key: b"k".to_vec() }],
        }),
        stale
    );
    assert_eq!(
        c.refused(LockCommand::Fenced {
            sequencer: first.clone(),
            secret: secret_of(first.session),
            conditions: vec![Condition::value_is("k", Some(b"v1".to_vec()))],
            ops: vec![BatchOp::Put {
                key: b"k2".to_vec(),
                value: b"stale".to_vec(),
            }],
        }),
        stale
    );
    assert_eq!(c.data("k"), Some(b"v1".to_vec()));
    assert_eq!(c.data("k2"), None);

    // A token above the current grant's (issued to nobody yet): stale.
    let ahead = Sequencer {
        token: Token(second.token.0 + 1),
        ..second.clone()
    };
    assert_eq!(
        c.refused(fenced_put(&ahead, "k", "ahead")),
        CommandError::StaleFence {
            name: "l".into(),
            token: ahead.token,
            current: Some(second.token),
        }
    );

    // The current grant writes; the stale ones raised no revision.
    assert_eq!(
        c.run(fenced_put(&second, "k", "v2")).0,
        Ok(Outcome::Batch {
            failed_condition: None,
            revision: 2,
        })
    );
    assert_eq!(c.data("k"), Some(b"v2".to_vec()));

    // Another owner of the same session is granted next: the second
    // grant's sequencer is stale in its turn.
    c.ok(release(a, 1, 4, "l", second.token));
    let third = c.grant(acquire(a, 2, 5, "l", Exclusive, TRY));
    assert!(third.token > second.token);
    assert_eq!(
        c.refused(fenced_put(&second, "k", "stale")),
        CommandError::StaleFence {
            name: "l".into(),
            token: second.token,
            current: Some(third.token),
        }
    );
    assert_eq!(c.data("k"), Some(b"v2".to_vec()));
}

// ---------------------------------------------------------------- retries

#[test]
fn a_retried_acquire_returns_the_first_outcome_and_never_grants_twice() {
    let mut c = Cluster::default();
    let a = c.open();
    let first = c.ok(acquire(a, 1, 1, "l", Exclusive, TRY)).0;
    let before = c.store.map.clone();
    let (again, events) = c.ok(acquire(a, 1, 1, "l", Exclusive, TRY));
    assert_eq!(again, first);
    assert!(events.is_empty());
    assert_eq!(c.holders("l")[0].4, 1, "the hold count did not move");
    let changed = c
        .store
        .map
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(v))
        .count();
    assert!(changed <= 1, "only the clock may move");
}

#[test]
fn a_retried_queued_acquire_returns_its_grant_once_granted() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let x = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    let queued = c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT)).0;
    assert_eq!(c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT)).0, queued);
    c.ok(release(a, 1, 2, "l", x.token));
    let (again, events) = c.ok(acquire(b, 1, 1, "l", Exclusive, WAIT));
    assert_eq!(
        again,
        LockOutcome::Granted {
            sequencer: Sequencer {
                name: "l".into(),
                mode: Exclusive,
                token: Token(2),
                session: b
            },
            hold_count: 1
        }
    );
    assert!(events.is_empty());
}

#[test]
fn a_retried_release_does_not_release_twice() {
    let mut c = Cluster::default();
    let a = c.open();
    let seq = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    c.ok(acquire(a, 1, 2, "l", Exclusive, TRY));
    let first = c.ok(release(a, 1, 3, "l", seq.token)).0;
    assert_eq!(c.ok(release(a, 1, 3, "l", seq.token)).0, first);
    assert_eq!(c.holders("l")[0].4, 1, "one hold is left");
}

#[test]
fn a_refused_request_is_judged_afresh_on_retry() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let x = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    assert!(matches!(
        c.refused(acquire(b, 1, 1, "l", Exclusive, TRY)),
        CommandError::Busy { .. }
    ));
    c.ok(release(a, 1, 2, "l", x.token));
    c.grant(acquire(b, 1, 1, "l", Exclusive, TRY));
}

#[test]
fn a_request_id_cannot_be_reused_for_another_request() {
    let mut c = Cluster::default();
    let a = c.open();
    let seq = c.grant(acquire(a, 1, 1, "l", Exclusive, TRY));
    for other in [
        acquire(a, 1, 1, "m", Exclusive, TRY),
        acquire(a, 2, 1, "l", Exclusive, TRY),
        acquire(a, 1, 1, "l", Exclusive, WAIT),
        release(a, 1, 1, "l", seq.token),
    ] {
        assert_eq!(
            c.refused(other),
            CommandError::RequestIdReused { request_id: 1 }
        );
    }
    // Request ids are per session.
    let b = c.open();
    c.ok(acquire(b, 1, 1, "m", Exclusive, TRY));
}

#[test]
fn request_memory_is_bounded_per_session() {
    let mut c = Cluster::default();
    let a = c.open();
    let n = u64::from(MAX_REMEMBERED_REQUESTS);
    let mut seqs = Vec::new();
    for rid in 0..n {
        seqs.push(c.grant(acquire(a, rid, rid, &format!("l{rid}"), Exclusive, TRY)));
    }
    // All remembered.
    assert_eq!(
        c.ok(acquire(a, 0, 0, "l0", Exclusive, TRY)).0,
        LockOutcome::Granted {
            sequencer: seqs[0].clone(),
            hold_count: 1
        }
    );
    // One more forgets the lowest id.
    c.grant(acquire(a, n, n, "last", Exclusive, TRY));
    assert_eq!(
        c.refused(acquire(a, 0, 0, "l0", Exclusive, TRY)),
        CommandError::RequestTooOld {
            request_id: 0,
            oldest: 1
        }
    );
    assert_eq!(
        c.ok(acquire(a, 1, 1, "l1", Exclusive, TRY)).0,
        LockOutcome::Granted {
            sequencer: seqs[1].clone(),
            hold_count: 1
        }
    );
    let remembered = c
        .store
        .map
        .keys()
        .filter(|k| k[0] == keyspace::REQUEST)
        .count();
    assert_eq!(remembered, MAX_REMEMBERED_REQUESTS as usize);
}

// ---------------------------------------------------------------- queries

#[test]
fn locks_are_listed_by_prefix_in_name_order() {
    let mut c = Cluster::default();
    let a = c.open();
    for (i, name) in ["b/2", "a/1", "b/1", "c", "b/3"].iter().enumerate() {
        c.grant(acquire(a, i as u64, i as u64, name, Exclusive, TRY));
    }
    let list = |prefix: &str, start_after: Option<&str>, limit: u32| match c.ask(LockQuery::Locks {
        prefix: prefix.into(),
        start_after: start_after.map(str::to_string),
        limit,
    }) {
        LockOutcome::Locks { locks, more } => {
            (locks.into_iter().map(|l| l.name).collect::<Vec<_>>(), more)
        }
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(list("", None, 0).0, ["a/1", "b/1", "b/2", "b/3", "c"]);
    assert_eq!(
        list("b/", None, 0),
        (vec!["b/1".into(), "b/2".into(), "b/3".into()], false)
    );
    assert_eq!(
        list("b/", None, 2),
        (vec!["b/1".into(), "b/2".into()], true)
    );
    assert_eq!(list("b/", Some("b/2"), 2), (vec!["b/3".into()], false));
    assert_eq!(list("b/", Some("a"), 1), (vec!["b/1".into()], true));
    assert_eq!(list("zz", None, 0), (vec![], false));
    // Lock queries never see user data or other rooms, and vice versa.
    let data = query(
        &c.store,
        &Query::Scan(latchkey_core::ScanRange::prefix(vec![], 0)),
    );
    assert_eq!(
        data,
        Ok(Ok(Outcome::Entries {
            entries: vec![],
            more: false,
            revision: 0,
        }))
    );
}

#[test]
fn timer_state_lists_every_countdown() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    c.grant(acquire_with(
        a,
        1,
        1,
        "leased",
        Exclusive,
        TRY,
        Some(7_000),
        None,
    ));
    c.ok(acquire_with(
        b,
        2,
        1,
        "leased",
        Exclusive,
        Some(900),
        None,
        None,
    ));
    let d = c.grant(acquire_with(
        a,
        1,
        2,
        "delayed",
        Exclusive,
        TRY,
        None,
        Some(400),
    ));
    c.ok(LockCommand::ExpireSession { session: a });
    let t = c.timers();
    assert_eq!(
        t.sessions,
        vec![SessionTimer {
            session: b,
            ttl_ms: 10_000,
            secret: secret_of(b),
            left_ms: 10_000,
            forced: ForcedReleases::default(),
        }]
    );
    // a's lease went with a; b was granted "leased" (no lease of its own).
    assert!(t.leases.is_empty());
    assert_eq!(
        t.lock_delays,
        vec![LockDelayTimer {
            name: "delayed".into(),
            token: d.token,
            delay_ms: 400
        }]
    );
    assert!(t.waits.is_empty());

    c.grant(acquire_with(b, 3, 2, "x", Shared, TRY, Some(1_500), None));
    c.ok(acquire_with(b, 4, 3, "x", Exclusive, Some(800), None, None));
    let t = c.timers();
    assert_eq!(t.leases.len(), 1);
    assert_eq!(
        (t.leases[0].name.as_str(), t.leases[0].lease_ms),
        ("x", 1_500)
    );
    assert_eq!(
        t.waits,
        vec![WaitTimer {
            session: b,
            owner: 4,
            name: "x".into(),
            request_id: 3,
            wait_ms: 800
        }]
    );
}

#[test]
fn session_query_of_unknown_session_is_none() {
    let c = Cluster::default();
    assert_eq!(
        c.ask(LockQuery::Session {
            session: SessionId(5)
        }),
        LockOutcome::Session(None)
    );
}

#[test]
fn an_operators_end_is_a_forced_end_and_needs_no_secret() {
    let mut c = Cluster::default();
    let a = c.open();
    let b = c.open();
    let held = c.grant(acquire_with(
        a,
        1,
        1,
        "x",
        Exclusive,
        TRY,
        None,
        Some(30_000),
    ));
    c.ok(acquire(b, 1, 1, "x", Exclusive, WAIT));
    // No lock-delay of its own on "y".
    let y = c.grant(acquire(a, 2, 2, "y", Exclusive, TRY));
    c.ok(acquire(b, 1, 2, "y", Exclusive, WAIT));

    let (outcome, events) = c.ok(LockCommand::EndSession { session: a });
    assert_eq!(
        outcome,
        LockOutcome::SessionEnded {
            session: a,
            released: 2,
            cancelled: 0
        }
    );
    // The holder's client may count itself a holder for up to its TTL
    // (10 s): every lock it held stays unavailable at least that long, and
    // longer if the grant asked for more; the waiter waits.
    assert!(events.contains(&Event::LockDelayStarted {
        name: "y".into(),
        token: y.token,
        delay_ms: 10_000
    }));
    assert!(events.contains(&Event::LockDelayStarted {
        name: "x".into(),
        token: held.token,
        delay_ms: 30_000
    }));
    assert!(grants(&events).is_empty());
    assert_eq!(
        events.last(),
        Some(&Event::SessionEnded {
            session: a,
            how: SessionEnd::Ended
        })
    );
    assert_eq!(
        c.ask(LockQuery::Session { session: a }),
        LockOutcome::Session(None)
    );
    // Ending it again, or a session never opened, is refused.
    assert_eq!(
        c.refused(LockCommand::EndSession { session: a }),
        CommandError::SessionEnded { session: a }
    );
    assert_eq!(
        c.refused(LockCommand::EndSession {
            session: SessionId(99)
        }),
        CommandError::UnknownSession {
            session: SessionId(99)
        }
    );
    assert_eq!(
        LockCommand::EndSession { session: b }.proposer(),
        Proposer::Client
    );
}

// ---------------------------------------------------------------- plumbing

#[test]
fn leader_only_commands_are_marked() {
    let a = SessionId(1);
    assert_eq!(
        LockCommand::ExpireSession { session: a }.proposer(),
        Proposer::Leader
    );
    assert_eq!(
        LockCommand::ExpireLockLease {
            name: "l".into(),
            token: Token(1)
        }
        .proposer(),
        Proposer::Leader
    );
    assert_eq!(
        LockCommand::EndLockDelay {
            name: "l".into(),
            token: Token(1)
        }
        .proposer(),
        Proposer::Leader
    );
    assert_eq!(cancel(a, 1, "l", 1).proposer(), Proposer::Client);
    assert_eq!(
        LockCommand::ExpireWait {
            session: a,
            owner: 1,
            name: "l".into(),
            request_id: 1
        }
        .proposer(),
        Proposer::Leader
    );
    assert_eq!(
        acquire(a, 1, 1, "l", Exclusive, TRY).proposer(),
        Proposer::Client
    );
}

#[test]
fn payload_len_counts_names_and_batch_bytes() {
    let a = SessionId(1);
    assert_eq!(
        Command::Lock(acquire(a, 1, 1, "lock", Exclusive, TRY)).payload_len(),
        4
    );
    assert_eq!(
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 5_000,
            secret: SessionSecret::default(),
            name: String::new(),
        })
        .payload_len(),
        0
    );
    let seq = Sequencer {
        name: "ab".into(),
        mode: Exclusive,
        token: Token(1),
        session: a,
    };
    assert_eq!(
        Command::Lock(fenced_put(&seq, "k", "vv")).payload_len(),
        2 + 1 + 2
    );
}

#[test]
fn lock_commands_move_the_clock_only_when_they_succeed() {
    let mut c = Cluster::default();
    let a = c.open();
    let clock = |c: &Cluster| c.store.map.get(META_NOW).cloned();
    let before = clock(&c);
    c.refused(acquire(SessionId(9), 1, 1, "l", Exclusive, TRY));
    assert_eq!(clock(&c), before);
    c.ok(acquire(a, 1, 1, "l", Exclusive, TRY));
    assert_eq!(clock(&c), Some(c.now.to_be_bytes().to_vec()));
}

#[test]
fn kv_commands_report_no_events() {
    let mut store = MemStore::default();
    let (result, events) = apply_with_events(
        &mut store,
        &Request {
            now: 1,
            command: Command::Put {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            },
        },
    )
    .expect("MemStore never fails");
    assert_eq!(result, Ok(Outcome::Written { revision: 1 }));
    assert!(events.is_empty());
}

#[test]
fn errors_read_well() {
    let cases = [
        (
            CommandError::UnknownSession { session: SessionId(4) },
            "unknown session 4: this cluster never issued it",
        ),
        (
            CommandError::StaleFence {
                name: "l".into(),
                token: Token(33),
                current: Some(Token(34)),
            },
            "stale fence on lock \"l\": token 33 is not the current exclusive holder (current token 34)",
        ),
        (
            CommandError::DurationOutOfRange {
                what: TimerKind::LockDelay,
                value: 0,
                min: 1,
                max: 60_000,
            },
            "lock-delay 0 ms is out of range: it must be 1 to 60000 ms",
        ),
        (
            CommandError::Busy {
                name: "l".into(),
                holder: None,
                holders: 0,
                waiters: 2,
                lock_delay: true,
            },
            "lock \"l\" is busy: not held, in lock-delay, 2 waiting",
        ),
    ];
    for (e, want) in cases {
        assert_eq!(e.to_string(), want);
    }
}

#[test]
fn a_queued_acquire_is_remembered_however_many_requests_follow() {
    let mut c = Cluster::default();
    let holder = c.open();
    let a = c.open();
    let held = c.grant(acquire(holder, 1, 1, "busy", Exclusive, TRY));
    // Request 1 of session `a` waits.
    let (queued, _) = c.ok(acquire(a, 1, 1, "busy", Exclusive, WAIT));
    assert!(matches!(queued, LockOutcome::Queued { .. }), "{queued:?}");
    // Far more requests than the session remembers, by another owner.
    let n = u64::from(MAX_REMEMBERED_REQUESTS) + 10;
    for i in 0..n {
        let rid = 2 + 2 * i;
        let s = c.grant(acquire(a, 2, rid, "other", Exclusive, TRY));
        c.ok(release(a, 2, rid + 1, "other", s.token));
    }
    // The wait is still found: a retry answers "still queued", not "too old".
    let (again, _) = c.ok(acquire(a, 1, 1, "busy", Exclusive, WAIT));
    assert!(matches!(again, LockOutcome::Queued { .. }), "{again:?}");
    // Once granted, a retry returns the grant, and a cancel finds it.
    c.ok(release(holder, 1, 2, "busy", held.token));
    let granted = match c.ok(acquire(a, 1, 1, "busy", Exclusive, WAIT)).0 {
        LockOutcome::Granted { sequencer, .. } => sequencer,
        other => panic!("expected the grant, got {other:?}"),
    };
    assert_eq!(
        c.ok(cancel(a, 1, "busy", 1)).0,
        LockOutcome::WaitCancel(WaitCancel::AlreadyGranted(granted))
    );
}

#[test]
fn many_queued_acquires_at_the_front_of_the_memory_are_all_kept() {
    // More queued waits than the eviction reads per round: the oldest
    // request that is not queued is found past all of them.
    let mut c = Cluster::default();
    let holder = c.open();
    let a = c.open();
    c.grant(acquire(holder, 1, 1, "busy", Exclusive, TRY));
    let waiting = 20u64;
    for owner in 1..=waiting {
        let (queued, _) = c.ok(acquire(a, owner, owner, "busy", Exclusive, WAIT));
        assert!(matches!(queued, LockOutcome::Queued { .. }), "{queued:?}");
    }
    let n = u64::from(MAX_REMEMBERED_REQUESTS) + 10;
    for i in 0..n {
        let rid = 1_000 + 2 * i;
        let s = c.grant(acquire(a, 999, rid, "other", Exclusive, TRY));
        c.ok(release(a, 999, rid + 1, "other", s.token));
    }
    for owner in 1..=waiting {
        let (again, _) = c.ok(acquire(a, owner, owner, "busy", Exclusive, WAIT));
        assert!(
            matches!(again, LockOutcome::Queued { .. }),
            "owner {owner}: {again:?}"
        );
    }
    // The early "other" requests were forgotten: a retry of the first is
    // refused as too old rather than answered.
    let first = acquire(a, 999, 1_000, "other", Exclusive, TRY);
    assert!(c.run(first).0.is_err());
}

use latchkey_core::Store as _;

/// The request ids `session` remembers, from the store itself.
fn remembered_ids(c: &Cluster, session: SessionId) -> Vec<u64> {
    let prefix = keyspace::requests_prefix(session.0);
    c.store
        .scan(
            std::ops::Bound::Included(prefix.as_slice()),
            std::ops::Bound::Unbounded,
            false,
            100_000,
        )
        .expect("MemStore never fails")
        .into_iter()
        .take_while(|(k, _)| k.starts_with(&prefix))
        .filter_map(|(k, _)| keyspace::read_u64(&k[prefix.len()..]))
        .collect()
}

#[test]
fn waits_granted_after_falling_behind_are_forgotten_first_in_id_order() {
    // Queued waits are kept while later requests are forgotten. Once they
    // are granted they are the oldest non-queued requests, so they go first,
    // lowest id first, and a retry of one is then too old.
    let mut c = Cluster::default();
    let holder = c.open();
    let a = c.open();
    let held = c.grant(acquire(holder, 1, 1, "busy", Exclusive, TRY));
    let waiting = 12u64;
    for owner in 1..=waiting {
        let (queued, _) = c.ok(acquire(a, owner, owner, "busy", Shared, WAIT));
        assert!(matches!(queued, LockOutcome::Queued { .. }), "{queued:?}");
    }
    let mut rid = 1_000u64;
    let mut cycle = |c: &mut Cluster| {
        let s = c.grant(acquire(a, 999, rid, "other", Exclusive, TRY));
        c.ok(release(a, 999, rid + 1, "other", s.token));
        rid += 2;
    };
    for _ in 0..MAX_REMEMBERED_REQUESTS + 40 {
        cycle(&mut c);
    }
    assert_eq!(
        remembered_ids(&c, a).len(),
        MAX_REMEMBERED_REQUESTS as usize
    );
    // Every shared waiter is granted by one release.
    c.ok(release(holder, 1, 2, "busy", held.token));
    for owner in 1..=waiting {
        let (again, _) = c.ok(acquire(a, owner, owner, "busy", Shared, WAIT));
        assert!(matches!(again, LockOutcome::Granted { .. }), "{again:?}");
    }
    // Each new request forgets the lowest granted wait.
    for forgotten in 1..=waiting {
        cycle(&mut c); // two requests: forgets two waits (one at the end)
        let gone = (2 * forgotten).min(waiting);
        let ids = remembered_ids(&c, a);
        for owner in 1..=waiting {
            assert_eq!(
                ids.contains(&owner),
                owner > gone,
                "after {forgotten} cycles, wait {owner}: {ids:?}"
            );
        }
        if gone == waiting {
            break;
        }
    }
    match c.run(acquire(a, 1, 1, "busy", Shared, WAIT)).0 {
        Err(CommandError::RequestTooOld { request_id: 1, .. }) => {}
        other => panic!("expected too old, got {other:?}"),
    }
    // After the waits, the oldest "other" request goes next.
    let oldest_other = *remembered_ids(&c, a).first().expect("remembers some");
    cycle(&mut c);
    assert!(!remembered_ids(&c, a).contains(&oldest_other));
}

#[test]
fn the_census_counts_sessions_locks_grants_waiters_and_delays() {
    let mut c = Cluster::default();
    let census = |c: &Cluster| match c.ask(LockQuery::Census) {
        LockOutcome::Census(census) => census,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(census(&c), LockCensus::default());
    let a = c.open();
    let b = c.open();
    let d = c.open();
    c.grant(acquire(a, 1, 1, "shared", Shared, TRY));
    c.grant(acquire(b, 1, 1, "shared", Shared, TRY));
    c.ok(acquire(d, 1, 1, "shared", Exclusive, WAIT));
    c.grant(acquire_with(
        a,
        1,
        2,
        "delayed",
        Exclusive,
        TRY,
        None,
        Some(30_000),
    ));
    c.ok(acquire(b, 1, 2, "delayed", Exclusive, WAIT));
    assert_eq!(
        census(&c),
        LockCensus {
            sessions: 3,
            locks: 2,
            held: 2,
            holds: 3,
            waiters: 2,
            delayed: 0,
        }
    );
    // `a` expires: "delayed" enters lock-delay with b still queued, and b
    // alone holds "shared" ahead of d's exclusive wait.
    c.ok(LockCommand::ExpireSession { session: a });
    assert_eq!(
        census(&c),
        LockCensus {
            sessions: 2,
            locks: 2,
            held: 1,
            holds: 1,
            waiters: 2,
            delayed: 1,
        }
    );
    c.ok(LockCommand::CloseSession {
        session: b,
        secret: secret_of(b),
    });
    c.ok(LockCommand::CloseSession {
        session: d,
        secret: secret_of(d),
    });
    // "delayed" stays in its lock-delay with nobody left.
    assert_eq!(
        census(&c),
        LockCensus {
            locks: 1,
            delayed: 1,
            ..LockCensus::default()
        }
    );
}
