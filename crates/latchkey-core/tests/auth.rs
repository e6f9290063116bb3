//! Access control in the core: grants on prefixes decide, at apply time;
//! a refusal writes nothing; sessions belong to their user; the root user
//! and role; and a property test of the prefix rules against a model.

use latchkey_core::auth::{AuthCommand, Grant, Permission, ROOT};
use latchkey_core::lock::{LockCommand, LockOutcome, LockQuery, SessionId, SessionSecret, Token};
use latchkey_core::{apply, query, Command, CommandError, MemStore, Outcome, Query, Request, Test};
use proptest::prelude::*;

fn run(store: &mut MemStore, command: Command) -> Result<Outcome, CommandError> {
    apply(store, &Request { now: 1, command }).expect("the store works")
}

/// An admin change, as root (a user of that name exists in every test
/// store before anything else, so this works whether or not access
/// control is on).
fn admin(store: &mut MemStore, command: AuthCommand) {
    let command = Command::As {
        user: ROOT.into(),
        command: Box::new(Command::Auth(command)),
    };
    run(store, command).expect("an admin change");
}

fn as_user(user: &str, command: Command) -> Command {
    Command::As {
        user: user.into(),
        command: Box::new(command),
    }
}

fn put(key: &str) -> Command {
    Command::Put {
        key: key.into(),
        value: b"v".to_vec(),
    }
}

/// root, and `app` with role `r` granting `grants`, access control on.
fn store_with(grants: &[(Permission, &str)]) -> MemStore {
    let mut store = MemStore::default();
    run(
        &mut store,
        Command::Auth(AuthCommand::AddUser {
            name: ROOT.into(),
            password: Some("a stored hash".into()),
        }),
    )
    .expect("root");
    for name in ["app", "other"] {
        admin(
            &mut store,
            AuthCommand::AddUser {
                name: name.into(),
                password: None,
            },
        );
    }
    admin(&mut store, AuthCommand::AddRole { name: "r".into() });
    for (permission, prefix) in grants {
        admin(
            &mut store,
            AuthCommand::GrantPermission {
                role: "r".into(),
                grant: Grant {
                    permission: *permission,
                    prefix: prefix.as_bytes().to_vec(),
                },
            },
        );
    }
    for user in ["app", "other"] {
        admin(
            &mut store,
            AuthCommand::GrantRole {
                user: user.into(),
                role: "r".into(),
            },
        );
    }
    admin(&mut store, AuthCommand::Enable);
    store
}

fn is_denied(result: &Result<Outcome, CommandError>, permission: Permission) -> bool {
    matches!(result, Err(CommandError::PermissionDenied { permission: p, .. }) if *p == permission)
}

#[test]
fn grants_cover_keys_and_ranges_under_their_prefix_only() {
    let mut store = store_with(&[(Permission::Write, "jobs/"), (Permission::Read, "jobs/")]);
    assert!(run(&mut store, as_user("app", put("jobs/1"))).is_ok());
    assert!(is_denied(
        &run(&mut store, as_user("app", put("jobs"))),
        Permission::Write
    ));
    let range = |start: &str, end: &str| Command::DeleteRange {
        start: start.into(),
        end: end.into(),
    };
    // Inside the prefix, up to its end ("jobs0" is the first key after it).
    assert!(run(&mut store, as_user("app", range("jobs/", "jobs0"))).is_ok());
    assert!(is_denied(
        &run(&mut store, as_user("app", range("jobs/", "jobs1"))),
        Permission::Write
    ));
    // Compare-and-put reads as well as writes.
    let cas = Command::CompareAndPut {
        key: "jobs/2".into(),
        test: Test::ValueIs(None),
        value: b"v".to_vec(),
    };
    assert!(run(&mut store, as_user("app", cas)).is_ok());
    // An unknown user is refused; so is a command naming nobody.
    assert!(matches!(
        run(&mut store, as_user("nobody", put("jobs/3"))),
        Err(CommandError::PermissionDenied { .. })
    ));
    assert_eq!(
        run(&mut store, put("jobs/3")),
        Err(CommandError::AuthRequired)
    );
    // Root may do anything; the other users may not administer.
    assert!(run(&mut store, as_user(ROOT, put("billing/1"))).is_ok());
    let change = Command::Auth(AuthCommand::Disable);
    assert!(is_denied(
        &run(&mut store, as_user("app", change)),
        Permission::Admin
    ));
}

#[test]
fn reads_are_checked_too() {
    let store = store_with(&[(Permission::Read, "a/")]);
    let read = |user: &str, key: &str| {
        query(
            &store,
            &Query::As {
                user: user.into(),
                query: Box::new(Query::Get { key: key.into() }),
            },
        )
        .expect("the store works")
    };
    assert!(read("app", "a/1").is_ok());
    assert!(is_denied(&read("app", "b/1"), Permission::Read));
}

#[test]
fn a_refusal_writes_nothing() {
    let mut store = store_with(&[(Permission::Write, "jobs/")]);
    let before = store.clone();
    let refused = run(&mut store, as_user("app", put("billing/1")));
    assert!(refused.is_err());
    assert_eq!(store, before);
}

/// Open a session as `user` with `secret`; its id.
fn open_as(store: &mut MemStore, user: &str, secret: SessionSecret) -> SessionId {
    let opened = run(
        store,
        as_user(
            user,
            Command::Lock(LockCommand::OpenSession {
                ttl_ms: 10_000,
                secret,
                name: String::new(),
            }),
        ),
    );
    let Ok(Outcome::Lock(LockOutcome::SessionOpened { session, .. })) = opened else {
        panic!("not opened: {opened:?}");
    };
    session
}

#[test]
fn sessions_belong_to_the_user_who_opened_them() {
    let mut store = store_with(&[(Permission::Lock, "")]);
    let secret = SessionSecret([7; SessionSecret::LEN]);
    let session = open_as(&mut store, "app", secret);
    let close = Command::Lock(LockCommand::CloseSession { session, secret });
    // Another user with the secret is refused; the owner is not.
    assert!(is_denied(
        &run(&mut store, as_user("other", close.clone())),
        Permission::Lock
    ));
    assert!(run(&mut store, as_user("app", close)).is_ok());
    // The ended session's owner row is gone with it.
    assert!(!store.map.keys().any(|k| k.starts_with(b"Ao")));
}

#[test]
fn only_an_admin_ends_another_users_session() {
    let mut store = store_with(&[(Permission::Lock, "")]);
    let secret = SessionSecret([9; SessionSecret::LEN]);
    let session = open_as(&mut store, "app", secret);
    let end = Command::Lock(LockCommand::EndSession { session });
    // Owning the session is not enough: ending it is an operator's act.
    assert!(is_denied(
        &run(&mut store, as_user("app", end.clone())),
        Permission::Admin
    ));
    assert!(is_denied(
        &run(&mut store, as_user("other", end.clone())),
        Permission::Admin
    ));
    assert!(store.map.keys().any(|k| k.starts_with(b"Ao")));
    assert!(matches!(
        run(&mut store, as_user(ROOT, end)),
        Ok(Outcome::Lock(LockOutcome::SessionEnded { .. }))
    ));
    assert!(!store.map.keys().any(|k| k.starts_with(b"Ao")));
}

#[test]
fn only_an_admin_forces_a_release_or_lists_sessions() {
    let mut store = store_with(&[(Permission::Lock, "")]);
    let force = Command::Lock(LockCommand::ForceRelease {
        name: "jobs".into(),
        token: Token(1),
    });
    // A lock user may not, even on locks it may take.
    assert!(is_denied(
        &run(&mut store, as_user("app", force.clone())),
        Permission::Admin
    ));
    assert!(matches!(
        run(&mut store, as_user(ROOT, force)),
        Ok(Outcome::Lock(LockOutcome::ForceReleased { .. }))
    ));
    let list = |user: &str| {
        query(
            &store,
            &Query::As {
                user: user.into(),
                query: Box::new(Query::Lock(LockQuery::Sessions {
                    start_after: None,
                    limit: 0,
                })),
            },
        )
        .expect("the store works")
    };
    assert!(is_denied(&list("app"), Permission::Admin));
    assert!(matches!(
        list(ROOT),
        Ok(Outcome::Lock(LockOutcome::Sessions { .. }))
    ));
}

#[test]
fn a_writer_opens_a_session_for_retry_safe_writes_and_a_reader_cannot() {
    let mut store = store_with(&[(Permission::Write, "jobs/")]);
    let secret = SessionSecret([5; SessionSecret::LEN]);
    let open = Command::Lock(LockCommand::OpenSession {
        ttl_ms: 10_000,
        secret,
        name: String::new(),
    });
    let opened = run(&mut store, as_user("app", open.clone()));
    let Ok(Outcome::Lock(LockOutcome::SessionOpened { session, .. })) = opened else {
        panic!("a writer could not open a session: {opened:?}");
    };
    let once = |key: &str, request_id| Command::Once {
        session,
        secret,
        request_id,
        command: Box::new(put(key)),
    };
    assert!(run(&mut store, as_user("app", once("jobs/1", 1))).is_ok());
    // The write itself still needs its permission, and the session is the
    // opener's own.
    assert!(is_denied(
        &run(&mut store, as_user("app", once("billing/1", 2))),
        Permission::Write
    ));
    assert!(is_denied(
        &run(&mut store, as_user("other", once("jobs/2", 3))),
        Permission::Lock
    ));
    // With neither lock nor write permission, no session.
    let mut store = store_with(&[(Permission::Read, "")]);
    assert!(is_denied(
        &run(&mut store, as_user("app", open)),
        Permission::Lock
    ));
}

#[test]
fn only_root_makes_roots_and_unowned_sessions_are_roots() {
    let mut store = store_with(&[(Permission::Admin, ""), (Permission::Lock, "")]);
    let promote = Command::Auth(AuthCommand::GrantRole {
        user: "app".into(),
        role: ROOT.into(),
    });
    assert!(is_denied(
        &run(&mut store, as_user("app", promote)),
        Permission::Admin
    ));
    // A session opened while access control was off has no owner: while it
    // is on, only root acts for it.
    admin(&mut store, AuthCommand::Disable);
    let secret = SessionSecret([9; SessionSecret::LEN]);
    let open = Command::Lock(LockCommand::OpenSession {
        ttl_ms: 10_000,
        secret,
        name: String::new(),
    });
    let Ok(Outcome::Lock(LockOutcome::SessionOpened { session, .. })) = run(&mut store, open)
    else {
        panic!("not opened");
    };
    admin(&mut store, AuthCommand::Enable);
    let close = Command::Lock(LockCommand::CloseSession { session, secret });
    assert!(is_denied(
        &run(&mut store, as_user("app", close.clone())),
        Permission::Lock
    ));
    assert!(run(&mut store, as_user(ROOT, close)).is_ok());
}

#[test]
fn root_cannot_be_removed_or_demoted_while_enabled() {
    let mut store = store_with(&[]);
    let delete = Command::Auth(AuthCommand::DeleteUser { name: ROOT.into() });
    assert!(run(&mut store, as_user(ROOT, delete)).is_err());
    let demote = Command::Auth(AuthCommand::RevokeRole {
        user: ROOT.into(),
        role: ROOT.into(),
    });
    assert!(run(&mut store, as_user(ROOT, demote)).is_err());
}

/// The model: a key may be written iff some write grant's prefix is a
/// prefix of it.
fn model_allows(grants: &[Vec<u8>], key: &[u8]) -> bool {
    grants.iter().any(|p| key.starts_with(p))
}

proptest! {
    #[test]
    fn writes_follow_the_prefix_model(
        prefixes in prop::collection::vec(prop::collection::vec(b'a'..=b'c', 0..3), 0..4),
        keys in prop::collection::vec(prop::collection::vec(b'a'..=b'c', 1..4), 1..12),
    ) {
        let mut store = store_with(&[]);
        for prefix in &prefixes {
            admin(&mut store, AuthCommand::GrantPermission {
                role: "r".into(),
                grant: Grant { permission: Permission::Write, prefix: prefix.clone() },
            });
        }
        for key in keys {
            let before = store.clone();
            let result = run(&mut store, as_user("app", Command::Put { key: key.clone(), value: vec![1] }));
            if model_allows(&prefixes, &key) {
                prop_assert!(result.is_ok(), "{:?} refused under {:?}", key, prefixes);
            } else {
                prop_assert!(is_denied(&result, Permission::Write));
                prop_assert_eq!(&store, &before);
            }
        }
    }
}
