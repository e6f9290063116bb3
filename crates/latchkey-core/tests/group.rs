//! [`Command::Group`]: the leader packs concurrent requests into one entry.
//! A group must be indistinguishable from its commands applied as entries of
//! their own with the same `now`: same results, same events, same store.

use latchkey_core::limits::MAX_GROUP_COMMANDS;
use latchkey_core::lock::{LockCommand, LockMode, SessionId, SessionSecret, Token};
use latchkey_core::{
    apply_with_events, validate_command, Command, CommandError, CommandResult, Event, MemStore,
    Outcome, Request,
};

fn open() -> Command {
    Command::Lock(LockCommand::OpenSession {
        ttl_ms: 10_000,
        secret: SessionSecret::default(),
        name: String::new(),
    })
}

fn acquire(session: u64, request_id: u64, wait: Option<u64>) -> Command {
    Command::Lock(LockCommand::Acquire {
        session: SessionId(session),
        secret: SessionSecret::default(),
        owner: 1,
        request_id,
        name: "jobs".into(),
        mode: LockMode::Exclusive,
        wait_ms: wait,
        lease_ms: None,
        lock_delay_ms: None,
        value: Vec::new(),
        permits: None,
    })
}

fn release(session: u64, request_id: u64, token: u64) -> Command {
    Command::Lock(LockCommand::Release {
        session: SessionId(session),
        secret: SessionSecret::default(),
        owner: 1,
        request_id,
        name: "jobs".into(),
        token: Token(token),
    })
}

fn put(key: &str, value: &str) -> Command {
    Command::Put {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

/// Apply `commands` one entry each, all stamped `now`.
fn one_by_one(
    store: &mut MemStore,
    now: u64,
    commands: &[Command],
) -> (Vec<CommandResult>, Vec<Event>) {
    let mut results = Vec::new();
    let mut events = Vec::new();
    for command in commands {
        let request = Request {
            now,
            command: command.clone(),
        };
        let (r, mut e) = apply_with_events(store, &request).expect("MemStore never fails");
        results.push(r);
        events.append(&mut e);
    }
    (results, events)
}

/// Apply `commands` as one group entry stamped `now`.
fn grouped(
    store: &mut MemStore,
    now: u64,
    commands: &[Command],
) -> (Vec<CommandResult>, Vec<Event>) {
    let request = Request {
        now,
        command: Command::Group {
            commands: commands.to_vec(),
        },
    };
    match apply_with_events(store, &request).expect("MemStore never fails") {
        (Ok(Outcome::Group(results)), events) => (results, events),
        other => panic!("a group answered {other:?}"),
    }
}

#[test]
fn a_group_is_its_commands_applied_one_by_one() {
    // Each round mixes grants, queued waits, a hand-off, refusals (a release
    // with a stale token, an invalid key, a session that does not exist) and
    // plain writes.
    let rounds: Vec<(u64, Vec<Command>)> = vec![
        (10, vec![open(), open(), put("a", "1")]),
        (
            20,
            vec![
                acquire(1, 1, Some(5_000)),
                acquire(2, 1, Some(5_000)),
                release(1, 2, 99),
                put("", "empty key is refused"),
                acquire(9, 1, None),
                put("b", "2"),
            ],
        ),
        (
            15,
            vec![release(1, 2, 1), acquire(1, 3, None), put("a", "3")],
        ),
        (30, vec![]),
    ];
    let mut separate = MemStore::default();
    let mut together = MemStore::default();
    for (now, commands) in rounds {
        let want = one_by_one(&mut separate, now, &commands);
        let got = grouped(&mut together, now, &commands);
        assert_eq!(got, want, "results and events at now={now}");
        assert_eq!(together, separate, "store after now={now}");
    }
    // The rounds did exercise refusals next to successes.
    let (results, _) = grouped(&mut together, 40, &[release(2, 9, 12345), put("c", "4")]);
    assert!(results[0].is_err(), "{results:?}");
    // Puts of "a", "b", "a" made revisions 1 to 3; this one makes 4.
    assert_eq!(results[1], Ok(Outcome::Written { revision: 4 }));
}

#[test]
fn a_refused_command_in_a_group_writes_nothing_and_spares_the_others() {
    let mut store = MemStore::default();
    grouped(&mut store, 1, &[open(), acquire(1, 1, None)]);
    let before = store.clone();
    // The stale release is refused; the put next to it is applied.
    let (results, events) = grouped(&mut store, 2, &[release(1, 2, 7)]);
    assert!(results[0].is_err());
    assert!(events.is_empty());
    assert_eq!(
        store, before,
        "a refused command alone in a group wrote something"
    );
    let (results, _) = grouped(&mut store, 3, &[release(1, 3, 7), put("k", "v")]);
    assert!(results[0].is_err());
    // Lock commands raise no revision: the put is the first change of a key.
    assert_eq!(results[1], Ok(Outcome::Written { revision: 1 }));
}

#[test]
fn groups_do_not_nest_and_have_a_size_limit() {
    let nested = Command::Group {
        commands: vec![Command::Group { commands: vec![] }],
    };
    assert!(matches!(
        validate_command(&nested),
        Err(CommandError::InvalidArgument(_))
    ));
    let mut store = MemStore::default();
    let request = Request {
        now: 1,
        command: nested,
    };
    let (result, events) = apply_with_events(&mut store, &request).expect("MemStore never fails");
    assert!(matches!(result, Err(CommandError::InvalidArgument(_))));
    assert!(events.is_empty());
    assert_eq!(store, MemStore::default());

    let too_many = Command::Group {
        commands: vec![put("k", "v"); MAX_GROUP_COMMANDS + 1],
    };
    assert!(validate_command(&too_many).is_err());
    let most = Command::Group {
        commands: vec![put("k", "v"); MAX_GROUP_COMMANDS],
    };
    assert!(validate_command(&most).is_ok());
}
