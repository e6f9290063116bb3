//! Multi-locks (`LockCommand::AcquireAll` and `LockCommand::ReleaseAll`):
//! the rules of the core's `multi_lock.rs`, each asserted, and a property
//! test over random single and multi acquires, releases, cancels, session
//! expiries and lock-delays: a multi-lock is granted all of its locks in
//! one entry or none, an exclusive lock has one holder at most, every queue
//! is served in strict FIFO order, no waiter that could be granted is left
//! waiting (so every queue drains once the holders let go), and tokens only
//! grow.

use std::collections::BTreeMap;

use latchkey_core::limits::MAX_MULTI_LOCK_NAMES;
use latchkey_core::lock::{
    election_lock_name, HoldEnd, HolderInfo, LockCommand, LockInfo, LockMode, LockOutcome,
    LockQuery, Sequencer, SessionEnd, SessionId, Token, WaitCancel, WaitEnd,
};
use latchkey_core::{
    apply_with_events, query, Command, CommandError, Event, Outcome, Query, Request,
};
use proptest::prelude::*;

mod state;
use state::{secret, Cluster};

/// How long a waiting acquire may wait.
const WAIT_MS: u64 = 60_000;

/// A lock command's outcome or refusal.
type Answer = Result<LockOutcome, CommandError>;

impl Cluster {
    /// Open session `id` (ids count up from 1, so the caller knows it).
    fn open(&mut self, id: u64) -> SessionId {
        let opened = self.lock(LockCommand::OpenSession {
            ttl_ms: 10_000,
            secret: secret(id),
            name: String::new(),
        });
        match opened {
            Ok(LockOutcome::SessionOpened { session, .. }) if session == SessionId(id) => session,
            other => panic!("open {id}: {other:?}"),
        }
    }

    /// Apply a lock command at the next leader time: its answer and events.
    fn exec(&mut self, command: LockCommand) -> (Answer, Vec<Event>) {
        self.now += 1;
        let request = Request {
            now: self.now,
            command: Command::Lock(command),
        };
        let (result, events) =
            apply_with_events(&mut self.store, &request).expect("MemStore never fails");
        let answer = result.map(|outcome| match outcome {
            Outcome::Lock(o) => o,
            other => panic!("not a lock outcome: {other:?}"),
        });
        (answer, events)
    }

    /// Apply a command that must succeed; its outcome.
    fn ok(&mut self, command: LockCommand) -> LockOutcome {
        match self.exec(command) {
            (Ok(outcome), _) => outcome,
            (Err(e), _) => panic!("refused: {e:?}"),
        }
    }

    /// Apply an acquire that must queue.
    fn queue(&mut self, command: LockCommand) {
        let outcome = self.ok(command);
        assert!(
            matches!(outcome, LockOutcome::Queued { .. }),
            "not queued: {outcome:?}"
        );
    }

    fn next_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    fn acquire_command(
        &mut self,
        session: u64,
        owner: u64,
        name: &str,
        mode: LockMode,
        wait: bool,
    ) -> LockCommand {
        LockCommand::Acquire {
            session: SessionId(session),
            secret: secret(session),
            owner,
            request_id: self.next_id(),
            name: name.to_string(),
            mode,
            wait_ms: wait.then_some(WAIT_MS),
            lease_ms: None,
            lock_delay_ms: None,
            value: Vec::new(),
            permits: None,
        }
    }

    fn acquire_all_command(
        &mut self,
        session: u64,
        owner: u64,
        names: &[&str],
        mode: LockMode,
        wait: bool,
    ) -> LockCommand {
        LockCommand::AcquireAll {
            session: SessionId(session),
            secret: secret(session),
            owner,
            request_id: self.next_id(),
            names: names.iter().map(|n| n.to_string()).collect(),
            mode,
            wait_ms: wait.then_some(WAIT_MS),
            lease_ms: None,
            lock_delay_ms: None,
        }
    }

    fn release_command(
        &mut self,
        session: u64,
        owner: u64,
        name: &str,
        token: Token,
    ) -> LockCommand {
        LockCommand::Release {
            session: SessionId(session),
            secret: secret(session),
            owner,
            request_id: self.next_id(),
            name: name.to_string(),
            token,
        }
    }

    fn release_all_command(
        &mut self,
        session: u64,
        owner: u64,
        grants: &[(&str, Token)],
    ) -> LockCommand {
        LockCommand::ReleaseAll {
            session: SessionId(session),
            secret: secret(session),
            owner,
            request_id: self.next_id(),
            grants: grants.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
        }
    }

    /// A single exclusive lock taken at once; its grant.
    fn take(&mut self, session: u64, owner: u64, name: &str) -> Sequencer {
        let command = self.acquire_command(session, owner, name, LockMode::Exclusive, false);
        granted(&self.exec(command).0)
    }

    /// Every lock in use, by name.
    fn locks(&self) -> BTreeMap<String, LockInfo> {
        let answer = query(
            &self.store,
            &Query::Lock(LockQuery::Locks {
                prefix: String::new(),
                start_after: None,
                limit: 0,
            }),
        )
        .expect("MemStore never fails");
        let Ok(Outcome::Lock(LockOutcome::Locks { locks, more: false })) = answer else {
            panic!("locks: {answer:?}")
        };
        locks.into_iter().map(|l| (l.name.clone(), l)).collect()
    }

    /// (session, owner, token) of each holder of `name`, in grant order.
    fn holders(&self, name: &str) -> Vec<(SessionId, u64, Token)> {
        self.locks().get(name).map_or_else(Vec::new, |l| {
            l.holders
                .iter()
                .map(|h| (h.session, h.owner, h.token))
                .collect()
        })
    }

    /// How many requests wait for `name`.
    fn waiters(&self, name: &str) -> u32 {
        self.locks().get(name).map_or(0, |l| l.waiters)
    }
}

fn cancel_command(session: u64, owner: u64, name: &str, request_id: u64) -> LockCommand {
    LockCommand::CancelWait {
        session: SessionId(session),
        secret: secret(session),
        owner,
        name: name.to_string(),
        request_id,
    }
}

fn request_of(command: &LockCommand) -> u64 {
    match command {
        LockCommand::Acquire { request_id, .. }
        | LockCommand::AcquireAll { request_id, .. }
        | LockCommand::Release { request_id, .. }
        | LockCommand::ReleaseAll { request_id, .. } => *request_id,
        other => panic!("no request id: {other:?}"),
    }
}

fn with_lock_delay(mut command: LockCommand, delay_ms: u64) -> LockCommand {
    match &mut command {
        LockCommand::Acquire { lock_delay_ms, .. }
        | LockCommand::AcquireAll { lock_delay_ms, .. } => *lock_delay_ms = Some(delay_ms),
        other => panic!("not an acquire: {other:?}"),
    }
    command
}

fn with_lease(mut command: LockCommand, ms: u64) -> LockCommand {
    match &mut command {
        LockCommand::Acquire { lease_ms, .. } | LockCommand::AcquireAll { lease_ms, .. } => {
            *lease_ms = Some(ms)
        }
        other => panic!("not an acquire: {other:?}"),
    }
    command
}

/// A single acquire's new or re-entrant grant.
fn granted(answer: &Answer) -> Sequencer {
    match answer {
        Ok(LockOutcome::Granted { sequencer, .. }) => sequencer.clone(),
        other => panic!("not granted: {other:?}"),
    }
}

/// A multi-lock's grants.
fn sequencers(answer: &Answer) -> Vec<Sequencer> {
    match answer {
        Ok(LockOutcome::GrantedAll { sequencers }) => sequencers.clone(),
        other => panic!("not granted all: {other:?}"),
    }
}

fn names_of(sequencers: &[Sequencer]) -> Vec<&str> {
    sequencers.iter().map(|s| s.name.as_str()).collect()
}

/// The grants an entry made: (session, owner, request id, lock, token, from
/// the queue), in order.
fn grants_in(events: &[Event]) -> Vec<(SessionId, u64, u64, String, Token, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Granted {
                session,
                owner,
                request_id,
                name,
                token,
                waited,
                ..
            } => Some((*session, *owner, *request_id, name.clone(), *token, *waited)),
            _ => None,
        })
        .collect()
}

/// The holds an entry ended: (session, lock, token, why), in order.
fn releases_in(events: &[Event]) -> Vec<(SessionId, String, Token, HoldEnd)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Released {
                session,
                name,
                token,
                why,
                ..
            } => Some((*session, name.clone(), *token, *why)),
            _ => None,
        })
        .collect()
}

/// The waits an entry ended without a grant: (session, request id, lock,
/// why), in order.
fn cancels_in(events: &[Event]) -> Vec<(SessionId, u64, String, WaitEnd)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::WaitCancelled {
                session,
                request_id,
                name,
                why,
                ..
            } => Some((*session, *request_id, name.clone(), *why)),
            _ => None,
        })
        .collect()
}

/// What a queued multi-lock's grant looks like in its entry's events: one
/// grant from the queue per lock, in the order asked.
fn queue_grants(
    session: SessionId,
    owner: u64,
    request_id: u64,
    sequencers: &[Sequencer],
) -> Vec<(SessionId, u64, u64, String, Token, bool)> {
    sequencers
        .iter()
        .map(|s| (session, owner, request_id, s.name.clone(), s.token, true))
        .collect()
}

// ------------------------------------------------------------ the rules

#[test]
fn free_locks_are_granted_at_once_in_the_order_asked() {
    let mut c = Cluster::new();
    let s = c.open(1);
    // Deliberately not in name order: grants follow the order asked.
    let command = c.acquire_all_command(1, 7, &["c", "a", "b"], LockMode::Exclusive, false);
    let request_id = request_of(&command);
    let (answer, events) = c.exec(command.clone());
    let seqs = sequencers(&answer);
    assert_eq!(names_of(&seqs), ["c", "a", "b"]);
    assert!(
        seqs.iter()
            .all(|q| q.session == s && q.mode == LockMode::Exclusive),
        "{seqs:?}"
    );
    assert!(
        seqs.windows(2).all(|w| w[0].token < w[1].token),
        "distinct tokens, increasing in the order asked: {seqs:?}"
    );
    assert_eq!(
        grants_in(&events),
        seqs.iter()
            .map(|q| (s, 7, request_id, q.name.clone(), q.token, false))
            .collect::<Vec<_>>(),
        "one grant per lock in this entry, none from a queue"
    );
    for q in &seqs {
        assert_eq!(c.holders(&q.name), [(s, 7, q.token)], "{}", q.name);
        assert_eq!(c.waiters(&q.name), 0);
    }
    // A retry answers the same grants and takes nothing more.
    let (again, events) = c.exec(command);
    assert_eq!(again, answer);
    assert!(grants_in(&events).is_empty(), "{events:?}");
    for q in &seqs {
        assert_eq!(c.holders(&q.name), [(s, 7, q.token)]);
    }
}

#[test]
fn a_shared_multi_lock_joins_shared_holders_at_once() {
    let mut c = Cluster::new();
    let (x, s) = (c.open(1), c.open(2));
    let reader = c.acquire_command(1, 0, "a", LockMode::Shared, false);
    let reader = granted(&c.exec(reader).0);
    let command = c.acquire_all_command(2, 0, &["a", "b"], LockMode::Shared, false);
    let seqs = sequencers(&c.exec(command).0);
    assert_eq!(names_of(&seqs), ["a", "b"]);
    assert!(seqs[0].token > reader.token);
    assert_eq!(
        c.holders("a"),
        [(x, 0, reader.token), (s, 0, seqs[0].token)]
    );
    // An exclusive multi-lock over a shared-held lock is busy.
    let command = c.acquire_all_command(1, 1, &["c", "a"], LockMode::Exclusive, false);
    let (answer, _) = c.exec(command);
    assert!(
        matches!(&answer, Err(CommandError::Busy { name, holders: 2, waiters: 0, .. }) if name == "a"),
        "{answer:?}"
    );
}

#[test]
fn try_once_is_refused_as_busy_naming_the_first_taken_lock_and_changes_nothing() {
    let mut c = Cluster::new();
    c.open(1);
    let x = c.open(2);
    let b = c.take(2, 0, "b");
    c.take(2, 1, "c");
    let before = c.store.clone();
    let locks_before = c.locks();
    let command = c.acquire_all_command(1, 0, &["a", "b", "c"], LockMode::Exclusive, false);
    let (answer, events) = c.exec(command);
    assert_eq!(
        answer,
        Err(CommandError::Busy {
            name: "b".into(),
            holder: Some(HolderInfo {
                session: x,
                owner: 0,
                mode: LockMode::Exclusive,
                token: b.token,
                hold_count: 1,
                lease_ms: None,
            }),
            holders: 1,
            waiters: 0,
            lock_delay: false,
        })
    );
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(c.store, before, "a refused multi-lock writes nothing");
    let locks = c.locks();
    assert_eq!(locks, locks_before);
    assert_eq!(
        locks.keys().map(String::as_str).collect::<Vec<_>>(),
        ["b", "c"],
        "\"a\" was not taken"
    );
    assert!(locks.values().all(|l| l.waiters == 0), "{locks:?}");
}

#[test]
fn a_queued_multi_lock_holds_nothing_and_is_granted_all_in_one_entry() {
    let mut c = Cluster::new();
    let p = c.open(1);
    let x = c.open(2);
    let z = c.open(3);
    let held = c.take(2, 0, "a");
    let command = c.acquire_all_command(1, 0, &["a", "b"], LockMode::Exclusive, true);
    let request_id = request_of(&command);
    let (answer, events) = c.exec(command.clone());
    assert_eq!(
        answer,
        Ok(LockOutcome::Queued {
            name: "a".into(),
            request_id,
            position: 0
        })
    );
    assert!(
        matches!(events.as_slice(), [Event::Queued { name, .. }] if name == "a"),
        "one wait, reported under the first lock: {events:?}"
    );
    assert_eq!(c.holders("a"), [(x, 0, held.token)]);
    assert_eq!(c.waiters("a"), 1);
    assert_eq!(c.holders("b"), [], "a waiting multi-lock holds nothing");
    assert_eq!(c.waiters("b"), 1);
    // Strict FIFO: the multi-lock heads b's queue, so b, though free, is
    // not for a newcomer.
    let try_b = c.acquire_command(3, 0, "b", LockMode::Exclusive, false);
    let (answer, _) = c.exec(try_b);
    assert_eq!(
        answer,
        Err(CommandError::Busy {
            name: "b".into(),
            holder: None,
            holders: 0,
            waiters: 1,
            lock_delay: false,
        })
    );
    let wait_b = c.acquire_command(3, 0, "b", LockMode::Exclusive, true);
    let z_request = request_of(&wait_b);
    assert!(matches!(
        c.exec(wait_b).0,
        Ok(LockOutcome::Queued { position: 1, .. })
    ));
    // A retry while it waits: still queued.
    assert_eq!(c.exec(command.clone()).0, answer_queued("a", request_id, 0));

    let release = c.release_command(2, 0, "a", held.token);
    let (released, events) = c.exec(release);
    assert!(matches!(
        released,
        Ok(LockOutcome::Released { remaining: 0, .. })
    ));
    let grants = grants_in(&events);
    assert_eq!(
        grants.len(),
        2,
        "both locks in the release's entry: {events:?}"
    );
    assert_eq!(c.holders("a"), [(p, 0, grants[0].4)]);
    assert_eq!(c.holders("b"), [(p, 0, grants[1].4)]);
    assert_eq!(c.waiters("a"), 0);
    assert_eq!(c.waiters("b"), 1, "the single waiter of b still waits");
    // The retry returns the grants.
    let seqs = sequencers(&c.exec(command).0);
    assert_eq!(names_of(&seqs), ["a", "b"]);
    assert_eq!(grants, queue_grants(p, 0, request_id, &seqs));
    assert!(seqs[0].token > held.token && seqs[1].token > seqs[0].token);
    // Giving them back lets the single waiter of b in.
    let release = c.release_all_command(1, 0, &[("a", seqs[0].token), ("b", seqs[1].token)]);
    let (answer, events) = c.exec(release);
    assert_eq!(
        answer,
        Ok(LockOutcome::ReleasedAll {
            released: vec!["a".into(), "b".into()],
            gone: vec![]
        })
    );
    let grants = grants_in(&events);
    assert!(
        matches!(grants.as_slice(), [(s, 0, r, n, _, true)] if *s == z && *r == z_request && n == "b"),
        "{grants:?}"
    );
}

fn answer_queued(name: &str, request_id: u64, position: u32) -> Answer {
    Ok(LockOutcome::Queued {
        name: name.into(),
        request_id,
        position,
    })
}

#[test]
fn multi_locks_in_opposite_orders_do_not_deadlock() {
    for x_first in [true, false] {
        let mut c = Cluster::new();
        let (p, q) = (c.open(1), c.open(2));
        c.open(3);
        c.open(4);
        let x = c.take(3, 0, "a");
        let y = c.take(4, 0, "b");
        let p_cmd = c.acquire_all_command(1, 0, &["a", "b"], LockMode::Exclusive, true);
        let q_cmd = c.acquire_all_command(2, 0, &["b", "a"], LockMode::Exclusive, true);
        let (p_req, q_req) = (request_of(&p_cmd), request_of(&q_cmd));
        assert_eq!(c.exec(p_cmd.clone()).0, answer_queued("a", p_req, 0));
        assert_eq!(c.exec(q_cmd.clone()).0, answer_queued("b", q_req, 1));
        let releases = [(3, "a", x.token), (4, "b", y.token)];
        let (first, second) = if x_first {
            (releases[0], releases[1])
        } else {
            (releases[1], releases[0])
        };
        let command = c.release_command(first.0, 0, first.1, first.2);
        let (_, events) = c.exec(command);
        assert_eq!(grants_in(&events), [], "one lock is still held");
        assert_eq!(c.holders(first.1), [], "nobody takes a lock piecemeal");
        assert_eq!((c.waiters("a"), c.waiters("b")), (2, 2));
        let command = c.release_command(second.0, 0, second.1, second.2);
        let (_, events) = c.exec(command);
        // The first to ask is granted, both locks at once.
        let p_seqs = sequencers(&c.exec(p_cmd.clone()).0);
        assert_eq!(grants_in(&events), queue_grants(p, 0, p_req, &p_seqs));
        assert_eq!(c.exec(q_cmd.clone()).0, answer_queued("b", q_req, 1));
        assert_eq!((c.waiters("a"), c.waiters("b")), (1, 1));
        // Then the second.
        let grants: Vec<(&str, Token)> =
            p_seqs.iter().map(|s| (s.name.as_str(), s.token)).collect();
        let command = c.release_all_command(1, 0, &grants);
        let (_, events) = c.exec(command);
        let q_seqs = sequencers(&c.exec(q_cmd).0);
        assert_eq!(names_of(&q_seqs), ["b", "a"]);
        assert_eq!(grants_in(&events), queue_grants(q, 0, q_req, &q_seqs));
        assert!(q_seqs[0].token > p_seqs[1].token);
        assert_eq!(c.holders("a"), [(q, 0, q_seqs[1].token)]);
        assert_eq!(c.holders("b"), [(q, 0, q_seqs[0].token)]);
        assert_eq!((c.waiters("a"), c.waiters("b")), (0, 0));
    }
}

#[test]
fn shared_multi_locks_in_opposite_orders_are_granted_together() {
    let mut c = Cluster::new();
    let (p, q) = (c.open(1), c.open(2));
    c.open(3);
    let z = c.open(4);
    let x = c.take(3, 0, "a");
    let y = c.take(3, 1, "b");
    let p_cmd = c.acquire_all_command(1, 0, &["a", "b"], LockMode::Shared, true);
    let q_cmd = c.acquire_all_command(2, 0, &["b", "a"], LockMode::Shared, true);
    c.queue(p_cmd.clone());
    c.queue(q_cmd.clone());
    // A single shared waiter of b, behind both.
    let z_cmd = c.acquire_command(4, 0, "b", LockMode::Shared, true);
    let z_request = request_of(&z_cmd);
    assert_eq!(c.exec(z_cmd).0, answer_queued("b", z_request, 2));
    let command = c.release_command(3, 1, "b", y.token);
    let (_, events) = c.exec(command);
    assert_eq!(grants_in(&events), []);
    let command = c.release_command(3, 0, "a", x.token);
    let (_, events) = c.exec(command);
    let p_seqs = sequencers(&c.exec(p_cmd.clone()).0);
    let q_seqs = sequencers(&c.exec(q_cmd.clone()).0);
    let mut expected = queue_grants(p, 0, request_of(&p_cmd), &p_seqs);
    expected.extend(queue_grants(q, 0, request_of(&q_cmd), &q_seqs));
    // The grants of a (released) moved b's queue on too.
    let z_token = c.holders("b").last().map(|h| h.2).expect("b is held");
    expected.push((z, 0, z_request, "b".into(), z_token, true));
    assert_eq!(
        grants_in(&events),
        expected,
        "all three, in the order they asked, in one entry"
    );
    assert_eq!(
        c.holders("a"),
        [(p, 0, p_seqs[0].token), (q, 0, q_seqs[1].token)]
    );
    assert_eq!(
        c.holders("b"),
        [
            (p, 0, p_seqs[1].token),
            (q, 0, q_seqs[0].token),
            (z, 0, z_token)
        ]
    );
    assert_eq!((c.waiters("a"), c.waiters("b")), (0, 0));
}

#[test]
fn cancelling_under_any_name_withdraws_the_wait_from_every_queue() {
    let mut c = Cluster::new();
    c.open(1);
    let x = c.open(2);
    let z = c.open(3);
    let held = c.take(2, 0, "a");
    let command = c.acquire_all_command(1, 0, &["a", "b"], LockMode::Exclusive, true);
    let request_id = request_of(&command);
    c.queue(command.clone());
    let wait_b = c.acquire_command(3, 0, "b", LockMode::Exclusive, true);
    let z_request = request_of(&wait_b);
    c.queue(wait_b);
    assert_eq!((c.waiters("a"), c.waiters("b")), (1, 2));

    // Under the second name.
    let (answer, events) = c.exec(cancel_command(1, 0, "b", request_id));
    assert_eq!(answer, Ok(LockOutcome::WaitCancel(WaitCancel::Cancelled)));
    assert_eq!(
        cancels_in(&events),
        [(
            SessionId(1),
            request_id,
            "a".to_string(),
            WaitEnd::Cancelled
        )],
        "one cancelled wait, reported under the first lock"
    );
    // b's queue moved on in the same entry.
    let grants = grants_in(&events);
    assert!(
        matches!(grants.as_slice(), [(s, 0, r, n, _, true)] if *s == z && *r == z_request && n == "b"),
        "{events:?}"
    );
    assert_eq!(c.waiters("a"), 0, "gone from a's queue too");
    assert_eq!(c.holders("a"), [(x, 0, held.token)]);
    assert_eq!(c.waiters("b"), 0);
    // A retry learns of the cancel; a second cancel finds it cancelled.
    assert_eq!(
        c.exec(command).0,
        Err(CommandError::WaitCancelled {
            name: "a".into(),
            request_id
        })
    );
    assert_eq!(
        c.exec(cancel_command(1, 0, "a", request_id)).0,
        Ok(LockOutcome::WaitCancel(WaitCancel::Cancelled))
    );

    // A cancel after the grant finds the grants and releases nothing.
    let command = c.acquire_all_command(1, 1, &["a", "c"], LockMode::Exclusive, true);
    let request_id = request_of(&command);
    c.queue(command.clone());
    let release = c.release_command(2, 0, "a", held.token);
    c.ok(release);
    let seqs = sequencers(&c.exec(command).0);
    let (answer, events) = c.exec(cancel_command(1, 1, "c", request_id));
    assert_eq!(
        answer,
        Ok(LockOutcome::WaitCancel(WaitCancel::AlreadyGrantedAll(
            seqs.clone()
        )))
    );
    assert!(releases_in(&events).is_empty(), "{events:?}");
    assert_eq!(c.holders("a"), [(SessionId(1), 1, seqs[0].token)]);
    assert_eq!(c.holders("c"), [(SessionId(1), 1, seqs[1].token)]);
    // Under a lock it did not ask for, there is no such wait.
    assert_eq!(
        c.exec(cancel_command(1, 1, "b", request_id)).0,
        Ok(LockOutcome::WaitCancel(WaitCancel::NotWaiting))
    );
}

#[test]
fn an_expired_waiter_leaves_every_queue_and_counts_as_one_cancelled_wait() {
    let mut c = Cluster::new();
    let s = c.open(1);
    c.open(2);
    let z = c.open(3);
    c.take(2, 0, "a");
    let command = c.acquire_all_command(1, 0, &["a", "b", "c"], LockMode::Exclusive, true);
    let request_id = request_of(&command);
    c.queue(command);
    let wait_b = c.acquire_command(3, 0, "b", LockMode::Exclusive, true);
    c.queue(wait_b);
    let (answer, events) = c.exec(LockCommand::ExpireSession { session: s });
    assert_eq!(
        answer,
        Ok(LockOutcome::SessionEnded {
            session: s,
            released: 0,
            cancelled: 1
        })
    );
    assert_eq!(
        cancels_in(&events),
        [(
            s,
            request_id,
            "a".to_string(),
            WaitEnd::SessionEnded(SessionEnd::Expired)
        )]
    );
    assert_eq!((c.waiters("a"), c.waiters("b"), c.waiters("c")), (0, 0, 0));
    assert_eq!(c.holders("b").first().map(|h| h.0), Some(z));
    assert!(!c.locks().contains_key("c"), "c is free again");
}

#[test]
fn an_expired_holder_frees_all_its_locks_and_the_next_waiter_is_granted() {
    let mut c = Cluster::new();
    let s = c.open(1);
    let w = c.open(2);
    let command = c.acquire_all_command(1, 0, &["a", "b", "c"], LockMode::Exclusive, false);
    let held = sequencers(&c.exec(command).0);
    let command = c.acquire_all_command(2, 0, &["c", "a"], LockMode::Exclusive, true);
    let request_id = request_of(&command);
    c.queue(command.clone());
    let (answer, events) = c.exec(LockCommand::ExpireSession { session: s });
    assert_eq!(
        answer,
        Ok(LockOutcome::SessionEnded {
            session: s,
            released: 3,
            cancelled: 0
        })
    );
    let mut released: Vec<(String, Token)> = releases_in(&events)
        .into_iter()
        .map(|(session, name, token, why)| {
            assert_eq!(
                (session, why),
                (s, HoldEnd::SessionEnded(SessionEnd::Expired))
            );
            (name, token)
        })
        .collect();
    released.sort();
    assert_eq!(
        released,
        held.iter()
            .map(|q| (q.name.clone(), q.token))
            .collect::<Vec<_>>()
    );
    let seqs = sequencers(&c.exec(command).0);
    assert_eq!(grants_in(&events), queue_grants(w, 0, request_id, &seqs));
    assert_eq!(c.holders("c"), [(w, 0, seqs[0].token)]);
    assert_eq!(c.holders("a"), [(w, 0, seqs[1].token)]);
    assert!(!c.locks().contains_key("b"), "b is free");
}

#[test]
fn a_multi_lock_waits_until_every_lock_delay_is_over() {
    let mut c = Cluster::new();
    let s = c.open(1);
    let w = c.open(2);
    let command = c.acquire_all_command(1, 0, &["a", "b"], LockMode::Exclusive, false);
    let command = with_lock_delay(command, 1_000);
    let held = sequencers(&c.exec(command).0);
    let command = c.acquire_all_command(2, 0, &["a", "b"], LockMode::Exclusive, true);
    let request_id = request_of(&command);
    c.queue(command.clone());
    let (_, events) = c.exec(LockCommand::ExpireSession { session: s });
    assert_eq!(grants_in(&events), [], "both locks are in lock-delay");
    let locks = c.locks();
    assert!(locks
        .values()
        .all(|l| l.lock_delay.is_some() && l.holders.is_empty()));
    let (answer, events) = c.exec(LockCommand::EndLockDelay {
        name: "a".into(),
        token: held[0].token,
    });
    assert_eq!(answer, Ok(LockOutcome::LockDelayEnded { ended: true }));
    assert_eq!(grants_in(&events), [], "b is still in lock-delay");
    assert_eq!(c.holders("a"), [], "a, though free, is not taken alone");
    assert_eq!((c.waiters("a"), c.waiters("b")), (1, 1));
    let (_, events) = c.exec(LockCommand::EndLockDelay {
        name: "b".into(),
        token: held[1].token,
    });
    let seqs = sequencers(&c.exec(command).0);
    assert_eq!(grants_in(&events), queue_grants(w, 0, request_id, &seqs));
}

/// A session's end cancels every wait of the session. Here the session
/// holds a, whose release in its end grants another session's shared
/// multi-lock of a and d, and that grant moves d's queue on before the end
/// reaches d: the ending session's own shared wait for d, behind the
/// multi-lock, must not be granted (it was, then released as the end
/// reached d, before the end dropped every hold and wait first).
#[test]
fn an_ending_session_is_not_granted_its_own_single_wait() {
    for how in [SessionEnd::Expired, SessionEnd::Closed] {
        let mut c = Cluster::new();
        let s = c.open(1);
        let w = c.open(2);
        let held = c.take(1, 0, "a");
        let w_cmd = c.acquire_all_command(2, 0, &["a", "d"], LockMode::Shared, true);
        let w_request = request_of(&w_cmd);
        c.queue(w_cmd.clone());
        let wait_d = c.acquire_command(1, 0, "d", LockMode::Shared, true);
        let s_request = request_of(&wait_d);
        assert_eq!(c.exec(wait_d).0, answer_queued("d", s_request, 1));
        let end = match how {
            SessionEnd::Closed => LockCommand::CloseSession {
                session: s,
                secret: secret(1),
            },
            _ => LockCommand::ExpireSession { session: s },
        };
        let (answer, events) = c.exec(end);
        let w_seqs = sequencers(&c.exec(w_cmd).0);
        assert_eq!(
            grants_in(&events),
            queue_grants(w, 0, w_request, &w_seqs),
            "{how:?}: only w is granted"
        );
        assert_eq!(
            releases_in(&events),
            [(s, "a".to_string(), held.token, HoldEnd::SessionEnded(how))],
            "{how:?}"
        );
        assert_eq!(
            cancels_in(&events),
            [(s, s_request, "d".to_string(), WaitEnd::SessionEnded(how))],
            "{how:?}"
        );
        assert_eq!(
            answer,
            Ok(LockOutcome::SessionEnded {
                session: s,
                released: 1,
                cancelled: 1
            }),
            "{how:?}"
        );
    }
}

/// As above, with the ending session's wait a multi-lock (b and c) that
/// asked for a lock-delay: had it been granted in the end, its grant of c
/// (which nobody else holds) would have been force-released into a
/// lock-delay, making c, never held before, unavailable to everyone.
#[test]
fn an_ending_session_is_not_granted_its_own_multi_lock_wait() {
    let mut c = Cluster::new();
    let s = c.open(1);
    let w = c.open(2);
    let held = c.take(1, 0, "a");
    // w waits, shared, for a and b: queued in both, heading b while b is free.
    let w_cmd = c.acquire_all_command(2, 0, &["a", "b"], LockMode::Shared, true);
    let w_request = request_of(&w_cmd);
    c.queue(w_cmd.clone());
    // s (another owner) waits, shared, for b and c: behind w in b, heading c.
    let command = c.acquire_all_command(1, 1, &["b", "c"], LockMode::Shared, true);
    let s_request = request_of(&command);
    c.queue(with_lock_delay(command, 1_000));
    let (answer, events) = c.exec(LockCommand::ExpireSession { session: s });
    // s's hold of a ends, and w is granted a and b in this entry.
    let w_seqs = sequencers(&c.exec(w_cmd).0);
    assert_eq!(
        grants_in(&events),
        queue_grants(w, 0, w_request, &w_seqs),
        "only w is granted"
    );
    assert_eq!(
        releases_in(&events),
        [(
            s,
            "a".to_string(),
            held.token,
            HoldEnd::SessionEnded(SessionEnd::Expired)
        )]
    );
    assert_eq!(
        cancels_in(&events),
        [(
            s,
            s_request,
            "b".to_string(),
            WaitEnd::SessionEnded(SessionEnd::Expired)
        )]
    );
    assert_eq!(
        answer,
        Ok(LockOutcome::SessionEnded {
            session: s,
            released: 1,
            cancelled: 1
        })
    );
    assert!(
        !c.locks().contains_key("c"),
        "c was never held: free, not in lock-delay: {:?}",
        c.locks().get("c")
    );
}

#[test]
fn release_all_gives_back_every_grant_in_one_entry_and_reports_the_gone() {
    let mut c = Cluster::new();
    c.open(1);
    let w = c.open(2);
    let command = c.acquire_all_command(1, 0, &["a", "b", "c"], LockMode::Exclusive, false);
    let command = with_lease(command, 5_000);
    let held = sequencers(&c.exec(command).0);
    let command = c.acquire_all_command(2, 0, &["a", "c"], LockMode::Exclusive, true);
    let request_id = request_of(&command);
    c.queue(command.clone());
    let (answer, events) = c.exec(LockCommand::ExpireLockLease {
        name: "b".into(),
        token: held[1].token,
    });
    assert_eq!(answer, Ok(LockOutcome::LeaseExpired { released: true }));
    assert_eq!(grants_in(&events), []);
    let grants: Vec<(&str, Token)> = held.iter().map(|s| (s.name.as_str(), s.token)).collect();
    let release = c.release_all_command(1, 0, &grants);
    let (answer, events) = c.exec(release.clone());
    assert_eq!(
        answer,
        Ok(LockOutcome::ReleasedAll {
            released: vec!["a".into(), "c".into()],
            gone: vec!["b".into()]
        })
    );
    assert_eq!(
        releases_in(&events),
        [
            (SessionId(1), "a".into(), held[0].token, HoldEnd::Released),
            (SessionId(1), "c".into(), held[2].token, HoldEnd::Released)
        ]
    );
    let seqs = sequencers(&c.exec(command).0);
    assert_eq!(
        grants_in(&events),
        queue_grants(w, 0, request_id, &seqs),
        "the waiter is granted in the release's entry"
    );
    assert!(!c.locks().contains_key("b"));
    // A retry answers the same and releases nothing more.
    let (again, events) = c.exec(release);
    assert_eq!(again, answer);
    assert!(releases_in(&events).is_empty());
    assert_eq!(c.holders("a"), [(w, 0, seqs[0].token)]);
    // A stale token is reported gone; the rest is released.
    let release = c.release_all_command(2, 0, &[("a", held[0].token), ("c", seqs[1].token)]);
    assert_eq!(
        c.exec(release).0,
        Ok(LockOutcome::ReleasedAll {
            released: vec!["c".into()],
            gone: vec!["a".into()]
        })
    );
    assert_eq!(c.holders("a"), [(w, 0, seqs[0].token)]);
    assert_eq!(c.holders("c"), []);
}

/// A raw client may re-enter a multi-lock's grant with a single acquire
/// by the same owner; giving the multi-lock back ends the grant whole, so
/// `released` never names a lock that is still held.
#[test]
fn release_all_ends_a_re_entered_grant_whole() {
    let mut c = Cluster::new();
    c.open(1);
    let command = c.acquire_all_command(1, 7, &["a", "b"], LockMode::Exclusive, false);
    let held = sequencers(&c.exec(command).0);
    let again = c.take(1, 7, "a");
    assert_eq!(again.token, held[0].token, "a re-entrant hold of the grant");
    let grants: Vec<(&str, Token)> = held.iter().map(|s| (s.name.as_str(), s.token)).collect();
    let release = c.release_all_command(1, 7, &grants);
    let (answer, events) = c.exec(release);
    assert_eq!(
        answer,
        Ok(LockOutcome::ReleasedAll {
            released: vec!["a".into(), "b".into()],
            gone: vec![]
        })
    );
    assert_eq!(releases_in(&events).len(), 2, "{events:?}");
    assert!(c.locks().is_empty(), "{:?}", c.locks());
}

#[test]
fn the_largest_multi_lock_is_taken() {
    let mut c = Cluster::new();
    c.open(1);
    let names: Vec<String> = (0..MAX_MULTI_LOCK_NAMES)
        .map(|i| format!("l{i:02}"))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let command = c.acquire_all_command(1, 0, &refs, LockMode::Exclusive, false);
    let seqs = sequencers(&c.exec(command).0);
    assert_eq!(names_of(&seqs), refs);
    assert_eq!(c.locks().len(), MAX_MULTI_LOCK_NAMES);
}

#[test]
fn bad_multi_locks_are_refused_and_write_nothing() {
    let mut c = Cluster::new();
    c.open(1);
    c.open(2);
    c.open(3);
    // Session 1's owner 0 holds "held" and waits for "x"; "pool" is a
    // semaphore of 2 permits.
    c.take(1, 0, "held");
    c.take(2, 0, "x");
    let wait_x = c.acquire_command(1, 0, "x", LockMode::Exclusive, true);
    let x_request = request_of(&wait_x);
    c.queue(wait_x);
    let mut permit = c.acquire_command(2, 0, "pool", LockMode::Shared, false);
    if let LockCommand::Acquire { permits, .. } = &mut permit {
        *permits = Some(2);
    }
    granted(&c.exec(permit).0);
    c.lock(LockCommand::ExpireSession {
        session: SessionId(3),
    })
    .expect("expires");

    let too_many: Vec<String> = (0..=MAX_MULTI_LOCK_NAMES)
        .map(|i| format!("l{i:02}"))
        .collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    let election = election_lock_name("e");
    let invalid = |e: &CommandError| matches!(e, CommandError::InvalidArgument(_));
    type Check = Box<dyn Fn(&CommandError) -> bool>;
    let mut cases: Vec<(&str, LockCommand, Check)> = vec![
        (
            "one name",
            c.acquire_all_command(1, 1, &["a"], LockMode::Exclusive, true),
            Box::new(invalid),
        ),
        (
            "no name",
            c.acquire_all_command(1, 1, &[], LockMode::Exclusive, true),
            Box::new(invalid),
        ),
        (
            "a name twice",
            c.acquire_all_command(1, 1, &["a", "b", "a"], LockMode::Exclusive, true),
            Box::new(invalid),
        ),
        (
            "too many names",
            c.acquire_all_command(1, 1, &too_many, LockMode::Exclusive, true),
            Box::new(invalid),
        ),
        (
            "an election",
            c.acquire_all_command(1, 1, &["a", election.as_str()], LockMode::Exclusive, true),
            Box::new(invalid),
        ),
        (
            "an empty name",
            c.acquire_all_command(1, 1, &["a", ""], LockMode::Exclusive, true),
            Box::new(|e: &CommandError| matches!(e, CommandError::InvalidLockName { len: 0, .. })),
        ),
        (
            "a semaphore",
            c.acquire_all_command(1, 1, &["a", "pool"], LockMode::Shared, true),
            Box::new(|e: &CommandError| {
                *e == CommandError::PermitsMismatch {
                    name: "pool".into(),
                    permits: Some(2),
                    asked: None,
                }
            }),
        ),
        (
            "a lock the owner holds",
            c.acquire_all_command(1, 0, &["a", "held"], LockMode::Exclusive, true),
            Box::new(invalid),
        ),
        (
            "a lock the owner waits for",
            c.acquire_all_command(1, 0, &["a", "x"], LockMode::Exclusive, true),
            Box::new(move |e: &CommandError| {
                *e == CommandError::AlreadyWaiting {
                    name: "x".into(),
                    request_id: x_request,
                }
            }),
        ),
        (
            "a wait of 0 ms",
            {
                let mut command =
                    c.acquire_all_command(1, 1, &["a", "b"], LockMode::Exclusive, true);
                if let LockCommand::AcquireAll { wait_ms, .. } = &mut command {
                    *wait_ms = Some(0);
                }
                command
            },
            Box::new(|e: &CommandError| matches!(e, CommandError::DurationOutOfRange { .. })),
        ),
        (
            "the wrong secret",
            {
                let mut command =
                    c.acquire_all_command(1, 1, &["a", "b"], LockMode::Exclusive, true);
                if let LockCommand::AcquireAll { secret: s, .. } = &mut command {
                    *s = secret(2);
                }
                command
            },
            Box::new(|e: &CommandError| {
                *e == CommandError::WrongSessionSecret {
                    session: SessionId(1),
                }
            }),
        ),
        (
            "an ended session",
            c.acquire_all_command(3, 0, &["a", "b"], LockMode::Exclusive, true),
            Box::new(|e: &CommandError| {
                *e == CommandError::SessionEnded {
                    session: SessionId(3),
                }
            }),
        ),
        (
            "a release of no grants",
            c.release_all_command(1, 0, &[]),
            Box::new(invalid),
        ),
        (
            "a release of token 0",
            c.release_all_command(1, 0, &[("held", Token(0))]),
            Box::new(invalid),
        ),
        (
            "a release naming a lock twice",
            c.release_all_command(1, 0, &[("held", Token(1)), ("held", Token(1))]),
            Box::new(invalid),
        ),
        (
            "a release of too many grants",
            {
                let grants: Vec<(&str, Token)> = too_many.iter().map(|n| (*n, Token(1))).collect();
                c.release_all_command(1, 0, &grants)
            },
            Box::new(invalid),
        ),
    ];
    // The same id again with another command.
    let reused = c.acquire_all_command(1, 2, &["r1", "r2"], LockMode::Exclusive, false);
    let reused_id = request_of(&reused);
    c.ok(reused);
    cases.push((
        "a request id used for another request",
        LockCommand::AcquireAll {
            session: SessionId(1),
            secret: secret(1),
            owner: 2,
            request_id: reused_id,
            names: vec!["c".into(), "d".into()],
            mode: LockMode::Exclusive,
            wait_ms: None,
            lease_ms: None,
            lock_delay_ms: None,
        },
        Box::new(move |e: &CommandError| {
            *e == CommandError::RequestIdReused {
                request_id: reused_id,
            }
        }),
    ));
    for (what, command, expected) in cases {
        let before = c.store.clone();
        let locks_before = c.locks();
        let (answer, events) = c.exec(command);
        match &answer {
            Err(e) => assert!(expected(e), "{what}: refused with {e:?}"),
            Ok(o) => panic!("{what}: not refused: {o:?}"),
        }
        assert!(events.is_empty(), "{what}: {events:?}");
        assert_eq!(c.locks(), locks_before, "{what}");
        assert!(c.store == before, "{what}: the store changed");
    }
}

// ------------------------------------------------------------ properties

const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const SLOTS: usize = 3;
const OWNERS: u64 = 2;
const DELAY_MS: u64 = 1_000;

#[derive(Debug, Clone)]
enum Step {
    Acquire {
        slot: usize,
        owner: u64,
        name: usize,
        shared: bool,
        wait: bool,
        delay: bool,
    },
    AcquireAll {
        slot: usize,
        owner: u64,
        names: Vec<usize>,
        shared: bool,
        wait: bool,
        delay: bool,
    },
    /// One hold of one of the party's single grants.
    Release {
        slot: usize,
        owner: u64,
        pick: usize,
    },
    /// One of the party's multi-locks, whole.
    ReleaseAll {
        slot: usize,
        owner: u64,
        pick: usize,
    },
    /// One of the party's waits, under its `via`-th lock.
    Cancel {
        slot: usize,
        owner: u64,
        pick: usize,
        via: usize,
    },
    /// The slot's session expires; a new one takes its place.
    Expire { slot: usize },
    /// The lock-delay of a lock, if it has one, ends.
    EndDelay { name: usize },
}

fn step() -> impl Strategy<Value = Step> {
    let slot = 0..SLOTS;
    let owner = 0..OWNERS;
    let pick = 0..4usize;
    let subset = prop::sample::subsequence((0..NAMES.len()).collect::<Vec<_>>(), 2..=NAMES.len())
        .prop_shuffle();
    let delay = prop::bool::weighted(0.2);
    prop_oneof![
        3 => (slot.clone(), owner.clone(), 0..NAMES.len(), any::<bool>(), prop::bool::weighted(0.7), delay)
            .prop_map(|(slot, owner, name, shared, wait, delay)| Step::Acquire { slot, owner, name, shared, wait, delay }),
        4 => (slot.clone(), owner.clone(), subset, any::<bool>(), prop::bool::weighted(0.8), delay)
            .prop_map(|(slot, owner, names, shared, wait, delay)| Step::AcquireAll { slot, owner, names, shared, wait, delay }),
        2 => (slot.clone(), owner.clone(), pick.clone()).prop_map(|(slot, owner, pick)| Step::Release { slot, owner, pick }),
        2 => (slot.clone(), owner.clone(), pick.clone()).prop_map(|(slot, owner, pick)| Step::ReleaseAll { slot, owner, pick }),
        1 => (slot.clone(), owner, pick.clone(), pick).prop_map(|(slot, owner, pick, via)| Step::Cancel { slot, owner, pick, via }),
        1 => slot.prop_map(|slot| Step::Expire { slot }),
        1 => (0..NAMES.len()).prop_map(|name| Step::EndDelay { name }),
    ]
}

/// (session id, owner).
type Party = (u64, u64);

/// A wait: its party and request id.
type WaitKey = (Party, u64);

#[derive(Debug, Clone)]
struct Grant {
    token: Token,
    count: u32,
    mode: LockMode,
    /// The request id of the multi-lock it is part of.
    multi: Option<u64>,
}

#[derive(Debug, Clone)]
struct Wait {
    names: Vec<String>,
    mode: LockMode,
    /// Arrival order.
    arrival: u64,
}

/// What the test knows, from answers and events alone.
#[derive(Debug, Default)]
struct Model {
    grants: BTreeMap<(Party, String), Grant>,
    /// Multi-locks that hold: their (lock, token)s, in the order asked.
    multis: BTreeMap<WaitKey, Vec<(String, Token)>>,
    waits: BTreeMap<WaitKey, Wait>,
    last_token: Token,
    arrivals: u64,
}

impl Model {
    /// The waits in `name`'s queue, in arrival order.
    fn queue(&self, name: &str) -> Vec<(WaitKey, &Wait)> {
        let mut q: Vec<_> = self
            .waits
            .iter()
            .filter(|(_, w)| w.names.iter().any(|n| n == name))
            .map(|(k, w)| (*k, w))
            .collect();
        q.sort_by_key(|(_, w)| w.arrival);
        q
    }

    fn waiting_for(&self, party: Party, name: &str) -> Option<u64> {
        self.waits
            .iter()
            .find(|((p, _), w)| *p == party && w.names.iter().any(|n| n == name))
            .map(|((_, r), _)| *r)
    }

    fn wait(&mut self, party: Party, request_id: u64, names: Vec<String>, mode: LockMode) {
        self.arrivals += 1;
        let arrival = self.arrivals;
        self.waits.insert(
            (party, request_id),
            Wait {
                names,
                mode,
                arrival,
            },
        );
    }

    /// Take in one entry's events: new grants (each token above every
    /// earlier one; a wait granted all of its locks in this entry, in the
    /// order asked), ended holds and waits. Returns the waits granted.
    fn absorb(
        &mut self,
        events: &[Event],
        immediate_multi: Option<u64>,
    ) -> Result<Vec<Wait>, TestCaseError> {
        let mut from_queue: Vec<(WaitKey, Vec<(String, Token)>)> = Vec::new();
        for e in events {
            match e {
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
                    prop_assert!(
                        *token > self.last_token,
                        "token {:?} after {:?}",
                        token,
                        self.last_token
                    );
                    self.last_token = *token;
                    let party = (session.0, *owner);
                    let key = (party, *request_id);
                    let multi = if *waited {
                        let wait = self.waits.get(&key);
                        prop_assert!(
                            wait.is_some(),
                            "granted from the queue, not waiting: {:?}",
                            e
                        );
                        let wait = wait.expect("checked");
                        prop_assert!(
                            wait.names.contains(name),
                            "granted a lock not asked for: {:?}",
                            e
                        );
                        prop_assert_eq!(wait.mode, *mode);
                        match from_queue.iter_mut().find(|(k, _)| *k == key) {
                            Some((_, got)) => got.push((name.clone(), *token)),
                            None => from_queue.push((key, vec![(name.clone(), *token)])),
                        }
                        (wait.names.len() > 1).then_some(*request_id)
                    } else {
                        immediate_multi.filter(|r| r == request_id)
                    };
                    let old = self.grants.insert(
                        (party, name.clone()),
                        Grant {
                            token: *token,
                            count: 1,
                            mode: *mode,
                            multi,
                        },
                    );
                    prop_assert!(old.is_none(), "a second grant of {} to {:?}", name, party);
                }
                Event::Released {
                    session,
                    owner,
                    name,
                    token,
                    ..
                } => {
                    let gone = self.grants.remove(&((session.0, *owner), name.clone()));
                    prop_assert_eq!(gone.map(|g| g.token), Some(*token), "{:?}", e);
                }
                Event::WaitCancelled {
                    session,
                    owner,
                    request_id,
                    name,
                    ..
                } => {
                    let gone = self.waits.remove(&((session.0, *owner), *request_id));
                    prop_assert!(gone.is_some(), "no such wait: {:?}", e);
                    prop_assert_eq!(
                        &gone.expect("checked").names[0],
                        name,
                        "a wait is reported under its first lock"
                    );
                }
                _ => {}
            }
        }
        let mut granted = Vec::new();
        for (key, got) in from_queue {
            let wait = self.waits.remove(&key).expect("checked above");
            let got_names: Vec<&String> = got.iter().map(|(n, _)| n).collect();
            prop_assert_eq!(
                got_names,
                wait.names.iter().collect::<Vec<_>>(),
                "a wait was granted a subset of its locks, or out of order"
            );
            if wait.names.len() > 1 {
                self.multis.insert(key, got);
            }
            granted.push(wait);
        }
        // FIFO: nobody still waiting arrived before a wait granted now, in
        // any of its queues.
        for g in &granted {
            for name in &g.names {
                if let Some((k, w)) = self.queue(name).first() {
                    prop_assert!(
                        w.arrival > g.arrival,
                        "{:?} still waits for {} ahead of a wait granted now ({:?})",
                        k,
                        name,
                        g
                    );
                }
            }
        }
        // All or nothing: a multi-lock holds all of its grants or none.
        let mut over = Vec::new();
        for ((party, request), members) in &self.multis {
            let held = members
                .iter()
                .filter(|(n, t)| {
                    self.grants
                        .get(&(*party, n.clone()))
                        .is_some_and(|g| g.token == *t && g.multi == Some(*request))
                })
                .count();
            prop_assert!(
                held == 0 || held == members.len(),
                "multi-lock {} of {:?} holds {} of {:?}",
                request,
                party,
                held,
                members
            );
            if held == 0 {
                over.push((*party, *request));
            }
        }
        for k in over {
            self.multis.remove(&k);
        }
        Ok(granted)
    }
}

/// Could a request in `mode` be granted `name` now, ignoring its queue?
fn free_for(locks: &BTreeMap<String, LockInfo>, name: &str, mode: LockMode) -> bool {
    match locks.get(name) {
        None => true,
        Some(l) => {
            l.lock_delay.is_none()
                && (l.holders.is_empty()
                    || (mode == LockMode::Shared
                        && l.holders.iter().all(|h| h.mode == LockMode::Shared)))
        }
    }
}

/// The state agrees with the model, and every invariant holds.
fn check(c: &Cluster, m: &Model) -> Result<(), TestCaseError> {
    let locks = c.locks();
    let mut held = BTreeMap::new();
    for l in locks.values() {
        prop_assert!(
            !l.holders.is_empty() || l.waiters > 0 || l.lock_delay.is_some(),
            "a free lock listed: {:?}",
            l
        );
        // At most one exclusive holder; holders all in one mode.
        if l.holders.iter().any(|h| h.mode == LockMode::Exclusive) {
            prop_assert_eq!(l.holders.len(), 1, "{:?}", l);
        }
        prop_assert!(l.lock_delay.is_none() || l.holders.is_empty(), "{:?}", l);
        for h in &l.holders {
            held.insert(
                ((h.session.0, h.owner), l.name.clone()),
                (h.token, h.hold_count, h.mode),
            );
        }
    }
    let expected: BTreeMap<_, _> = m
        .grants
        .iter()
        .map(|(k, g)| (k.clone(), (g.token, g.count, g.mode)))
        .collect();
    prop_assert_eq!(&held, &expected, "holders");
    for name in NAMES {
        prop_assert_eq!(
            locks.get(name).map_or(0, |l| l.waiters) as usize,
            m.queue(name).len(),
            "waiters of {}",
            name
        );
    }
    // Every multi-lock that holds holds all of its locks with the tokens
    // reported; a waiting one holds none.
    for ((party, _), members) in &m.multis {
        for (name, token) in members {
            prop_assert_eq!(held.get(&(*party, name.clone())).map(|h| h.0), Some(*token));
        }
    }
    for ((party, _), w) in &m.waits {
        for name in &w.names {
            prop_assert!(
                !held.contains_key(&(*party, name.clone())),
                "{:?} holds {} while it waits for it",
                party,
                name
            );
        }
    }
    // Nobody waits who could be granted: a wait heading every queue it is
    // in, every lock free for it, would have been granted in the entry
    // that made it so.
    for (key, w) in &m.waits {
        let grantable = w.names.iter().all(|n| {
            m.queue(n).first().map(|(k, _)| k) == Some(key) && free_for(&locks, n, w.mode)
        });
        prop_assert!(!grantable, "{:?} could be granted {:?} but waits", key, w);
    }
    Ok(())
}

fn mode(shared: bool) -> LockMode {
    if shared {
        LockMode::Shared
    } else {
        LockMode::Exclusive
    }
}

/// Run `command`, take in its events and check everything.
fn run_checked(
    c: &mut Cluster,
    m: &mut Model,
    command: LockCommand,
    immediate_multi: Option<u64>,
) -> Result<(Answer, Vec<Event>, Vec<Wait>), TestCaseError> {
    let before = c.store.clone();
    let (answer, events) = c.exec(command);
    if answer.is_err() {
        prop_assert!(events.is_empty(), "a refusal with events: {:?}", events);
        prop_assert!(c.store == before, "a refusal wrote: {:?}", answer);
    }
    let granted = m.absorb(&events, immediate_multi)?;
    Ok((answer, events, granted))
}

/// Random single and multi acquires (exclusive or shared, waiting or not,
/// some with a lock-delay), releases, whole releases, cancels, session
/// expiries and lock-delay ends over 4 locks. After every step the lock
/// table is exactly what the answers and events said: each acquire's
/// answer is the one the rules give (granted at once only if free and
/// nobody queued; else queued at the back, or busy); a multi-lock is
/// granted all of its locks in one entry and holds all or none; an
/// exclusive lock has one holder at most; queues are served in FIFO order
/// and no waiter that could be granted waits; tokens only grow. At the
/// end, once every holder lets go (repeatedly, as waiters get their
/// grants), every wait has been granted and every lock is free.
/// An expiring session is granted none of its own waits.
fn run_steps(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let mut c = Cluster::new();
    let mut sessions = [0u64; SLOTS];
    for (i, s) in sessions.iter_mut().enumerate() {
        *s = c.open(i as u64 + 1).0;
    }
    let mut next_session = SLOTS as u64 + 1;
    let mut m = Model::default();
    for step in steps {
        let locks = c.locks();
        match step {
            Step::Acquire {
                slot,
                owner,
                name,
                shared,
                wait,
                delay,
            } => {
                let (sid, name, mode) = (sessions[slot], NAMES[name], mode(shared));
                let party = (sid, owner);
                let grant = m.grants.get(&(party, name.to_string())).cloned();
                if grant.as_ref().is_some_and(|g| g.multi.is_some()) {
                    // Re-entering one lock of a multi-lock would make
                    // the whole release leave it held.
                    continue;
                }
                let queue_len = m.queue(name).len() as u32;
                let free = queue_len == 0 && free_for(&locks, name, mode);
                let already = m.waiting_for(party, name);
                let mut command = c.acquire_command(sid, owner, name, mode, wait);
                if delay {
                    command = with_lock_delay(command, DELAY_MS);
                }
                let request_id = request_of(&command);
                let (answer, events, _) = run_checked(&mut c, &mut m, command, None)?;
                match (grant, already) {
                    (Some(g), _) => match (g.mode, mode) {
                        (LockMode::Shared, LockMode::Exclusive) => prop_assert_eq!(
                            answer,
                            Err(CommandError::UpgradeNotAllowed { name: name.into() })
                        ),
                        (LockMode::Exclusive, LockMode::Shared) => prop_assert_eq!(
                            answer,
                            Err(CommandError::DowngradeNotAllowed { name: name.into() })
                        ),
                        _ => {
                            let Ok(LockOutcome::Granted {
                                sequencer,
                                hold_count,
                            }) = &answer
                            else {
                                return Err(TestCaseError::fail(format!("re-entrant: {answer:?}")));
                            };
                            prop_assert_eq!((sequencer.token, *hold_count), (g.token, g.count + 1));
                            prop_assert!(events.is_empty());
                            m.grants
                                .get_mut(&(party, name.to_string()))
                                .expect("held")
                                .count += 1;
                        }
                    },
                    (None, Some(waiting)) => prop_assert_eq!(
                        answer,
                        Err(CommandError::AlreadyWaiting {
                            name: name.into(),
                            request_id: waiting
                        })
                    ),
                    (None, None) if free => {
                        let sequencer = granted(&answer);
                        prop_assert_eq!(
                            m.grants.get(&(party, name.to_string())).map(|g| g.token),
                            Some(sequencer.token)
                        );
                    }
                    (None, None) if wait => {
                        prop_assert_eq!(answer, answer_queued(name, request_id, queue_len));
                        m.wait(party, request_id, vec![name.to_string()], mode);
                    }
                    (None, None) => prop_assert!(
                        matches!(&answer, Err(CommandError::Busy { name: n, .. }) if n == name),
                        "{:?}",
                        answer
                    ),
                }
            }
            Step::AcquireAll {
                slot,
                owner,
                names,
                shared,
                wait,
                delay,
            } => {
                let (sid, mode) = (sessions[slot], mode(shared));
                let party = (sid, owner);
                let names: Vec<&str> = names.iter().map(|&i| NAMES[i]).collect();
                // The first lock the party holds or waits for, in the order asked.
                let mut refusal = None;
                for n in &names {
                    if m.grants.contains_key(&(party, n.to_string())) {
                        refusal = Some(None);
                        break;
                    }
                    if let Some(r) = m.waiting_for(party, n) {
                        refusal = Some(Some(CommandError::AlreadyWaiting {
                            name: n.to_string(),
                            request_id: r,
                        }));
                        break;
                    }
                }
                let busy = names
                    .iter()
                    .find(|n| !(m.queue(n).is_empty() && free_for(&locks, n, mode)));
                let position = names.iter().map(|n| m.queue(n).len()).max().unwrap_or(0) as u32;
                let mut command = c.acquire_all_command(sid, owner, &names, mode, wait);
                if delay {
                    command = with_lock_delay(command, DELAY_MS);
                }
                let request_id = request_of(&command);
                let (answer, events, _) = run_checked(&mut c, &mut m, command, Some(request_id))?;
                match (refusal, busy) {
                    (Some(None), _) => prop_assert!(
                        matches!(answer, Err(CommandError::InvalidArgument(_))),
                        "{:?}",
                        answer
                    ),
                    (Some(Some(e)), _) => prop_assert_eq!(answer, Err(e)),
                    (None, None) => {
                        let seqs = sequencers(&answer);
                        prop_assert_eq!(names_of(&seqs), names.clone());
                        let reported: Vec<(String, Token)> =
                            seqs.iter().map(|s| (s.name.clone(), s.token)).collect();
                        let in_events: Vec<(String, Token)> =
                            grants_in(&events).into_iter().map(|g| (g.3, g.4)).collect();
                        prop_assert_eq!(&reported, &in_events);
                        m.multis.insert((party, request_id), reported);
                    }
                    (None, Some(busy)) if wait => {
                        let _ = busy;
                        prop_assert_eq!(answer, answer_queued(names[0], request_id, position));
                        m.wait(
                            party,
                            request_id,
                            names.iter().map(|n| n.to_string()).collect(),
                            mode,
                        );
                    }
                    (None, Some(busy)) => prop_assert!(
                        matches!(&answer, Err(CommandError::Busy { name, .. }) if name == busy),
                        "{:?}",
                        answer
                    ),
                }
            }
            Step::Release { slot, owner, pick } => {
                let party = (sessions[slot], owner);
                let singles: Vec<(String, Grant)> = m
                    .grants
                    .iter()
                    .filter(|((p, _), g)| *p == party && g.multi.is_none())
                    .map(|((_, n), g)| (n.clone(), g.clone()))
                    .collect();
                let Some((name, g)) = singles.get(pick % singles.len().max(1)).cloned() else {
                    continue;
                };
                let command = c.release_command(party.0, owner, &name, g.token);
                let (answer, _, _) = run_checked(&mut c, &mut m, command, None)?;
                prop_assert_eq!(
                    answer,
                    Ok(LockOutcome::Released {
                        name: name.clone(),
                        token: g.token,
                        remaining: g.count - 1
                    })
                );
                if g.count > 1 {
                    m.grants.get_mut(&(party, name)).expect("still held").count -= 1;
                }
            }
            Step::ReleaseAll { slot, owner, pick } => {
                let party = (sessions[slot], owner);
                let mine: Vec<Vec<(String, Token)>> = m
                    .multis
                    .iter()
                    .filter(|((p, _), _)| *p == party)
                    .map(|(_, g)| g.clone())
                    .collect();
                let Some(grants) = mine.get(pick % mine.len().max(1)).cloned() else {
                    continue;
                };
                let refs: Vec<(&str, Token)> =
                    grants.iter().map(|(n, t)| (n.as_str(), *t)).collect();
                let command = c.release_all_command(party.0, owner, &refs);
                let (answer, events, _) = run_checked(&mut c, &mut m, command, None)?;
                prop_assert_eq!(
                    answer,
                    Ok(LockOutcome::ReleasedAll {
                        released: grants.iter().map(|(n, _)| n.clone()).collect(),
                        gone: vec![],
                    })
                );
                let mut ended: Vec<(String, Token)> = releases_in(&events)
                    .into_iter()
                    .filter(|r| r.0 .0 == party.0)
                    .map(|r| (r.1, r.2))
                    .collect();
                let mut expected = grants.clone();
                ended.sort();
                expected.sort();
                prop_assert_eq!(ended, expected, "every grant released in this entry");
            }
            Step::Cancel {
                slot,
                owner,
                pick,
                via,
            } => {
                let party = (sessions[slot], owner);
                let mine: Vec<(u64, Wait)> = m
                    .waits
                    .iter()
                    .filter(|((p, _), _)| *p == party)
                    .map(|((_, r), w)| (*r, w.clone()))
                    .collect();
                let Some((request_id, w)) = mine.get(pick % mine.len().max(1)).cloned() else {
                    continue;
                };
                let name = w.names[via % w.names.len()].clone();
                let command = LockCommand::CancelWait {
                    session: SessionId(party.0),
                    secret: secret(party.0),
                    owner,
                    name,
                    request_id,
                };
                let (answer, _, _) = run_checked(&mut c, &mut m, command, None)?;
                prop_assert_eq!(answer, Ok(LockOutcome::WaitCancel(WaitCancel::Cancelled)));
                prop_assert!(
                    !m.waits.contains_key(&(party, request_id)),
                    "the cancel was not reported"
                );
            }
            Step::Expire { slot } => {
                let sid = sessions[slot];
                let holds = m.grants.keys().filter(|((s, _), _)| *s == sid).count() as u32;
                let waits = m.waits.keys().filter(|((s, _), _)| *s == sid).count() as u32;
                let command = LockCommand::ExpireSession {
                    session: SessionId(sid),
                };
                let (answer, events, _) = run_checked(&mut c, &mut m, command, None)?;
                let own: Vec<u64> = grants_in(&events)
                    .into_iter()
                    .filter(|g| g.0 .0 == sid)
                    .map(|g| g.2)
                    .collect();
                prop_assert!(
                    own.is_empty(),
                    "the ending session {} was granted its waits {:?}: {:?}",
                    sid,
                    own,
                    events
                );
                prop_assert_eq!(
                    answer,
                    Ok(LockOutcome::SessionEnded {
                        session: SessionId(sid),
                        released: holds,
                        cancelled: waits,
                    })
                );
                prop_assert!(
                    !m.grants.keys().any(|((s, _), _)| *s == sid),
                    "a hold of the ended session is left"
                );
                prop_assert!(
                    !m.waits.keys().any(|((s, _), _)| *s == sid),
                    "a wait of the ended session is left"
                );
                sessions[slot] = c.open(next_session).0;
                next_session += 1;
            }
            Step::EndDelay { name } => {
                let name = NAMES[name];
                let Some(delay) = locks.get(name).and_then(|l| l.lock_delay.clone()) else {
                    continue;
                };
                let command = LockCommand::EndLockDelay {
                    name: name.into(),
                    token: delay.token,
                };
                let (answer, _, _) = run_checked(&mut c, &mut m, command, None)?;
                prop_assert_eq!(answer, Ok(LockOutcome::LockDelayEnded { ended: true }));
            }
        }
        check(&c, &m)?;
    }

    // Liveness: let every holder go, as often as waiters get grants;
    // every wait must end granted.
    let mut rounds = 0;
    while !(m.grants.is_empty() && m.waits.is_empty() && c.locks().is_empty()) {
        rounds += 1;
        prop_assert!(rounds <= 50, "queues do not drain: {:?}", m);
        let before = (m.grants.len(), m.waits.len(), m.last_token);
        let mut drained_events = Vec::new();
        for (name, l) in c.locks() {
            if let Some(delay) = l.lock_delay {
                let (answer, events, _) = run_checked(
                    &mut c,
                    &mut m,
                    LockCommand::EndLockDelay {
                        name,
                        token: delay.token,
                    },
                    None,
                )?;
                prop_assert_eq!(answer, Ok(LockOutcome::LockDelayEnded { ended: true }));
                drained_events.extend(events);
                check(&c, &m)?;
            }
        }
        let multis: Vec<(Party, Vec<(String, Token)>)> =
            m.multis.iter().map(|((p, _), g)| (*p, g.clone())).collect();
        for (party, grants) in multis {
            let refs: Vec<(&str, Token)> = grants.iter().map(|(n, t)| (n.as_str(), *t)).collect();
            let command = c.release_all_command(party.0, party.1, &refs);
            let (answer, events, _) = run_checked(&mut c, &mut m, command, None)?;
            prop_assert!(
                matches!(&answer, Ok(LockOutcome::ReleasedAll { gone, .. }) if gone.is_empty()),
                "{:?}",
                answer
            );
            drained_events.extend(events);
            check(&c, &m)?;
        }
        let singles: Vec<(Party, String, Grant)> = m
            .grants
            .iter()
            .filter(|(_, g)| g.multi.is_none())
            .map(|((p, n), g)| (*p, n.clone(), g.clone()))
            .collect();
        for (party, name, g) in singles {
            for remaining in (0..g.count).rev() {
                let command = c.release_command(party.0, party.1, &name, g.token);
                let (answer, events, _) = run_checked(&mut c, &mut m, command, None)?;
                prop_assert_eq!(
                    answer,
                    Ok(LockOutcome::Released {
                        name: name.clone(),
                        token: g.token,
                        remaining
                    })
                );
                if remaining > 0 {
                    m.grants
                        .get_mut(&(party, name.clone()))
                        .expect("still held")
                        .count -= 1;
                }
                drained_events.extend(events);
                check(&c, &m)?;
            }
        }
        prop_assert!(
            cancels_in(&drained_events).is_empty(),
            "a wait ended without a grant: {:?}",
            drained_events
        );
        prop_assert!(
            before != (m.grants.len(), m.waits.len(), m.last_token) || c.locks().is_empty(),
            "no progress: {:?}",
            m
        );
    }
    prop_assert!(m.waits.is_empty());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// See [`run_steps`].
    #[test]
    fn multi_locks_are_all_or_nothing_and_every_queue_drains(steps in prop::collection::vec(step(), 1..40)) {
        run_steps(steps)?;
    }
}
