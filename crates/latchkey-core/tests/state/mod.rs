//! A core state machine driven by whole commands, for the election and
//! semaphore tests: a store, the leader time each command carries (one
//! more each time) and a request-id counter. Each test file adds the
//! helpers it needs in its own `impl Cluster`; the shared ones here are
//! not all used by every file.

#![allow(dead_code)]

use latchkey_core::lock::{Event, LockCommand, LockOutcome, SessionSecret};
use latchkey_core::{
    apply, apply_with_events, Command, CommandError, CommandResult, MemStore, Outcome, Request,
};

/// Session `id`'s secret in these tests.
pub fn secret(id: u64) -> SessionSecret {
    SessionSecret([id as u8; 16])
}

pub struct Cluster {
    pub store: MemStore,
    pub now: u64,
    pub next_request: u64,
}

impl Cluster {
    pub fn new() -> Self {
        Cluster {
            store: MemStore::default(),
            now: 1,
            next_request: 1,
        }
    }

    /// Apply `command` at the next leader time.
    pub fn run(&mut self, command: Command) -> CommandResult {
        self.now += 1;
        let request = Request {
            now: self.now,
            command,
        };
        apply(&mut self.store, &request).expect("MemStore never fails")
    }

    /// Apply a lock command; its lock outcome or refusal.
    pub fn lock(&mut self, command: LockCommand) -> Result<LockOutcome, CommandError> {
        match self.run(Command::Lock(command))? {
            Outcome::Lock(o) => Ok(o),
            other => panic!("not a lock outcome: {other:?}"),
        }
    }

    /// Apply `command` at the next leader time, with its events.
    pub fn step(&mut self, command: Command) -> (CommandResult, Vec<Event>) {
        self.now += 1;
        let request = Request {
            now: self.now,
            command,
        };
        apply_with_events(&mut self.store, &request).expect("MemStore never fails")
    }

    /// Apply a lock command, expecting success; its outcome and events.
    pub fn succeed(&mut self, command: LockCommand) -> (LockOutcome, Vec<Event>) {
        let shown = format!("{command:?}");
        match self.step(Command::Lock(command)) {
            (Ok(Outcome::Lock(o)), events) => (o, events),
            (other, _) => panic!("{shown}: unexpected {other:?}"),
        }
    }

    /// Apply a lock command expecting a refusal that writes nothing and
    /// reports no event.
    pub fn refused(&mut self, command: LockCommand) -> CommandError {
        let before = self.store.clone();
        let (result, events) = self.step(Command::Lock(command));
        assert!(events.is_empty(), "a refusal reported {events:?}");
        assert_eq!(self.store, before, "a refusal wrote something");
        result.expect_err("a refusal")
    }
}
