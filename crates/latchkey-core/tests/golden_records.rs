//! Golden bytes of the records the state machine writes: every row of the
//! core's keyspace (`latchkey_core::keyspace`) after a script that leaves
//! one of each kind behind, and what those literal rows answer when read
//! back.
//!
//! A replica's state machine (and every snapshot of it) holds these rows for
//! as long as the cluster lives, and a new build must read what an old one
//! wrote. docs/FORMATS.md describes the formats and the rules for changing
//! them; `codec.rs`'s `format_is_frozen` pins the command and reply
//! encodings, latchkey-storage's `golden_formats` the log, snapshot and mark.

use std::collections::BTreeMap;

use latchkey_core::codec::FORMAT_VERSION;
use latchkey_core::lock::{
    Event, ForcedReleases, LeaseLeft, LeaseTimer, LockCommand, LockDelayTimer, LockMode,
    LockOutcome, LockQuery, Sequencer, SessionId, SessionLeft, SessionSecret, SessionTimer,
    TimerState, Token, WaitTimer,
};
use latchkey_core::{
    apply_with_events, query, Command, MemStore, Outcome, Query, Request, Versioned,
};

/// Bytes from hex. Whitespace and `#` comments (to the end of the line)
/// are ignored, so literals can be laid out and explained field by field.
fn unhex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .lines()
        .flat_map(|line| line.split('#').next().unwrap_or("").bytes())
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    assert!(
        digits.len().is_multiple_of(2),
        "odd number of hex digits in {s:?}"
    );
    digits
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).expect("ascii");
            u8::from_str_radix(pair, 16).unwrap_or_else(|_| panic!("not hex: {pair:?}"))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const S1: SessionId = SessionId(1);
const S2: SessionId = SessionId(2);
const S3: SessionId = SessionId(3);

/// Session n's secret in the script: 16 bytes of 0xn0 + n.
fn secret(session: SessionId) -> SessionSecret {
    SessionSecret([0x10 * session.0 as u8 + session.0 as u8; 16])
}

#[allow(clippy::too_many_arguments)]
fn acquire(
    session: SessionId,
    owner: u64,
    request_id: u64,
    name: &str,
    wait_ms: Option<u64>,
    lease_ms: Option<u64>,
    lock_delay_ms: Option<u64>,
) -> Command {
    Command::Lock(LockCommand::Acquire {
        session,
        secret: secret(session),
        owner,
        request_id,
        name: name.to_string(),
        mode: LockMode::Exclusive,
        wait_ms,
        lease_ms,
        lock_delay_ms,
        value: Vec::new(),
        permits: None,
    })
}

/// A put of `key` bound to `session`.
fn bound(key: &[u8], value: &[u8], session: SessionId) -> Command {
    Command::PutBound {
        key: key.to_vec(),
        value: value.to_vec(),
        session,
        secret: secret(session),
    }
}

/// The commands of the script, each stamped with its leader time.
fn script() -> Vec<Request> {
    let commands = vec![
        // "k" is created at revision 1, "j" at 2, "k" rewritten at 3: "k"
        // holds create revision 1, mod revision 3, version 2.
        Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        },
        Command::Put {
            key: b"j".to_vec(),
            value: b"w".to_vec(),
        },
        Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        },
        Command::NextSequence {
            key: b"ids".to_vec(),
            step: 10,
        },
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 10_000,
            secret: secret(S1),
            name: "app".to_string(),
        }),
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 5_000,
            secret: secret(S2),
            name: String::new(),
        }),
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 3_000,
            secret: secret(S3),
            name: String::new(),
        }),
        // Session 1 holds "a" (token 1) with a lease; session 2 waits for it.
        acquire(S1, 1, 1, "a", None, Some(60_000), None),
        acquire(S2, 1, 1, "a", Some(5_000), None, Some(1_000)),
        // Session 3 holds "b" (token 2) with a lock-delay, and expires:
        // "b" is left in lock-delay.
        acquire(S3, 7, 1, "b", None, None, Some(2_000)),
        // "e" is bound to session 1 (revision 4), "t" to session 3
        // (revision 5), which expires: "t" is deleted at revision 6.
        bound(b"e", b"x", S1),
        bound(b"t", b"y", S3),
        Command::Lock(LockCommand::ExpireSession { session: S3 }),
        // A retry-safe delete of "j" (revision 7), remembered by session 1
        // as its request 2.
        Command::Once {
            session: S1,
            secret: secret(S1),
            request_id: 2,
            command: Box::new(Command::Delete { key: b"j".to_vec() }),
        },
        // The leader records that session 1 has 4 s left and the lease of
        // "a" 30 s; session 2's 5 s is its whole TTL, so nothing is kept.
        Command::Lock(LockCommand::Checkpoint {
            sessions: vec![
                SessionLeft {
                    session: S1,
                    left_ms: 4_000,
                },
                SessionLeft {
                    session: S2,
                    left_ms: 5_000,
                },
            ],
            leases: vec![LeaseLeft {
                name: "a".into(),
                token: Token(1),
                left_ms: 30_000,
            }],
        }),
    ];
    commands
        .into_iter()
        .zip(10u64..)
        .map(|(command, now)| Request { now, command })
        .collect()
}

fn run(store: &mut MemStore, now: u64, command: Command) -> (Outcome, Vec<Event>) {
    let shown = format!("{command:?}");
    match apply_with_events(store, &Request { now, command }).expect("MemStore never fails") {
        (Ok(outcome), events) => (outcome, events),
        (Err(e), _) => panic!("{shown}: refused: {e}"),
    }
}

fn ask(store: &MemStore, q: LockQuery) -> LockOutcome {
    match query(store, &Query::Lock(q)).expect("MemStore never fails") {
        Ok(Outcome::Lock(o)) => o,
        other => panic!("unexpected {other:?}"),
    }
}

/// Every row the script leaves, in key order: (key, value), hex. Values
/// marked codec start with the FORMAT_VERSION byte (0b); bincode 2 writes
/// unsigned integers as varints (below 251 one byte, `fb` + u16 LE, ...),
/// strings and lists as a varint length then the items, `Option` as 0/1,
/// enum variants as their index.
const ROWS: &[(&str, &str)] = &[
    // D + user key -> create revision, mod revision, version, bound session
    // (0: none) (u64 BE each), then the user value, raw.
    (
        "44 65",
        "0000000000000004 0000000000000004 0000000000000001 0000000000000001 78",
    ),
    (
        "44 6b",
        "0000000000000001 0000000000000003 0000000000000002 0000000000000000 76",
    ),
    // E + session id (u64 BE) + user key -> empty: "e" is bound to session 1.
    ("45 0000000000000001 65", ""),
    // W + revision (u64 BE) -> codec(Record { revision, changes, previous_dropped }),
    // each change { key, current: Option<Versioned>, previous: Option<Versioned> }
    // with Versioned { value, create, mod, version }.
    (
        "57 0000000000000001",
        "0c 01 01           # revision 1, 1 change:
         01 6b              #   key \"k\",
         01 01 76 01 01 01  #   current Some { \"v\", 1, 1, 1 },
         00                 #   previous None
         00                 # previous_dropped false",
    ),
    (
        "57 0000000000000002",
        "0c 02 01  01 6a  01 01 77 02 02 01  00  00",
    ),
    (
        "57 0000000000000003",
        "0c 03 01  01 6b
         01 01 76 01 03 02  #   current Some { \"v\", create 1, mod 3, version 2 },
         01 01 76 01 01 01  #   previous Some { \"v\", 1, 1, 1 }
         00",
    ),
    (
        "57 0000000000000004",
        "0c 04 01  01 65  01 01 78 04 04 01  00  00",
    ),
    (
        "57 0000000000000005",
        "0c 05 01  01 74  01 01 79 05 05 01  00  00",
    ),
    (
        "57 0000000000000006",
        "0c 06 01  01 74    # revision 6 (session 3 expired), 1 change: \"t\"
         00                 #   current None (deleted),
         01 01 79 05 05 01  #   previous Some { \"y\", 5, 5, 1 }
         00",
    ),
    (
        "57 0000000000000007",
        "0c 07 01  01 6a    # revision 7 (the retry-safe delete), 1 change: \"j\"
         00                 #   current None (deleted),
         01 01 77 02 02 01  #   previous Some { \"w\", 2, 2, 1 }
         00",
    ),
    // Mhist -> oldest revision kept, bytes of records kept (u64 BE each).
    ("4d686973 74", "0000000000000001 0000000000000060"),
    // H + session id (u64 BE) + lock name -> empty: session 1 holds "a",
    // session 2 waits for it.
    ("48 0000000000000001 61", ""),
    ("48 0000000000000002 61", ""),
    // L + lock name -> codec(LockRecord { holders, queue, delay, permits }).
    (
        "4c 61",
        "0c
         01                 # holders: 1
         01 01 00 01 01 01  #   session 1, owner 1, Exclusive, token 1, count 1, request 1,
         01 fb60ea  00      #   lease_ms Some(60000), lock_delay_ms None,
         00                 #   value [] (not a campaign),
         01 fb3075          #   lease_left_ms Some(30000) (recorded by the leader)
         01                 # queue: 1
         02 01 01 00        #   session 2, owner 1, request 1, Exclusive,
         fb8813  00         #   wait_ms 5000, lease_ms None,
         01 fbe803          #   lock_delay_ms Some(1000),
         00                 #   value [],
         00                 #   group [] (not a multi-lock)
         00                 # delay: None,
         00                 # permits: None (a lock, not a semaphore)",
    ),
    (
        "4c 62",
        "0c
         00 00              # no holders, no queue
         01 02 fbd007       # delay: Some({ token 2, delay_ms 2000 }),
         00                 # permits: None",
    ),
    // M + name -> u64 BE: the live sessions, the leader time last applied,
    // the cluster's revision, the last session id and the last fencing
    // token issued.
    ("4d 6c697665", "0000000000000002"),
    ("4d 6e6f77", "0000000000000018"),
    ("4d 726576", "0000000000000007"),
    ("4d 73657373696f6e", "0000000000000003"),
    ("4d 746f6b656e", "0000000000000002"),
    // Q + sequence key -> next start, u64 BE.
    ("51 696473", "000000000000000a"),
    // R + session id + request id (u64 BE each) -> codec(RequestRecord {
    // request, answer }).
    (
        "52 0000000000000001 0000000000000001",
        "0c
         00 03              # request: Asked::Lock(LockCommand::Acquire)
         01                 # session 1,
         11111111111111111111111111111111 # secret,
         01 01  01 61 00    # owner 1, request 1, name \"a\", Exclusive,
         00  01 fb60ea  00  # wait_ms None, lease_ms Some(60000), lock_delay_ms None,
         00  00             # value [], permits None
         00                 # answer: Answer::Outcome
         02                 #   LockOutcome::Granted
         01 61 00 01 01     #   sequencer { \"a\", Exclusive, token 1, session 1 },
         01                 #   hold_count 1",
    ),
    (
        "52 0000000000000001 0000000000000002",
        "0c
         01                 # request: Asked::Write, the SHA-256 of the delete:
         1cef68fe585f6770c237a0d02da18d078d26740ceeb92daa5a6411efe4dcf2f6
         02                 # answer: Answer::Written
         04 01 07           #   Outcome::Deleted { count 1, revision 7 }",
    ),
    (
        "52 0000000000000002 0000000000000001",
        "0c
         00 03              # request: Asked::Lock(LockCommand::Acquire)
         02                 # session 2,
         22222222222222222222222222222222 # secret,
         01 01  01 61 00    # owner 1, request 1, name \"a\", Exclusive,
         01 fb8813  00      # wait_ms Some(5000), lease_ms None,
         01 fbe803          # lock_delay_ms Some(1000),
         00  00             # value [], permits None
         00                 # answer: Answer::Outcome
         03                 #   LockOutcome::Queued
         01 61 01 00        #   { name \"a\", request_id 1, position 0 }",
    ),
    // S + session id (u64 BE) -> codec(SessionRecord { ttl_ms, remembered,
    // forgotten_below, kept_below, secret, left_ms, name, forced_total,
    // forced }).
    (
        "53 0000000000000001",
        "0c fb1027 02 00 00     # ttl 10000, 2 remembered, 0, [],
         11111111111111111111111111111111 # secret,
         01 fba00f              # left_ms Some(4000) (recorded by the leader),
         03 617070              # name \"app\",
         00 00                  # forced_total 0, forced []",
    ),
    (
        "53 0000000000000002",
        "0c fb8813 01 00 00     # ttl 5000, 1 remembered, 0, [],
         22222222222222222222222222222222 # secret,
         00                     # left_ms None (the whole TTL),
         00  00 00              # name \"\", forced_total 0, forced []",
    ),
];

fn golden_store() -> MemStore {
    MemStore {
        map: ROWS
            .iter()
            .map(|(k, v)| (unhex(k), unhex(v)))
            .collect::<BTreeMap<_, _>>(),
    }
}

/// The rows the state machine writes: user data with its revisions, a
/// sequence, the metadata
/// counters, session records, lock records (a holder with a lease, a
/// waiter, a lock-delay), a session's lock index and remembered requests.
///
/// A change of these bytes is a format change: bump FORMAT_VERSION and add
/// a migration or refuse old data.
#[test]
fn stored_records_are_frozen() {
    assert_eq!(FORMAT_VERSION, 12);
    let mut store = MemStore::default();
    for request in script() {
        let now = request.now;
        run(&mut store, now, request.command);
    }
    let actual: Vec<(String, String)> = store.map.iter().map(|(k, v)| (hex(k), hex(v))).collect();
    let golden: Vec<(String, String)> = golden_store()
        .map
        .iter()
        .map(|(k, v)| (hex(k), hex(v)))
        .collect();
    assert_eq!(
        actual, golden,
        "the stored records changed. This is a format change: bump FORMAT_VERSION and add a \
         migration or refuse old data (see docs/FORMATS.md)"
    );
}

/// The literal rows, as an older build wrote them, read back: every query
/// answers from them, and commands carry on from them.
///
/// A change of these bytes is a format change: bump FORMAT_VERSION and add
/// a migration or refuse old data.
#[test]
fn stored_records_read_back() {
    let mut store = golden_store();
    assert_eq!(
        query(&store, &Query::Get { key: b"k".to_vec() }).unwrap(),
        Ok(Outcome::Value {
            value: Some(Versioned {
                value: b"v".to_vec(),
                create_revision: 1,
                mod_revision: 3,
                version: 2,
            }),
            revision: 7,
        })
    );
    assert_eq!(
        ask(&store, LockQuery::TimerState),
        LockOutcome::Timers(TimerState {
            sessions: vec![
                SessionTimer {
                    session: S1,
                    ttl_ms: 10_000,
                    secret: secret(S1),
                    left_ms: 4_000,
                    forced: ForcedReleases::default(),
                },
                SessionTimer {
                    session: S2,
                    ttl_ms: 5_000,
                    secret: secret(S2),
                    left_ms: 5_000,
                    forced: ForcedReleases::default(),
                },
            ],
            leases: vec![LeaseTimer {
                name: "a".into(),
                token: Token(1),
                lease_ms: 60_000,
                left_ms: 30_000,
            }],
            lock_delays: vec![LockDelayTimer {
                name: "b".into(),
                token: Token(2),
                delay_ms: 2_000,
            }],
            waits: vec![WaitTimer {
                name: "a".into(),
                session: S2,
                owner: 1,
                request_id: 1,
                wait_ms: 5_000,
            }],
        })
    );
    let first = Sequencer {
        name: "a".into(),
        mode: LockMode::Exclusive,
        token: Token(1),
        session: S1,
    };
    assert_eq!(
        ask(&store, LockQuery::CheckSequencer(first.clone())),
        LockOutcome::SequencerCheck { current: true }
    );

    // A retried acquire gets its remembered outcome (the request record).
    let (outcome, _) = run(
        &mut store,
        100,
        acquire(S1, 1, 1, "a", None, Some(60_000), None),
    );
    assert_eq!(
        outcome,
        Outcome::Lock(LockOutcome::Granted {
            sequencer: first.clone(),
            hold_count: 1
        })
    );
    // A retried retry-safe write gets its remembered outcome and deletes
    // nothing more.
    let (outcome, _) = run(
        &mut store,
        100,
        Command::Once {
            session: S1,
            secret: secret(S1),
            request_id: 2,
            command: Box::new(Command::Delete { key: b"j".to_vec() }),
        },
    );
    assert_eq!(
        outcome,
        Outcome::Deleted {
            count: 1,
            revision: 7
        }
    );
    // The revision counter and the key's revisions carry on.
    let (outcome, _) = run(
        &mut store,
        100,
        Command::Put {
            key: b"k".to_vec(),
            value: b"v2".to_vec(),
        },
    );
    assert_eq!(outcome, Outcome::Written { revision: 8 });
    assert_eq!(
        query(&store, &Query::Get { key: b"k".to_vec() }).unwrap(),
        Ok(Outcome::Value {
            value: Some(Versioned {
                value: b"v2".to_vec(),
                create_revision: 1,
                mod_revision: 8,
                version: 3,
            }),
            revision: 8,
        })
    );
    // The sequence and the token counter carry on.
    let (outcome, _) = run(
        &mut store,
        101,
        Command::NextSequence {
            key: b"ids".to_vec(),
            step: 1,
        },
    );
    assert_eq!(outcome, Outcome::Sequence { start: 10, end: 11 });
    // Session 1 closes: "a" passes to the waiter with the next token, and
    // "e", bound to it, is deleted at the next revision.
    let (_, events) = run(
        &mut store,
        102,
        Command::Lock(LockCommand::CloseSession {
            session: S1,
            secret: secret(S1),
        }),
    );
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Granted { session, token, name, waited: true, .. }
                if *session == S2 && *token == Token(3) && name == "a"
        )),
        "{events:?}"
    );
    assert_eq!(
        query(&store, &Query::Get { key: b"e".to_vec() }).unwrap(),
        Ok(Outcome::Value {
            value: None,
            revision: 9,
        })
    );
    assert!(
        !store.map.keys().any(|k| k.first() == Some(&b'E')),
        "session 1's key index is gone"
    );
    // The session counter carries on.
    let (outcome, _) = run(
        &mut store,
        103,
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 3_000,
            secret: latchkey_core::lock::SessionSecret::default(),
            name: String::new(),
        }),
    );
    assert_eq!(
        outcome,
        Outcome::Lock(LockOutcome::SessionOpened {
            session: SessionId(4),
            ttl_ms: 3_000,
            secret: latchkey_core::lock::SessionSecret::default(),
        })
    );
}
