//! The leader's countdowns: one deadline per live session, lock lease,
//! lock-delay and queued acquire, on the leader's monotonic clock.
//!
//! The table only decides *when* to propose an expiry; the state machine
//! decides what the expiry does, and refuses or ignores an expiry whose
//! target is gone. A spurious deadline is therefore harmless, a missing one
//! is not: every rule below errs towards keeping a countdown.
//!
//! `record` builds the leader's countdown checkpoints from this table.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use latchkey_core::lock::{
    HoldEnd, LockCommand, SessionEnd, SessionId, SessionSecret, TimerState, Token, WaitEnd,
};
use latchkey_core::Event;

use super::checkpoints::{lagging_after, record_every, MIN_RECORD_EVERY, RECORD_SESSIONS_EVERY};

mod record;

/// What a countdown expires.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TimerKey {
    /// A session's TTL: no keep-alive arrived in time.
    Session(SessionId),
    /// The lease (maximum hold time) of one grant.
    Lease { name: String, token: Token },
    /// A lock-delay, guarded by the token of the grant that caused it.
    Delay { name: String, token: Token },
    /// A queued acquire's wait.
    Wait {
        session: SessionId,
        owner: u64,
        name: String,
        request_id: u64,
    },
    /// When to record how long a session has left (see `checkpoints`).
    RecordSession(SessionId),
    /// When to record how long a grant's lease has left.
    RecordLease { name: String, token: Token },
}

impl TimerKey {
    /// The countdown of a queued acquire.
    fn wait(session: SessionId, owner: u64, name: &str, request_id: u64) -> TimerKey {
        TimerKey::Wait {
            session,
            owner,
            name: name.to_string(),
            request_id,
        }
    }

    /// The leader's command that ends what this countdown guards; `None`
    /// for a countdown to a checkpoint (see [`Timers::checkpoint`]).
    pub(crate) fn expiry(&self) -> Option<LockCommand> {
        Some(match self {
            TimerKey::Session(session) => LockCommand::ExpireSession { session: *session },
            TimerKey::Lease { name, token } => LockCommand::ExpireLockLease {
                name: name.clone(),
                token: *token,
            },
            TimerKey::Delay { name, token } => LockCommand::EndLockDelay {
                name: name.clone(),
                token: *token,
            },
            TimerKey::Wait {
                session,
                owner,
                name,
                request_id,
            } => LockCommand::ExpireWait {
                session: *session,
                owner: *owner,
                name: name.clone(),
                request_id: *request_id,
            },
            TimerKey::RecordSession(_) | TimerKey::RecordLease { .. } => return None,
        })
    }
}

/// Deadlines by key, and the same deadlines in time order.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    at: BTreeMap<TimerKey, Instant>,
    queue: BTreeSet<(Instant, TimerKey)>,
    /// The TTL and secret of every live session, for keep-alives.
    sessions: BTreeMap<SessionId, (Duration, SessionSecret)>,
    /// The full length of every lease counted down, for its checkpoints.
    leases: BTreeMap<(String, Token), Duration>,
    /// Where this table's record slots start (see [`Timers::set`]).
    slots_from: Option<Instant>,
    /// Sessions whose last record in the log (committed or proposed) holds
    /// less than their TTL: a keep-alive for one is answered only once a
    /// later record of it commits (see [`Timers::checkpoint`]).
    recorded: BTreeSet<SessionId>,
    /// When each grant made while this table leads began, for the
    /// hold-time histogram (grants made before are not here).
    granted: BTreeMap<(String, Token), Instant>,
    /// When each acquire queued while this table leads joined its queue,
    /// keyed by its wait countdown, for the acquire-wait histogram.
    queued: BTreeMap<TimerKey, Instant>,
    /// The acquire (session, owner, request id) of the last grant made
    /// without waiting. A multi-lock's acquire is granted every lock in
    /// one entry, as one `Granted` event per lock one after another: only
    /// the first counts as its wait (request ids are never reused within a
    /// session, so the same triple again is the same acquire).
    last_immediate: Option<(SessionId, u64, u64)>,
}

/// What an applied event tells the metrics (see [`Timers::apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observation {
    /// An acquire's wait ended (`outcome`: how, as the metric labels it:
    /// `granted`, `cancelled` or `session_ended`) after this long (zero
    /// for a grant without waiting).
    WaitEnded {
        outcome: &'static str,
        waited: Duration,
    },
    /// A hold ended (`end`: how, as the metric labels it) after this long.
    HoldEnded { end: &'static str, held: Duration },
}

/// `d` in whole milliseconds, rounded up: a record never holds less than
/// the leader counted.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1_000)).unwrap_or(u64::MAX)
}

/// The `end` label of `latchkey_lock_hold_seconds` for `why`.
fn hold_end(why: HoldEnd) -> &'static str {
    match why {
        HoldEnd::Released => "released",
        HoldEnd::SessionEnded(SessionEnd::Closed) => "session_closed",
        HoldEnd::SessionEnded(SessionEnd::Expired) => "session_expired",
        HoldEnd::SessionEnded(SessionEnd::Ended) => "session_ended_by_operator",
        HoldEnd::LeaseExpired => "lease_expired",
        HoldEnd::Forced => "forced_by_operator",
    }
}

/// What a keep-alive found in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeptAlive {
    /// The session's deadline is now at least `received + ttl`; `margin`
    /// is how much of the TTL was left when it arrived (at most the TTL;
    /// `None` if it had no countdown). `recorded`: the log holds less than
    /// the TTL for it, so the keep-alive may be answered only once a reset
    /// is committed (see [`Timers::checkpoint`]).
    Extended {
        ttl: Duration,
        margin: Option<Duration>,
        recorded: bool,
    },
    /// The keep-alive did not carry the session's secret: nothing changed.
    WrongSecret,
    /// The session is not counted down here.
    NotCounted,
}

impl Timers {
    /// Set `key` to fire at `deadline`, replacing an earlier setting. A
    /// countdown to a checkpoint is rounded up to the table's next record
    /// slot (see [`MIN_RECORD_EVERY`]), so that records due close together
    /// share one checkpoint: at most four a second, however many sessions
    /// and leases there are.
    pub(crate) fn set(&mut self, key: TimerKey, deadline: Instant) {
        let deadline = if key.expiry().is_none() {
            self.slot(deadline)
        } else {
            deadline
        };
        if let Some(old) = self.at.insert(key.clone(), deadline) {
            self.queue.remove(&(old, key.clone()));
        }
        self.queue.insert((deadline, key));
    }

    /// The first record slot at or after `at`: slots are
    /// [`MIN_RECORD_EVERY`] apart from the first one this table set.
    fn slot(&mut self, at: Instant) -> Instant {
        let origin = *self.slots_from.get_or_insert(at);
        let since = at.saturating_duration_since(origin).as_nanos();
        let every = MIN_RECORD_EVERY.as_nanos();
        let slots = since.div_ceil(every);
        let offset = u64::try_from(slots.saturating_mul(every)).unwrap_or(u64::MAX);
        origin + Duration::from_nanos(offset)
    }

    /// Stop the countdown of `key`, if any.
    pub(crate) fn remove(&mut self, key: &TimerKey) {
        if let Some(old) = self.at.remove(key) {
            self.queue.remove(&(old, key.clone()));
        }
    }

    /// When `key` fires, if it is counting down.
    pub(crate) fn deadline(&self, key: &TimerKey) -> Option<Instant> {
        self.at.get(key).copied()
    }

    /// Whether this table counts `session` down.
    pub(crate) fn counts(&self, session: SessionId) -> bool {
        self.sessions.contains_key(&session)
    }

    /// Start counting down `session` with `ttl` from `now`.
    pub(crate) fn open_session(
        &mut self,
        session: SessionId,
        ttl: Duration,
        secret: SessionSecret,
        now: Instant,
    ) {
        self.sessions.insert(session, (ttl, secret));
        self.set(TimerKey::Session(session), now + ttl);
        self.set(TimerKey::RecordSession(session), now + lagging_after(ttl));
    }

    /// Start counting down the lease of grant `token` of `name`: `full`
    /// long, of which `left` remain from `now`.
    fn start_lease(
        &mut self,
        name: &str,
        token: Token,
        full: Duration,
        left: Duration,
        now: Instant,
    ) {
        let id = (name.to_string(), token);
        self.leases.insert(id, full);
        self.set(
            TimerKey::Lease {
                name: name.to_string(),
                token,
            },
            now + left,
        );
        self.set(
            TimerKey::RecordLease {
                name: name.to_string(),
                token,
            },
            now + record_every(full),
        );
    }

    /// Stop counting down the lease of grant `token` of `name`.
    fn end_lease(&mut self, name: &str, token: Token) {
        self.leases.remove(&(name.to_string(), token));
        self.remove(&TimerKey::Lease {
            name: name.to_string(),
            token,
        });
        self.remove(&TimerKey::RecordLease {
            name: name.to_string(),
            token,
        });
    }

    /// A keep-alive for `session` carrying `secret`, received at
    /// `received`: if the secret is the session's, its deadline becomes
    /// `received + ttl` unless it is already later.
    pub(crate) fn keep_alive(
        &mut self,
        session: SessionId,
        secret: &SessionSecret,
        received: Instant,
    ) -> KeptAlive {
        let Some((ttl, own)) = self.sessions.get(&session).copied() else {
            return KeptAlive::NotCounted;
        };
        if !own.matches(secret) {
            return KeptAlive::WrongSecret;
        }
        let key = TimerKey::Session(session);
        let deadline = received + ttl;
        let old = self.deadline(&key);
        let margin = old.map(|d| d.saturating_duration_since(received).min(ttl));
        match old {
            Some(d) if d >= deadline => {}
            _ => self.set(key, deadline),
        }
        let recorded = self.recorded.contains(&session);
        if !recorded {
            let next = received + lagging_after(ttl);
            let record = TimerKey::RecordSession(session);
            if self.deadline(&record).is_none_or(|d| d < next) {
                self.set(record, next);
            }
        }
        KeptAlive::Extended {
            ttl,
            margin,
            recorded,
        }
    }

    /// The earliest deadline.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// Take every countdown due at `now`, earliest first.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<TimerKey> {
        let mut due = Vec::new();
        while let Some((at, _)) = self.queue.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.queue.pop_first() {
                self.at.remove(&key);
                due.push(key);
            }
        }
        due
    }

    /// Forget everything (leadership lost).
    pub(crate) fn clear(&mut self) {
        self.at.clear();
        self.queue.clear();
        self.sessions.clear();
        self.leases.clear();
        self.recorded.clear();
        self.slots_from = None;
        self.granted.clear();
        self.queued.clear();
        self.last_immediate = None;
    }

    /// How many countdowns run.
    pub(crate) fn len(&self) -> usize {
        self.at.len()
    }

    /// Take every expiry due at `now` (not the countdowns to checkpoints).
    #[cfg(test)]
    fn take_due_expiries(&mut self, now: Instant) -> Vec<TimerKey> {
        let mut due = self.take_due(now);
        due.retain(|k| k.expiry().is_some());
        due
    }

    /// How many grants and queued acquires are being timed.
    #[cfg(test)]
    fn timed(&self) -> (usize, usize) {
        (self.granted.len(), self.queued.len())
    }

    /// A new leader's table: every session and lease resumes from what
    /// the last leader recorded of it (its full length if nothing), every
    /// lock-delay and wait restarts at full length, all from `now`, and
    /// every session and lease is recorded [`record_every`] from now unless
    /// a keep-alive comes first. Failover lengthens a countdown (by the
    /// time since it was last recorded and the time without a leader),
    /// never shortens it.
    pub(crate) fn restart(&mut self, state: &TimerState, now: Instant) {
        self.clear();
        self.slots_from = Some(now);
        for s in &state.sessions {
            let ttl = Duration::from_millis(s.ttl_ms);
            self.sessions.insert(s.session, (ttl, s.secret));
            self.set(
                TimerKey::Session(s.session),
                now + Duration::from_millis(s.left_ms.min(s.ttl_ms)),
            );
            self.set(
                TimerKey::RecordSession(s.session),
                now + RECORD_SESSIONS_EVERY,
            );
            // Every session counts as recorded, not only those the state
            // says are: a record taken by the table before this one may
            // still be on its way to the log, unseen by the state read, and
            // the next keep-alive must be answered only after a reset that
            // lands behind it.
            self.recorded.insert(s.session);
        }
        for l in &state.leases {
            self.start_lease(
                &l.name,
                l.token,
                Duration::from_millis(l.lease_ms),
                Duration::from_millis(l.left_ms.min(l.lease_ms)),
                now,
            );
        }
        for d in &state.lock_delays {
            self.set(
                TimerKey::Delay {
                    name: d.name.clone(),
                    token: d.token,
                },
                now + Duration::from_millis(d.delay_ms),
            );
        }
        for w in &state.waits {
            self.set(
                TimerKey::wait(w.session, w.owner, &w.name, w.request_id),
                now + Duration::from_millis(w.wait_ms),
            );
        }
    }

    /// Follow one applied event, and say what it tells the metrics.
    /// Replaying events the table already reflects converges to the same
    /// set of countdowns (each key ends where its last event puts it),
    /// which is what lets a new leader replay the events that raced with
    /// its [`Timers::restart`]; it replays them with `timed` false, so that
    /// grants and queued acquires from before it led are not timed as if
    /// they began at `now`.
    pub(crate) fn apply(
        &mut self,
        event: &Event,
        now: Instant,
        timed: bool,
    ) -> Option<Observation> {
        let mut seen = None;
        match event {
            Event::SessionOpened {
                session,
                ttl_ms,
                secret,
            } => self.open_session(*session, Duration::from_millis(*ttl_ms), *secret, now),
            Event::SessionEnded { session, .. } => {
                self.sessions.remove(session);
                self.recorded.remove(session);
                self.remove(&TimerKey::Session(*session));
                self.remove(&TimerKey::RecordSession(*session));
            }
            Event::Granted {
                session,
                owner,
                request_id,
                name,
                token,
                lease_ms,
                waited,
                ..
            } => {
                if *waited {
                    let key = TimerKey::wait(*session, *owner, name, *request_id);
                    self.remove(&key);
                    if let Some(since) = self.queued.remove(&key) {
                        seen = Some(Observation::WaitEnded {
                            outcome: "granted",
                            waited: now.saturating_duration_since(since),
                        });
                    }
                } else if timed
                    && self.last_immediate.replace((*session, *owner, *request_id))
                        != Some((*session, *owner, *request_id))
                {
                    seen = Some(Observation::WaitEnded {
                        outcome: "granted",
                        waited: Duration::ZERO,
                    });
                }
                if timed {
                    self.granted.entry((name.clone(), *token)).or_insert(now);
                }
                if let Some(lease) = lease_ms {
                    let full = Duration::from_millis(*lease);
                    self.start_lease(name, *token, full, full, now);
                }
            }
            Event::Queued {
                session,
                owner,
                request_id,
                name,
                wait_ms,
                ..
            } => {
                let key = TimerKey::wait(*session, *owner, name, *request_id);
                if timed {
                    self.queued.entry(key.clone()).or_insert(now);
                }
                self.set(key, now + Duration::from_millis(*wait_ms));
            }
            Event::WaitCancelled {
                session,
                owner,
                request_id,
                name,
                why,
            } => {
                let key = TimerKey::wait(*session, *owner, name, *request_id);
                if let Some(since) = self.queued.remove(&key) {
                    seen = Some(Observation::WaitEnded {
                        outcome: match why {
                            WaitEnd::Cancelled => "cancelled",
                            WaitEnd::SessionEnded(_) => "session_ended",
                        },
                        waited: now.saturating_duration_since(since),
                    });
                }
                self.remove(&key);
            }
            Event::Released {
                name, token, why, ..
            } => {
                self.end_lease(name, *token);
                if let Some(since) = self.granted.remove(&(name.clone(), *token)) {
                    seen = Some(Observation::HoldEnded {
                        end: hold_end(*why),
                        held: now.saturating_duration_since(since),
                    });
                }
            }
            Event::LockDelayStarted {
                name,
                token,
                delay_ms,
            } => self.set(
                TimerKey::Delay {
                    name: name.clone(),
                    token: *token,
                },
                now + Duration::from_millis(*delay_ms),
            ),
            Event::LockDelayEnded { name, token } => self.remove(&TimerKey::Delay {
                name: name.clone(),
                token: *token,
            }),
            Event::LockFreed { .. } => {}
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_core::lock::{HoldEnd, LockMode, SessionEnd, SessionTimer, WaitTimer};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const SECRET: SessionSecret = SessionSecret([7; 16]);

    /// A multi-lock granted at once is one acquire: one wait observation,
    /// not one per lock; the next acquire counts again.
    #[test]
    fn a_multi_lock_granted_at_once_is_one_wait() {
        let mut t = Timers::default();
        let t0 = Instant::now();
        let s = SessionId(1);
        let granted = |name: &str, token: u64, request_id: u64| Event::Granted {
            session: s,
            owner: 1,
            request_id,
            name: name.into(),
            mode: LockMode::Exclusive,
            token: Token(token),
            lease_ms: None,
            waited: false,
        };
        let seen: Vec<_> = [granted("a", 1, 5), granted("b", 2, 5), granted("c", 3, 6)]
            .iter()
            .map(|e| t.apply(e, t0, true))
            .collect();
        let once = Some(Observation::WaitEnded {
            outcome: "granted",
            waited: Duration::ZERO,
        });
        assert_eq!(seen, vec![once, None, once]);
    }

    #[test]
    fn due_countdowns_come_out_in_time_order_once() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.open_session(SessionId(2), ms(300), SECRET, t0);
        t.open_session(SessionId(1), ms(100), SECRET, t0);
        assert_eq!(t.next_deadline(), Some(t0 + ms(100)));
        assert!(t.take_due_expiries(t0 + ms(50)).is_empty());
        assert_eq!(
            t.take_due_expiries(t0 + ms(300)),
            vec![
                TimerKey::Session(SessionId(1)),
                TimerKey::Session(SessionId(2))
            ]
        );
        assert!(t.take_due_expiries(t0 + ms(1000)).is_empty());
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn keep_alive_extends_never_shortens() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        assert_eq!(
            t.keep_alive(SessionId(1), &SECRET, t0),
            KeptAlive::NotCounted
        );
        t.open_session(SessionId(1), ms(100), SECRET, t0 + ms(50));
        assert_eq!(
            t.keep_alive(SessionId(1), &SECRET, t0),
            KeptAlive::Extended {
                ttl: ms(100),
                margin: Some(ms(100)),
                recorded: false,
            }
        );
        assert_eq!(
            t.deadline(&TimerKey::Session(SessionId(1))),
            Some(t0 + ms(150))
        );
        assert_eq!(
            t.keep_alive(SessionId(1), &SECRET, t0 + ms(80)),
            KeptAlive::Extended {
                ttl: ms(100),
                margin: Some(ms(70)),
                recorded: false,
            }
        );
        assert_eq!(
            t.deadline(&TimerKey::Session(SessionId(1))),
            Some(t0 + ms(180))
        );
        // Late: the deadline had passed (the countdown had not fired yet).
        assert_eq!(
            t.keep_alive(SessionId(1), &SECRET, t0 + ms(200)),
            KeptAlive::Extended {
                ttl: ms(100),
                margin: Some(ms(0)),
                recorded: false,
            }
        );
    }

    #[test]
    fn a_keep_alive_without_the_secret_changes_nothing() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.open_session(SessionId(1), ms(100), SECRET, t0);
        assert_eq!(
            t.keep_alive(SessionId(1), &SessionSecret([8; 16]), t0 + ms(90)),
            KeptAlive::WrongSecret
        );
        assert_eq!(
            t.deadline(&TimerKey::Session(SessionId(1))),
            Some(t0 + ms(100))
        );
    }

    #[test]
    fn events_start_and_stop_countdowns() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        let s = SessionId(4);
        t.apply(
            &Event::SessionOpened {
                session: s,
                ttl_ms: 5000,
                secret: SECRET,
            },
            t0,
            true,
        );
        t.apply(
            &Event::Queued {
                session: s,
                owner: 1,
                request_id: 9,
                name: "a".into(),
                mode: LockMode::Exclusive,
                wait_ms: 700,
            },
            t0,
            true,
        );
        let granted = t.apply(
            &Event::Granted {
                session: s,
                owner: 1,
                request_id: 9,
                name: "a".into(),
                mode: LockMode::Exclusive,
                token: Token(3),
                lease_ms: Some(2000),
                waited: true,
            },
            t0 + ms(30),
            true,
        );
        let lease = TimerKey::Lease {
            name: "a".into(),
            token: Token(3),
        };
        assert_eq!(t.deadline(&lease), Some(t0 + ms(2030)));
        assert_eq!(
            t.len(),
            4,
            "the wait ended with the grant: the session and the lease, each \
             with its countdown to a checkpoint"
        );
        assert_eq!(
            granted,
            Some(Observation::WaitEnded {
                outcome: "granted",
                waited: ms(30)
            })
        );
        let released = t.apply(
            &Event::Released {
                session: s,
                owner: 1,
                name: "a".into(),
                token: Token(3),
                why: HoldEnd::Released,
            },
            t0 + ms(530),
            true,
        );
        assert_eq!(
            released,
            Some(Observation::HoldEnded {
                end: "released",
                held: ms(500)
            })
        );
        t.apply(
            &Event::LockDelayStarted {
                name: "a".into(),
                token: Token(3),
                delay_ms: 10,
            },
            t0,
            true,
        );
        t.apply(
            &Event::SessionEnded {
                session: s,
                how: SessionEnd::Closed,
            },
            t0,
            true,
        );
        assert!(!t.counts(s));
        assert_eq!(
            t.take_due_expiries(t0 + ms(10)),
            vec![TimerKey::Delay {
                name: "a".into(),
                token: Token(3)
            }]
        );
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn restart_counts_everything_at_full_length() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        t.open_session(SessionId(99), ms(1), SECRET, t0);
        let state = TimerState {
            sessions: vec![SessionTimer {
                session: SessionId(1),
                ttl_ms: 3000,
                secret: SECRET,
                left_ms: 3000,
                forced: Default::default(),
            }],
            waits: vec![WaitTimer {
                session: SessionId(1),
                owner: 2,
                name: "q".into(),
                request_id: 5,
                wait_ms: 400,
            }],
            ..TimerState::default()
        };
        t.restart(&state, t0);
        assert!(!t.counts(SessionId(99)), "old table dropped");
        assert_eq!(
            t.take_due_expiries(t0 + ms(3000)).len(),
            2,
            "session and wait restarted from now"
        );
    }

    #[test]
    fn holds_and_waits_from_before_leading_are_not_timed() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        let grant = |request_id, token, waited| Event::Granted {
            session: SessionId(1),
            owner: 1,
            request_id,
            name: "a".into(),
            mode: LockMode::Shared,
            token: Token(token),
            lease_ms: None,
            waited,
        };
        let release = |token| Event::Released {
            session: SessionId(1),
            owner: 1,
            name: "a".into(),
            token: Token(token),
            why: HoldEnd::SessionEnded(SessionEnd::Expired),
        };
        // Replayed after a restart: not timed, and neither is its release.
        assert_eq!(t.apply(&grant(1, 1, false), t0, false), None);
        assert_eq!(t.apply(&release(1), t0 + ms(5), true), None);
        // A grant from a queue this table never saw: its wait is unknown.
        assert_eq!(t.apply(&grant(2, 2, true), t0, true), None);
        assert_eq!(
            t.apply(&release(2), t0 + ms(9), true),
            Some(Observation::HoldEnded {
                end: "session_expired",
                held: ms(9)
            })
        );
        // Granted at once: waited zero.
        assert_eq!(
            t.apply(&grant(3, 3, false), t0, true),
            Some(Observation::WaitEnded {
                outcome: "granted",
                waited: Duration::ZERO
            })
        );
        t.clear();
        assert_eq!(t.apply(&release(3), t0 + ms(1), true), None, "forgotten");

        // A wait that ends without a grant is timed too, and nothing timed
        // outlives its event.
        let queued = Event::Queued {
            session: SessionId(1),
            owner: 1,
            request_id: 4,
            name: "a".into(),
            mode: LockMode::Exclusive,
            wait_ms: 1000,
        };
        assert_eq!(t.apply(&queued, t0, true), None);
        assert!(t.apply(&grant(5, 5, false), t0, true).is_some());
        assert_eq!(t.timed(), (1, 1));
        assert_eq!(
            t.apply(
                &Event::WaitCancelled {
                    session: SessionId(1),
                    owner: 1,
                    request_id: 4,
                    name: "a".into(),
                    why: WaitEnd::SessionEnded(SessionEnd::Expired),
                },
                t0 + ms(7),
                true
            ),
            Some(Observation::WaitEnded {
                outcome: "session_ended",
                waited: ms(7)
            })
        );
        assert!(t.apply(&release(5), t0 + ms(8), true).is_some());
        assert_eq!(t.timed(), (0, 0));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn expiry_commands_name_their_target() {
        let key = TimerKey::Wait {
            session: SessionId(1),
            owner: 2,
            name: "n".into(),
            request_id: 3,
        };
        assert_eq!(
            key.expiry(),
            Some(LockCommand::ExpireWait {
                session: SessionId(1),
                owner: 2,
                name: "n".into(),
                request_id: 3
            })
        );
        assert_eq!(
            TimerKey::Session(SessionId(7))
                .expiry()
                .map(|c| c.proposer()),
            Some(latchkey_core::lock::Proposer::Leader)
        );
        assert_eq!(TimerKey::RecordSession(SessionId(7)).expiry(), None);
    }
}
