//! An operator's tools: named sessions, the session list
//! (`LockQuery::Sessions`) and the forced release of a lock
//! (`LockCommand::ForceRelease`). Each rule of the lock module docs
//! (*An operator's forced release*) is asserted here: the grant ends with
//! a lock-delay of at least its session's TTL, the next grant takes a
//! higher token and the old holder's fenced writes are refused, the
//! holder's session lives on and reports the release to its keep-alives,
//! an election's leader is deposed and the next candidate leads, nothing
//! matching is no error, and bad input is refused with nothing written.

use latchkey_core::limits::{
    MAX_FORCED_REMEMBERED, MAX_SESSION_LIST_LIMIT, MAX_SESSION_NAME_BYTES,
};
use latchkey_core::lock::{
    election_lock_name, Event, ForcedReleases, HoldEnd, LockCommand, LockMode, LockOutcome,
    LockQuery, Sequencer, SessionId, SessionInfo, Token,
};
use latchkey_core::{query, validate_command, BatchOp, Command, CommandError, Outcome, Query};

mod state;
use state::{secret, Cluster};

const TTL_MS: u64 = 10_000;

impl Cluster {
    fn open_named(&mut self, id: u64, name: &str) -> SessionId {
        match self.succeed(LockCommand::OpenSession {
            ttl_ms: TTL_MS + id * 1_000,
            secret: secret(id),
            name: name.to_string(),
        }) {
            (LockOutcome::SessionOpened { session, .. }, _) => {
                assert_eq!(session, SessionId(id), "ids count up from 1");
                session
            }
            (other, _) => panic!("unexpected {other:?}"),
        }
    }

    fn acquire_command(&mut self, session: u64, name: &str, wait: bool) -> LockCommand {
        self.next_request += 1;
        LockCommand::Acquire {
            session: SessionId(session),
            secret: secret(session),
            owner: 1,
            request_id: self.next_request,
            name: name.to_string(),
            mode: LockMode::Exclusive,
            wait_ms: wait.then_some(60_000),
            lease_ms: None,
            lock_delay_ms: None,
            value: Vec::new(),
            permits: None,
        }
    }

    fn take(&mut self, session: u64, name: &str) -> Sequencer {
        let command = self.acquire_command(session, name, false);
        match self.succeed(command) {
            (LockOutcome::Granted { sequencer, .. }, _) => sequencer,
            (other, _) => panic!("unexpected {other:?}"),
        }
    }

    fn force(&mut self, name: &str, token: Token) -> (Vec<Token>, Vec<Event>) {
        match self.succeed(LockCommand::ForceRelease {
            name: name.to_string(),
            token,
        }) {
            (LockOutcome::ForceReleased { released }, events) => {
                (released.iter().map(|h| h.token).collect(), events)
            }
            (other, _) => panic!("unexpected {other:?}"),
        }
    }

    fn ask(&self, q: LockQuery) -> LockOutcome {
        match query(&self.store, &Query::Lock(q)).expect("MemStore never fails") {
            Ok(Outcome::Lock(o)) => o,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn forced(&self, session: u64) -> ForcedReleases {
        match self.ask(LockQuery::Session {
            session: SessionId(session),
        }) {
            LockOutcome::Session(Some(SessionInfo { forced, .. })) => forced,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn timer_forced(&self, session: u64) -> ForcedReleases {
        match self.ask(LockQuery::SessionTimer {
            session: SessionId(session),
        }) {
            LockOutcome::SessionTimer(Some(t)) => t.forced,
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_forced_release_ends_the_grant_with_a_lock_delay_and_the_next_token_is_higher() {
    let mut c = Cluster::new();
    c.open_named(1, "holder");
    c.open_named(2, "waiter");
    let held = c.take(1, "jobs");
    let wait = c.acquire_command(2, "jobs", true);
    assert!(matches!(c.succeed(wait), (LockOutcome::Queued { .. }, _)));

    let (released, events) = c.force("jobs", held.token);
    assert_eq!(released, vec![held.token]);
    assert_eq!(
        events,
        vec![
            Event::Released {
                session: SessionId(1),
                owner: 1,
                name: "jobs".into(),
                token: held.token,
                why: HoldEnd::Forced,
            },
            // At least the holder's TTL (11 s): its client counts itself a
            // holder until it hears.
            Event::LockDelayStarted {
                name: "jobs".into(),
                token: held.token,
                delay_ms: 11_000,
            },
        ]
    );
    // The waiter is granted only when the delay ends, under a higher token.
    let (ended, events) = c.succeed(LockCommand::EndLockDelay {
        name: "jobs".into(),
        token: held.token,
    });
    assert_eq!(ended, LockOutcome::LockDelayEnded { ended: true });
    let granted = events.iter().find_map(|e| match e {
        Event::Granted { session, token, .. } => Some((*session, *token)),
        _ => None,
    });
    assert_eq!(granted.map(|g| g.0), Some(SessionId(2)));
    assert!(granted.is_some_and(|g| g.1 > held.token));

    // The old holder's session lives on, and its fenced write is refused.
    assert!(matches!(
        c.ask(LockQuery::Session {
            session: SessionId(1)
        }),
        LockOutcome::Session(Some(_))
    ));
    let fenced = c.lock(LockCommand::Fenced {
        sequencer: held.clone(),
        secret: secret(1),
        conditions: Vec::new(),
        ops: vec![BatchOp::Put {
            key: b"out".to_vec(),
            value: b"stale".to_vec(),
        }],
    });
    assert!(
        matches!(fenced, Err(CommandError::StaleFence { .. })),
        "{fenced:?}"
    );
    // Its own release of the grant it lost is refused as not held.
    c.next_request += 1;
    let release = c.lock(LockCommand::Release {
        session: SessionId(1),
        secret: secret(1),
        owner: 1,
        request_id: c.next_request,
        name: "jobs".into(),
        token: held.token,
    });
    assert!(
        matches!(release, Err(CommandError::NotHolder { .. })),
        "{release:?}"
    );
}

#[test]
fn the_holders_session_reports_what_was_forced_to_its_keep_alives() {
    let mut c = Cluster::new();
    c.open_named(1, "holder");
    assert_eq!(c.forced(1), ForcedReleases::default());
    let a = c.take(1, "a");
    let b = c.take(1, "b");
    c.force("b", b.token);
    let expected = ForcedReleases {
        total: 1,
        recent: vec![b.token],
    };
    assert_eq!(c.forced(1), expected);
    // The leader's countdown state (what a new leader answers keep-alives
    // from) carries the same.
    assert_eq!(c.timer_forced(1), expected);
    // "a" is still held.
    let locks = match c.ask(LockQuery::Locks {
        prefix: String::new(),
        start_after: None,
        limit: 0,
    }) {
        LockOutcome::Locks { locks, .. } => locks,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(locks.len(), 2, "{locks:?}"); // "a" held, "b" in lock-delay
    assert_eq!(locks[0].holders[0].token, a.token);
    assert!(locks[1].holders.is_empty());
}

#[test]
fn a_session_remembers_only_its_latest_forced_tokens_but_counts_them_all() {
    let mut c = Cluster::new();
    c.open_named(1, "holder");
    let n = MAX_FORCED_REMEMBERED + 3;
    let mut tokens = Vec::new();
    for i in 0..n {
        let name = format!("l{i}");
        let s = c.take(1, &name);
        c.force(&name, s.token);
        tokens.push(s.token);
    }
    let forced = c.forced(1);
    assert_eq!(forced.total, n as u64);
    assert_eq!(forced.recent, tokens[3..].to_vec());
}

#[test]
fn a_forced_release_of_nothing_is_no_error_and_writes_nothing() {
    let mut c = Cluster::new();
    c.open_named(1, "holder");
    let held = c.take(1, "jobs");
    let before = c.store.clone();
    // A free lock, a token that is not a holder.
    let (none, events) = c.force("free", Token(1));
    assert!(none.is_empty() && events.is_empty());
    let (none, events) = c.force("jobs", Token(held.token.0 + 5));
    assert!(none.is_empty() && events.is_empty());
    let mut after = c.store.clone();
    // Only the leader time moved.
    after.map.remove(latchkey_core::keyspace::META_NOW);
    let mut before = before;
    before.map.remove(latchkey_core::keyspace::META_NOW);
    assert_eq!(after, before);
    // A resend of a release that worked finds nothing left.
    assert_eq!(c.force("jobs", held.token).0, vec![held.token]);
    assert!(c.force("jobs", held.token).0.is_empty());
    assert_eq!(c.forced(1).total, 1);
}

#[test]
fn a_forced_permit_is_not_granted_again_before_its_delay_ends() {
    let mut c = Cluster::new();
    let mut tokens = Vec::new();
    for id in 1..=3 {
        c.open_named(id, &format!("worker {id}"));
        c.next_request += 1;
        let (outcome, _) = c.succeed(LockCommand::Acquire {
            session: SessionId(id),
            secret: secret(id),
            owner: 1,
            request_id: c.next_request,
            name: "pool".into(),
            mode: LockMode::Shared,
            wait_ms: None,
            lease_ms: None,
            lock_delay_ms: None,
            value: Vec::new(),
            permits: Some(3),
        });
        let LockOutcome::Granted { sequencer, .. } = outcome else {
            panic!("unexpected {outcome:?}")
        };
        tokens.push(sequencer.token);
    }
    // One permit by token: the others keep theirs, but the lock-delay (the
    // holder's TTL, 12 s) starts anyway: a waiter must not take the freed
    // permit while its old holder may still believe it holds it.
    let (one, events) = c.force("pool", tokens[1]);
    assert_eq!(one, vec![tokens[1]]);
    assert!(events.contains(&Event::LockDelayStarted {
        name: "pool".into(),
        token: tokens[1],
        delay_ms: 12_000,
    }));
    c.open_named(4, "worker 4");
    c.next_request += 1;
    let (outcome, _) = c.succeed(LockCommand::Acquire {
        session: SessionId(4),
        secret: secret(4),
        owner: 1,
        request_id: c.next_request,
        name: "pool".into(),
        mode: LockMode::Shared,
        wait_ms: Some(60_000),
        lease_ms: None,
        lock_delay_ms: None,
        value: Vec::new(),
        permits: Some(3),
    });
    assert!(matches!(outcome, LockOutcome::Queued { .. }), "{outcome:?}");
    // A second forced permit keeps the delay at least as long, under the
    // newer token.
    let (two, events) = c.force("pool", tokens[2]);
    assert_eq!(two, vec![tokens[2]]);
    assert!(events.contains(&Event::LockDelayStarted {
        name: "pool".into(),
        token: tokens[2],
        delay_ms: 13_000,
    }));
    // The stale delay's end does nothing; the current one's grants.
    let (ended, _) = c.succeed(LockCommand::EndLockDelay {
        name: "pool".into(),
        token: tokens[1],
    });
    assert_eq!(ended, LockOutcome::LockDelayEnded { ended: false });
    let (ended, events) = c.succeed(LockCommand::EndLockDelay {
        name: "pool".into(),
        token: tokens[2],
    });
    assert_eq!(ended, LockOutcome::LockDelayEnded { ended: true });
    assert!(events.iter().any(|e| matches!(
        e,
        Event::Granted {
            session: SessionId(4),
            ..
        }
    )));
    assert_eq!(c.forced(2).recent, vec![tokens[1]]);
}

#[test]
fn forcing_an_elections_lock_deposes_its_leader_and_the_next_candidate_leads() {
    let mut c = Cluster::new();
    c.open_named(1, "scheduler-a");
    c.open_named(2, "scheduler-b");
    let lock = election_lock_name("scheduler");
    let campaign = |c: &mut Cluster, id: u64| {
        c.next_request += 1;
        LockCommand::Acquire {
            session: SessionId(id),
            secret: secret(id),
            owner: 1,
            request_id: c.next_request,
            name: lock.clone(),
            mode: LockMode::Exclusive,
            wait_ms: Some(60_000),
            lease_ms: None,
            lock_delay_ms: None,
            value: format!("node-{id}").into_bytes(),
            permits: None,
        }
    };
    let first = campaign(&mut c, 1);
    let LockOutcome::Granted {
        sequencer: term1, ..
    } = c.succeed(first).0
    else {
        panic!("the first candidate leads")
    };
    let second = campaign(&mut c, 2);
    assert!(matches!(c.succeed(second).0, LockOutcome::Queued { .. }));
    c.force(&lock, term1.token);
    c.succeed(LockCommand::EndLockDelay {
        name: lock.clone(),
        token: term1.token,
    });
    let holders = match c.ask(LockQuery::Locks {
        prefix: lock.clone(),
        start_after: None,
        limit: 0,
    }) {
        LockOutcome::Locks { locks, .. } => locks[0].holders.clone(),
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].session, SessionId(2));
    assert!(holders[0].token > term1.token, "a new, higher term");
}

#[test]
fn the_session_list_shows_names_holds_waits_and_keys_and_pages() {
    let mut c = Cluster::new();
    c.open_named(1, "api-7 (pid 4242)");
    c.open_named(2, "");
    c.open_named(3, "batch");
    let a = c.take(1, "a");
    let b = c.take(1, "b");
    let wait = c.acquire_command(2, "a", true);
    c.succeed(wait);
    c.run(Command::PutBound {
        key: b"members/1".to_vec(),
        value: b"up".to_vec(),
        session: SessionId(1),
        secret: secret(1),
    })
    .expect("bound put");
    c.force("b", b.token);

    let (sessions, more) = match c.ask(LockQuery::Sessions {
        start_after: None,
        limit: 2,
    }) {
        LockOutcome::Sessions { sessions, more } => (sessions, more),
        other => panic!("unexpected {other:?}"),
    };
    assert!(more);
    assert_eq!(sessions.len(), 2);
    let s1 = &sessions[0];
    assert_eq!(s1.session, SessionId(1));
    assert_eq!(s1.name, "api-7 (pid 4242)");
    assert_eq!(s1.ttl_ms, 11_000);
    assert_eq!(s1.holds, 1);
    assert_eq!(s1.held.len(), 1);
    assert_eq!(s1.held[0].name, "a");
    assert_eq!(s1.held[0].token, a.token);
    assert_eq!(s1.waits, 0);
    assert_eq!(s1.keys, 1);
    assert_eq!(s1.forced, 1);
    let s2 = &sessions[1];
    assert_eq!((s2.name.as_str(), s2.holds, s2.waits), ("", 0, 1));
    assert_eq!(s2.waiting, vec!["a".to_string()]);
    // The next page starts after the last one listed.
    let (rest, more) = match c.ask(LockQuery::Sessions {
        start_after: Some(SessionId(2)),
        limit: 0,
    }) {
        LockOutcome::Sessions { sessions, more } => (sessions, more),
        other => panic!("unexpected {other:?}"),
    };
    assert!(!more);
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].name, "batch");
}

#[test]
fn bad_names_tokens_and_limits_are_refused_with_nothing_written() {
    let mut c = Cluster::new();
    c.open_named(1, "fine");
    let too_long = LockCommand::OpenSession {
        ttl_ms: TTL_MS,
        secret: secret(2),
        name: "x".repeat(MAX_SESSION_NAME_BYTES + 1),
    };
    assert!(validate_command(&Command::Lock(too_long.clone())).is_err());
    assert!(matches!(
        c.refused(too_long),
        CommandError::InvalidArgument(_)
    ));
    let control = LockCommand::OpenSession {
        ttl_ms: TTL_MS,
        secret: secret(2),
        name: "evil\u{1b}[2J".into(),
    };
    assert!(matches!(
        c.refused(control),
        CommandError::InvalidArgument(_)
    ));
    // The longest name is fine.
    c.succeed(LockCommand::OpenSession {
        ttl_ms: TTL_MS,
        secret: secret(2),
        name: "é".repeat(MAX_SESSION_NAME_BYTES / 2),
    });
    assert!(c
        .refused(LockCommand::ForceRelease {
            name: "a".into(),
            token: Token(0),
        })
        .to_string()
        .contains("token"));
    assert!(matches!(
        c.refused(LockCommand::ForceRelease {
            name: String::new(),
            token: Token(1),
        }),
        CommandError::InvalidLockName { .. }
    ));
    let list = query(
        &c.store,
        &Query::Lock(LockQuery::Sessions {
            start_after: None,
            limit: MAX_SESSION_LIST_LIMIT + 1,
        }),
    )
    .expect("MemStore never fails");
    assert!(
        matches!(list, Err(CommandError::InvalidArgument(_))),
        "{list:?}"
    );
}
