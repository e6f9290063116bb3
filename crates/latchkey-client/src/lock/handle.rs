//! [`Lock`]: one owner's handle on a named lock, and acquiring it (FIFO
//! waits, cancellation, withdrawing an abandoned acquire). A grant becomes
//! a [`LockGuard`] (`guard.rs`). Handles are made from a [`Session`]
//! ([`Session::lock`], defined here so that `session.rs` need not import
//! this file).

use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_core::limits::{MAX_LOCK_WAIT_MS, MIN_LOCK_WAIT_MS};
use latchkey_core::lock::{LockCommand, LockMode, LockOutcome, Sequencer, WaitCancel};
use latchkey_core::{Command, CommandError, CommandResult, Outcome};
use latchkey_proto::Operation;

use super::guard::{release, release_all, Grants, LockGuard};
use super::lease_clock;
use super::session::{millis, Session};
use crate::error::Error;
use crate::kv::{unexpected, Client};

/// Extra time, past an acquire's wait, that the client gives the leader to
/// cancel the wait itself before the client cancels it.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// Longest time one `Acquire` call is held by a replica before the client
/// asks again (bounds how long a grant can go unnoticed if the replica it
/// waits on is cut off from the cluster).
const MAX_HOLD: Duration = Duration::from_secs(30);

impl Client {
    /// One acquire call, held by the replica up to `hold` while it waits.
    async fn acquire_call(
        &self,
        command: &Command,
        hold: Duration,
    ) -> Result<CommandResult, Error> {
        let op = Operation::Acquire {
            command: command.clone(),
            hold,
        };
        let options = self.router().options().clone();
        let attempt_budget = hold + options.attempt_timeout;
        self.router()
            .call_with(
                false,
                attempt_budget + options.request_timeout,
                attempt_budget,
                |target, _| {
                    let op = op.clone();
                    async move { target.send(op, attempt_budget).await }
                },
            )
            .await
    }
}

/// One owner's handle on a named lock; acquire it to get a [`LockGuard`].
///
/// # Owners and re-entrancy
///
/// Each [`Lock`] handle (from [`Session::lock`]) is one owner: acquiring the
/// same lock again through the same handle is re-entrant (same token, hold
/// count up, and the first grant's lease); two handles, even on one session,
/// contend like two clients. Cloning a handle makes a new owner, so handles
/// passed to different tasks exclude each other.
///
/// # Cancellation
///
/// Dropping an `acquire` future (a `select!`, a `timeout`) withdraws the
/// request in the background: its wait is cancelled, and if it was granted
/// meanwhile, the grant is released. No lock is left held by nobody.
///
/// # Example
///
/// ```no_run
/// # async fn demo(session: latchkey_client::Session) -> Result<(), latchkey_client::Error> {
/// use std::time::Duration;
/// let lock = session
///     .lock("jobs/compaction")
///     .lease(Duration::from_secs(60)) // released by the cluster after 60 s at most
///     .lock_delay(Duration::from_secs(5)); // kept unavailable 5 s after a forced release
/// match lock.acquire_timeout(Duration::from_secs(30)).await? {
///     Some(guard) => { /* work, passing guard.token() to storage */ guard.release().await? }
///     None => println!("still busy after 30 s"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Lock {
    session: Session,
    name: String,
    owner: u64,
    mode: LockMode,
    lease: Option<Duration>,
    lock_delay: Option<Duration>,
    /// A campaign's value (an election's lock, see [`crate::Election`]);
    /// empty for a lock.
    value: Vec<u8>,
    /// A semaphore's permit count (see [`crate::Semaphore`]); `None` for a
    /// lock.
    permits: Option<u32>,
    /// A multi-lock's other locks (see [`crate::MultiLock`]), taken with
    /// `name` in one step; empty for a lock.
    also: Vec<String>,
    /// Local lease deadline of each live grant of this owner, by token, so
    /// a re-entrant acquire inherits the first grant's deadline (the cluster
    /// keeps the first grant's lease).
    grants: Grants,
}

impl Lock {
    /// A handle on `name` for a new owner in `session`: exclusive, no
    /// lease, no lock-delay until configured.
    fn new(session: Session, name: String) -> Lock {
        Lock {
            owner: session.next_owner(),
            session,
            name,
            mode: LockMode::Exclusive,
            lease: None,
            lock_delay: None,
            value: Vec::new(),
            permits: None,
            also: Vec::new(),
            grants: Arc::default(),
        }
    }

    /// This handle's owner and grants, acquiring with `value`: a
    /// campaign's (see [`crate::Election::campaign`]).
    pub(super) fn with_value(&self, value: Vec<u8>) -> Lock {
        Lock {
            session: self.session.clone(),
            name: self.name.clone(),
            owner: self.owner,
            mode: self.mode,
            lease: self.lease,
            lock_delay: self.lock_delay,
            value,
            permits: self.permits,
            also: self.also.clone(),
            grants: self.grants.clone(),
        }
    }
}

impl Clone for Lock {
    /// A clone is a **new owner** of the same lock: it contends with the
    /// original like another client would (no shared re-entrancy).
    fn clone(&self) -> Self {
        Lock {
            session: self.session.clone(),
            name: self.name.clone(),
            owner: self.session.next_owner(),
            mode: self.mode,
            lease: self.lease,
            lock_delay: self.lock_delay,
            value: self.value.clone(),
            permits: self.permits,
            also: self.also.clone(),
            grants: Arc::default(),
        }
    }
}

/// What an acquire got: one grant per lock asked for, in the order asked.
pub(super) struct Got {
    sequencers: Vec<Sequencer>,
    /// A lower bound of the grant time.
    granted_after: Instant,
    /// Holds of the grant, counting this one (a multi-lock's: 1).
    hold_count: u32,
}

/// Withdraws an acquire whose caller stopped waiting (its future was
/// dropped, or it failed without a definite answer): the wait is cancelled
/// and a grant that happened anyway is released, so no lock stays held by
/// nobody.
struct PendingAcquire<'a> {
    lock: &'a Lock,
    request_id: u64,
    armed: bool,
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.lock.abandon(self.request_id);
        }
    }
}

/// The longest wait the cluster accepts (a day).
fn longest_wait() -> Duration {
    Duration::from_millis(MAX_LOCK_WAIT_MS)
}

/// `wait` held to what the cluster accepts: 1 ms to a day.
pub(super) fn clamp_wait(wait: Duration) -> Duration {
    wait.clamp(Duration::from_millis(MIN_LOCK_WAIT_MS), longest_wait())
}

impl Lock {
    /// Acquire in shared mode (many shared holders at once, no exclusive).
    pub fn shared(mut self) -> Self {
        self.mode = LockMode::Shared;
        self
    }

    /// A maximum hold time: the cluster releases the grant after `lease`
    /// even if the session stays alive (1 s to 1 day).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// After a forced release (session expiry, lease expiry), keep the lock
    /// unavailable for `delay` (up to 1 min), so a holder that lost it has
    /// time to notice before anyone else acts (Chubby's lock-delay).
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some(delay);
        self
    }

    /// Take a permit of a semaphore of `permits` permits rather than the
    /// lock (see [`crate::Semaphore`]).
    pub(super) fn with_permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// Take `also` with this lock, all in one step (see
    /// [`crate::MultiLock`]).
    pub(super) fn with_also(mut self, also: Vec<String>) -> Self {
        self.also = also;
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this owner holds a grant it has not fully released yet.
    pub(super) fn holds_any(&self) -> bool {
        !self
            .grants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Wait as long as it takes (queueing again each day, the longest wait).
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        loop {
            if let Some(g) = self.acquire_inner(Some(longest_wait())).await? {
                return Ok(g);
            }
            // The longest wait (a day) passed: queue again, at the tail.
        }
    }

    /// Try once: `None` if the lock is busy (held, queued for, or in
    /// lock-delay).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        self.acquire_inner(None).await
    }

    /// Wait in the lock's FIFO queue up to `wait` (held to 1 ms .. 1 day):
    /// `None` if not granted by then. The replica wakes this call when the
    /// grant is applied; it does not poll.
    ///
    /// # The path of `wait`
    ///
    /// `wait` stays a [`Duration`] everywhere but in the log: the command
    /// carries it as `wait_ms` (whole milliseconds, the log's format), and
    /// the leader counts it down from the entry's apply (its wait timer
    /// proposes `ExpireWait` when it runs out). Around that, this client
    /// gives up at `first send + wait + 2 s` (the grace lets the leader's
    /// expiry arrive first); each attempt asks the replica to hold the call
    /// open for the time left to that give-up, at most 30 s, and the
    /// replica caps what it holds at 5 min. An attempt cut by a reconnect
    /// or a leader change resends the same request id, which the session's
    /// request memory answers without a second grant. At the give-up the
    /// client cancels the wait; a grant that won the race is kept and
    /// returned. docs/ARCHITECTURE.md, "The path of a lock acquire", shows
    /// the three timers side by side.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        self.acquire_inner(Some(clamp_wait(wait))).await
    }

    /// Acquire, waiting up to `wait` (`None`: try once).
    async fn acquire_inner(&self, wait: Option<Duration>) -> Result<Option<LockGuard>, Error> {
        let got = self.acquire_grants(wait).await?;
        Ok(got.and_then(|got| self.guards(got).into_iter().next()))
    }

    /// The acquire (of this lock, or of all of a multi-lock's locks) that
    /// request `request_id` sends.
    fn acquire_command(&self, request_id: u64, wait_ms: Option<u64>) -> Command {
        let session = &self.session;
        if self.also.is_empty() {
            return Command::Lock(LockCommand::Acquire {
                session: session.id(),
                secret: session.secret(),
                owner: self.owner,
                request_id,
                name: self.name.clone(),
                mode: self.mode,
                wait_ms,
                lease_ms: self.lease.map(millis),
                lock_delay_ms: self.lock_delay.map(millis),
                value: self.value.clone(),
                permits: self.permits,
            });
        }
        Command::Lock(LockCommand::AcquireAll {
            session: session.id(),
            secret: session.secret(),
            owner: self.owner,
            request_id,
            names: std::iter::once(&self.name)
                .chain(&self.also)
                .cloned()
                .collect(),
            mode: self.mode,
            wait_ms,
            lease_ms: self.lease.map(millis),
            lock_delay_ms: self.lock_delay.map(millis),
        })
    }

    /// Acquire, waiting up to `wait` (`None`: try once): the grants, or
    /// `None` if busy or not granted in time.
    pub(super) async fn acquire_grants(
        &self,
        wait: Option<Duration>,
    ) -> Result<Option<Got>, Error> {
        let session = &self.session;
        if !session.is_live() {
            return Err(session.lost_error());
        }
        let request_id = session.next_request();
        let command = self.acquire_command(request_id, wait.map(millis));
        latchkey_core::validate_command(&command)?;
        let mut pending = PendingAcquire {
            lock: self,
            request_id,
            armed: true,
        };
        let first_sent = lease_clock::now();
        // A lower bound of the grant time: the send of the latest attempt
        // whose proposal was answered "still queued" (the grant came after
        // it), else the first send.
        let mut lease_base = first_sent;
        let client = session.client();
        let give_up = first_sent + wait.unwrap_or(Duration::ZERO) + CANCEL_GRACE;
        loop {
            let attempt_sent = lease_clock::now();
            let result = if wait.is_some() {
                let hold = give_up
                    .saturating_duration_since(attempt_sent)
                    .min(MAX_HOLD);
                client.acquire_call(&command, hold).await
            } else {
                match client.execute_with(command.clone(), true).await {
                    Ok(outcome) => Ok(Ok(outcome)),
                    Err(Error::Refused(e)) => Ok(Err(e)),
                    Err(e) => Err(e),
                }
            };
            // On an error the acquire may be queued or even granted: the
            // armed `pending` withdraws it.
            let outcome = result?;
            match outcome {
                Ok(Outcome::Lock(LockOutcome::Granted {
                    sequencer,
                    hold_count,
                })) => {
                    pending.armed = false;
                    return Ok(Some(Got {
                        sequencers: vec![sequencer],
                        granted_after: lease_base,
                        hold_count,
                    }));
                }
                Ok(Outcome::Lock(LockOutcome::GrantedAll { sequencers })) => {
                    if !self.is_all_asked(&sequencers) {
                        // A malformed answer: the armed `pending` withdraws
                        // the acquire, releasing whatever it was granted.
                        return Err(unexpected(
                            "one grant per lock asked, in order",
                            &Outcome::Lock(LockOutcome::GrantedAll { sequencers }),
                        ));
                    }
                    pending.armed = false;
                    return Ok(Some(Got {
                        sequencers,
                        granted_after: lease_base,
                        hold_count: 1,
                    }));
                }
                Ok(Outcome::Lock(LockOutcome::Queued { .. })) => {
                    lease_base = attempt_sent;
                    if lease_clock::now() < give_up {
                        continue;
                    }
                    let answer = self.cancel(request_id, lease_base).await;
                    pending.armed = answer.is_err();
                    return answer;
                }
                Ok(other) => return Err(unexpected("Granted or Queued", &other)),
                Err(CommandError::Busy { .. }) | Err(CommandError::WaitCancelled { .. }) => {
                    pending.armed = false;
                    return Ok(None);
                }
                Err(CommandError::SessionEnded { .. })
                | Err(CommandError::UnknownSession { .. }) => {
                    pending.armed = false;
                    return Err(Error::SessionLost {
                        session: session.id().0,
                        reason: "the cluster says it has ended".into(),
                    });
                }
                Err(e) => return Err(Error::Refused(e)),
            }
        }
    }

    fn cancel_command(&self, request_id: u64) -> Command {
        Command::Lock(LockCommand::CancelWait {
            session: self.session.id(),
            secret: self.session.secret(),
            owner: self.owner,
            name: self.name.clone(),
            request_id,
        })
    }

    /// Withdraw a wait the leader has not cancelled in time.
    async fn cancel(&self, request_id: u64, granted_after: Instant) -> Result<Option<Got>, Error> {
        let client = self.session.client();
        let got = |sequencers| {
            Some(Got {
                sequencers,
                granted_after,
                hold_count: 1,
            })
        };
        match client
            .execute_with(self.cancel_command(request_id), true)
            .await?
        {
            Outcome::Lock(LockOutcome::WaitCancel(WaitCancel::AlreadyGranted(sequencer))) => {
                Ok(got(vec![sequencer]))
            }
            Outcome::Lock(LockOutcome::WaitCancel(WaitCancel::AlreadyGrantedAll(all))) => {
                Ok(got(all))
            }
            Outcome::Lock(LockOutcome::WaitCancel(_)) => Ok(None),
            other => Err(unexpected("WaitCancel", &other)),
        }
    }

    /// In the background: cancel the wait `request_id`, and release its
    /// grant if it was granted meanwhile.
    fn abandon(&self, request_id: u64) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = self.session.clone();
        let owner = self.owner;
        let cancel = self.cancel_command(request_id);
        handle.spawn(async move {
            // Until a definite answer, or the session is gone (which ends
            // every wait and hold of it anyway).
            let mut pause = Duration::from_millis(100);
            while session.is_live() {
                match session.client().execute_with(cancel.clone(), true).await {
                    Ok(Outcome::Lock(LockOutcome::WaitCancel(WaitCancel::AlreadyGranted(s)))) => {
                        let _ = release(&session, owner, &s, None).await;
                        return;
                    }
                    Ok(Outcome::Lock(LockOutcome::WaitCancel(WaitCancel::AlreadyGrantedAll(
                        all,
                    )))) => {
                        let _ = release_all(&session, owner, &all, None).await;
                        return;
                    }
                    Ok(_) | Err(Error::Refused(_)) | Err(Error::InvalidArgument(_)) => return,
                    Err(e) => {
                        tracing::debug!(error = %e, "withdrawing an abandoned acquire; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
    }

    /// Whether `sequencers` are one grant of each lock asked for, in order.
    fn is_all_asked(&self, sequencers: &[Sequencer]) -> bool {
        let asked = std::iter::once(&self.name).chain(&self.also);
        sequencers.len() == 1 + self.also.len()
            && asked.zip(sequencers).all(|(name, s)| s.name == *name)
    }

    /// A guard for each grant an acquire got, in the order asked.
    pub(super) fn guards(&self, got: Got) -> Vec<LockGuard> {
        got.sequencers
            .into_iter()
            .map(|s| self.guard(s, got.granted_after, got.hold_count))
            .collect()
    }

    /// A guard for a grant that happened after `granted_after`.
    fn guard(&self, sequencer: Sequencer, granted_after: Instant, hold_count: u32) -> LockGuard {
        let mut grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        let lease_until = match grants.get(&sequencer.token) {
            // Re-entrant: the cluster keeps the first grant's lease.
            Some(first) if hold_count > 1 => *first,
            // Re-entrant into a grant this handle does not know: if it may
            // have a lease, its deadline is unknown, so vouch for nothing.
            None if hold_count > 1 => self.lease.map(|_| granted_after),
            // The cluster counts a lease from the grant, which came after
            // `granted_after`: counting from there ends it here no later.
            _ => self.lease.map(|l| granted_after + l.saturating_sub(l / 10)),
        };
        grants.insert(sequencer.token, lease_until);
        LockGuard::new(
            self.session.clone(),
            self.owner,
            sequencer,
            lease_until,
            self.grants.clone(),
        )
    }
}

impl Session {
    /// A handle on the lock `name` for a new owner in this session:
    /// exclusive, no lease, no lock-delay until configured.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(self.clone(), name.into())
    }
}
