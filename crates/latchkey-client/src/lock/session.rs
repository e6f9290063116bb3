//! [`Session`]: a lease on the cluster, the room every lock lives in, kept
//! alive by its watchdog (`watchdog.rs`). Opening one is
//! [`Client::session`]; lock handles are made in `handle.rs`
//! ([`Session::lock`](crate::Session::lock)), so this file does not import
//! them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latchkey_core::limits::{MAX_SESSION_TTL_MS, MIN_SESSION_TTL_MS};
use latchkey_core::lock::{LockCommand, LockOutcome, SessionId, SessionSecret, Token};
use latchkey_core::{Command, CommandError, Outcome};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::detached;
use super::lease_clock;
use super::watchdog::{at_risk_from, watchdog, LeaseState};
use crate::error::Error;
use crate::kv::{unexpected, Client};

/// `d` in whole milliseconds, saturating.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
        let mut sent = lease_clock::now();
        let outcome = self
            .execute_noting_sends(
                Command::Lock(LockCommand::OpenSession {
                    ttl_ms: millis(ttl),
                    // The replica draws the secret; this one is not sent.
                    secret: SessionSecret::default(),
                    name: crate::options::fit_session_name(&self.router().options().session_name),
                }),
                true,
                || sent = lease_clock::now(),
            )
            .await?;
        let (id, ttl_ms, secret) = match outcome {
            Outcome::Lock(LockOutcome::SessionOpened {
                session,
                ttl_ms,
                secret,
            }) => (session, ttl_ms, secret),
            other => return Err(unexpected("SessionOpened", &other)),
        };
        if !(MIN_SESSION_TTL_MS..=MAX_SESSION_TTL_MS).contains(&ttl_ms) {
            return Err(Error::Protocol(format!(
                "the server opened a session with an impossible ttl of {ttl_ms} ms"
            )));
        }
        let ttl = Duration::from_millis(ttl_ms);
        let margin = ttl / 10;
        let (tx, rx) = watch::channel(LeaseState::new(
            sent + ttl - margin,
            at_risk_from(sent, ttl),
        ));
        let watchdog = tokio::spawn(watchdog(self.clone(), id, secret, ttl, margin, sent, tx));
        tracing::debug!(session = id.0, ?ttl, "session opened");
        Ok(Session {
            inner: Arc::new(SessionInner {
                client: self.clone(),
                id,
                secret,
                ttl,
                next_request: AtomicU64::new(1),
                next_owner: AtomicU64::new(1),
                lease: rx,
                watchdog: Mutex::new(Some(watchdog)),
                closed: AtomicBool::new(false),
            }),
        })
    }
}

/// A lock-service session: a lease kept alive by a background watchdog.
///
/// Cheap to clone; the session closes (releasing its locks at once) when
/// [`Session::close`] is called or the last clone and the last guard are
/// dropped inside a Tokio runtime (the close is sent in the background).
/// Dropped outside any runtime, nothing can be sent: the cluster expires the
/// session after its TTL instead.
///
/// # The lease, as the client sees it
///
/// A [`Session`] is valid until `send time of the last acknowledged
/// keep-alive + ttl - margin` on this process's monotonic clock, with
/// `margin = ttl / 10` for clock-rate drift and scheduling. The leader counts
/// the same lease from the *receipt* of that keep-alive, and a new leader
/// restarts it at full length, so the cluster never expires a session before
/// this client stops vouching for it. The watchdog sends a keep-alive every
/// `ttl / 3`, to whichever replica leads, retrying others with backoff; once
/// the deadline passes without an acknowledgement, or the cluster answers
/// that the session ended, the session is **lost** for good: every guard
/// reports [`LockGuard::is_held`](crate::LockGuard::is_held) false and [`Session::lost`] resolves.
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), latchkey_client::Error> {
/// use std::time::Duration;
/// use latchkey_client::Client;
/// let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
/// let session = client.session(Duration::from_secs(10)).await?;
/// let guard = session.lock("reports/daily").acquire().await?;
/// // Hand the token to the storage you write to; it refuses older tokens.
/// println!("holding with token {}", guard.token());
/// // Writes to latchkey's own KV can be fenced: refused once we lost the lock.
/// guard.put("reports/daily/last-run", "2026-11-21").await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

struct SessionInner {
    client: Client,
    id: SessionId,
    /// The secret the cluster gave at open: every request for the session
    /// carries it. Never printed.
    secret: SessionSecret,
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
        let (session, secret) = (self.id, self.secret);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = client
                    .execute_with(
                        Command::Lock(LockCommand::CloseSession { session, secret }),
                        true,
                    )
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

    /// The session's secret, given by the cluster at open: every request
    /// acting for the session carries it (the client does this), and the
    /// cluster refuses one without it. Hand it only to a process that must
    /// write fenced with this session's grants ([`Client::put_fenced`]);
    /// whoever has it can also release the session's locks or close it.
    pub fn secret(&self) -> SessionSecret {
        self.inner.secret
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

    /// How long the lease is still vouched for from now (zero once it is
    /// not): exact, on the lease clock. A process that must stop work when
    /// the lease ends (`latchkey lock -- CMD` hands it to a watcher process)
    /// can add it to `CLOCK_BOOTTIME` read just before.
    pub fn remaining(&self) -> std::time::Duration {
        if !self.is_live() {
            return std::time::Duration::ZERO;
        }
        self.valid_until()
            .saturating_duration_since(lease_clock::now())
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

    /// The lease as the watchdog publishes it.
    pub(super) fn lease(&self) -> watch::Receiver<LeaseState> {
        self.inner.lease.clone()
    }

    /// Whether an operator force-released this session's grant `token`
    /// (the cluster said so in a keep-alive answer).
    pub(super) fn is_revoked(&self, token: Token) -> bool {
        self.inner.lease.borrow().revoked.contains(&token)
    }

    /// Resolves once the grant `token` is known to be force-released (or
    /// never, while it is not).
    pub(super) async fn revoked(&self, token: Token) {
        let mut rx = self.inner.lease.clone();
        loop {
            if rx.borrow_and_update().revoked.contains(&token) {
                return;
            }
            if rx.changed().await.is_err() {
                // The watchdog is gone: the session's own loss reports it.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Whether the session was closed by this client.
    pub(super) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    pub(super) fn lost_error(&self) -> Error {
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

    /// A new owner id within this session (each [`Lock`](crate::Lock)
    /// handle is one).
    pub(super) fn next_owner(&self) -> u64 {
        self.inner.next_owner.fetch_add(1, Ordering::SeqCst)
    }

    pub(super) fn next_request(&self) -> u64 {
        self.inner.next_request.fetch_add(1, Ordering::SeqCst)
    }

    /// Set `key` to `value`, bound to this session (an ephemeral key): the
    /// cluster deletes it in the same step that ends the session, closed
    /// or expired because its keep-alives stopped (the process died, or
    /// lost the cluster for longer than the TTL), so watchers see every
    /// key of the session go at one revision. A later put of the key,
    /// bound or not, sets its binding anew (a plain [`Client::put`]
    /// unbinds it). Returns the revision the put made.
    ///
    /// Refused, writing nothing, once the session has ended
    /// ([`CommandError::SessionEnded`]), and past
    /// [`MAX_KEYS_PER_SESSION`](latchkey_core::limits::MAX_KEYS_PER_SESSION)
    /// keys ([`CommandError::TooManySessionKeys`]).
    ///
    /// Service discovery: each member binds `members/<id>` to its session;
    /// everyone lists `members/` and watches it from the list's revision
    /// plus one ([`Client::watch`]).
    ///
    /// ```no_run
    /// # async fn demo(client: latchkey_client::Client) -> Result<(), latchkey_client::Error> {
    /// let session = client.session(std::time::Duration::from_secs(10)).await?;
    /// session.put("members/n1", "10.0.0.1:8080").await?;
    /// // ... serve; the key goes when the session is closed or expires.
    /// session.close().await?;
    /// # Ok(()) }
    /// ```
    pub async fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<u64, Error> {
        let command = Command::PutBound {
            key: key.as_ref().to_vec(),
            value: value.as_ref().to_vec(),
            session: self.inner.id,
            secret: self.inner.secret,
        };
        match self.inner.client.execute(command).await? {
            Outcome::Written { revision } => Ok(revision),
            other => Err(unexpected("Written", &other)),
        }
    }

    /// Stop keeping the session alive, without closing it: the cluster ends
    /// it once its TTL runs out after the last keep-alive, as if this
    /// process had died (its locks then pass on after their lock-delay, and
    /// its bound keys go). Dropping a session closes it instead. For drills
    /// and tests of what a crash does.
    pub fn abandon(self) {
        self.stop_watchdog();
        self.inner.closed.store(true, Ordering::SeqCst);
    }

    /// Stop the keep-alives.
    fn stop_watchdog(&self) {
        if let Some(w) = self
            .inner
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            w.abort();
        }
    }

    /// End the session now: its locks are released at once (no lock-delay),
    /// its waits cancelled and the keys bound to it deleted. Cancel-safe:
    /// the close runs in a task of its own, so dropping this future stops
    /// only the waiting.
    pub async fn close(&self) -> Result<(), Error> {
        self.stop_watchdog();
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let (session, secret) = (self.inner.id, self.inner.secret);
        let client = self.inner.client.clone();
        detached::finish(async move {
            match client
                .execute_with(
                    Command::Lock(LockCommand::CloseSession { session, secret }),
                    true,
                )
                .await
            {
                Ok(_) => Ok(()),
                // A retried close, or the leader expired it first: ended either way.
                Err(Error::Refused(CommandError::SessionEnded { .. })) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .await
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
