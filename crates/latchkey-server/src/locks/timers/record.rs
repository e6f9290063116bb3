//! Building a countdown checkpoint from the leader's table (see
//! `crate::locks::checkpoints` for when, and the module docs of
//! `crate::locks` for why this is safe).

use std::collections::BTreeSet;
use std::time::Instant;

use latchkey_core::limits::MAX_CHECKPOINT_ITEMS;
use latchkey_core::lock::{LeaseLeft, LockCommand, SessionId, SessionLeft};

use super::{millis, TimerKey, Timers};
use crate::locks::checkpoints::{lagging_after, record_every, RECORD_SESSIONS_EVERY};

impl Timers {
    /// Count `session` as recorded with less than its TTL in the log.
    pub(crate) fn mark_recorded(&mut self, session: SessionId) {
        self.recorded.insert(session);
    }

    /// The checkpoint to propose at `now` for the countdowns to record in
    /// `due` (`RecordSession` and `RecordLease` keys) and the `resets`
    /// (recorded sessions with a keep-alive waiting), with every item it
    /// records; `None` if nothing is left to record. Takes at most
    /// [`MAX_CHECKPOINT_ITEMS`] items, resets first, removing them from
    /// the lists; the rest wait for the next one.
    ///
    /// Each countdown recorded is counted as recorded from now on and is
    /// recorded again after [`record_every`] of its full length; a reset
    /// records the whole TTL (the keep-alive just extended it) and is
    /// recorded next after [`lagging_after`], like any keep-alive. A reset
    /// session stays counted as recorded until [`Timers::reset_done`]: a
    /// keep-alive that arrives meanwhile waits for the next reset.
    ///
    /// Why this keeps the promise that no leader expires a session before
    /// its client's own deadline: a keep-alive is answered only after the
    /// log holds a record of its session proposed after it arrived (a
    /// reset, or a checkpoint taken from the deadline it extended), and
    /// one proposal is in flight at a time, so records reach the log in
    /// the order they were taken. A new leader resumes from the last
    /// record, which is at least what the old leader counted when it was
    /// taken, from a moment after it was taken.
    pub(crate) fn checkpoint(
        &mut self,
        due: &mut BTreeSet<TimerKey>,
        resets: &mut Vec<SessionId>,
        now: Instant,
    ) -> Option<(LockCommand, Vec<SessionId>)> {
        let mut sessions = Vec::new();
        let mut leases = Vec::new();
        let mut reset = Vec::new();
        let take = resets.len().min(MAX_CHECKPOINT_ITEMS);
        for session in resets.drain(..take) {
            let Some((ttl, _)) = self.sessions.get(&session).copied() else {
                continue;
            };
            sessions.push(SessionLeft {
                session,
                left_ms: millis(ttl),
            });
            self.set(TimerKey::RecordSession(session), now + lagging_after(ttl));
            due.remove(&TimerKey::RecordSession(session));
            reset.push(session);
        }
        while sessions.len() + leases.len() < MAX_CHECKPOINT_ITEMS {
            let Some(key) = due.pop_first() else { break };
            if self.deadline(&key).is_some() {
                // Set again since it fell due (a keep-alive came): not due.
                continue;
            }
            match key {
                TimerKey::RecordSession(session) => {
                    if !self.sessions.contains_key(&session) {
                        continue;
                    }
                    let Some(deadline) = self.deadline(&TimerKey::Session(session)) else {
                        continue;
                    };
                    sessions.push(SessionLeft {
                        session,
                        left_ms: millis(deadline.saturating_duration_since(now)),
                    });
                    self.recorded.insert(session);
                    self.set(
                        TimerKey::RecordSession(session),
                        now + RECORD_SESSIONS_EVERY,
                    );
                }
                TimerKey::RecordLease { name, token } => {
                    let Some(full) = self.leases.get(&(name.clone(), token)).copied() else {
                        continue;
                    };
                    let lease = TimerKey::Lease {
                        name: name.clone(),
                        token,
                    };
                    let Some(deadline) = self.deadline(&lease) else {
                        continue;
                    };
                    self.set(
                        TimerKey::RecordLease {
                            name: name.clone(),
                            token,
                        },
                        now + record_every(full),
                    );
                    leases.push(LeaseLeft {
                        name,
                        token,
                        left_ms: millis(deadline.saturating_duration_since(now)),
                    });
                }
                _ => {}
            }
        }
        if sessions.is_empty() && leases.is_empty() {
            return None;
        }
        Some((LockCommand::Checkpoint { sessions, leases }, reset))
    }

    /// The resets of `sessions` are committed: their records hold the
    /// whole TTL again (no later checkpoint can have recorded them since:
    /// the lock task proposes one checkpoint at a time).
    pub(crate) fn reset_done(&mut self, sessions: &[SessionId]) {
        for s in sessions {
            self.recorded.remove(s);
        }
    }
}
