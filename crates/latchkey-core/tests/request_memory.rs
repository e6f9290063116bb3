//! Property test of a session's request memory at its bound
//! (`MAX_REMEMBERED_REQUESTS`): which request is forgotten, and when a retry
//! is answered, refused as too old, or judged afresh.
//!
//! The store keeps, in the session record, the remembered ids that fell
//! below `forgotten_below` (queued acquires), so that finding the request to
//! forget never steps over the deleted records of earlier ones. This test
//! runs random scripts at the bound and checks after every command that the
//! list is exactly the remembered ids below `forgotten_below`, and that
//! requests were forgotten at all.

use std::ops::Bound;

use latchkey_core::keyspace;
use latchkey_core::limits::MAX_REMEMBERED_REQUESTS;
use latchkey_core::lock::{LockCommand, LockMode, LockOutcome, SessionId, SessionSecret, Token};
use latchkey_core::{
    apply_with_events, codec, Command, CommandResult, MemStore, Outcome, Request, Store,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// The session record: ttl_ms, remembered, forgotten_below, kept_below,
/// secret, left_ms, name, forced_total, forced.
type Record = (
    u64,
    u32,
    u64,
    Vec<u64>,
    [u8; 16],
    Option<u64>,
    String,
    u64,
    Vec<u64>,
);

fn config(cases: u32) -> Config {
    fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
        std::env::var(name).ok().and_then(|s| s.parse().ok())
    }
    Config {
        cases: env("LATCHKEY_CASES").unwrap_or(cases),
        rng_seed: RngSeed::Fixed(env("LATCHKEY_SEED").unwrap_or(0x5eed_0d0e)),
        ..Config::default()
    }
}

#[derive(Default, Clone)]
struct Node {
    store: MemStore,
    now: u64,
}

impl Node {
    fn run(&mut self, command: &LockCommand) -> CommandResult {
        self.now += 1;
        let request = Request {
            now: self.now,
            command: Command::Lock(command.clone()),
        };
        apply_with_events(&mut self.store, &request)
            .expect("MemStore never fails")
            .0
    }

    fn all(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.store
            .scan(Bound::Unbounded, Bound::Unbounded, false, usize::MAX)
            .expect("MemStore never fails")
    }

    fn record(&self, session: SessionId) -> Record {
        let bytes = self
            .store
            .get(&keyspace::session_key(session.0))
            .expect("MemStore never fails")
            .expect("the session is live");
        codec::decode(&bytes).expect("a session record")
    }

    fn remembered_ids(&self, session: SessionId) -> Vec<u64> {
        let prefix = keyspace::requests_prefix(session.0);
        self.all()
            .into_iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .filter_map(|(k, _)| keyspace::read_u64(&k[prefix.len()..]))
            .collect()
    }
}

/// One step of a script, for session `A` unless said otherwise.
#[derive(Debug, Clone)]
enum Step {
    /// Acquire and release a free lock: two remembered requests.
    Cycle,
    /// Wait (shared or exclusive) on one of the locks session `H` holds.
    Wait { lock: usize, shared: bool },
    /// `H` releases its hold on a lock, granting waiters.
    HolderRelease { lock: usize },
    /// `H` takes a lock again (refused while others hold or wait).
    HolderTake { lock: usize },
    /// Cancel one of `A`'s earlier waits.
    Cancel { pick: usize },
    /// Send one of `A`'s earlier requests again.
    Retry { pick: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => Just(Step::Cycle),
        3 => (0..3usize, any::<bool>()).prop_map(|(lock, shared)| Step::Wait { lock, shared }),
        2 => (0..3usize).prop_map(|lock| Step::HolderRelease { lock }),
        2 => (0..3usize).prop_map(|lock| Step::HolderTake { lock }),
        1 => any::<usize>().prop_map(|pick| Step::Cancel { pick }),
        2 => any::<usize>().prop_map(|pick| Step::Retry { pick }),
    ]
}

const BUSY: [&str; 3] = ["busy-0", "busy-1", "busy-2"];

fn acquire(
    session: SessionId,
    owner: u64,
    rid: u64,
    name: &str,
    mode: LockMode,
    wait: bool,
) -> LockCommand {
    LockCommand::Acquire {
        session,
        secret: SessionSecret::default(),
        owner,
        request_id: rid,
        name: name.to_string(),
        mode,
        wait_ms: wait.then_some(60_000),
        lease_ms: None,
        lock_delay_ms: None,
        value: Vec::new(),
        permits: None,
    }
}

fn granted_token(result: &CommandResult) -> Option<Token> {
    match result {
        Ok(Outcome::Lock(LockOutcome::Granted { sequencer, .. })) => Some(sequencer.token),
        _ => None,
    }
}

fn open(n: &mut Node) -> SessionId {
    match n.run(&LockCommand::OpenSession {
        ttl_ms: 60_000,
        secret: SessionSecret::default(),
        name: String::new(),
    }) {
        Ok(Outcome::Lock(LockOutcome::SessionOpened { session, .. })) => session,
        other => panic!("open: {other:?}"),
    }
}

/// Run `steps` on a fresh store (see the module docs).
fn check(steps: &[Step]) -> Result<(), TestCaseError> {
    let mut plain = Node::default();
    let h = open(&mut plain);
    let a = open(&mut plain);
    let mut held: [Option<Token>; 3] = [None; 3];
    for (i, name) in BUSY.iter().enumerate() {
        held[i] = granted_token(&plain.run(&acquire(
            h,
            1,
            i as u64 + 1,
            name,
            LockMode::Exclusive,
            false,
        )));
    }
    let (mut rid, mut h_rid, mut owner) = (1u64, 100u64, 10u64);
    let mut sent: Vec<LockCommand> = Vec::new();
    let mut waits: Vec<(u64, u64, usize)> = Vec::new();

    // Fill the memory to its bound first, so every script runs at it.
    let mut script: Vec<Step> = vec![Step::Cycle; MAX_REMEMBERED_REQUESTS as usize / 2];
    script.extend_from_slice(steps);

    for (n, st) in script.iter().enumerate() {
        let mut commands: Vec<LockCommand> = Vec::new();
        match st {
            Step::Cycle => {
                commands.push(acquire(a, 2, rid, "free", LockMode::Exclusive, false));
                rid += 1;
            }
            Step::Wait { lock, shared } => {
                let mode = if *shared {
                    LockMode::Shared
                } else {
                    LockMode::Exclusive
                };
                owner += 1;
                waits.push((owner, rid, *lock));
                commands.push(acquire(a, owner, rid, BUSY[*lock], mode, true));
                rid += 1;
            }
            Step::HolderRelease { lock } => {
                if let Some(token) = held[*lock].take() {
                    commands.push(LockCommand::Release {
                        session: h,
                        secret: SessionSecret::default(),
                        owner: 1,
                        request_id: h_rid,
                        name: BUSY[*lock].to_string(),
                        token,
                    });
                    h_rid += 1;
                }
            }
            Step::HolderTake { lock } => {
                if held[*lock].is_none() {
                    commands.push(acquire(
                        h,
                        1,
                        h_rid,
                        BUSY[*lock],
                        LockMode::Exclusive,
                        false,
                    ));
                    h_rid += 1;
                }
            }
            Step::Cancel { pick } => {
                if !waits.is_empty() {
                    let (o, r, lock) = waits[pick % waits.len()];
                    commands.push(LockCommand::CancelWait {
                        session: a,
                        secret: SessionSecret::default(),
                        owner: o,
                        name: BUSY[lock].to_string(),
                        request_id: r,
                    });
                }
            }
            Step::Retry { pick } => {
                if !sent.is_empty() {
                    commands.push(sent[pick % sent.len()].clone());
                }
            }
        }
        let mut i = 0;
        while let Some(command) = commands.get(i).cloned() {
            i += 1;
            let want = plain.run(&command);
            if let LockCommand::Acquire { session, .. } | LockCommand::Release { session, .. } =
                &command
            {
                if *session == a {
                    sent.push(command.clone());
                }
            }
            match (&command, granted_token(&want)) {
                // A fresh grant of the free lock is released at once.
                (
                    LockCommand::Acquire {
                        name, request_id, ..
                    },
                    Some(token),
                ) if name == "free" && *request_id + 1 == rid => {
                    commands.push(LockCommand::Release {
                        session: a,
                        secret: SessionSecret::default(),
                        owner: 2,
                        request_id: rid,
                        name: "free".to_string(),
                        token,
                    });
                    rid += 1;
                }
                (LockCommand::Acquire { session, name, .. }, Some(token)) if *session == h => {
                    if let Some(l) = BUSY.iter().position(|b| b == name) {
                        held[l] = Some(token);
                    }
                }
                _ => {}
            }

            let pr = plain.record(a);
            // The list is exactly the remembered ids below forgotten_below.
            let below: Vec<u64> = plain
                .remembered_ids(a)
                .into_iter()
                .filter(|id| *id < pr.2)
                .collect();
            prop_assert_eq!(pr.3, below, "step {}", n);
        }
    }
    // The scripts did reach the bound and forget requests.
    prop_assert!(plain.record(a).2 > 0, "nothing was forgotten");
    Ok(())
}

proptest! {
    #![proptest_config(config(24))]

    #[test]
    fn the_kept_list_is_exactly_the_remembered_ids_below_the_bound(
        steps in proptest::collection::vec(step(), 50..400),
    ) {
        check(&steps)?;
    }
}
