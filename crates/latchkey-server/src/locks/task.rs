//! The lock task of one replica (see the module docs of `crate::locks`):
//! it follows applied entries, wakes waiters, and on the leader runs the
//! countdowns and answers keep-alives. It reaches its replica only through
//! [`LockHost`].

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_core::limits::MAX_CHECKPOINT_ITEMS;
use latchkey_core::lock::{LockOutcome, SessionId, SessionInfo, TimerState};
use latchkey_core::{CommandError, CommandResult, Event, Outcome};
use latchkey_proto::ReplicaFailure;
use latchkey_storage::StateChange;
use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;
use tokio::sync::{mpsc, oneshot};

use super::host::LockHost;
use super::shared::{CountdownAsk, KeepAlive, LockInbox};
use super::timers::{KeptAlive, Observation, TimerKey, Timers};

/// Pause before proposing an expiry again after a failed proposal.
const RETRY_EXPIRY: Duration = Duration::from_millis(200);
/// Pause before a new leader tries again to read its timer state.
const RETRY_BUILD: Duration = Duration::from_millis(200);

enum Role {
    Follower,
    /// Leader of `term`, reading its timer state; events and keep-alives
    /// that arrive meanwhile wait here.
    Building {
        term: u64,
        /// When this replica saw itself lead: the countdowns resume from
        /// here (see `Timers::restart`).
        since: Instant,
        events: Vec<Event>,
        keep_alives: Vec<KeepAlive>,
    },
    Leader {
        term: u64,
    },
}

enum Internal {
    Built {
        term: u64,
        state: Result<TimerState, String>,
    },
    /// A leadership confirmation round begun in `epoch` ended.
    Confirmed {
        epoch: u64,
        batch: Vec<(KeepAlive, Duration)>,
        result: Result<(), ReplicaFailure>,
    },
    RetryExpiry {
        term: u64,
        key: TimerKey,
    },
    /// A checkpoint proposed in `epoch` is committed or failed; `resets`:
    /// the keep-alives it answers, `reset`: their sessions.
    Recorded {
        epoch: u64,
        resets: Vec<(KeepAlive, Duration)>,
        reset: Vec<SessionId>,
        result: Result<CommandResult, ReplicaFailure>,
    },
    Rebuild {
        term: u64,
    },
}

struct Task<H> {
    replica: Arc<H>,
    role: Role,
    /// Counts the tables this task has built and dropped: a round begun
    /// for one table (a confirmation, a checkpoint) vouches for nothing in
    /// the next, whose countdowns were read afresh from the state.
    epoch: u64,
    timers: Timers,
    /// Sessions whose `ExpireSession` is proposed: keep-alives for them are
    /// refused, even before the expiry is applied.
    expiring: BTreeSet<SessionId>,
    pending: Vec<(KeepAlive, Duration)>,
    confirming: bool,
    /// Countdowns due to be recorded in the next checkpoint.
    due_records: BTreeSet<TimerKey>,
    /// Keep-alives of recorded sessions, answered once a checkpoint that
    /// resets their session commits.
    resets: Vec<(KeepAlive, Duration)>,
    /// Whether a checkpoint is in flight (one at a time: records must
    /// reach the log in the order they were taken).
    recording: bool,
    internal: mpsc::UnboundedSender<Internal>,
}

/// Run the lock task of the replica `replica` hosts it on until `stop` fires or the state machine
/// goes away.
pub(crate) async fn run<H: LockHost>(
    replica: Arc<H>,
    mut changes: mpsc::UnboundedReceiver<StateChange>,
    inbox: LockInbox,
    mut stop: oneshot::Receiver<()>,
) {
    let LockInbox {
        mut keep_alives,
        mut countdowns,
    } = inbox;
    let (internal, mut internal_rx) = mpsc::unbounded_channel();
    // Server metrics change with the vote, state and leader only, not with
    // every applied entry.
    let mut metrics = replica.server_metrics();
    let mut task = Task {
        replica,
        role: Role::Follower,
        epoch: 0,
        timers: Timers::default(),
        expiring: BTreeSet::new(),
        pending: Vec::new(),
        confirming: false,
        due_records: BTreeSet::new(),
        resets: Vec::new(),
        recording: false,
        internal,
    };
    task.on_metrics(&metrics.borrow_and_update().clone());
    loop {
        let next = match task.role {
            Role::Leader { .. } => task.timers.next_deadline(),
            _ => None,
        };
        let far = Instant::now() + Duration::from_secs(3600);
        let sleep = tokio::time::sleep_until(next.unwrap_or(far).into());
        tokio::select! {
            biased;
            _ = &mut stop => break,
            // Applied entries first: a keep-alive or timer must never be
            // judged on a table that misses an entry applied before it.
            change = changes.recv() => match change {
                Some(c) => task.on_change(c),
                None => break,
            },
            // Leadership changes before the lock task's own results: a
            // round's answer must be judged against the role it is for.
            changed = metrics.changed() => {
                if changed.is_err() { break }
                let m = metrics.borrow_and_update().clone();
                task.on_metrics(&m);
            }
            msg = internal_rx.recv() => {
                if let Some(m) = msg { task.on_internal(m) }
            }
            ka = keep_alives.recv() => match ka {
                Some(ka) => task.on_keep_alive(ka, true),
                None => break,
            },
            ask = countdowns.recv() => match ask {
                Some(ask) => task.on_countdown_ask(ask),
                None => break,
            },
            _ = sleep, if next.is_some() => task.fire_due(),
        }
    }
    tracing::debug!("lock task stopped");
}

fn session_ended(session: SessionId) -> Result<CommandResult, ReplicaFailure> {
    Ok(Err(CommandError::SessionEnded { session }))
}

fn wrong_secret(session: SessionId) -> Result<CommandResult, ReplicaFailure> {
    Ok(Err(CommandError::WrongSessionSecret { session }))
}

impl<H: LockHost> Task<H> {
    fn leader_term(&self) -> Option<u64> {
        match self.role {
            Role::Leader { term } => Some(term),
            _ => None,
        }
    }

    fn on_change(&mut self, change: StateChange) {
        match change {
            StateChange::Applied { events, .. } => {
                let now = Instant::now();
                self.replica.shared().waiters.on_entry(&events);
                for event in events {
                    if let Event::SessionEnded { session, .. } = &event {
                        self.expiring.remove(session);
                    }
                    match &mut self.role {
                        Role::Leader { .. } => match self.timers.apply(&event, now, true) {
                            Some(Observation::WaitEnded { outcome, waited }) => {
                                self.replica.metrics().wait_ended(outcome, waited);
                            }
                            Some(Observation::HoldEnded { end, held }) => {
                                self.replica.metrics().hold_ended(end, held);
                            }
                            None => {}
                        },
                        Role::Building { events, .. } => events.push(event),
                        Role::Follower => {}
                    }
                }
            }
            StateChange::SnapshotInstalled { .. } => {
                self.replica.shared().waiters.wake_all_unknown();
                if let Some(term) = self.leader_term() {
                    self.start_building(term);
                }
            }
        }
    }

    fn on_metrics(
        &mut self,
        m: &openraft::metrics::RaftServerMetrics<latchkey_storage::TypeConfig>,
    ) {
        let leading = m.state == ServerState::Leader && m.current_leader == Some(m.id);
        let current = m.vote.leader_id.term;
        match (&self.role, leading) {
            (Role::Leader { term } | Role::Building { term, .. }, true) if *term == current => {}
            (_, true) => self.start_building(current),
            (Role::Follower, false) => {}
            (_, false) => self.step_down(),
        }
    }

    fn step_down(&mut self) {
        tracing::info!(
            countdowns = self.timers.len(),
            "no longer leader: dropping lock countdowns"
        );
        let old = std::mem::replace(&mut self.role, Role::Follower);
        self.epoch += 1;
        self.timers.clear();
        self.expiring.clear();
        // Clients waiting here ask again (at the new leader): a deposed
        // leader cut off from the cluster would not see their grants.
        self.replica.shared().waiters.wake_all_unknown();
        let leader = self.replica.leader();
        if let Role::Building { keep_alives, .. } = old {
            for ka in keep_alives {
                let _ = ka.reply.send(Err(ReplicaFailure::NotLeader {
                    leader: leader.clone(),
                }));
            }
        }
        self.due_records.clear();
        for (ka, _) in self.pending.drain(..).chain(self.resets.drain(..)) {
            let _ = ka.reply.send(Err(ReplicaFailure::NotLeader {
                leader: leader.clone(),
            }));
        }
    }

    /// Become leader of `term`: read the timer state once everything
    /// committed before this term is applied, then resume every countdown.
    /// Keep-alives not answered yet are judged again on the new table
    /// (their receipt time is kept): the extensions the old table gave them
    /// are not in the state the new one is read from.
    fn start_building(&mut self, term: u64) {
        let mut keep_alives = match std::mem::replace(&mut self.role, Role::Follower) {
            Role::Building { keep_alives, .. } => keep_alives,
            _ => Vec::new(),
        };
        keep_alives.extend(
            self.pending
                .drain(..)
                .chain(self.resets.drain(..))
                .map(|(ka, _)| ka),
        );
        self.epoch += 1;
        self.role = Role::Building {
            term,
            since: Instant::now(),
            events: Vec::new(),
            keep_alives,
        };
        self.timers.clear();
        self.expiring.clear();
        self.due_records.clear();
        let replica = self.replica.clone();
        let internal = self.internal.clone();
        tokio::spawn(async move {
            let state = replica.timer_state().await;
            let _ = internal.send(Internal::Built { term, state });
        });
    }

    fn on_internal(&mut self, msg: Internal) {
        match msg {
            Internal::Built { term, state } => self.on_built(term, state),
            Internal::Confirmed {
                epoch,
                batch,
                result,
            } => {
                self.confirming = false;
                self.answer_kept(epoch, batch, &result);
                self.confirm_pending();
            }
            Internal::RetryExpiry { term, key } => {
                let ended = match &key {
                    TimerKey::Session(s) => !self.timers.counts(*s),
                    _ => false,
                };
                if ended {
                    // Its end was applied meanwhile.
                    if let TimerKey::Session(s) = &key {
                        self.expiring.remove(s);
                    }
                } else if self.leader_term() == Some(term) {
                    self.timers.set(key, Instant::now() + RETRY_EXPIRY);
                }
            }
            Internal::Recorded {
                epoch,
                resets,
                reset,
                result,
            } => self.on_recorded(epoch, resets, &reset, result),
            Internal::Rebuild { term } => {
                if matches!(self.role, Role::Building { term: t, .. } if t == term) {
                    self.start_building(term);
                }
            }
        }
    }

    /// Answer keep-alives once the round that vouches for them (a
    /// leadership confirmation or a committed reset, begun in `epoch` after
    /// they arrived) ended with `result`. If the table was rebuilt since,
    /// they are judged again on the new one instead.
    fn answer_kept(
        &mut self,
        epoch: u64,
        kept: Vec<(KeepAlive, Duration)>,
        result: &Result<(), ReplicaFailure>,
    ) {
        if epoch != self.epoch && !matches!(self.role, Role::Follower) {
            for (ka, _) in kept {
                self.on_keep_alive(ka, false);
            }
            return;
        }
        let still = epoch == self.epoch && self.leader_term().is_some();
        for (ka, ttl) in kept {
            let gone = self.expiring.contains(&ka.session) || !self.timers.counts(ka.session);
            let answer = match (result, still) {
                (Ok(()), true) if gone => session_ended(ka.session),
                (Ok(()), true) => self.kept_alive(ka.session, ttl),
                (Err(f), _) => Err(f.clone()),
                (Ok(()), false) => Err(ReplicaFailure::NotLeader {
                    leader: self.replica.leader(),
                }),
            };
            let _ = ka.reply.send(answer);
        }
    }

    /// The answer to a keep-alive of `session` (of `ttl`) that is vouched
    /// for: with the grants operators force-released, read from the state
    /// now (it holds every entry applied before this answer), so the
    /// client learns of a forced release at its first keep-alive after it.
    fn kept_alive(
        &self,
        session: SessionId,
        ttl: Duration,
    ) -> Result<CommandResult, ReplicaFailure> {
        let forced = match self.replica.local_session(session) {
            Ok(Some(s)) => s.forced,
            Ok(None) => return session_ended(session),
            Err(f) => return Err(f),
        };
        Ok(Ok(Outcome::Lock(LockOutcome::Session(Some(SessionInfo {
            session,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            forced,
        })))))
    }

    /// A checkpoint of `term` ended: answer the keep-alives it reset, and
    /// take the next one.
    fn on_recorded(
        &mut self,
        epoch: u64,
        resets: Vec<(KeepAlive, Duration)>,
        reset: &[SessionId],
        result: Result<CommandResult, ReplicaFailure>,
    ) {
        self.recording = false;
        let result = match result {
            Ok(Ok(_)) => {
                if epoch == self.epoch && self.leader_term().is_some() {
                    self.timers.reset_done(reset);
                }
                Ok(())
            }
            Ok(Err(e)) => {
                // The core never refuses a checkpoint the leader built; if
                // it does, the records stay as they were, and the
                // keep-alives fail as unavailable (their clients retry; a
                // refusal would tell them their session is over).
                tracing::error!(error = %e, "the state machine refused a countdown checkpoint");
                Err(ReplicaFailure::Unavailable(format!(
                    "the leader could not record the session's countdown: {e}"
                )))
            }
            Err(f) => {
                if !matches!(f, ReplicaFailure::NotLeader { .. }) {
                    tracing::warn!(failure = %f, "checkpoint not committed");
                }
                Err(f)
            }
        };
        self.answer_kept(epoch, resets, &result);
        self.record();
    }

    /// Propose the next checkpoint if countdowns are due to be recorded or
    /// keep-alives wait for a reset, unless one is in flight (its end
    /// starts the next).
    fn record(&mut self) {
        if self.recording {
            return;
        }
        if self.leader_term().is_none() {
            return;
        }
        let epoch = self.epoch;
        // A caller that gave up needs no answer and no write.
        self.resets.retain(|(ka, _)| !ka.reply.is_closed());
        let mut sessions: Vec<SessionId> = Vec::new();
        let mut take = 0;
        for (ka, _) in &self.resets {
            if !sessions.contains(&ka.session) {
                if sessions.len() == MAX_CHECKPOINT_ITEMS {
                    break;
                }
                sessions.push(ka.session);
            }
            take += 1;
        }
        let resets: Vec<(KeepAlive, Duration)> = self.resets.drain(..take).collect();
        let now = Instant::now();
        let built = self
            .timers
            .checkpoint(&mut self.due_records, &mut sessions, now);
        let reset: BTreeSet<SessionId> = built
            .as_ref()
            .map(|(_, r)| r.iter().copied().collect())
            .unwrap_or_default();
        // A keep-alive whose session is no longer counted here (its end was
        // applied while it waited) is not vouched for by this checkpoint.
        let (resets, gone): (Vec<_>, Vec<_>) = resets
            .into_iter()
            .partition(|(ka, _)| reset.contains(&ka.session));
        for (ka, _) in gone {
            let _ = ka.reply.send(session_ended(ka.session));
        }
        let Some((command, reset)) = built else {
            return;
        };
        self.recording = true;
        let replica = self.replica.clone();
        let internal = self.internal.clone();
        tokio::spawn(async move {
            let result = replica.propose_own(command).await;
            let _ = internal.send(Internal::Recorded {
                epoch,
                resets,
                reset,
                result,
            });
        });
    }

    fn on_built(&mut self, term: u64, state: Result<TimerState, String>) {
        let Role::Building { term: t, .. } = &self.role else {
            return;
        };
        if *t != term {
            return;
        }
        let state = match state {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "new leader could not read its lock timers yet; retrying");
                let internal = self.internal.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY_BUILD).await;
                    let _ = internal.send(Internal::Rebuild { term });
                });
                return;
            }
        };
        let Role::Building {
            since,
            events,
            keep_alives,
            ..
        } = std::mem::replace(&mut self.role, Role::Leader { term })
        else {
            return;
        };
        let now = Instant::now();
        // From `since`, not `now`: the time spent reading the state counts
        // (every record in it was taken before this replica was elected).
        self.timers.restart(&state, since);
        for e in &events {
            self.timers.apply(e, now, false);
        }
        tracing::info!(
            term,
            sessions = state.sessions.len(),
            countdowns = self.timers.len(),
            read_ms = now.saturating_duration_since(since).as_millis(),
            "leader resumed every lock countdown from the last record"
        );
        for ka in keep_alives {
            self.on_keep_alive(ka, false);
        }
    }

    /// Answer how long the sessions asked about have left: from the
    /// table if this replica leads and has built it, else nothing.
    fn on_countdown_ask(&self, ask: CountdownAsk) {
        let now = Instant::now();
        let leading = self.leader_term().is_some();
        let left = ask
            .sessions
            .iter()
            .map(|s| {
                leading
                    .then(|| self.timers.deadline(&TimerKey::Session(*s)))
                    .flatten()
                    .map(|d| d.saturating_duration_since(now))
            })
            .collect();
        let _ = ask.reply.send(left);
    }

    /// `timed`: whether the keep-alive's margin is measured (see
    /// `crate::metrics`); not for those held while the table was built.
    fn on_keep_alive(&mut self, ka: KeepAlive, timed: bool) {
        match &mut self.role {
            Role::Follower => {
                let _ = ka.reply.send(Err(ReplicaFailure::NotLeader {
                    leader: self.replica.leader(),
                }));
            }
            Role::Building { keep_alives, .. } => {
                // A caller that gave up needs no answer: while the state
                // read is retried, the held keep-alives are swept of them
                // each time their number doubles (amortised O(1) a push).
                if keep_alives.len() >= 64 && keep_alives.len().is_power_of_two() {
                    keep_alives.retain(|held| !held.reply.is_closed());
                }
                keep_alives.push(ka);
            }
            Role::Leader { .. } => {
                if self.expiring.contains(&ka.session) {
                    let _ = ka.reply.send(session_ended(ka.session));
                    return;
                }
                let ttl = match self.timers.keep_alive(ka.session, &ka.secret, ka.received) {
                    KeptAlive::Extended {
                        ttl,
                        margin,
                        recorded,
                    } => {
                        // Not for keep-alives held while the table was
                        // built: their margin is the new leader's, not the
                        // client's.
                        if let (Some(margin), true) = (margin, timed) {
                            self.replica.metrics().keep_alive_margin(margin);
                        }
                        if recorded {
                            self.resets.push((ka, ttl));
                            self.record();
                            return;
                        }
                        ttl
                    }
                    KeptAlive::WrongSecret => {
                        let _ = ka.reply.send(wrong_secret(ka.session));
                        return;
                    }
                    KeptAlive::NotCounted => match self.replica.local_session(ka.session) {
                        Ok(Some(s)) if !s.secret.matches(&ka.secret) => {
                            let _ = ka.reply.send(wrong_secret(ka.session));
                            return;
                        }
                        // Live in the state but not counted down here: count
                        // it down from now (errs towards a longer lease).
                        // Counted as recorded whatever the state says, as
                        // `Timers::restart` does.
                        Ok(Some(s)) => {
                            let ttl = Duration::from_millis(s.ttl_ms);
                            self.timers
                                .open_session(ka.session, ttl, s.secret, ka.received);
                            self.timers.mark_recorded(ka.session);
                            self.resets.push((ka, ttl));
                            self.record();
                            return;
                        }
                        Ok(None) => {
                            let _ = ka.reply.send(session_ended(ka.session));
                            return;
                        }
                        Err(f) => {
                            let _ = ka.reply.send(Err(f));
                            return;
                        }
                    },
                };
                self.pending.push((ka, ttl));
                self.confirm_pending();
            }
        }
    }

    /// Start one leadership confirmation round for every pending keep-alive,
    /// unless one is already in flight (the next round takes them).
    fn confirm_pending(&mut self) {
        if self.confirming || self.pending.is_empty() {
            return;
        }
        if self.leader_term().is_none() {
            return;
        }
        let epoch = self.epoch;
        self.confirming = true;
        let batch = std::mem::take(&mut self.pending);
        let replica = self.replica.clone();
        let internal = self.internal.clone();
        tokio::spawn(async move {
            let result = replica.confirm_leadership().await;
            let _ = internal.send(Internal::Confirmed {
                epoch,
                batch,
                result,
            });
        });
    }

    fn fire_due(&mut self) {
        let Some(term) = self.leader_term() else {
            return;
        };
        for key in self.timers.take_due(Instant::now()) {
            let Some(expiry) = key.expiry() else {
                self.due_records.insert(key);
                continue;
            };
            if let TimerKey::Session(s) = &key {
                self.expiring.insert(*s);
            }
            tracing::debug!(?key, "countdown ran out; proposing its expiry");
            let replica = self.replica.clone();
            let internal = self.internal.clone();
            tokio::spawn(async move {
                match replica.propose_own(expiry).await {
                    Ok(_) => {}
                    Err(ReplicaFailure::NotLeader { .. }) => {}
                    Err(f) => {
                        tracing::warn!(?key, failure = %f, "expiry not committed; retrying");
                        let _ = internal.send(Internal::RetryExpiry { term, key });
                    }
                }
            });
        }
        self.record();
    }
}
