//! Semaphores (`LockCommand::Acquire` with `permits`): the rules, each
//! asserted, and a property test over random acquires, releases, cancels
//! and session ends: a semaphore never has more holders than permits, its
//! count never changes while it is in use, its queue is served in FIFO
//! order, and every permit has its own, growing token.

use std::collections::BTreeMap;

use latchkey_core::lock::{
    LockCommand, LockMode, LockOutcome, LockQuery, Sequencer, SessionId, Token, WaitCancel,
};
use latchkey_core::{query, BatchOp, Command, CommandError, CommandResult, Outcome, Query};
use proptest::prelude::*;

mod state;
use state::{secret, Cluster};

impl Cluster {
    fn open(&mut self, id: u64) {
        let opened = self.lock(LockCommand::OpenSession {
            ttl_ms: 10_000,
            secret: secret(id),
            name: String::new(),
        });
        assert!(
            matches!(opened, Ok(LockOutcome::SessionOpened { session, .. }) if session == SessionId(id)),
            "{opened:?}"
        );
    }

    fn acquire_command(
        &mut self,
        session: u64,
        owner: u64,
        name: &str,
        mode: LockMode,
        permits: Option<u32>,
        wait: bool,
    ) -> LockCommand {
        self.next_request += 1;
        LockCommand::Acquire {
            session: SessionId(session),
            secret: secret(session),
            owner,
            request_id: self.next_request,
            name: name.to_string(),
            mode,
            wait_ms: wait.then_some(60_000),
            lease_ms: None,
            lock_delay_ms: None,
            value: Vec::new(),
            permits,
        }
    }

    fn permit(
        &mut self,
        session: u64,
        owner: u64,
        permits: u32,
    ) -> Result<LockOutcome, CommandError> {
        let command = self.acquire_command(
            session,
            owner,
            "pool",
            LockMode::Shared,
            Some(permits),
            true,
        );
        self.lock(command)
    }

    fn release(&mut self, session: u64, owner: u64, token: Token) -> CommandResult {
        self.next_request += 1;
        self.run(Command::Lock(LockCommand::Release {
            session: SessionId(session),
            secret: secret(session),
            owner,
            request_id: self.next_request,
            name: "pool".to_string(),
            token,
        }))
    }

    /// (holders, waiters, permits) of `pool`.
    fn pool(&self) -> (Vec<(SessionId, Token)>, u32, Option<u32>) {
        let answer = query(
            &self.store,
            &Query::Lock(LockQuery::Locks {
                prefix: "pool".to_string(),
                start_after: None,
                limit: 0,
            }),
        )
        .expect("MemStore never fails");
        let Ok(Outcome::Lock(LockOutcome::Locks { locks, .. })) = answer else {
            panic!("locks: {answer:?}")
        };
        match locks.into_iter().find(|l| l.name == "pool") {
            Some(l) => (
                l.holders.iter().map(|h| (h.session, h.token)).collect(),
                l.waiters,
                l.permits,
            ),
            None => (Vec::new(), 0, None),
        }
    }
}

fn granted(outcome: &Result<LockOutcome, CommandError>) -> Option<Sequencer> {
    match outcome {
        Ok(LockOutcome::Granted { sequencer, .. }) => Some(sequencer.clone()),
        _ => None,
    }
}

#[test]
fn at_most_n_permits_and_the_next_waiter_gets_a_released_one() {
    let mut c = Cluster::new();
    for id in 1..=3 {
        c.open(id);
    }
    let one = granted(&c.permit(1, 0, 2)).expect("a first permit");
    let two = granted(&c.permit(2, 0, 2)).expect("a second permit");
    assert_ne!(one.token, two.token, "each permit has its own token");
    assert_eq!(one.mode, LockMode::Shared);
    let third = c.permit(3, 0, 2).expect("queues");
    assert!(
        matches!(third, LockOutcome::Queued { position: 0, .. }),
        "{third:?}"
    );
    assert_eq!(c.pool().2, Some(2));
    c.release(1, 0, one.token).expect("releases");
    let (holders, waiters, _) = c.pool();
    assert_eq!(waiters, 0);
    assert_eq!(holders.len(), 2, "the waiter took the released permit");
    let newest = holders.iter().map(|(_, t)| *t).max().expect("holders");
    assert!(newest > two.token, "a new permit, a new token");
}

#[test]
fn the_count_is_fixed_while_in_use_and_forgotten_when_free() {
    let mut c = Cluster::new();
    c.open(1);
    c.open(2);
    let held = granted(&c.permit(1, 0, 3)).expect("a permit");
    let refused = c.permit(2, 0, 4).expect_err("another count");
    assert_eq!(
        refused,
        CommandError::PermitsMismatch {
            name: "pool".into(),
            permits: Some(3),
            asked: Some(4)
        }
    );
    for mode in [LockMode::Exclusive, LockMode::Shared] {
        let plain = c.acquire_command(2, 0, "pool", mode, None, true);
        let refused = c.lock(plain).expect_err("a plain acquire of a semaphore");
        assert!(
            matches!(
                refused,
                CommandError::PermitsMismatch {
                    permits: Some(3),
                    asked: None,
                    ..
                }
            ),
            "{refused:?}"
        );
    }
    c.release(1, 0, held.token).expect("releases");
    assert_eq!(
        c.pool(),
        (Vec::new(), 0, None),
        "a free semaphore keeps nothing"
    );
    // Free again: a new count may start.
    assert!(granted(&c.permit(2, 0, 4)).is_some());
    assert_eq!(c.pool().2, Some(4));
    // And a lock in use is not a semaphore.
    let lock = c.acquire_command(1, 0, "plain", LockMode::Exclusive, None, false);
    c.lock(lock).expect("locks");
    let mut permit = c.acquire_command(2, 0, "plain", LockMode::Shared, Some(2), false);
    if let LockCommand::Acquire { name, .. } = &mut permit {
        *name = "plain".into();
    }
    let refused = c.lock(permit).expect_err("a permit of a lock");
    assert!(
        matches!(
            refused,
            CommandError::PermitsMismatch {
                permits: None,
                asked: Some(2),
                ..
            }
        ),
        "{refused:?}"
    );
}

#[test]
fn a_dead_holders_permit_returns_when_its_session_ends() {
    let mut c = Cluster::new();
    c.open(1);
    c.open(2);
    granted(&c.permit(1, 0, 1)).expect("the only permit");
    c.permit(2, 0, 1).expect("queues");
    c.lock(LockCommand::ExpireSession {
        session: SessionId(1),
    })
    .expect("expires");
    let (holders, waiters, permits) = c.pool();
    assert_eq!(
        holders.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [SessionId(2)]
    );
    assert_eq!((waiters, permits), (0, Some(1)));
}

#[test]
fn a_permit_fences_writes_while_it_is_held_and_a_reader_never_does() {
    let mut c = Cluster::new();
    c.open(1);
    c.open(2);
    let permit = granted(&c.permit(1, 0, 2)).expect("a permit");
    let fenced = |sequencer: &Sequencer, session: u64| {
        Command::Lock(LockCommand::Fenced {
            sequencer: sequencer.clone(),
            secret: secret(session),
            conditions: vec![],
            ops: vec![BatchOp::Put {
                key: b"out".to_vec(),
                value: b"1".to_vec(),
            }],
        })
    };
    c.run(fenced(&permit, 1)).expect("a held permit fences");
    // The same token under another session is not that permit.
    let mut other = permit.clone();
    other.session = SessionId(2);
    let refused = c.run(fenced(&other, 2)).expect_err("another session");
    assert!(
        matches!(refused, CommandError::StaleFence { .. }),
        "{refused:?}"
    );
    c.release(1, 0, permit.token).expect("releases");
    let refused = c.run(fenced(&permit, 1)).expect_err("released");
    assert!(
        matches!(refused, CommandError::StaleFence { current: None, .. }),
        "{refused:?}"
    );

    let reader = c.acquire_command(2, 0, "readers", LockMode::Shared, None, false);
    let reader = granted(&c.lock(reader)).expect("a shared hold");
    let refused = c.run(fenced(&reader, 2)).expect_err("a reader");
    assert!(
        matches!(refused, CommandError::InvalidArgument(_)),
        "{refused:?}"
    );
}

#[test]
fn bad_permit_counts_are_refused_before_anything_changes() {
    let mut c = Cluster::new();
    c.open(1);
    for (mode, permits, name) in [
        (LockMode::Shared, 0, "pool"),
        (LockMode::Shared, 1_025, "pool"),
        (LockMode::Exclusive, 2, "pool"),
        (LockMode::Shared, 2, "latchkey.election/e"),
    ] {
        let command = c.acquire_command(1, 0, name, mode, Some(permits), true);
        let refused = c.lock(command).expect_err("invalid");
        assert!(
            matches!(refused, CommandError::InvalidArgument(_)),
            "{refused:?}"
        );
    }
    let mut delayed = c.acquire_command(1, 0, "pool", LockMode::Shared, Some(2), true);
    if let LockCommand::Acquire { lock_delay_ms, .. } = &mut delayed {
        *lock_delay_ms = Some(1_000);
    }
    let refused = c.lock(delayed).expect_err("a permit with a lock-delay");
    assert!(
        matches!(refused, CommandError::InvalidArgument(_)),
        "{refused:?}"
    );
    assert_eq!(c.pool(), (Vec::new(), 0, None));
}

// ------------------------------------------------------------ properties

#[derive(Debug, Clone)]
enum Step {
    /// A permit of a semaphore of `count` permits (mostly [`PERMITS`]).
    Permit {
        slot: u64,
        owner: u64,
        wait: bool,
        count: u32,
    },
    /// A plain exclusive acquire of the same name.
    Plain {
        slot: u64,
        owner: u64,
    },
    Release {
        slot: u64,
        owner: u64,
    },
    Cancel {
        slot: u64,
        owner: u64,
    },
    End {
        slot: u64,
        expire: bool,
    },
}

const SLOTS: u64 = 4;
const PERMITS: u32 = 2;

fn step() -> impl Strategy<Value = Step> {
    let slot = 1..=SLOTS;
    let owner = 0..2u64;
    prop_oneof![
        5 => (slot.clone(), owner.clone(), any::<bool>(), prop_oneof![4 => Just(PERMITS), 1 => Just(3u32)])
            .prop_map(|(slot, owner, wait, count)| Step::Permit { slot, owner, wait, count }),
        1 => (slot.clone(), owner.clone()).prop_map(|(slot, owner)| Step::Plain { slot, owner }),
        3 => (slot.clone(), owner.clone()).prop_map(|(slot, owner)| Step::Release { slot, owner }),
        1 => (slot.clone(), owner).prop_map(|(slot, owner)| Step::Cancel { slot, owner }),
        1 => (slot, any::<bool>()).prop_map(|(slot, expire)| Step::End { slot, expire }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Never more holders than permits; the count stays while in use (an
    /// acquire with another count, or a plain one, is refused); a waiter is
    /// granted only when a permit is free, in FIFO order; every grant's
    /// token is above every earlier one.
    #[test]
    fn never_more_holders_than_permits(steps in prop::collection::vec(step(), 1..80)) {
        let mut c = Cluster::new();
        for id in 1..=SLOTS {
            c.open(id);
        }
        // (slot, owner) -> (token of its permit, request id of its wait)
        let mut held: BTreeMap<(u64, u64), Token> = BTreeMap::new();
        let mut waiting: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        let mut last_token = Token(0);
        // Queued parties, in the order they queued.
        let mut queue: Vec<(u64, u64)> = Vec::new();
        for step in steps {
            let (_, _, in_use_as) = c.pool();
            match step {
                Step::Permit { slot, owner, wait, count } => {
                    let command = c.acquire_command(slot, owner, "pool", LockMode::Shared, Some(count), wait);
                    let request_id = c.next_request;
                    let answer = c.lock(command);
                    if let Some(p) = in_use_as {
                        if p != count {
                            prop_assert!(
                                mismatch_or_dead(&answer),
                                "a count of {} on a semaphore of {}: {:?}", count, p, answer
                            );
                        }
                    }
                    if let Ok(LockOutcome::Queued { .. }) = answer {
                        waiting.insert((slot, owner), request_id);
                        queue.push((slot, owner));
                    }
                }
                Step::Plain { slot, owner } => {
                    let command = c.acquire_command(slot, owner, "pool", LockMode::Exclusive, None, false);
                    let answer = c.lock(command);
                    if in_use_as.is_some() {
                        prop_assert!(
                            mismatch_or_dead(&answer),
                            "a plain acquire of a semaphore: {:?}", answer
                        );
                    } else if answer.is_ok() {
                        // Held as a plain lock: release it at once so the
                        // name is a semaphore again when next used.
                        if let Ok(LockOutcome::Granted { sequencer, .. }) = answer {
                            let _ = c.release(slot, owner, sequencer.token);
                        }
                    }
                }
                Step::Release { slot, owner } => {
                    let token = held.get(&(slot, owner)).copied().unwrap_or(Token(1));
                    let _ = c.release(slot, owner, token);
                }
                Step::Cancel { slot, owner } => {
                    if let Some(request_id) = waiting.get(&(slot, owner)).copied() {
                        let answer = c.lock(LockCommand::CancelWait {
                            session: SessionId(slot),
                            secret: secret(slot),
                            owner,
                            name: "pool".into(),
                            request_id,
                        });
                        if matches!(answer, Ok(LockOutcome::WaitCancel(WaitCancel::Cancelled))) {
                            queue.retain(|p| *p != (slot, owner));
                            waiting.remove(&(slot, owner));
                        }
                    }
                }
                Step::End { slot, expire } => {
                    let session = SessionId(slot);
                    let end = if expire {
                        LockCommand::ExpireSession { session }
                    } else {
                        LockCommand::CloseSession { session, secret: secret(slot) }
                    };
                    if c.lock(end).is_ok() {
                        // Its waits were cancelled with it.
                        queue.retain(|(s, _)| *s != slot);
                        waiting.retain(|(s, _), _| *s != slot);
                    }
                }
            }
            let (holders, waiters, permits) = c.pool();
            let limit = permits.unwrap_or(1) as usize;
            prop_assert!(holders.len() <= limit, "{} holders of {} permits", holders.len(), limit);
            if let (Some(before), Some(now)) = (in_use_as, permits) {
                prop_assert_eq!(before, now, "the count changed while in use");
            }
            if waiters > 0 {
                prop_assert_eq!(holders.len(), limit, "a waiter waits while a permit is free");
            }
            for (_, token) in &holders {
                if !held.values().any(|t| t == token) {
                    prop_assert!(*token > last_token, "token {:?} after {:?}", token, last_token);
                    last_token = *token;
                }
            }
            // Re-read who holds what (sessions ended, waits granted).
            held.clear();
            let answer = query(&c.store, &Query::Lock(LockQuery::Locks {
                prefix: "pool".into(), start_after: None, limit: 0,
            })).expect("MemStore never fails");
            if let Ok(Outcome::Lock(LockOutcome::Locks { locks, .. })) = answer {
                for l in locks.into_iter().filter(|l| l.name == "pool") {
                    for h in l.holders {
                        held.insert((h.session.0, h.owner), h.token);
                    }
                }
            }
            // FIFO: the waiters granted by this step were the oldest ones.
            let granted: Vec<usize> = queue
                .iter()
                .enumerate()
                .filter(|(_, p)| held.contains_key(p))
                .map(|(i, _)| i)
                .collect();
            prop_assert!(
                granted.iter().enumerate().all(|(n, i)| n == *i),
                "waiters granted out of order: positions {:?} of {:?}", granted, queue
            );
            queue.retain(|p| !held.contains_key(p));
            waiting.retain(|k, _| !held.contains_key(k));
        }
    }
}

/// Refused for the count (or, first, because the session has ended).
fn mismatch_or_dead(answer: &Result<LockOutcome, CommandError>) -> bool {
    matches!(
        answer,
        Err(CommandError::PermitsMismatch { .. } | CommandError::SessionEnded { .. })
    )
}
