//! A core state machine driven by whole commands, for the election and
//! semaphore tests: a store, the leader time each command carries (one
//! more each time) and a request-id counter. Each test file adds the
//! helpers it needs in its own `impl Cluster`.

use latchkey_core::lock::{LockCommand, LockOutcome, SessionSecret};
use latchkey_core::{apply, Command, CommandError, CommandResult, MemStore, Outcome, Request};

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
}
