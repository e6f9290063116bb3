//! Elections (`latchkey_core::lock::election_lock_name`): the rules of the
//! election module, each asserted, and a property test over random
//! campaigns, resignations, proclamations, session ends and lock-delays:
//! after every step the leader key says exactly who holds the election's
//! lock, terms only grow, and every change of leader is one revision.

use std::collections::BTreeMap;

use latchkey_core::data;
use latchkey_core::lock::{
    election_lock_name, Leader, LockCommand, LockMode, LockOutcome, LockQuery, Sequencer,
    SessionId, Token, MAX_ELECTION_VALUE_LEN,
};
use latchkey_core::{query, BatchOp, Command, CommandError, CommandResult, Outcome, Query, Test};
use proptest::prelude::*;

mod state;
use state::{secret, Cluster};

impl Cluster {
    fn open(&mut self, id: u64) -> SessionId {
        match self.lock(LockCommand::OpenSession {
            ttl_ms: 10_000,
            secret: secret(id),
            name: String::new(),
        }) {
            Ok(LockOutcome::SessionOpened { session, .. }) => {
                assert_eq!(session, SessionId(id));
                session
            }
            other => panic!("open: {other:?}"),
        }
    }

    fn campaign_command(
        &mut self,
        session: SessionId,
        election: &str,
        value: &[u8],
        wait: bool,
        lock_delay_ms: Option<u64>,
    ) -> LockCommand {
        self.next_request += 1;
        LockCommand::Acquire {
            session,
            secret: secret(session.0),
            owner: 0,
            request_id: self.next_request,
            name: election_lock_name(election),
            mode: LockMode::Exclusive,
            wait_ms: wait.then_some(60_000),
            lease_ms: None,
            lock_delay_ms,
            value: value.to_vec(),
            permits: None,
        }
    }

    fn campaign(
        &mut self,
        session: SessionId,
        election: &str,
        value: &[u8],
    ) -> Result<LockOutcome, CommandError> {
        let command = self.campaign_command(session, election, value, true, None);
        self.lock(command)
    }

    fn resign(&mut self, session: SessionId, election: &str, term: Token) -> CommandResult {
        self.next_request += 1;
        self.run(Command::Lock(LockCommand::Release {
            session,
            secret: secret(session.0),
            owner: 0,
            request_id: self.next_request,
            name: election_lock_name(election),
            token: term,
        }))
    }

    fn proclaim(
        &mut self,
        session: SessionId,
        election: &str,
        term: Token,
        value: &[u8],
    ) -> CommandResult {
        self.run(Command::Lock(LockCommand::Proclaim {
            session,
            secret: secret(session.0),
            owner: 0,
            name: election_lock_name(election),
            token: term,
            value: value.to_vec(),
        }))
    }

    /// The leader key, decoded.
    fn leader(&self, election: &str) -> Option<Leader> {
        let key = election_lock_name(election);
        data::get(&self.store, key.as_bytes())
            .expect("MemStore never fails")
            .map(|v| Leader::decode(&v.value).expect("a leader key decodes"))
    }

    fn revision(&self) -> u64 {
        data::revision(&self.store).expect("MemStore never fails")
    }

    /// The holder of the election's lock, from the lock table.
    fn holder(&self, election: &str) -> Option<(Token, SessionId)> {
        let name = election_lock_name(election);
        let answer = query(
            &self.store,
            &Query::Lock(LockQuery::Locks {
                prefix: name.clone(),
                start_after: None,
                limit: 0,
            }),
        )
        .expect("MemStore never fails");
        let Ok(Outcome::Lock(LockOutcome::Locks { locks, .. })) = answer else {
            panic!("locks: {answer:?}")
        };
        locks
            .into_iter()
            .find(|l| l.name == name)
            .and_then(|l| l.holders.first().map(|h| (h.token, h.session)))
    }
}

fn term_of(outcome: &LockOutcome) -> Token {
    match outcome {
        LockOutcome::Granted { sequencer, .. } => sequencer.token,
        other => panic!("not leading: {other:?}"),
    }
}

#[test]
fn the_leader_key_follows_the_lock_through_campaign_resign_and_handover() {
    let mut c = Cluster::new();
    let (a, b) = (c.open(1), c.open(2));
    assert_eq!(c.leader("sched"), None);
    let before = c.revision();
    let first = term_of(&c.campaign(a, "sched", b"host-a").expect("leads"));
    assert_eq!(c.revision(), before + 1, "a new leader is one revision");
    assert_eq!(
        c.leader("sched"),
        Some(Leader {
            term: first,
            session: a,
            value: b"host-a".to_vec()
        })
    );
    let queued = c.campaign(b, "sched", b"host-b").expect("queues");
    assert!(matches!(queued, LockOutcome::Queued { position: 0, .. }));
    assert_eq!(
        c.leader("sched").map(|l| l.session),
        Some(a),
        "a waiter does not lead"
    );
    let before = c.revision();
    c.resign(a, "sched", first).expect("resigns");
    assert_eq!(c.revision(), before + 1, "the hand-over is one revision");
    let second = c
        .leader("sched")
        .expect("b leads in the resignation's entry");
    assert_eq!(second.session, b);
    assert_eq!(second.value, b"host-b");
    assert!(second.term > first, "terms only grow");
    assert_eq!(c.holder("sched"), Some((second.term, b)));
    c.resign(b, "sched", second.term).expect("resigns");
    assert_eq!(c.leader("sched"), None, "nobody campaigns: no leader key");
}

#[test]
fn a_leaders_session_end_hands_over_in_the_same_entry_as_its_keys_go() {
    for how in ["close", "expire", "operator"] {
        let mut c = Cluster::new();
        let (a, b) = (c.open(1), c.open(2));
        let first = term_of(&c.campaign(a, "e", b"a").expect("leads"));
        c.campaign(b, "e", b"b").expect("queues");
        c.run(Command::PutBound {
            key: b"svc/a".to_vec(),
            value: b"up".to_vec(),
            session: a,
            secret: secret(1),
        })
        .expect("binds");
        let before = c.revision();
        let end = match how {
            "close" => LockCommand::CloseSession {
                session: a,
                secret: secret(1),
            },
            "expire" => LockCommand::ExpireSession { session: a },
            _ => LockCommand::EndSession { session: a },
        };
        c.lock(end).expect("ends");
        assert_eq!(
            c.revision(),
            before + 1,
            "{how}: one revision for everything"
        );
        assert!(data::get(&c.store, b"svc/a").expect("reads").is_none());
        let now = c.leader("e");
        if how == "operator" {
            // An operator's end puts the lock in a lock-delay of at least the TTL.
            assert_eq!(now, None, "{how}: no leader during the lock-delay");
        } else {
            let now = now.expect("b leads");
            assert_eq!((now.session, now.value.as_slice()), (b, &b"b"[..]), "{how}");
            assert!(now.term > first);
        }
    }
}

#[test]
fn a_lock_delay_leaves_the_election_without_a_leader_until_it_ends() {
    let mut c = Cluster::new();
    let (a, b) = (c.open(1), c.open(2));
    let command = c.campaign_command(a, "e", b"a", false, Some(5_000));
    let first = term_of(&c.lock(command).expect("leads"));
    c.campaign(b, "e", b"b").expect("queues");
    c.lock(LockCommand::ExpireSession { session: a })
        .expect("expires");
    assert_eq!(c.leader("e"), None);
    c.lock(LockCommand::EndLockDelay {
        name: election_lock_name("e"),
        token: first,
    })
    .expect("ends the delay");
    let now = c.leader("e").expect("b leads once the delay ends");
    assert_eq!(now.session, b);
    assert!(now.term > first);
}

#[test]
fn only_the_leader_proclaims_and_only_under_its_term() {
    let mut c = Cluster::new();
    let (a, b) = (c.open(1), c.open(2));
    let term = term_of(&c.campaign(a, "e", b"v1").expect("leads"));
    let before = c.revision();
    let answer = c.proclaim(a, "e", term, b"v2").expect("proclaims");
    assert_eq!(answer, Outcome::Lock(LockOutcome::Proclaimed { term }));
    assert_eq!(c.revision(), before + 1);
    assert_eq!(
        c.leader("e").map(|l| (l.term, l.value)),
        Some((term, b"v2".to_vec()))
    );
    // The same value again changes nothing, not even the revision.
    c.proclaim(a, "e", term, b"v2").expect("proclaims");
    assert_eq!(c.revision(), before + 1);
    c.campaign(b, "e", b"b").expect("queues");
    let refused = c.proclaim(b, "e", term, b"x").expect_err("b does not lead");
    assert_eq!(
        refused,
        CommandError::NotHolder {
            name: election_lock_name("e")
        }
    );
    let refused = c
        .proclaim(a, "e", Token(term.0 + 100), b"x")
        .expect_err("another term");
    assert!(matches!(refused, CommandError::StaleToken { current, .. } if current == term));
    let refused = c
        .proclaim(c_session(9), "e", term, b"x")
        .expect_err("unknown session");
    assert!(matches!(refused, CommandError::UnknownSession { .. }));
    assert_eq!(
        c.leader("e").map(|l| l.value),
        Some(b"v2".to_vec()),
        "nothing changed"
    );
}

fn c_session(id: u64) -> SessionId {
    SessionId(id)
}

#[test]
fn a_re_entrant_campaign_keeps_the_term_and_the_value() {
    let mut c = Cluster::new();
    let a = c.open(1);
    let term = term_of(&c.campaign(a, "e", b"first").expect("leads"));
    let again = c.campaign(a, "e", b"second").expect("re-enters");
    assert!(matches!(again, LockOutcome::Granted { hold_count: 2, .. }));
    assert_eq!(term_of(&again), term);
    assert_eq!(c.leader("e").map(|l| l.value), Some(b"first".to_vec()));
}

#[test]
fn a_deposed_leaders_fenced_write_is_refused() {
    let mut c = Cluster::new();
    let (a, b) = (c.open(1), c.open(2));
    let term = term_of(&c.campaign(a, "e", b"a").expect("leads"));
    let sequencer = Sequencer {
        name: election_lock_name("e"),
        mode: LockMode::Exclusive,
        token: term,
        session: a,
    };
    let fenced = |sequencer: &Sequencer| {
        Command::Lock(LockCommand::Fenced {
            sequencer: sequencer.clone(),
            secret: secret(sequencer.session.0),
            conditions: vec![],
            ops: vec![BatchOp::Put {
                key: b"out".to_vec(),
                value: b"1".to_vec(),
            }],
        })
    };
    c.run(fenced(&sequencer)).expect("the leader writes");
    c.campaign(b, "e", b"b").expect("queues");
    c.lock(LockCommand::ExpireSession { session: a })
        .expect("expires");
    let refused = c.run(fenced(&sequencer)).expect_err("deposed");
    assert!(
        matches!(refused, CommandError::StaleFence { .. }),
        "{refused:?}"
    );
}

#[test]
fn clients_cannot_write_leader_keys_and_range_deletes_skip_them() {
    let mut c = Cluster::new();
    let a = c.open(1);
    c.campaign(a, "e", b"a").expect("leads");
    let key = election_lock_name("e").into_bytes();
    let writes = [
        Command::Put {
            key: key.clone(),
            value: b"forged".to_vec(),
        },
        Command::PutIfAbsent {
            key: key.clone(),
            value: b"forged".to_vec(),
        },
        Command::Delete { key: key.clone() },
        Command::Batch {
            conditions: vec![],
            ops: vec![BatchOp::Delete { key: key.clone() }],
        },
        Command::PutBound {
            key: key.clone(),
            value: b"forged".to_vec(),
            session: a,
            secret: secret(1),
        },
        Command::GetAndPut {
            key: key.clone(),
            value: b"forged".to_vec(),
        },
        Command::CompareAndPut {
            key: key.clone(),
            test: Test::Exists(true),
            value: b"forged".to_vec(),
        },
        Command::Once {
            session: a,
            secret: secret(1),
            request_id: 1_000,
            command: Box::new(Command::Delete { key: key.clone() }),
        },
        Command::Lock(LockCommand::Fenced {
            sequencer: Sequencer {
                name: election_lock_name("e"),
                mode: LockMode::Exclusive,
                token: Token(1),
                session: a,
            },
            secret: secret(1),
            conditions: vec![],
            ops: vec![BatchOp::Put {
                key: key.clone(),
                value: b"forged".to_vec(),
            }],
        }),
    ];
    for write in writes {
        let shown = format!("{write:?}");
        let refused = c.run(write).expect_err(&shown);
        assert!(
            matches!(&refused, CommandError::InvalidArgument(m) if m.contains("leader keys")),
            "{shown}: {refused:?}"
        );
    }
    c.run(Command::Put {
        key: b"m".to_vec(),
        value: b"1".to_vec(),
    })
    .expect("puts");
    let deleted = c
        .run(Command::DeleteRange {
            start: Vec::new(),
            end: vec![0xff],
        })
        .expect("deletes");
    assert!(
        matches!(deleted, Outcome::Deleted { count: 1, .. }),
        "{deleted:?}"
    );
    assert_eq!(
        c.leader("e").map(|l| l.session),
        Some(a),
        "the leader key stays"
    );
}

#[test]
fn malformed_campaigns_are_refused_before_anything_changes() {
    let mut c = Cluster::new();
    let a = c.open(1);
    let revision = c.revision();
    let mut shared = c.campaign_command(a, "e", b"v", true, None);
    if let LockCommand::Acquire { mode, .. } = &mut shared {
        *mode = LockMode::Shared;
    }
    let mut plain_with_value = c.campaign_command(a, "e", b"v", true, None);
    if let LockCommand::Acquire { name, .. } = &mut plain_with_value {
        *name = "plain".to_string();
    }
    let too_long = c.campaign_command(a, "e", &vec![7; MAX_ELECTION_VALUE_LEN + 1], true, None);
    let unnamed = c.campaign_command(a, "", b"v", true, None);
    for command in [shared, plain_with_value, too_long, unnamed] {
        let shown = format!("{command:?}");
        let refused = c.lock(command).expect_err(&shown);
        assert!(
            matches!(refused, CommandError::InvalidArgument(_)),
            "{shown}: {refused:?}"
        );
    }
    let refused = c
        .proclaim(a, "e", Token(1), &vec![1; MAX_ELECTION_VALUE_LEN + 1])
        .expect_err("too long");
    assert!(matches!(refused, CommandError::InvalidArgument(_)));
    let refused = c
        .run(Command::Lock(LockCommand::Proclaim {
            session: a,
            secret: secret(1),
            owner: 0,
            name: "plain".to_string(),
            token: Token(1),
            value: vec![],
        }))
        .expect_err("not an election");
    assert!(matches!(refused, CommandError::InvalidArgument(_)));
    assert_eq!(c.revision(), revision, "nothing was written");
    assert_eq!(c.leader("e"), None);
}

// ------------------------------------------------------------ properties

#[derive(Debug, Clone)]
enum Step {
    Campaign {
        slot: u64,
        election: usize,
        value: u8,
        wait: bool,
        delay: bool,
    },
    Resign {
        slot: u64,
        election: usize,
    },
    Proclaim {
        slot: u64,
        election: usize,
        value: u8,
    },
    End {
        slot: u64,
        how: u8,
    },
    EndDelay {
        election: usize,
    },
    Open,
}

const SLOTS: u64 = 4;
const ELECTIONS: [&str; 2] = ["e0", "e1"];

fn step() -> impl Strategy<Value = Step> {
    let slot = 1..=SLOTS;
    let election = 0..ELECTIONS.len();
    prop_oneof![
        5 => (slot.clone(), election.clone(), any::<u8>(), any::<bool>(), prop::bool::weighted(0.3))
            .prop_map(|(slot, election, value, wait, delay)| Step::Campaign { slot, election, value, wait, delay }),
        2 => (slot.clone(), election.clone()).prop_map(|(slot, election)| Step::Resign { slot, election }),
        2 => (slot.clone(), election.clone(), any::<u8>())
            .prop_map(|(slot, election, value)| Step::Proclaim { slot, election, value }),
        2 => (slot, 0u8..3).prop_map(|(slot, how)| Step::End { slot, how }),
        1 => election.prop_map(|election| Step::EndDelay { election }),
        1 => Just(Step::Open),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After every step: the leader key is exactly the lock's holder (term,
    /// session) with the value it campaigned or last proclaimed with, or
    /// absent when nobody holds the lock; each election's terms only grow;
    /// and a step that changes a leader key raises the revision by one.
    #[test]
    fn the_leader_key_is_always_the_lock_holder(steps in prop::collection::vec(step(), 1..60)) {
        let mut c = Cluster::new();
        let mut opened = 0u64;
        for _ in 0..SLOTS / 2 {
            opened += 1;
            c.open(opened);
        }
        // The value each (election, session) campaigned or proclaimed with last.
        let mut values: BTreeMap<(usize, SessionId), Vec<u8>> = BTreeMap::new();
        let mut last_term: [Option<Token>; 2] = [None, None];
        for step in steps {
            let one_command = !matches!(step, Step::EndDelay { .. });
            let keys_before: Vec<Option<Leader>> = ELECTIONS.iter().map(|e| c.leader(e)).collect();
            let revision_before = c.revision();
            match step {
                Step::Open => {
                    if opened < SLOTS {
                        opened += 1;
                        c.open(opened);
                    }
                }
                Step::Campaign { slot, election, value, wait, delay } => {
                    let command = c.campaign_command(
                        SessionId(slot), ELECTIONS[election], &[value], wait, delay.then_some(1_000));
                    let leading = c.holder(ELECTIONS[election]).map(|(_, s)| s) == Some(SessionId(slot));
                    if c.lock(command).is_ok() && !leading {
                        values.insert((election, SessionId(slot)), vec![value]);
                    }
                }
                Step::Resign { slot, election } => {
                    let term = c.holder(ELECTIONS[election]).map(|(t, _)| t).unwrap_or(Token(1));
                    let _ = c.resign(SessionId(slot), ELECTIONS[election], term);
                }
                Step::Proclaim { slot, election, value } => {
                    let term = c.holder(ELECTIONS[election]).map(|(t, _)| t).unwrap_or(Token(1));
                    if c.proclaim(SessionId(slot), ELECTIONS[election], term, &[value]).is_ok() {
                        values.insert((election, SessionId(slot)), vec![value]);
                    }
                }
                Step::End { slot, how } => {
                    let session = SessionId(slot);
                    let command = match how {
                        0 => LockCommand::CloseSession { session, secret: secret(slot) },
                        1 => LockCommand::ExpireSession { session },
                        _ => LockCommand::EndSession { session },
                    };
                    let _ = c.lock(command);
                }
                Step::EndDelay { election } => {
                    // Any token: a wrong one is a no-op.
                    for token in 1..=c.next_request.min(64) {
                        let _ = c.lock(LockCommand::EndLockDelay {
                            name: election_lock_name(ELECTIONS[election]),
                            token: Token(token),
                        });
                    }
                }
            }
            let mut changed = false;
            for (i, election) in ELECTIONS.iter().enumerate() {
                let key = c.leader(election);
                let holder = c.holder(election);
                match (&key, holder) {
                    (None, None) => {}
                    (Some(leader), Some((term, session))) => {
                        prop_assert_eq!((leader.term, leader.session), (term, session));
                        prop_assert_eq!(Some(&leader.value), values.get(&(i, session)));
                        if let Some(last) = last_term[i] {
                            prop_assert!(term >= last, "terms only grow: {:?} after {:?}", term, last);
                        }
                        last_term[i] = Some(term);
                    }
                    (key, holder) => prop_assert!(false, "{}: key {:?} but holder {:?}", election, key, holder),
                }
                changed |= key != keys_before[i];
            }
            if changed && one_command {
                prop_assert_eq!(c.revision(), revision_before + 1, "one command, one revision");
            }
        }
    }
}
