//! A recorder for the checkers' unit tests: its own clock, every event
//! 10 ns after the previous, and one-line helpers for the workloads' calls.

use super::ops::{acquire, gate_write, kv_write, observed, permit, permit_write};
use super::{History, HistoryBuilder, Op};

/// Builds a test history event by event.
pub(crate) struct Rec {
    b: HistoryBuilder,
    t: u64,
}

impl Rec {
    pub(crate) fn new() -> Rec {
        Rec {
            b: HistoryBuilder::new(),
            t: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.t += 10;
        self.t
    }

    pub(crate) fn invoke(&mut self, p: u64, op: Op) -> u64 {
        let t = self.tick();
        self.b.invoke(p, t, op)
    }

    pub(crate) fn ok(&mut self, p: u64, op: Op) -> u64 {
        let t = self.tick();
        self.b.ok(p, t, op)
    }

    pub(crate) fn unknown(&mut self, p: u64, op: Op) -> u64 {
        let t = self.tick();
        self.b.unknown(p, t, op)
    }

    /// A lock acquire that is granted `token`.
    pub(crate) fn grant(&mut self, p: u64, resource: &str, holder: &str, token: u64) {
        self.invoke(p, acquire(resource, holder, None));
        self.ok(p, acquire(resource, holder, Some(token)));
    }

    /// A gate write, accepted or refused.
    pub(crate) fn gate(
        &mut self,
        p: u64,
        resource: &str,
        holder: &str,
        token: u64,
        accepted: bool,
    ) {
        self.invoke(p, gate_write(resource, holder, token, None));
        self.ok(p, gate_write(resource, holder, token, Some(accepted)));
    }

    /// A fenced KV write, accepted or refused.
    pub(crate) fn kv(&mut self, p: u64, resource: &str, holder: &str, token: u64, accepted: bool) {
        self.invoke(p, kv_write(resource, "data", holder, token, None));
        self.ok(p, kv_write(resource, "data", holder, token, Some(accepted)));
    }

    /// A permit of `semaphore` (of `permits`) granted with `token`.
    pub(crate) fn permit(&mut self, p: u64, semaphore: &str, permits: u32, token: u64) {
        let holder = format!("c{p}");
        self.invoke(p, permit(semaphore, permits, &holder, None));
        self.ok(p, permit(semaphore, permits, &holder, Some(token)));
    }

    /// A write fenced by the permit `token`, accepted or refused.
    pub(crate) fn permit_write(&mut self, p: u64, semaphore: &str, token: u64, accepted: bool) {
        let holder = format!("c{p}");
        self.invoke(p, permit_write(semaphore, "data", &holder, token, None));
        self.ok(
            p,
            permit_write(semaphore, "data", &holder, token, Some(accepted)),
        );
    }

    /// Observer `p` is told that `term` leads `election`.
    pub(crate) fn observed(&mut self, p: u64, election: &str, term: Option<u64>, skipped: bool) {
        self.ok(p, observed(election, term, skipped));
    }

    pub(crate) fn build(self) -> History {
        match self.b.build() {
            Ok(h) => h,
            Err(e) => panic!("a malformed test history: {e}"),
        }
    }
}
