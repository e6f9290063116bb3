//! The lock API of [`Client`]: sessions with an auto-renewing watchdog,
//! locks, guards, sequencers and fenced writes.
//!
//! # The lease, as the client sees it
//!
//! A [`Session`] is valid until `send time of the last acknowledged
//! keep-alive + ttl - margin` on this process's monotonic clock, with
//! `margin = ttl / 10` for clock-rate drift and scheduling. The leader counts
//! the same lease from the *receipt* of that keep-alive, and a new leader
//! restarts it at full length, so the cluster never expires a session before
//! this client stops vouching for it. The watchdog sends a keep-alive every
//! `ttl / 3`, to whichever replica leads, retrying others with backoff; once
//! the deadline passes without an acknowledgement, or the cluster answers
//! that the session ended, the session is **lost** for good: every guard
//! reports [`LockGuard::is_held`] false and [`Session::lost`] resolves.
//!
//! # Owners and re-entrancy
//!
//! Each [`Lock`] handle (from [`Session::lock`]) is one owner: acquiring the
//! same lock again through the same handle is re-entrant (same token, hold
//! count up, and the first grant's lease); two handles, even on one session,
//! contend like two clients. Cloning a handle makes a new owner, so handles
//! passed to different tasks exclude each other.
//!
//! # Cancellation
//!
//! Dropping an `acquire` future (a `select!`, a `timeout`) withdraws the
//! request in the background: its wait is cancelled, and if it was granted
//! meanwhile, the grant is released. No lock is left held by nobody.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), latchkey_client::Error> {
//! use std::time::Duration;
//! use latchkey_client::Client;
//! let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
//! let session = client.session(Duration::from_secs(10)).await?;
//! let guard = session.lock("reports/daily").acquire().await?;
//! // Hand the token to the storage you write to; it refuses older tokens.
//! println!("holding with token {}", guard.token());
//! // Writes to latchkey's own KV can be fenced: refused once we lost the lock.
//! guard.put("reports/daily/last-run", "2026-11-21").await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latchkey_core::limits::{
    MAX_LOCK_LIST_LIMIT, MAX_LOCK_WAIT_MS, MAX_SESSION_TTL_MS, MIN_LOCK_WAIT_MS, MIN_SESSION_TTL_MS,
};
use latchkey_core::lock::{
    LockCommand, LockInfo, LockMode, LockOutcome, LockQuery, Sequencer, SessionId, Token,
    WaitCancel,
};
use latchkey_core::{Command, CommandError, CommandResult, Outcome, Query};
use latchkey_proto::Operation;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::lease_clock;
use crate::{Batch, Client, Consistency, Error};

/// Extra time, past an acquire's wait, that the client gives the leader to
/// cancel the wait itself before the client cancels it.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// Longest time one `Acquire` call is held by a replica before the client
/// asks again (bounds how long a grant can go unnoticed if the replica it
/// waits on is cut off from the cluster).
const MAX_HOLD: Duration = Duration::from_secs(30);

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unexpected(what: &str, outcome: &Outcome) -> Error {
    Error::Protocol(format!("expected {what}, server answered {outcome:?}"))
}

impl Client {
    /// Open a session with `ttl` (3 s to 10 min) and start its watchdog.
    ///
    /// Choose the TTL as "how long may my locks outlive a crash of this
    /// process". It must also cover a leader failover: after a missed
    /// keep-alive the watchdog has `ttl - ttl/3 - ttl/10` to reach the new
    /// leader, and an election plus the new leader's start-up takes about
    /// 1–4 s here. 10 s (the CLI's default) is a sound choice; 3 s sessions
    /// can be lost across a failover on a loaded machine.
    ///
    /// A retried open after a lost reply may leave an unused session
    /// behind; it holds nothing and expires after its TTL.
    pub async fn session(&self, ttl: Duration) -> Result<Session, Error> {
        // The leader starts the countdown when it applies the open, after
        // the successful attempt was sent: count the lease from that send.
        let (outcome, sent) = self
            .execute_timed(
                Command::Lock(LockCommand::OpenSession {
                    ttl_ms: millis(ttl),
                }),
                true,
            )
            .await?;
        let (id, ttl_ms) = match outcome {
            Outcome::Lock(LockOutcome::SessionOpened { session, ttl_ms }) => (session, ttl_ms),
            other => return Err(unexpected("SessionOpened", &other)),
        };
        if !(MIN_SESSION_TTL_MS..=MAX_SESSION_TTL_MS).contains(&ttl_ms) {
            return Err(Error::Protocol(format!(
                "the server opened a session with an impossible ttl of {ttl_ms} ms"
            )));
        }
        let ttl = Duration::from_millis(ttl_ms);
        let margin = ttl / 10;
        let (tx, rx) = watch::channel(LeaseState {
            valid_until: sent + ttl - margin,
            lost: None,
        });
        let watchdog = tokio::spawn(watchdog(self.clone(), id, ttl, margin, sent, tx));
        tracing::debug!(session = id.0, ?ttl, "session opened");
        Ok(Session {
            inner: Arc::new(SessionInner {
                client: self.clone(),
                id,
                ttl,
                next_request: AtomicU64::new(1),
                next_owner: AtomicU64::new(1),
                lease: rx,
                watchdog: Mutex::new(Some(watchdog)),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// Is `sequencer` still the current holder of its lock (linearizable)?
    /// A storage service can call this before accepting work, Chubby-style.
    pub async fn check_sequencer(&self, sequencer: &Sequencer) -> Result<bool, Error> {
        match self
            .query(
                Query::Lock(LockQuery::CheckSequencer(sequencer.clone())),
                Consistency::Linearizable,
            )
            .await?
        {
            Outcome::Lock(LockOutcome::SequencerCheck { current }) => Ok(current),
            other => Err(unexpected("SequencerCheck", &other)),
        }
    }

    /// Locks in use whose names start with `prefix`, in name order: holders
    /// with their tokens, queue lengths, lock-delays. Pages through every
    /// match.
    pub async fn locks(&self, prefix: &str) -> Result<Vec<LockInfo>, Error> {
        let mut all = Vec::new();
        let mut start_after = None;
        loop {
            let outcome = self
                .query(
                    Query::Lock(LockQuery::Locks {
                        prefix: prefix.to_string(),
                        start_after: start_after.clone(),
                        limit: MAX_LOCK_LIST_LIMIT,
                    }),
                    Consistency::Linearizable,
                )
                .await?;
            let Outcome::Lock(LockOutcome::Locks { locks, more }) = outcome else {
                return Err(unexpected("Locks", &outcome));
            };
            start_after = locks.last().map(|l| l.name.clone());
            all.extend(locks);
            if !more || start_after.is_none() {
                return Ok(all);
            }
        }
    }

    /// Set `key` to `value` only while `sequencer` is the current exclusive
    /// holder of its lock; otherwise nothing is written and the error
    /// answers [`Error::is_stale_fence`].
    pub async fn put_fenced(
        &self,
        sequencer: &Sequencer,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<(), Error> {
        self.batch_fenced(sequencer, Batch::new().put(key, value))
            .await?
            .map_err(|i| Error::Protocol(format!("condition {i} failed in a batch without one")))
    }

    /// Delete `key` only while `sequencer` is the current exclusive holder.
    pub async fn delete_fenced(
        &self,
        sequencer: &Sequencer,
        key: impl AsRef<[u8]>,
    ) -> Result<(), Error> {
        self.batch_fenced(sequencer, Batch::new().delete(key))
            .await?
            .map_err(|i| Error::Protocol(format!("condition {i} failed in a batch without one")))
    }

    /// Apply `batch` only while `sequencer` is the current exclusive holder,
    /// atomically with that check. `Err(index)` of the first failed
    /// condition, as [`Client::batch`].
    pub async fn batch_fenced(
        &self,
        sequencer: &Sequencer,
        batch: Batch,
    ) -> Result<Result<(), u32>, Error> {
        let Command::Batch { conditions, ops } = batch.into_command() else {
            return Err(Error::Protocol("a batch is always a batch command".into()));
        };
        let command = Command::Lock(LockCommand::Fenced {
            sequencer: sequencer.clone(),
            conditions,
            ops,
        });
        match self.execute(command).await? {
            Outcome::Batch { failed_condition } => Ok(match failed_condition {
                None => Ok(()),
                Some(i) => Err(i),
            }),
            other => Err(unexpected("Batch", &other)),
        }
    }

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

    /// One keep-alive, retried across replicas until `within` has passed;
    /// also answers when the acknowledged attempt was sent.
    async fn keep_alive_call(
        &self,
        session: SessionId,
        within: Duration,
    ) -> Result<(CommandResult, Instant), Error> {
        let attempt = self.router().options().attempt_timeout.min(within);
        let mut sent = lease_clock::now();
        let result = self
            .router()
            .call_with(false, within, attempt, |target, _| {
                sent = lease_clock::now();
                async move { target.send(Operation::KeepAlive(session), attempt).await }
            })
            .await?;
        Ok((result, sent))
    }
}

#[derive(Debug, Clone)]
struct LeaseState {
    valid_until: Instant,
    /// Why the session is lost, once it is (sticky).
    lost: Option<String>,
}

/// Renew the lease every `ttl / 3` until it is lost or the session closes.
async fn watchdog(
    client: Client,
    id: SessionId,
    ttl: Duration,
    margin: Duration,
    opened: Instant,
    lease: watch::Sender<LeaseState>,
) {
    let interval = ttl / 3;
    let mut next = opened + interval;
    loop {
        tokio::time::sleep_until(lease_clock::timer(next)).await;
        let valid_until = lease.borrow().valid_until;
        let now = lease_clock::now();
        if now >= valid_until {
            mark_lost(
                &lease,
                id,
                "the lease ran out before a keep-alive could be sent".into(),
            );
            return;
        }
        match client.keep_alive_call(id, valid_until - now).await {
            Ok((Ok(_), sent)) => {
                let acked = lease_clock::now();
                if acked >= valid_until {
                    // Guards may already have reported the lock lost: stay lost.
                    mark_lost(
                        &lease,
                        id,
                        "a keep-alive was acknowledged only after the lease ran out".into(),
                    );
                    return;
                }
                lease.send_modify(|l| {
                    l.valid_until = l.valid_until.max(sent + ttl - margin);
                });
                next = sent + interval;
            }
            Ok((Err(e), _)) => {
                mark_lost(&lease, id, format!("the cluster ended it: {e}"));
                return;
            }
            Err(e) => {
                mark_lost(
                    &lease,
                    id,
                    format!("no keep-alive was acknowledged before the lease ran out: {e}"),
                );
                return;
            }
        }
    }
}

fn mark_lost(lease: &watch::Sender<LeaseState>, id: SessionId, reason: String) {
    tracing::warn!(session = id.0, %reason, "session lost");
    lease.send_modify(|l| {
        if l.lost.is_none() {
            l.lost = Some(reason);
        }
    });
}

/// A lock-service session: a lease kept alive by a background watchdog.
///
/// Cheap to clone; the session closes (releasing its locks at once) when
/// [`Session::close`] is called or the last clone and the last guard are
/// dropped inside a Tokio runtime (the close is sent in the background).
/// Dropped outside any runtime, nothing can be sent: the cluster expires the
/// session after its TTL instead. See the [module docs](self) for how the
/// lease is judged.
#[derive(Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

struct SessionInner {
    client: Client,
    id: SessionId,
    ttl: Duration,
    next_request: AtomicU64,
    next_owner: AtomicU64,
    lease: watch::Receiver<LeaseState>,
    watchdog: Mutex<Option<JoinHandle<()>>>,
    closed: AtomicBool,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        if let Some(w) = self
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            w.abort();
        }
        if self.closed.swap(true, Ordering::SeqCst) || self.lease.borrow().lost.is_some() {
            return;
        }
        let client = self.client.clone();
        let session = self.id;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = client
                    .execute_with(Command::Lock(LockCommand::CloseSession { session }), true)
                    .await;
            });
        }
    }
}

impl Session {
    /// The cluster's id of this session.
    pub fn id(&self) -> SessionId {
        self.inner.id
    }

    /// The session's TTL.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The client this session talks through.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// True while the lease is vouched for: not lost, not closed, and the
    /// local deadline has not passed.
    pub fn is_live(&self) -> bool {
        let l = self.inner.lease.borrow();
        l.lost.is_none()
            && !self.inner.closed.load(Ordering::SeqCst)
            && lease_clock::now() < l.valid_until
    }

    /// Until when the lease is vouched for, on the lease clock: `Instant`
    /// moved forward by any time the machine spent suspended since the
    /// client started (CLOCK_BOOTTIME), so a suspend ends the lease as it
    /// does on the cluster. Compare with `Instant::now()` only as an
    /// estimate; [`Session::is_live`] is exact.
    pub fn valid_until(&self) -> Instant {
        self.inner.lease.borrow().valid_until
    }

    /// Resolves once the session is lost (or closed): from then on none of
    /// its locks may be relied on. Fires at the local deadline even if the
    /// watchdog is stuck.
    pub async fn lost(&self) {
        let mut rx = self.inner.lease.clone();
        loop {
            let (valid_until, lost) = {
                let l = rx.borrow_and_update();
                (l.valid_until, l.lost.is_some())
            };
            if lost || self.inner.closed.load(Ordering::SeqCst) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(lease_clock::timer(valid_until)) => {
                    if lease_clock::now() >= rx.borrow().valid_until { return; }
                }
                changed = rx.changed() => if changed.is_err() { return; },
            }
        }
    }

    fn lost_error(&self) -> Error {
        let reason = match &self.inner.lease.borrow().lost {
            Some(r) => r.clone(),
            None if self.inner.closed.load(Ordering::SeqCst) => "closed by this client".into(),
            None => "its lease ran out before a keep-alive was acknowledged".into(),
        };
        Error::SessionLost {
            session: self.inner.id.0,
            reason,
        }
    }

    fn next_request(&self) -> u64 {
        self.inner.next_request.fetch_add(1, Ordering::SeqCst)
    }

    /// A handle on the lock `name` for a new owner in this session:
    /// exclusive, no lease, no lock-delay until configured.
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock {
            session: self.clone(),
            name: name.into(),
            owner: self.inner.next_owner.fetch_add(1, Ordering::SeqCst),
            mode: LockMode::Exclusive,
            lease: None,
            lock_delay: None,
            grants: Arc::default(),
        }
    }

    /// End the session now: its locks are released at once (no lock-delay)
    /// and its waits cancelled.
    pub async fn close(&self) -> Result<(), Error> {
        if let Some(w) = self
            .inner
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            w.abort();
        }
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let session = self.inner.id;
        match self
            .inner
            .client
            .execute_with(Command::Lock(LockCommand::CloseSession { session }), true)
            .await
        {
            Ok(_) => Ok(()),
            // A retried close, or the leader expired it first: ended either way.
            Err(Error::Refused(CommandError::SessionEnded { .. })) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.id.0)
            .field("ttl", &self.inner.ttl)
            .field("live", &self.is_live())
            .finish()
    }
}

/// One owner's handle on a named lock; acquire it to get a [`LockGuard`].
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
    /// Local lease deadline of each live grant of this owner, by token, so
    /// a re-entrant acquire inherits the first grant's deadline (the cluster
    /// keeps the first grant's lease).
    grants: Arc<Mutex<BTreeMap<Token, Option<Instant>>>>,
}

impl Clone for Lock {
    /// A clone is a **new owner** of the same lock: it contends with the
    /// original like another client would (no shared re-entrancy).
    fn clone(&self) -> Self {
        Lock {
            session: self.session.clone(),
            name: self.name.clone(),
            owner: self.session.inner.next_owner.fetch_add(1, Ordering::SeqCst),
            mode: self.mode,
            lease: self.lease,
            lock_delay: self.lock_delay,
            grants: Arc::default(),
        }
    }
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

enum Wait {
    No,
    For(Duration),
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

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Wait as long as it takes (queueing again each day, the longest wait).
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        loop {
            let wait = Wait::For(Duration::from_millis(MAX_LOCK_WAIT_MS));
            if let Some(g) = self.acquire_inner(wait).await? {
                return Ok(g);
            }
            // The longest wait (a day) passed: queue again, at the tail.
        }
    }

    /// Try once: `None` if the lock is busy (held, queued for, or in
    /// lock-delay).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        self.acquire_inner(Wait::No).await
    }

    /// Wait in the lock's FIFO queue up to `wait`: `None` if not granted
    /// by then. The replica wakes this call when the grant is applied; it
    /// does not poll.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        let ms = millis(wait).clamp(MIN_LOCK_WAIT_MS, MAX_LOCK_WAIT_MS);
        self.acquire_inner(Wait::For(Duration::from_millis(ms)))
            .await
    }

    async fn acquire_inner(&self, wait: Wait) -> Result<Option<LockGuard>, Error> {
        let session = &self.session;
        if !session.is_live() {
            return Err(session.lost_error());
        }
        let request_id = session.next_request();
        let wait_ms = match wait {
            Wait::No => None,
            Wait::For(d) => Some(millis(d)),
        };
        let command = Command::Lock(LockCommand::Acquire {
            session: session.id(),
            owner: self.owner,
            request_id,
            name: self.name.clone(),
            mode: self.mode,
            wait_ms,
            lease_ms: self.lease.map(millis),
            lock_delay_ms: self.lock_delay.map(millis),
        });
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
        let give_up = first_sent + Duration::from_millis(wait_ms.unwrap_or(0)) + CANCEL_GRACE;
        loop {
            let attempt_sent = lease_clock::now();
            let result = if wait_ms.is_some() {
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
                    return Ok(Some(self.guard(sequencer, lease_base, hold_count)));
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
            owner: self.owner,
            name: self.name.clone(),
            request_id,
        })
    }

    /// Withdraw a wait the leader has not cancelled in time.
    async fn cancel(
        &self,
        request_id: u64,
        granted_after: Instant,
    ) -> Result<Option<LockGuard>, Error> {
        let client = self.session.client();
        match client
            .execute_with(self.cancel_command(request_id), true)
            .await?
        {
            Outcome::Lock(LockOutcome::WaitCancel(WaitCancel::AlreadyGranted(sequencer))) => {
                Ok(Some(self.guard(sequencer, granted_after, 1)))
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
                        let _ = release(&session, owner, &s).await;
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
        LockGuard {
            session: self.session.clone(),
            owner: self.owner,
            lease_until,
            sequencer,
            released: AtomicBool::new(false),
            grants: self.grants.clone(),
        }
    }
}

async fn release(session: &Session, owner: u64, sequencer: &Sequencer) -> Result<u32, Error> {
    let command = Command::Lock(LockCommand::Release {
        session: session.id(),
        owner,
        request_id: session.next_request(),
        name: sequencer.name.clone(),
        token: sequencer.token,
    });
    match session.client().execute_with(command.clone(), true).await {
        Ok(Outcome::Lock(LockOutcome::Released { remaining, .. })) => Ok(remaining),
        Ok(other) => Err(unexpected("Released", &other)),
        Err(Error::Refused(CommandError::SessionEnded { .. })) => Err(session.lost_error()),
        Err(e @ (Error::Unavailable { .. } | Error::UnknownOutcome(_))) => {
            // The cluster did not answer in time. The release carries its
            // request id, so repeating it is safe: keep trying in the
            // background so the lock is not left held until the session ends.
            retry_release_in_background(session.clone(), command);
            Err(e)
        }
        Err(e) => Err(e),
    }
}

fn retry_release_in_background(session: Session, command: Command) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        let mut pause = Duration::from_millis(200);
        while session.is_live() {
            tokio::time::sleep(pause).await;
            match session.client().execute_with(command.clone(), true).await {
                Err(Error::Unavailable { .. } | Error::UnknownOutcome(_)) => {
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                // Released, or a definite refusal (e.g. already released).
                _ => return,
            }
        }
    });
}

/// One hold of a lock. Its [`token`](LockGuard::token) is the fencing token
/// to hand to any storage the holder writes to.
///
/// Dropping a guard inside a Tokio runtime releases it in the background
/// (outside one, the lock is freed when its session ends);
/// [`LockGuard::release`] releases it and reports the outcome.
pub struct LockGuard {
    session: Session,
    owner: u64,
    sequencer: Sequencer,
    lease_until: Option<Instant>,
    released: AtomicBool,
    /// The handle's grant table, emptied of this grant once fully released.
    grants: Arc<Mutex<BTreeMap<Token, Option<Instant>>>>,
}

fn forget_grant(grants: &Mutex<BTreeMap<Token, Option<Instant>>>, token: Token, remaining: u32) {
    if remaining == 0 {
        grants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token);
    }
}

impl LockGuard {
    /// The fencing token of this grant: strictly greater than every token
    /// of every grant made before it, cluster-wide. A re-entrant acquire
    /// (same handle, lock already held) shares the token of the grant it
    /// re-enters.
    pub fn token(&self) -> Token {
        self.sequencer.token
    }

    /// The grant's sequencer (lock name, mode, token, session); its
    /// `to_string()` is safe in an HTTP header or environment variable and
    /// parses back with `str::parse`.
    pub fn sequencer(&self) -> &Sequencer {
        &self.sequencer
    }

    /// The session holding this guard.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// True while this client can vouch that it holds the lock: not
    /// released, the session's lease valid, and the lock lease (if any) not
    /// run out on the local clock. Even so, a paused process can act after
    /// this turns false: only fencing protects storage.
    pub fn is_held(&self) -> bool {
        !self.released.load(Ordering::SeqCst)
            && self.session.is_live()
            && self.lease_until.is_none_or(|t| lease_clock::now() < t)
    }

    /// Resolves once the lock can no longer be relied on: the session is
    /// lost, or the lock lease ran out on the local clock.
    pub async fn lost(&self) {
        match self.lease_until {
            Some(t) => tokio::select! {
                _ = self.session.lost() => {}
                _ = tokio::time::sleep_until(lease_clock::timer(t)) => {}
            },
            None => self.session.lost().await,
        }
    }

    /// Release this hold (for a re-entrant grant, one hold of it). If the
    /// cluster does not answer in time the error is returned and the
    /// release keeps being retried in the background (same request id, so
    /// it applies at most once) while the session lives.
    pub async fn release(self) -> Result<(), Error> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let remaining = release(&self.session, self.owner, &self.sequencer).await?;
        forget_grant(&self.grants, self.sequencer.token, remaining);
        Ok(())
    }

    /// [`Client::put_fenced`] with this guard's sequencer.
    pub async fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), Error> {
        self.session
            .client()
            .put_fenced(&self.sequencer, key, value)
            .await
    }

    /// [`Client::delete_fenced`] with this guard's sequencer.
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<(), Error> {
        self.session
            .client()
            .delete_fenced(&self.sequencer, key)
            .await
    }

    /// [`Client::batch_fenced`] with this guard's sequencer.
    pub async fn batch(&self, batch: Batch) -> Result<Result<(), u32>, Error> {
        self.session
            .client()
            .batch_fenced(&self.sequencer, batch)
            .await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released.swap(true, Ordering::SeqCst) || !self.session.is_live() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = self.session.clone();
        let owner = self.owner;
        let sequencer = self.sequencer.clone();
        let grants = self.grants.clone();
        handle.spawn(async move {
            match release(&session, owner, &sequencer).await {
                Ok(remaining) => forget_grant(&grants, sequencer.token, remaining),
                Err(e) => {
                    tracing::warn!(lock = %sequencer.name, error = %e, "background release failed")
                }
            }
        });
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("sequencer", &self.sequencer.to_string())
            .field("held", &self.is_held())
            .finish()
    }
}
