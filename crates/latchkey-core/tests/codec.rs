//! The codec: round trips, the frozen format, and hostile input.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Debug;

mod strategies;

use latchkey_core::codec::{decode, encode, CodecError, FORMAT_VERSION};
use latchkey_core::lock::{
    Event, ForcedReleases, HeldLock, HoldEnd, HolderInfo, LeaseLeft, LeaseTimer, LockCommand,
    LockDelayTimer, LockInfo, LockMode, LockOutcome, LockQuery, Sequencer, SessionEnd, SessionId,
    SessionInfo, SessionLeft, SessionListing, SessionSecret, SessionTimer, TimerKind, TimerState,
    Token, WaitCancel, WaitEnd, WaitTimer,
};
use latchkey_core::{
    BatchOp, Command, CommandError, CommandResult, Compare, Condition, Outcome, Query, Request,
    RevisionField, ScanRange, Test, Versioned,
};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

// ---------------------------------------------------------------- allocation probe

/// Records the largest single allocation made by the current thread, so a
/// test can show that decoding a hostile length prefix stays bounded.
struct Probe;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: never panic inside the allocator, even during thread exit.
    let _ = LARGEST.try_with(|l| {
        if size > l.get() {
            l.set(size);
        }
    });
}

// SAFETY: forwards every call to `System` unchanged; only records sizes.
unsafe impl GlobalAlloc for Probe {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static PROBE: Probe = Probe;

/// The largest single allocation `f` makes on this thread.
fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|l| l.set(0));
    let r = f();
    (r, LARGEST.with(Cell::get))
}

// ---------------------------------------------------------------- samples

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn commands() -> Vec<Command> {
    vec![
        Command::Put {
            key: b("k"),
            value: b("v"),
        },
        Command::Put {
            key: vec![0, 0xff],
            value: vec![],
        },
        Command::PutIfAbsent {
            key: b("k"),
            value: vec![7; 300],
        },
        Command::CompareAndPut {
            key: b("k"),
            test: Test::ValueIs(None),
            value: b("v"),
        },
        Command::CompareAndPut {
            key: b("k"),
            test: Test::ValueIs(Some(vec![])),
            value: b("v"),
        },
        Command::CompareAndPut {
            key: b("k"),
            test: Test::Exists(true),
            value: b("v"),
        },
        Command::CompareAndPut {
            key: b("k"),
            test: Test::mod_revision_is(u64::MAX),
            value: b("v"),
        },
        Command::CompareAndPut {
            key: b("k"),
            test: Test::Revision {
                field: RevisionField::Version,
                compare: Compare::Less,
                value: 3,
            },
            value: b("v"),
        },
        Command::GetAndPut {
            key: b("k"),
            value: b("v"),
        },
        Command::Delete { key: b("k") },
        Command::DeleteRange {
            start: vec![],
            end: vec![0xff; 3],
        },
        Command::Batch {
            conditions: vec![],
            ops: vec![],
        },
        Command::Batch {
            conditions: vec![
                Condition::value_is("a", None),
                Condition::value_is("b", Some(b("x"))),
                Condition::new("c", Test::Exists(false)),
                Condition::new(
                    "d",
                    Test::Revision {
                        field: RevisionField::Create,
                        compare: Compare::Greater,
                        value: 250,
                    },
                ),
                Condition::new(
                    "e",
                    Test::Revision {
                        field: RevisionField::Mod,
                        compare: Compare::NotEqual,
                        value: 251,
                    },
                ),
            ],
            ops: vec![
                BatchOp::Put {
                    key: b("a"),
                    value: b("1"),
                },
                BatchOp::Delete { key: b("b") },
            ],
        },
        Command::NextSequence {
            key: b("s"),
            step: 0,
        },
        Command::NextSequence {
            key: b("s"),
            step: u64::MAX,
        },
        Command::Lock(LockCommand::OpenSession {
            ttl_ms: 3_000,
            secret: SessionSecret::default(),
            name: String::new(),
        }),
        Command::Lock(LockCommand::CloseSession {
            session: SessionId(1),
            secret: SessionSecret::default(),
        }),
        Command::Lock(LockCommand::ExpireSession {
            session: SessionId(u64::MAX),
        }),
        Command::Lock(LockCommand::Acquire {
            session: SessionId(2),
            secret: SessionSecret::default(),
            owner: 3,
            request_id: 4,
            name: "jobs/é".to_string(),
            mode: LockMode::Shared,
            wait_ms: Some(1),
            lease_ms: None,
            lock_delay_ms: Some(60_000),
            value: Vec::new(),
            permits: None,
        }),
        Command::Lock(LockCommand::Release {
            session: SessionId(2),
            secret: SessionSecret::default(),
            owner: 3,
            request_id: 5,
            name: "l".to_string(),
            token: Token(9),
        }),
        Command::Lock(LockCommand::CancelWait {
            session: SessionId(2),
            secret: SessionSecret::default(),
            owner: 3,
            name: "l".to_string(),
            request_id: 4,
        }),
        Command::Lock(LockCommand::ExpireLockLease {
            name: "l".to_string(),
            token: Token(1),
        }),
        Command::Lock(LockCommand::EndLockDelay {
            name: "l".to_string(),
            token: Token(1),
        }),
        Command::Lock(LockCommand::Fenced {
            sequencer: sequencer(),
            secret: SessionSecret::default(),
            conditions: vec![Condition::new("a", Test::mod_revision_is(2))],
            ops: vec![BatchOp::Put {
                key: b("a"),
                value: b("1"),
            }],
        }),
        Command::Once {
            session: SessionId(4),
            secret: SessionSecret([3; 16]),
            request_id: u64::MAX,
            command: Box::new(Command::GetAndPut {
                key: b("k"),
                value: b("v"),
            }),
        },
        Command::Lock(LockCommand::Checkpoint {
            sessions: vec![SessionLeft {
                session: SessionId(3),
                left_ms: 1_200,
            }],
            leases: vec![LeaseLeft {
                name: "l".to_string(),
                token: Token(4),
                left_ms: 0,
            }],
        }),
        Command::Lock(LockCommand::ForceRelease {
            name: "l".to_string(),
            token: Token(9),
        }),
        Command::Lock(LockCommand::ForceRelease {
            name: "m".to_string(),
            token: Token(u64::MAX),
        }),
    ]
}

fn versioned(value: &str, create_revision: u64, mod_revision: u64, version: u64) -> Versioned {
    Versioned {
        value: b(value),
        create_revision,
        mod_revision,
        version,
    }
}

fn sequencer() -> Sequencer {
    Sequencer {
        name: "l".to_string(),
        mode: LockMode::Exclusive,
        token: Token(34),
        session: SessionId(7),
    }
}

fn holder() -> HolderInfo {
    HolderInfo {
        session: SessionId(7),
        owner: 1,
        mode: LockMode::Exclusive,
        token: Token(34),
        hold_count: 2,
        lease_ms: Some(1_000),
    }
}

fn queries() -> Vec<Query> {
    vec![
        Query::Get { key: b("k") },
        Query::MultiGet { keys: vec![] },
        Query::MultiGet {
            keys: vec![b("a"), vec![], b("c")],
        },
        Query::Scan(ScanRange::prefix("p", 0)),
        Query::Scan(ScanRange {
            start: b("a"),
            end: Some(b("z")),
            prefix: vec![],
            limit: u32::MAX,
            reverse: true,
        }),
        Query::Lock(LockQuery::CheckSequencer(sequencer())),
        Query::Lock(LockQuery::Locks {
            prefix: "jobs/".to_string(),
            start_after: Some("jobs/3".to_string()),
            limit: 10,
        }),
        Query::Lock(LockQuery::Session {
            session: SessionId(1),
        }),
        Query::Lock(LockQuery::TimerState),
        Query::Lock(LockQuery::Sessions {
            start_after: Some(SessionId(3)),
            limit: 5,
        }),
    ]
}

fn outcomes() -> Vec<Outcome> {
    vec![
        Outcome::Written { revision: 1 },
        Outcome::Written { revision: u64::MAX },
        Outcome::Previous {
            previous: None,
            revision: 0,
        },
        Outcome::Previous {
            previous: Some(b("old")),
            revision: 7,
        },
        Outcome::Swapped {
            succeeded: true,
            current: Some(versioned("v", 3, 9, 4)),
            revision: 9,
        },
        Outcome::Swapped {
            succeeded: false,
            current: None,
            revision: 0,
        },
        Outcome::Deleted {
            count: 0,
            revision: 5,
        },
        Outcome::Deleted {
            count: u64::MAX,
            revision: 6,
        },
        Outcome::Batch {
            failed_condition: None,
            revision: 300,
        },
        Outcome::Batch {
            failed_condition: Some(3),
            revision: 299,
        },
        Outcome::Sequence {
            start: 5,
            end: u64::MAX,
        },
        Outcome::Value {
            value: None,
            revision: 0,
        },
        Outcome::Value {
            value: Some(versioned("", 1, 1, 1)),
            revision: 2,
        },
        Outcome::Values {
            values: vec![
                None,
                Some(versioned("x", 1, 2, 2)),
                Some(versioned("", 3, 3, 1)),
            ],
            revision: 3,
        },
        Outcome::Entries {
            entries: vec![],
            more: false,
            revision: 0,
        },
        Outcome::Entries {
            entries: vec![
                (b("a"), versioned("1", 1, 4, 2)),
                (b("b"), versioned("", 2, 2, 1)),
            ],
            more: true,
            revision: u64::MAX,
        },
        Outcome::Lock(LockOutcome::SessionOpened {
            session: SessionId(1),
            ttl_ms: 3_000,
            secret: SessionSecret([9; 16]),
        }),
        Outcome::Lock(LockOutcome::SessionEnded {
            session: SessionId(1),
            released: 2,
            cancelled: 0,
        }),
        Outcome::Lock(LockOutcome::Granted {
            sequencer: sequencer(),
            hold_count: 1,
        }),
        Outcome::Lock(LockOutcome::Queued {
            name: "l".to_string(),
            request_id: 4,
            position: 0,
        }),
        Outcome::Lock(LockOutcome::Released {
            name: "l".to_string(),
            token: Token(34),
            remaining: 0,
        }),
        Outcome::Lock(LockOutcome::WaitCancel(WaitCancel::Cancelled)),
        Outcome::Lock(LockOutcome::WaitCancel(WaitCancel::AlreadyGranted(
            sequencer(),
        ))),
        Outcome::Lock(LockOutcome::WaitCancel(WaitCancel::NotWaiting)),
        Outcome::Lock(LockOutcome::LeaseExpired { released: true }),
        Outcome::Lock(LockOutcome::LockDelayEnded { ended: false }),
        Outcome::Lock(LockOutcome::Checkpointed { recorded: 2 }),
        Outcome::Lock(LockOutcome::SequencerCheck { current: true }),
        Outcome::Lock(LockOutcome::Locks {
            locks: vec![LockInfo {
                name: "l".to_string(),
                mode: Some(LockMode::Exclusive),
                holders: vec![holder()],
                waiters: 3,
                lock_delay: None,
                permits: Some(4),
            }],
            more: true,
        }),
        Outcome::Lock(LockOutcome::Session(Some(SessionInfo {
            session: SessionId(1),
            ttl_ms: 3_000,
            forced: ForcedReleases {
                total: 3,
                recent: vec![Token(7), Token(9)],
            },
        }))),
        Outcome::Lock(LockOutcome::ForceReleased {
            released: vec![holder()],
        }),
        Outcome::Lock(LockOutcome::Sessions {
            sessions: vec![SessionListing {
                session: SessionId(2),
                name: "worker-1 (pid 7)".to_string(),
                ttl_ms: 10_000,
                held: vec![HeldLock {
                    name: "l".to_string(),
                    owner: 1,
                    mode: LockMode::Shared,
                    token: Token(5),
                    permits: Some(3),
                }],
                holds: 1,
                waiting: vec!["m".to_string()],
                waits: 1,
                keys: 2,
                forced: 0,
                left_ms: Some(1_500),
            }],
            more: false,
        }),
        Outcome::Lock(LockOutcome::Session(None)),
        Outcome::Lock(LockOutcome::Timers(TimerState {
            sessions: vec![SessionTimer {
                session: SessionId(1),
                ttl_ms: 3_000,
                secret: SessionSecret([9; 16]),
                left_ms: 2_000,
                forced: ForcedReleases::default(),
            }],
            leases: vec![LeaseTimer {
                name: "l".to_string(),
                token: Token(3),
                lease_ms: 1_000,
                left_ms: 1_000,
            }],
            lock_delays: vec![LockDelayTimer {
                name: "m".to_string(),
                token: Token(2),
                delay_ms: 5,
            }],
            waits: vec![WaitTimer {
                session: SessionId(1),
                owner: 0,
                name: "l".to_string(),
                request_id: 9,
                wait_ms: 50,
            }],
        })),
    ]
}

fn results() -> Vec<CommandResult> {
    let mut all: Vec<CommandResult> = outcomes().into_iter().map(Ok).collect();
    all.push(Err(CommandError::invalid("key must not be empty")));
    all.push(Err(CommandError::InvalidArgument(String::new())));
    all.push(Err(CommandError::SequenceExhausted {
        key: "s\u{fffd}".to_string(),
        step: 9,
    }));
    all.push(Err(CommandError::KeyAbsent {
        key: "k".to_string(),
    }));
    let name = || "l".to_string();
    all.extend(
        [
            CommandError::UnknownSession {
                session: SessionId(0),
            },
            CommandError::SessionEnded {
                session: SessionId(3),
            },
            CommandError::InvalidLockName { len: 0, max: 256 },
            CommandError::TtlOutOfRange {
                ttl_ms: 0,
                min: 3_000,
                max: 600_000,
            },
            CommandError::DurationOutOfRange {
                what: TimerKind::Lease,
                value: 5,
                min: 1_000,
                max: 86_400_000,
            },
            CommandError::NotHolder { name: name() },
            CommandError::PermitsMismatch {
                name: name(),
                permits: Some(4),
                asked: None,
            },
            CommandError::StaleToken {
                name: name(),
                token: Token(1),
                current: Token(2),
            },
            CommandError::UpgradeNotAllowed { name: name() },
            CommandError::DowngradeNotAllowed { name: name() },
            CommandError::Busy {
                name: name(),
                holder: Some(holder()),
                holders: 1,
                waiters: 0,
                lock_delay: false,
            },
            CommandError::AlreadyWaiting {
                name: name(),
                request_id: 1,
            },
            CommandError::QueueFull {
                name: name(),
                max: 1_024,
            },
            CommandError::StaleFence {
                name: name(),
                token: Token(33),
                current: Some(Token(34)),
            },
            CommandError::RequestTooOld {
                request_id: 1,
                oldest: 2,
            },
            CommandError::RequestIdReused { request_id: 1 },
            CommandError::WaitCancelled {
                name: name(),
                request_id: 1,
            },
            CommandError::CounterExhausted {
                counter: "fencing tokens".to_string(),
            },
        ]
        .map(Err),
    );
    all
}

#[test]
fn events_round_trip() {
    let events = [
        Event::SessionOpened {
            session: SessionId(1),
            ttl_ms: 3_000,
            secret: SessionSecret([9; 16]),
        },
        Event::SessionEnded {
            session: SessionId(1),
            how: SessionEnd::Expired,
        },
        Event::Granted {
            session: SessionId(1),
            owner: 2,
            request_id: 3,
            name: "l".to_string(),
            mode: LockMode::Shared,
            token: Token(4),
            lease_ms: Some(1_000),
            waited: true,
        },
        Event::Queued {
            session: SessionId(1),
            owner: 2,
            request_id: 3,
            name: "l".to_string(),
            mode: LockMode::Exclusive,
            wait_ms: 5,
        },
        Event::WaitCancelled {
            session: SessionId(1),
            owner: 2,
            request_id: 3,
            name: "l".to_string(),
            why: WaitEnd::SessionEnded(SessionEnd::Closed),
        },
        Event::Released {
            session: SessionId(1),
            owner: 2,
            name: "l".to_string(),
            token: Token(4),
            why: HoldEnd::LeaseExpired,
        },
        Event::LockDelayStarted {
            name: "l".to_string(),
            token: Token(4),
            delay_ms: 100,
        },
        Event::LockDelayEnded {
            name: "l".to_string(),
            token: Token(4),
        },
        Event::LockFreed {
            name: "l".to_string(),
        },
    ];
    for e in &events {
        round_trip(e);
    }
}

fn requests() -> Vec<Request> {
    commands()
        .into_iter()
        .zip(
            [0, 1, 250, 251, 65_535, 65_536, u32::MAX as u64, u64::MAX]
                .into_iter()
                .cycle(),
        )
        .map(|(command, now)| Request { now, command })
        .collect()
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &T) -> Vec<u8> {
    let bytes = encode(value).expect("encodes");
    assert_eq!(bytes[0], FORMAT_VERSION);
    let back: T = decode(&bytes).expect("decodes");
    assert_eq!(&back, value);
    bytes
}

// ---------------------------------------------------------------- round trips

#[test]
fn requests_round_trip() {
    for r in requests() {
        round_trip(&r);
    }
}

#[test]
fn commands_round_trip() {
    for c in commands() {
        round_trip(&c);
    }
}

#[test]
fn queries_round_trip() {
    for q in queries() {
        round_trip(&q);
    }
}

#[test]
fn outcomes_round_trip() {
    for o in outcomes() {
        round_trip(&o);
    }
}

#[test]
fn command_results_round_trip() {
    for r in results() {
        round_trip(&r);
    }
}

#[test]
fn large_values_round_trip() {
    let r = Request {
        now: 3,
        command: Command::Put {
            key: vec![1; latchkey_core::limits::MAX_KEY_LEN],
            value: vec![2; latchkey_core::limits::MAX_VALUE_LEN],
        },
    };
    round_trip(&r);
}

/// The log and snapshots outlive builds: a change of these bytes is a format
/// change and must come with a new [`FORMAT_VERSION`] (the leading byte; 12
/// since sessions carry a name and forced releases).
#[test]
fn format_is_frozen() {
    let bytes = encode(&Request {
        now: 1,
        command: Command::Put {
            key: b("k"),
            value: b("v"),
        },
    })
    .expect("encodes");
    assert_eq!(bytes, [12, 1, 0, 1, b'k', 1, b'v']);
    let bytes = encode(&Ok::<_, CommandError>(Outcome::Sequence {
        start: 0,
        end: 300,
    }))
    .expect("encodes");
    // Ok, variant 6, 0, varint 300 (0xfb + u16 little-endian).
    assert_eq!(bytes, [12, 0, 6, 0, 0xfb, 0x2c, 0x01]);
    // Lock commands come after every KV command: Command variant 8, then
    // LockCommand variant 0 (OpenSession), ttl 3000, then the secret's 16
    // bytes as they are, then the name.
    let bytes = encode(&Request {
        now: 1,
        command: Command::Lock(LockCommand::OpenSession {
            ttl_ms: 3_000,
            secret: SessionSecret([0xaa; 16]),
            name: String::new(),
        }),
    })
    .expect("encodes");
    let mut expected = vec![12, 1, 8, 0, 0xfb, 0xb8, 0x0b];
    expected.extend([0xaa; 16]);
    // Then the name: an empty string.
    expected.push(0);
    assert_eq!(bytes, expected);
    // Lock errors come after the KV errors: CommandError variant 2 is
    // UnknownSession.
    let bytes = encode(&Err::<Outcome, _>(CommandError::UnknownSession {
        session: SessionId(5),
    }))
    .expect("encodes");
    assert_eq!(bytes, [12, 1, 2, 5]);
    // KeyAbsent was appended after every other error: variant 23.
    let bytes = encode(&Err::<Outcome, _>(CommandError::KeyAbsent {
        key: "k".to_string(),
    }))
    .expect("encodes");
    assert_eq!(bytes, [12, 1, 23, 1, b'k']);
    // A compare-and-put by revision: Command variant 2, key, then the test
    // (Test variant 2, Revision: RevisionField variant 1 = Mod, Compare
    // variant 0 = Equal, varint 41), then the value.
    let bytes = encode(&Request {
        now: 1,
        command: Command::CompareAndPut {
            key: b("k"),
            test: Test::mod_revision_is(41),
            value: b("v"),
        },
    })
    .expect("encodes");
    assert_eq!(bytes, [12, 1, 2, 1, b'k', 2, 1, 0, 41, 1, b'v']);
    // A batch (Command variant 6) whose conditions are (key, test) structs:
    // "a" ValueIs(None) (Test variant 0, None), "b" Exists(true) (Test
    // variant 1, true), "c" Version Greater 300 (Test variant 2, field 2,
    // compare 3, varint 300), then one put.
    let bytes = encode(&Request {
        now: 1,
        command: Command::Batch {
            conditions: vec![
                Condition::value_is("a", None),
                Condition::new("b", Test::Exists(true)),
                Condition::new(
                    "c",
                    Test::Revision {
                        field: RevisionField::Version,
                        compare: Compare::Greater,
                        value: 300,
                    },
                ),
            ],
            ops: vec![BatchOp::Put {
                key: b("a"),
                value: b("1"),
            }],
        },
    })
    .expect("encodes");
    assert_eq!(
        bytes,
        [
            12, 1, 6, // version, now, Batch
            3, // three conditions
            1, b'a', 0, 0, // "a": ValueIs(None)
            1, b'b', 1, 1, // "b": Exists(true)
            1, b'c', 2, 2, 3, 0xfb, 0x2c, 0x01, // "c": Revision { Version, Greater, 300 }
            1, 0, 1, b'a', 1, b'1', // one op: Put "a" = "1"
        ]
    );
    // Reads carry the key's revisions: Ok, Outcome variant 7 (Value),
    // Some(Versioned { value "v", create 1, mod 2, version 3 }), revision 2.
    let bytes = encode(&Ok::<_, CommandError>(Outcome::Value {
        value: Some(Versioned {
            value: b("v"),
            create_revision: 1,
            mod_revision: 2,
            version: 3,
        }),
        revision: 2,
    }))
    .expect("encodes");
    assert_eq!(bytes, [12, 0, 7, 1, 1, b'v', 1, 2, 3, 2]);
    // A write's outcome carries the revision after it: Ok, Outcome variant 1
    // (Written; 0 is Done, the answer to an entry no client proposed),
    // revision 251 (0xfb + u16).
    let bytes =
        encode(&Ok::<_, CommandError>(Outcome::Written { revision: 251 })).expect("encodes");
    assert_eq!(bytes, [12, 0, 1, 0xfb, 0xfb, 0x00]);
    // A put bound to a session was appended after every other command:
    // variant 12, key, value, session 9, then the secret's 16 bytes.
    let bytes = encode(&Request {
        now: 1,
        command: Command::PutBound {
            key: b("k"),
            value: b("v"),
            session: SessionId(9),
            secret: SessionSecret([0xbb; 16]),
        },
    })
    .expect("encodes");
    let mut expected = vec![12, 1, 12, 1, b'k', 1, b'v', 9];
    expected.extend([0xbb; 16]);
    assert_eq!(bytes, expected);
    // TooManySessionKeys was appended after KeyAbsent: variant 24.
    let bytes = encode(&Err::<Outcome, _>(CommandError::TooManySessionKeys {
        session: SessionId(9),
        max: 1_000,
    }))
    .expect("encodes");
    assert_eq!(bytes, [12, 1, 24, 9, 0xfb, 0xe8, 0x03]);
    // A retry-safe write was appended after the bound put: variant 13,
    // session 9, the secret's 16 bytes, request id 3, then the write.
    let bytes = encode(&Request {
        now: 1,
        command: Command::Once {
            session: SessionId(9),
            secret: SessionSecret([0xcc; 16]),
            request_id: 3,
            command: Box::new(Command::Delete { key: b("k") }),
        },
    })
    .expect("encodes");
    let mut expected = vec![12, 1, 13, 9];
    expected.extend([0xcc; 16]);
    expected.extend([3, 4, 1, b'k']);
    assert_eq!(bytes, expected);
    // Countdown checkpoints were appended after ReleaseAll: Command variant
    // 8 (Lock), LockCommand variant 14, one session (3, 1200 as 0xfb +
    // u16), one lease ("l", token 4, 0 left).
    let bytes = encode(&Request {
        now: 1,
        command: Command::Lock(LockCommand::Checkpoint {
            sessions: vec![SessionLeft {
                session: SessionId(3),
                left_ms: 1_200,
            }],
            leases: vec![LeaseLeft {
                name: "l".to_string(),
                token: Token(4),
                left_ms: 0,
            }],
        }),
    })
    .expect("encodes");
    assert_eq!(
        bytes,
        [12, 1, 8, 14, 1, 3, 0xfb, 0xb0, 0x04, 1, 1, b'l', 4, 0]
    );
}

// ---------------------------------------------------------------- refusals

#[test]
fn empty_input_is_refused() {
    assert_eq!(decode::<Request>(&[]), Err(CodecError::Empty));
    assert_eq!(decode::<CommandResult>(&[]), Err(CodecError::Empty));
}

#[test]
fn unknown_version_is_refused() {
    let mut bytes = encode(&requests()[0]).expect("encodes");
    for version in [0u8, 2, FORMAT_VERSION.wrapping_add(1), 0xff] {
        if version == FORMAT_VERSION {
            continue;
        }
        bytes[0] = version;
        assert_eq!(decode::<Request>(&bytes), Err(CodecError::Version(version)));
    }
    assert_eq!(decode::<Query>(&[0]), Err(CodecError::Version(0)));
}

#[test]
fn trailing_bytes_are_refused() {
    for r in requests() {
        let mut bytes = encode(&r).expect("encodes");
        bytes.push(0);
        assert!(
            matches!(decode::<Request>(&bytes), Err(CodecError::Decode(_))),
            "{r:?}"
        );
    }
    let mut bytes = encode(&Outcome::Written { revision: 1 }).expect("encodes");
    bytes.extend_from_slice(b"junk");
    let err = decode::<Outcome>(&bytes).expect_err("trailing bytes");
    assert_eq!(err, CodecError::Decode("4 trailing bytes".to_string()));
}

#[test]
fn truncated_input_is_refused() {
    for r in requests() {
        let bytes = encode(&r).expect("encodes");
        for cut in 1..bytes.len() {
            assert!(
                matches!(decode::<Request>(&bytes[..cut]), Err(CodecError::Decode(_))),
                "{r:?} cut at {cut}"
            );
        }
    }
}

#[test]
fn garbage_is_refused() {
    let cases: &[&[u8]] = &[
        &[FORMAT_VERSION],
        // now = 0, then a Command variant that does not exist.
        &[FORMAT_VERSION, 0, 9],
        // now = 0, Command::Lock with no lock command after it.
        &[FORMAT_VERSION, 0, 8],
        // now = 0, Command::Lock with a lock command that does not exist.
        &[FORMAT_VERSION, 0, 8, 9],
        &[FORMAT_VERSION, 0, 200],
        // A varint marker with nothing after it.
        &[FORMAT_VERSION, 0xfd],
        // An invalid varint marker (0xff is reserved).
        &[FORMAT_VERSION, 0xff, 0, 0, 1, b'k', 1, b'v'],
        // CompareAndPut, Test::ValueIs with an Option tag of 2.
        &[FORMAT_VERSION, 0, 2, 1, b'k', 0, 2, 1, b'v'],
        // CompareAndPut with a Test variant that does not exist.
        &[FORMAT_VERSION, 0, 2, 1, b'k', 3, 1, b'v'],
        // CompareAndPut, Test::Exists with a bool of 2.
        &[FORMAT_VERSION, 0, 2, 1, b'k', 1, 2, 1, b'v'],
        // CompareAndPut, Test::Revision with a RevisionField that does not
        // exist, then one with a Compare that does not exist.
        &[FORMAT_VERSION, 0, 2, 1, b'k', 2, 3, 0, 1, 1, b'v'],
        &[FORMAT_VERSION, 0, 2, 1, b'k', 2, 0, 4, 1, 1, b'v'],
    ];
    for bytes in cases {
        assert!(
            matches!(decode::<Request>(bytes), Err(CodecError::Decode(_))),
            "{bytes:?}"
        );
    }
    // A bool that is neither 0 nor 1: Swapped { succeeded: 2, .. }.
    assert!(decode::<Outcome>(&[FORMAT_VERSION, 2, 2, 0]).is_err());
    // An error message that is not UTF-8.
    assert!(decode::<CommandResult>(&[FORMAT_VERSION, 1, 0, 2, 0xc3, 0x28]).is_err());
    // Text is not a request.
    assert!(decode::<Request>(b"\x01hello, world").is_err());
    // Bytes of one type are not another.
    let q = encode(&Query::Get { key: b("k") }).expect("encodes");
    assert!(decode::<Request>(&q).is_err());
}

#[test]
fn allocation_probe_sees_large_allocations() {
    let (v, largest) = largest_allocation(|| std::hint::black_box(vec![1u8; 8 << 20]));
    assert_eq!(v.len(), 8 << 20);
    assert!(largest >= 8 << 20, "probe saw only {largest} bytes");
}

/// Inputs that claim an enormous collection: decoding fails at once without
/// allocating anywhere near the claim.
#[test]
fn huge_length_prefix_is_refused_without_allocating() {
    let mut cases: Vec<Vec<u8>> = Vec::new();
    // Request { now: 0, Put { key: <claimed length> ... } }
    for claim in [
        vec![0xfc, 0x00, 0x00, 0x80, 0x0c], // u32: 200 MiB, under the decode limit
        vec![0xfc, 0xff, 0xff, 0xff, 0xff], // u32::MAX
        vec![0xfd, 0, 0, 0, 0, 0, 1, 0, 0], // u64: 2^48
        vec![0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], // u64::MAX
    ] {
        let mut bytes = vec![FORMAT_VERSION, 0, 0];
        bytes.extend_from_slice(&claim);
        bytes.extend_from_slice(b"abc");
        cases.push(bytes);
    }
    for (i, bytes) in cases.iter().enumerate() {
        let (result, largest) = largest_allocation(|| decode::<Request>(bytes));
        assert!(result.is_err(), "case {i}: {result:?}");
        assert!(largest < 4 << 20, "case {i}: allocated {largest} bytes");
    }

    // The same for collections of collections: MultiGet { keys } and Entries.
    let multi_get = [
        FORMAT_VERSION,
        1,
        0xfd,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0xff,
        0x0f,
        1,
        b'a',
    ];
    let (result, largest) = largest_allocation(|| decode::<Query>(&multi_get));
    assert!(result.is_err(), "{result:?}");
    assert!(largest < 4 << 20, "allocated {largest} bytes");
    let entries = [
        FORMAT_VERSION,
        0,
        8,
        0xfc,
        0xff,
        0xff,
        0xff,
        0x7f,
        1,
        b'a',
        1,
        b'b',
    ];
    let (result, largest) = largest_allocation(|| decode::<CommandResult>(&entries));
    assert!(result.is_err(), "{result:?}");
    assert!(largest < 4 << 20, "allocated {largest} bytes");
}

// ---------------------------------------------------------------- properties

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..12)
}

fn arb_command() -> impl Strategy<Value = Command> {
    let condition = (bytes(), arb_test()).prop_map(|(key, test)| Condition { key, test });
    let op = prop_oneof![
        (bytes(), bytes()).prop_map(|(key, value)| BatchOp::Put { key, value }),
        bytes().prop_map(|key| BatchOp::Delete { key }),
    ];
    prop_oneof![
        (bytes(), bytes()).prop_map(|(key, value)| Command::Put { key, value }),
        (bytes(), bytes()).prop_map(|(key, value)| Command::PutIfAbsent { key, value }),
        (bytes(), arb_test(), bytes()).prop_map(|(key, test, value)| Command::CompareAndPut {
            key,
            test,
            value
        }),
        (bytes(), bytes()).prop_map(|(key, value)| Command::GetAndPut { key, value }),
        bytes().prop_map(|key| Command::Delete { key }),
        (bytes(), bytes()).prop_map(|(start, end)| Command::DeleteRange { start, end }),
        (
            prop::collection::vec(condition, 0..4),
            prop::collection::vec(op, 0..4)
        )
            .prop_map(|(conditions, ops)| Command::Batch { conditions, ops }),
        (bytes(), any::<u64>()).prop_map(|(key, step)| Command::NextSequence { key, step }),
        arb_lock_command().prop_map(Command::Lock),
    ]
}

fn arb_test() -> impl Strategy<Value = Test> {
    strategies::key_test(bytes(), any::<u64>())
}

fn arb_versioned() -> impl Strategy<Value = Versioned> {
    (bytes(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(value, create_revision, mod_revision, version)| Versioned {
            value,
            create_revision,
            mod_revision,
            version,
        },
    )
}

fn arb_mode() -> impl Strategy<Value = LockMode> {
    prop_oneof![Just(LockMode::Exclusive), Just(LockMode::Shared)]
}

fn arb_lock_command() -> impl Strategy<Value = LockCommand> {
    let session = any::<u64>().prop_map(SessionId);
    let token = any::<u64>().prop_map(Token);
    let name = ".{0,8}";
    let opt = || prop::option::of(any::<u64>());
    prop_oneof![
        (any::<u64>(), name).prop_map(|(ttl_ms, name)| LockCommand::OpenSession {
            ttl_ms,
            secret: SessionSecret::default(),
            name: name.to_string(),
        }),
        session
            .clone()
            .prop_map(|session| LockCommand::CloseSession {
                session,
                secret: SessionSecret::default()
            }),
        session
            .clone()
            .prop_map(|session| LockCommand::ExpireSession { session }),
        session
            .clone()
            .prop_map(|session| LockCommand::EndSession { session }),
        (name, token.clone()).prop_map(|(name, token)| LockCommand::ForceRelease { name, token }),
        (
            session.clone(),
            any::<u64>(),
            any::<u64>(),
            name,
            arb_mode(),
            opt(),
            opt(),
            opt()
        )
            .prop_map(
                |(session, owner, request_id, name, mode, wait_ms, lease_ms, lock_delay_ms)| {
                    LockCommand::Acquire {
                        session,
                        secret: SessionSecret::default(),
                        owner,
                        request_id,
                        name,
                        mode,
                        wait_ms,
                        lease_ms,
                        lock_delay_ms,
                        value: Vec::new(),
                        permits: None,
                    }
                }
            ),
        (
            session.clone(),
            any::<u64>(),
            any::<u64>(),
            name,
            token.clone()
        )
            .prop_map(
                |(session, owner, request_id, name, token)| LockCommand::Release {
                    session,
                    secret: SessionSecret::default(),
                    owner,
                    request_id,
                    name,
                    token,
                }
            ),
        (session.clone(), any::<u64>(), name, any::<u64>()).prop_map(
            |(session, owner, name, request_id)| LockCommand::CancelWait {
                session,
                secret: SessionSecret::default(),
                owner,
                name,
                request_id,
            }
        ),
        (name, token.clone())
            .prop_map(|(name, token)| LockCommand::ExpireLockLease { name, token }),
        (name, token.clone()).prop_map(|(name, token)| LockCommand::EndLockDelay { name, token }),
        (
            name,
            arb_mode(),
            token,
            session,
            prop::collection::vec((bytes(), bytes()), 0..3)
        )
            .prop_map(|(name, mode, token, session, puts)| LockCommand::Fenced {
                sequencer: Sequencer {
                    name,
                    mode,
                    token,
                    session,
                },
                secret: SessionSecret([3; 16]),
                conditions: vec![],
                ops: puts
                    .into_iter()
                    .map(|(key, value)| BatchOp::Put { key, value })
                    .collect(),
            }),
    ]
}

fn arb_query() -> impl Strategy<Value = Query> {
    prop_oneof![
        bytes().prop_map(|key| Query::Get { key }),
        prop::collection::vec(bytes(), 0..4).prop_map(|keys| Query::MultiGet { keys }),
        (
            bytes(),
            prop::option::of(bytes()),
            bytes(),
            any::<u32>(),
            any::<bool>()
        )
            .prop_map(|(start, end, prefix, limit, reverse)| {
                Query::Scan(ScanRange {
                    start,
                    end,
                    prefix,
                    limit,
                    reverse,
                })
            }),
    ]
}

fn arb_result() -> impl Strategy<Value = CommandResult> {
    let outcome = prop_oneof![
        any::<u64>().prop_map(|revision| Outcome::Written { revision }),
        (prop::option::of(bytes()), any::<u64>())
            .prop_map(|(previous, revision)| Outcome::Previous { previous, revision }),
        (
            any::<bool>(),
            prop::option::of(arb_versioned()),
            any::<u64>()
        )
            .prop_map(|(succeeded, current, revision)| Outcome::Swapped {
                succeeded,
                current,
                revision
            }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(count, revision)| Outcome::Deleted { count, revision }),
        (prop::option::of(any::<u32>()), any::<u64>()).prop_map(|(failed_condition, revision)| {
            Outcome::Batch {
                failed_condition,
                revision,
            }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(start, end)| Outcome::Sequence { start, end }),
        (prop::option::of(arb_versioned()), any::<u64>())
            .prop_map(|(value, revision)| Outcome::Value { value, revision }),
        (
            prop::collection::vec(prop::option::of(arb_versioned()), 0..4),
            any::<u64>()
        )
            .prop_map(|(values, revision)| Outcome::Values { values, revision }),
        (
            prop::collection::vec((bytes(), arb_versioned()), 0..4),
            any::<bool>(),
            any::<u64>()
        )
            .prop_map(|(entries, more, revision)| Outcome::Entries {
                entries,
                more,
                revision
            }),
    ];
    prop_oneof![
        4 => outcome.prop_map(Ok),
        1 => ".{0,12}".prop_map(|m| Err(CommandError::InvalidArgument(m))),
        1 => (".{0,12}", any::<u64>())
            .prop_map(|(key, step)| Err(CommandError::SequenceExhausted { key, step })),
        1 => ".{0,12}".prop_map(|key| Err(CommandError::KeyAbsent { key })),
    ]
}

/// Decode `bytes` as `T`; whatever it gives, it must not panic, and a value it
/// accepts must survive its own round trip.
fn decode_is_total<T: Serialize + DeserializeOwned + PartialEq + Debug>(
    bytes: &[u8],
) -> Result<(), TestCaseError> {
    if let Ok(value) = decode::<T>(bytes) {
        let again = encode(&value).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(decode::<T>(&again).ok(), Some(value));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_requests_round_trip(now in any::<u64>(), command in arb_command()) {
        let request = Request { now, command };
        let bytes = encode(&request).expect("encodes");
        prop_assert_eq!(decode::<Request>(&bytes), Ok(request));
        // Every strict prefix is refused, and so is any extension.
        for cut in 0..bytes.len() {
            prop_assert!(decode::<Request>(&bytes[..cut]).is_err());
        }
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert!(decode::<Request>(&longer).is_err());
    }

    #[test]
    fn arbitrary_queries_round_trip(q in arb_query()) {
        let bytes = encode(&q).expect("encodes");
        prop_assert_eq!(decode::<Query>(&bytes), Ok(q));
    }

    #[test]
    fn arbitrary_results_round_trip(r in arb_result()) {
        let bytes = encode(&r).expect("encodes");
        prop_assert_eq!(decode::<CommandResult>(&bytes), Ok(r));
    }

    /// Arbitrary bytes never make decode panic; with a wrong version byte they
    /// are always refused as such.
    #[test]
    fn decoding_arbitrary_bytes_never_panics(
        body in prop::collection::vec(any::<u8>(), 0..64),
        version in prop_oneof![3 => Just(FORMAT_VERSION), 1 => any::<u8>()],
    ) {
        let mut bytes = vec![version];
        bytes.extend_from_slice(&body);
        if version != FORMAT_VERSION {
            prop_assert_eq!(decode::<Request>(&bytes), Err(CodecError::Version(version)));
        }
        decode_is_total::<Request>(&bytes)?;
        decode_is_total::<Command>(&bytes)?;
        decode_is_total::<Query>(&bytes)?;
        decode_is_total::<Outcome>(&bytes)?;
        decode_is_total::<CommandResult>(&bytes)?;
    }

    /// Corrupting one byte of a valid entry either fails to decode or decodes
    /// to some value; it never panics.
    #[test]
    fn corrupted_entries_never_panic(
        now in any::<u64>(),
        command in arb_command(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut bytes = encode(&Request { now, command }).expect("encodes");
        let i = at.index(bytes.len() - 1) + 1; // keep the version byte
        bytes[i] = byte;
        decode_is_total::<Request>(&bytes)?;
    }
}

/// Byte-string fields are (de)serialized as one block for speed; the bytes
/// on disk and on the wire must stay exactly those of a plain `Vec<u8>`.
#[test]
fn byte_fields_encode_like_plain_vectors() {
    /// The first variants of `Command`, with derived byte fields.
    #[derive(Serialize)]
    #[allow(dead_code)]
    enum Plain {
        Put {
            key: Vec<u8>,
            value: Vec<u8>,
        },
        PutIfAbsent {
            key: Vec<u8>,
            value: Vec<u8>,
        },
        CompareAndPut {
            key: Vec<u8>,
            test: PlainTest,
            value: Vec<u8>,
        },
    }
    /// The first variant of `Test`, with a derived byte field.
    #[derive(Serialize)]
    enum PlainTest {
        ValueIs(Option<Vec<u8>>),
    }
    /// `Versioned`, with a derived byte field.
    #[derive(Serialize)]
    struct PlainVersioned {
        value: Vec<u8>,
        create_revision: u64,
        mod_revision: u64,
        version: u64,
    }
    /// The first variants of `Outcome` up to `Value`.
    #[derive(Serialize)]
    #[allow(dead_code)]
    enum PlainOutcome {
        Done,
        Written {},
        Previous {},
        Swapped {},
        Deleted {},
        Batch {},
        Sequence {},
        Value {
            value: Option<PlainVersioned>,
            revision: u64,
        },
    }
    let value: Vec<u8> = (0..=255u8).cycle().take(300).collect();
    for expected in [None, Some(Vec::new()), Some(vec![7u8; 200])] {
        let fast = Command::CompareAndPut {
            key: b"k".to_vec(),
            test: Test::ValueIs(expected.clone()),
            value: value.clone(),
        };
        let plain = Plain::CompareAndPut {
            key: b"k".to_vec(),
            test: PlainTest::ValueIs(expected),
            value: value.clone(),
        };
        let encoded = encode(&fast).expect("encodes");
        assert_eq!(encoded, encode(&plain).expect("encodes"));
        let back: Command = decode(&encoded).expect("decodes");
        assert_eq!(back, fast);
    }
    let got = Outcome::Value {
        value: Some(Versioned {
            value: value.clone(),
            create_revision: 1,
            mod_revision: 300,
            version: 70_000,
        }),
        revision: 301,
    };
    let plain = PlainOutcome::Value {
        value: Some(PlainVersioned {
            value: value.clone(),
            create_revision: 1,
            mod_revision: 300,
            version: 70_000,
        }),
        revision: 301,
    };
    let encoded = encode(&got).expect("encodes");
    assert_eq!(encoded, encode(&plain).expect("encodes"));
    let back: Outcome = decode(&encoded).expect("decodes");
    assert_eq!(back, got);
}
