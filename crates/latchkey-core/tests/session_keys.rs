//! Keys bound to sessions ([`Command::PutBound`]), against a model: over
//! random opens, closes, expiries, bound and plain puts and deletes, after
//! every step the store holds exactly the model's keys with their bindings,
//! the `E` index lists exactly the bound keys, a session's end deletes
//! exactly its keys (in one revision, recorded together in the watch
//! history), and a refused command writes nothing.

use std::collections::{BTreeMap, BTreeSet};

use latchkey_core::history;
use latchkey_core::keyspace::{self, DATA, META_REVISION, SESSION_KEYS};
use latchkey_core::lock::{LockCommand, LockOutcome, SessionId, SessionSecret};
use latchkey_core::{
    apply, Command, CommandError, CommandResult, MemStore, Outcome, Request, StoreError,
};
use proptest::prelude::*;

/// Sessions the steps name: ids 1..=SLOTS (some never opened, some ended).
const SLOTS: u64 = 5;

/// One step, abstract: the concrete command (with the right secret or a
/// wrong one) is made from the model when the step runs.
#[derive(Debug, Clone)]
enum Step {
    Open,
    Close {
        slot: u64,
        right_secret: bool,
    },
    /// The leader's expiry, or an operator's end of the session.
    Expire {
        slot: u64,
        by_operator: bool,
    },
    PutBound {
        key: u8,
        value: u8,
        slot: u64,
        right_secret: bool,
    },
    Put {
        key: u8,
        value: u8,
    },
    Delete {
        key: u8,
    },
    DeleteRange {
        start: u8,
        end: u8,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let key = 0u8..5;
    let slot = 1..=SLOTS;
    prop_oneof![
        2 => Just(Step::Open),
        1 => (slot.clone(), prop::bool::weighted(0.8))
            .prop_map(|(slot, right_secret)| Step::Close { slot, right_secret }),
        1 => (slot.clone(), any::<bool>())
            .prop_map(|(slot, by_operator)| Step::Expire { slot, by_operator }),
        5 => (key.clone(), any::<u8>(), slot, prop::bool::weighted(0.85)).prop_map(
            |(key, value, slot, right_secret)| Step::PutBound { key, value, slot, right_secret }
        ),
        2 => (key.clone(), any::<u8>()).prop_map(|(key, value)| Step::Put { key, value }),
        1 => key.clone().prop_map(|key| Step::Delete { key }),
        1 => (key.clone(), key).prop_map(|(start, end)| Step::DeleteRange { start, end }),
    ]
}

fn user_key(k: u8) -> Vec<u8> {
    vec![b'k', b'0' + k]
}

/// The secret session `id` is opened with.
fn secret(id: u64) -> SessionSecret {
    SessionSecret([id as u8; 16])
}

#[derive(Debug, Default)]
struct Model {
    /// Live sessions.
    live: BTreeSet<u64>,
    /// The last session id issued.
    last: u64,
    data: Keys,
    revision: u64,
}

impl Model {
    fn not_live(&self, id: u64) -> CommandError {
        let session = SessionId(id);
        if id == 0 || id > self.last {
            CommandError::UnknownSession { session }
        } else {
            CommandError::SessionEnded { session }
        }
    }

    /// The keys bound to `id`, in key order.
    fn bound_to(&self, id: u64) -> Vec<Vec<u8>> {
        self.data
            .iter()
            .filter(|(_, (_, s))| *s == id)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// End session `id`: its keys go at one new revision (if it has any).
    fn end(&mut self, id: u64) -> Vec<Vec<u8>> {
        let doomed = self.bound_to(id);
        for k in &doomed {
            self.data.remove(k);
        }
        if !doomed.is_empty() {
            self.revision += 1;
        }
        self.live.remove(&id);
        doomed
    }

    /// The command for `step`, what the model expects of it, and the keys
    /// a session end must delete together.
    fn run(&mut self, step: &Step) -> (Command, Expected, Vec<Vec<u8>>) {
        match *step {
            Step::Open => {
                self.last += 1;
                self.live.insert(self.last);
                let command = Command::Lock(LockCommand::OpenSession {
                    ttl_ms: 5_000,
                    secret: secret(self.last),
                    name: String::new(),
                });
                (command, Expected::Opened(self.last), Vec::new())
            }
            Step::Close { slot, right_secret } => {
                let given = if right_secret {
                    secret(slot)
                } else {
                    secret(slot + 100)
                };
                let command = Command::Lock(LockCommand::CloseSession {
                    session: SessionId(slot),
                    secret: given,
                });
                if !self.live.contains(&slot) {
                    return (command, Expected::Refused(self.not_live(slot)), Vec::new());
                }
                if !right_secret {
                    let e = CommandError::WrongSessionSecret {
                        session: SessionId(slot),
                    };
                    return (command, Expected::Refused(e), Vec::new());
                }
                let doomed = self.end(slot);
                (command, Expected::Ended(slot), doomed)
            }
            Step::Expire { slot, by_operator } => {
                let session = SessionId(slot);
                let command = Command::Lock(if by_operator {
                    LockCommand::EndSession { session }
                } else {
                    LockCommand::ExpireSession { session }
                });
                if !self.live.contains(&slot) {
                    return (command, Expected::Refused(self.not_live(slot)), Vec::new());
                }
                let doomed = self.end(slot);
                (command, Expected::Ended(slot), doomed)
            }
            Step::PutBound {
                key,
                value,
                slot,
                right_secret,
            } => {
                let given = if right_secret {
                    secret(slot)
                } else {
                    secret(slot + 100)
                };
                let command = Command::PutBound {
                    key: user_key(key),
                    value: vec![value],
                    session: SessionId(slot),
                    secret: given,
                };
                if self.live.contains(&slot) && !right_secret {
                    let e = CommandError::WrongSessionSecret {
                        session: SessionId(slot),
                    };
                    return (command, Expected::Refused(e), Vec::new());
                }
                if !self.live.contains(&slot) {
                    return (command, Expected::Refused(self.not_live(slot)), Vec::new());
                }
                self.revision += 1;
                self.data.insert(user_key(key), (vec![value], slot));
                (command, Expected::Written(self.revision), Vec::new())
            }
            Step::Put { key, value } => {
                self.revision += 1;
                self.data.insert(user_key(key), (vec![value], 0));
                let command = Command::Put {
                    key: user_key(key),
                    value: vec![value],
                };
                (command, Expected::Written(self.revision), Vec::new())
            }
            Step::Delete { key } => {
                if self.data.remove(&user_key(key)).is_some() {
                    self.revision += 1;
                }
                let command = Command::Delete { key: user_key(key) };
                (command, Expected::Deleted(self.revision), Vec::new())
            }
            Step::DeleteRange { start, end } => {
                let (start, end) = (user_key(start), user_key(end));
                let command = Command::DeleteRange {
                    start: start.clone(),
                    end: end.clone(),
                };
                if start >= end {
                    let e = CommandError::InvalidArgument(String::new());
                    return (command, Expected::Refused(e), Vec::new());
                }
                let doomed: Vec<Vec<u8>> = self
                    .data
                    .range(start..end)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in &doomed {
                    self.data.remove(k);
                }
                if !doomed.is_empty() {
                    self.revision += 1;
                }
                (command, Expected::Deleted(self.revision), Vec::new())
            }
        }
    }
}

#[derive(Debug)]
enum Expected {
    Opened(u64),
    Ended(u64),
    Written(u64),
    Deleted(u64),
    Refused(CommandError),
}

fn check_result(got: &CommandResult, want: &Expected) -> Result<(), TestCaseError> {
    match (got, want) {
        (Ok(Outcome::Lock(LockOutcome::SessionOpened { session, .. })), Expected::Opened(id))
        | (Ok(Outcome::Lock(LockOutcome::SessionEnded { session, .. })), Expected::Ended(id)) => {
            prop_assert_eq!(session.0, *id)
        }
        (Ok(Outcome::Written { revision }), Expected::Written(r))
        | (Ok(Outcome::Deleted { revision, .. }), Expected::Deleted(r)) => {
            prop_assert_eq!(revision, r)
        }
        (
            Err(CommandError::InvalidArgument(_)),
            Expected::Refused(CommandError::InvalidArgument(_)),
        ) => {}
        (Err(e), Expected::Refused(w)) => prop_assert_eq!(e, w),
        (got, want) => prop_assert!(false, "got {:?}, expected {:?}", got, want),
    }
    Ok(())
}

/// Key -> (value, bound session or 0).
type Keys = BTreeMap<Vec<u8>, (Vec<u8>, u64)>;

/// [`Keys`] from the raw `D` rows.
fn stored_data(store: &MemStore) -> Result<Keys, StoreError> {
    let mut out = BTreeMap::new();
    for (k, row) in store.map.iter().filter(|(k, _)| k.first() == Some(&DATA)) {
        let key = k[1..].to_vec();
        let v = latchkey_core::data::decode(&key, row)?;
        let session = latchkey_core::data::bound_session(&key, row)?;
        out.insert(key, (v.value, session));
    }
    Ok(out)
}

/// (session, key) from the raw `E` rows.
fn stored_index(store: &MemStore) -> BTreeSet<(u64, Vec<u8>)> {
    store
        .map
        .keys()
        .filter(|k| k.first() == Some(&SESSION_KEYS))
        .map(|k| {
            let id = keyspace::read_u64(&k[1..9]).expect("8-byte id");
            (id, k[9..].to_vec())
        })
        .collect()
}

fn stored_revision(store: &MemStore) -> u64 {
    store
        .map
        .get(META_REVISION)
        .and_then(|v| keyspace::read_u64(v))
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_sessions_end_deletes_exactly_its_keys(steps in prop::collection::vec(step(), 1..60)) {
        let mut store = MemStore::default();
        let mut model = Model::default();
        for (i, step) in steps.iter().enumerate() {
            let before = store.clone();
            let (command, want, doomed) = model.run(step);
            let request = Request { now: 10 + i as u64, command };
            let got = apply(&mut store, &request).expect("MemStore never fails");
            check_result(&got, &want)?;
            if got.is_err() {
                prop_assert_eq!(&store, &before, "a refusal wrote at step {}: {:?}", i, step);
                continue;
            }
            let data = stored_data(&store).expect("rows decode");
            prop_assert_eq!(&data, &model.data, "keys after step {}: {:?}", i, step);
            let index: BTreeSet<(u64, Vec<u8>)> = model
                .data
                .iter()
                .filter(|(_, (_, s))| *s != 0)
                .map(|(k, (_, s))| (*s, k.clone()))
                .collect();
            prop_assert_eq!(stored_index(&store), index, "index after step {}", i);
            prop_assert_eq!(stored_revision(&store), model.revision, "revision after step {}", i);
            if !doomed.is_empty() {
                // The end's deletes: one record, at the end's revision, in
                // key order, each a delete.
                let key = history::record_key(model.revision);
                let row = store.map.get(&key).expect("the end's record");
                let record = history::decode_record(&key, row).expect("decodes");
                let keys: Vec<Vec<u8>> = record.changes.iter().map(|c| c.key.clone()).collect();
                prop_assert_eq!(keys, doomed, "the end's record at step {}", i);
                prop_assert!(record.changes.iter().all(|c| c.current.is_none()));
            }
        }
    }
}

#[test]
fn a_put_bound_to_a_dead_or_foreign_session_writes_nothing() {
    let mut store = MemStore::default();
    let run = |store: &mut MemStore, command: Command| {
        apply(store, &Request { now: 1, command }).expect("MemStore never fails")
    };
    let put = |session: u64, secret_of: u64| Command::PutBound {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        session: SessionId(session),
        secret: secret(secret_of),
    };
    // Never opened.
    let empty = store.clone();
    assert_eq!(
        run(&mut store, put(1, 1)),
        Err(CommandError::UnknownSession {
            session: SessionId(1)
        })
    );
    assert_eq!(store, empty);
    // Session 0 is no session.
    assert!(matches!(
        run(&mut store, put(0, 0)),
        Err(CommandError::InvalidArgument(_))
    ));
    run(
        &mut store,
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 5_000,
            secret: secret(1),
            name: String::new(),
        }),
    )
    .expect("opens");
    let opened = store.clone();
    // Another's secret.
    assert_eq!(
        run(&mut store, put(1, 2)),
        Err(CommandError::WrongSessionSecret {
            session: SessionId(1)
        })
    );
    assert_eq!(store, opened);
    // Ended.
    run(
        &mut store,
        Command::Lock(LockCommand::ExpireSession {
            session: SessionId(1),
        }),
    )
    .expect("expires");
    let ended = store.clone();
    assert_eq!(
        run(&mut store, put(1, 1)),
        Err(CommandError::SessionEnded {
            session: SessionId(1)
        })
    );
    assert_eq!(store, ended);
}

#[test]
fn a_session_holds_at_most_its_limit_of_keys() {
    let max = latchkey_core::limits::MAX_KEYS_PER_SESSION;
    let mut store = MemStore::default();
    let mut run = |command: Command| {
        apply(&mut store, &Request { now: 1, command }).expect("MemStore never fails")
    };
    run(Command::Lock(LockCommand::OpenSession {
        ttl_ms: 5_000,
        secret: secret(1),
        name: String::new(),
    }))
    .expect("opens");
    let put = |i: u64| Command::PutBound {
        key: format!("k{i:05}").into_bytes(),
        value: b"v".to_vec(),
        session: SessionId(1),
        secret: secret(1),
    };
    for i in 0..max {
        run(put(i)).expect("within the limit");
    }
    assert_eq!(
        run(put(max)),
        Err(CommandError::TooManySessionKeys {
            session: SessionId(1),
            max
        })
    );
    // Rewriting a key it holds takes no more room.
    assert!(run(put(0)).is_ok());
    // Its end deletes them all, at one revision.
    let before = run(Command::Put {
        key: b"plain".to_vec(),
        value: b"v".to_vec(),
    });
    let Ok(Outcome::Written { revision }) = before else {
        panic!("{before:?}")
    };
    run(Command::Lock(LockCommand::CloseSession {
        session: SessionId(1),
        secret: secret(1),
    }))
    .expect("closes");
    let left = run(Command::Delete {
        key: b"k00000".to_vec(),
    });
    assert_eq!(
        left,
        Ok(Outcome::Deleted {
            count: 0,
            revision: revision + 1
        })
    );
}
