//! Retry-safe writes: a key-value write sent as a [`Command::Once`] under a
//! session and a request id, resent with the same id until it is answered,
//! so a lost answer (a leader killed mid-write, a timed-out attempt) is not
//! an unknown outcome: the replicas return the first outcome of a request
//! they applied already (see `latchkey_core::lock` on request memory).
//!
//! [`call_once`] sends one tagged write. [`Writer`] is the session a
//! [`Client`](crate::Client) opens for its key-value writes (a lock
//! session's bound puts included), on the first one, and keeps alive in the
//! background.
//!
//! When the outcome can still be unknown ([`Error::UnknownOutcome`]), each
//! time after an attempt that may have been applied:
//! - the call's deadline passed before a replica answered (no replica
//!   could answer for
//!   [`ClientOptions::request_timeout`](crate::ClientOptions)),
//! - the session ended before the retry arrived (the process was paused or
//!   cut off from every replica for about the session's TTL, 30 s, or an
//!   operator ended it),
//! - the request was forgotten before the retry arrived (a session
//!   remembers its last 256 requests; the client's own session never
//!   lets a write lag more than 128 later ones, see `request_window`, but
//!   a lock session's many handles can),
//! - the retry was refused (the write's permission was revoked meanwhile,
//!   or the state changed so that the write no longer holds): a refusal is
//!   not remembered, so it does not say what the earlier attempt did, or
//! - a reply could not be read.
//!
//! A write no attempt of which can have been applied is sent again under a
//! new request id (forgotten) or a new session (ended) instead.
//!
//! This module sits between the router and the API rooms: it imports the
//! router, never a room.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use latchkey_core::lock::{LockCommand, LockOutcome, SessionId, SessionSecret};
use latchkey_core::{Command, CommandError, CommandResult, Outcome};
use latchkey_proto::{Operation, ReplicaFailure};
use tokio::task::JoinHandle;

use crate::error::Error;
use crate::request_window::RequestWindow;
use crate::router::Router;
use crate::transport::Attempt;

/// The TTL of the session a client opens for its own retry-safe writes:
/// how long the replicas remember its writes' outcomes after the client
/// last reached them.
pub(crate) const WRITER_SESSION_TTL: Duration = Duration::from_secs(30);

/// What makes a write retry-safe: the session whose request memory keeps
/// its outcome, and its request id there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tag {
    pub(crate) session: SessionId,
    pub(crate) secret: SessionSecret,
    pub(crate) request_id: u64,
}

/// How a tagged write ended.
pub(crate) enum Called {
    /// The replicas answered (the first outcome, on a retry).
    Answered(CommandResult),
    /// No attempt was applied, and the tag can no longer be used: its
    /// session is not live (`session_ended`) or its request was forgotten.
    /// The write may be sent again under a new tag.
    Resend { session_ended: bool },
}

/// Send `command` under `tag`, resending it with the same tag across
/// replicas and leader changes until it is answered or the client's
/// request deadline passes (then [`Error::UnknownOutcome`] if an attempt
/// may have been applied, else [`Error::Unavailable`]).
pub(crate) async fn call_once(
    router: &Router,
    tag: Tag,
    command: Command,
) -> Result<Called, Error> {
    let op = Operation::Write(Command::Once {
        session: tag.session,
        secret: tag.secret,
        request_id: tag.request_id,
        command: Box::new(command),
    });
    if let Operation::Write(once) = &op {
        latchkey_core::validate_command(once)?;
    }
    // Attempts begun, and attempts that certainly applied nothing: an
    // attempt cut by the router's per-attempt timeout never reports, so
    // it counts as maybe applied.
    let begun = Arc::new(AtomicU32::new(0));
    let cleared = Arc::new(AtomicU32::new(0));
    let called = router
        .call(false, |target, budget| {
            let op = op.clone();
            let (begun, cleared) = (Arc::clone(&begun), Arc::clone(&cleared));
            async move {
                begun.fetch_add(1, Ordering::SeqCst);
                let answer = target.send(op, budget).await;
                if applied_nothing(&answer) {
                    cleared.fetch_add(1, Ordering::SeqCst);
                }
                answer
            }
        })
        .await;
    let maybe_applied = || begun.load(Ordering::SeqCst) > cleared.load(Ordering::SeqCst);
    match called {
        Ok(Err(
            CommandError::SessionEnded { session } | CommandError::UnknownSession { session },
        )) if session == tag.session => {
            if maybe_applied() {
                return Err(Error::UnknownOutcome(format!(
                    "session {} ended between an attempt of this write and its retry (no \
                     replica was reached for about its TTL): it may or may not have been applied",
                    tag.session.0
                )));
            }
            Ok(Called::Resend {
                session_ended: true,
            })
        }
        Ok(Err(CommandError::RequestTooOld { request_id, oldest })) => {
            if maybe_applied() {
                return Err(Error::UnknownOutcome(format!(
                    "request {request_id} of session {} was forgotten (the session remembers \
                     requests from {oldest} on) before its retry arrived: it may or may not \
                     have been applied",
                    tag.session.0
                )));
            }
            Ok(Called::Resend {
                session_ended: false,
            })
        }
        // A refusal is not remembered: after an attempt that may have been
        // applied, it says nothing of what that attempt did.
        Ok(Err(refused)) if maybe_applied() => Err(Error::UnknownOutcome(format!(
            "a retry of this write was refused ({refused}) after an earlier attempt that may \
             have been applied"
        ))),
        Ok(result) => Ok(Called::Answered(result)),
        Err(Error::Protocol(why)) if maybe_applied() => Err(Error::UnknownOutcome(format!(
            "a reply could not be read ({why}) after an attempt that may have been applied"
        ))),
        Err(Error::Unavailable {
            attempts,
            elapsed,
            last,
        }) if maybe_applied() => Err(Error::UnknownOutcome(format!(
            "no replica answered a retry-safe write within {elapsed:?} ({attempts} attempts; \
             the last: {last}); an earlier attempt may have been applied"
        ))),
        Err(e) => Err(e),
    }
}

/// Whether an attempt's answer shows that it applied nothing.
fn applied_nothing(answer: &Result<CommandResult, Attempt>) -> bool {
    match answer {
        // Refused by the state machine: a refused command writes nothing.
        Ok(result) => result.is_err(),
        Err(Attempt::NotSent(_)) => true,
        Err(Attempt::Refused(failure)) => !matches!(failure, ReplicaFailure::UnknownOutcome(_)),
        Err(Attempt::Sent(_) | Attempt::Protocol(_)) => false,
    }
}

/// One keep-alive of `session`, retried across replicas until `within` has
/// passed. `on_send` runs just before each attempt (a lock session notes
/// its lease clock there).
pub(crate) async fn keep_alive(
    router: &Router,
    session: SessionId,
    secret: SessionSecret,
    within: Duration,
    mut on_send: impl FnMut(),
) -> Result<CommandResult, Error> {
    let attempt = router.options().attempt_timeout.min(within);
    router
        .call_with(false, within, attempt, |target, _| {
            on_send();
            async move {
                target
                    .send(Operation::KeepAlive { session, secret }, attempt)
                    .await
            }
        })
        .await
}

/// The session a client opens for its own retry-safe writes (on the first
/// write; again if it ends), kept alive in the background and closed when
/// the last clone of the client is dropped inside a Tokio runtime.
pub(crate) struct Writer {
    router: Arc<Router>,
    current: tokio::sync::Mutex<Option<Arc<WriterSession>>>,
    in_flight: tokio::sync::Semaphore,
}

/// Most writes one client has in flight at once: half what a session
/// remembers.
const MAX_IN_FLIGHT: usize = 128;

/// How many tags one write is tried under before it is given up as
/// unavailable (a new one only when no attempt can have been applied).
const RESENDS: u32 = 3;

struct WriterSession {
    id: SessionId,
    secret: SessionSecret,
    /// Its request ids: never far past the oldest write in flight.
    requests: RequestWindow,
    /// The cluster said it ended (or a write found it gone).
    ended: Arc<AtomicBool>,
    keep_alive: JoinHandle<()>,
}

impl Drop for WriterSession {
    fn drop(&mut self) {
        self.keep_alive.abort();
    }
}

impl Writer {
    pub(crate) fn new(router: Arc<Router>) -> Writer {
        Writer {
            router,
            current: tokio::sync::Mutex::new(None),
            in_flight: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
        }
    }

    /// Apply `command`, a key-value write, retry-safe: tagged with this
    /// client's session and the next request id. A write certainly not
    /// applied whose session had ended, or whose request was forgotten, is
    /// sent again under a new tag (at most [`RESENDS`] tags in all).
    pub(crate) async fn execute(&self, command: Command) -> Result<Outcome, Error> {
        let started = std::time::Instant::now();
        // Fewer writes in flight than the session remembers, so that a
        // write is forgotten only if it lags many that began after it.
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| Error::Protocol("the client's write limiter was closed".into()))?;
        for _ in 0..RESENDS {
            let session = match self.session().await {
                Ok(session) => session,
                // The cluster would not open a session for this client
                // (the user may not write at all, or the cluster is at its
                // session limit): send the write as it is, to be applied
                // or refused on its own terms.
                Err(Error::Refused(refused)) => {
                    tracing::debug!(%refused, "no session for retry-safe writes; writing plain");
                    return self.plain(command).await;
                }
                Err(e) => return Err(e),
            };
            let ticket = session.requests.take().await;
            let tag = Tag {
                session: session.id,
                secret: session.secret,
                request_id: ticket.id(),
            };
            let called = call_once(&self.router, tag, command.clone()).await?;
            drop(ticket);
            match called {
                Called::Answered(result) => return Ok(result?),
                Called::Resend { session_ended } => {
                    if session_ended {
                        session.ended.store(true, Ordering::SeqCst);
                    }
                }
            }
        }
        Err(Error::Unavailable {
            attempts: RESENDS,
            elapsed: started.elapsed(),
            last: "the write's session ended, or its request was forgotten, each time before \
                   the write was applied (it was not applied)"
                .into(),
        })
    }

    /// Send `command` once, not retry-safe.
    async fn plain(&self, command: Command) -> Result<Outcome, Error> {
        Ok(self.router.send(true, Operation::Write(command)).await??)
    }

    /// The live session, opened if there is none.
    async fn session(&self) -> Result<Arc<WriterSession>, Error> {
        let mut current = self.current.lock().await;
        if let Some(session) = current.as_ref() {
            if !session.ended.load(Ordering::SeqCst) {
                return Ok(Arc::clone(session));
            }
        }
        let opened = Arc::new(self.open().await?);
        *current = Some(Arc::clone(&opened));
        Ok(opened)
    }

    async fn open(&self) -> Result<WriterSession, Error> {
        let open = Operation::Write(Command::Lock(LockCommand::OpenSession {
            ttl_ms: u64::try_from(WRITER_SESSION_TTL.as_millis()).unwrap_or(u64::MAX),
            // The replica draws the secret; this one is not sent.
            secret: SessionSecret::default(),
            name: crate::options::fit_session_name(&format!(
                "{} retry-safe writes",
                self.router.options().session_name
            )),
        }));
        // A retried open after a lost reply may open a second session,
        // which holds nothing and expires after its TTL.
        let (id, secret) = match self.router.send(false, open).await?? {
            Outcome::Lock(LockOutcome::SessionOpened {
                session, secret, ..
            }) => (session, secret),
            other => {
                return Err(Error::Protocol(format!(
                    "expected SessionOpened, the replica answered {other:?}"
                )))
            }
        };
        tracing::debug!(
            session = id.0,
            "opened the client's session for retry-safe writes"
        );
        let ended = Arc::new(AtomicBool::new(false));
        let keep_alive = tokio::spawn(renew(
            Arc::clone(&self.router),
            id,
            secret,
            Arc::clone(&ended),
        ));
        Ok(WriterSession {
            id,
            secret,
            requests: RequestWindow::new(1),
            ended,
            keep_alive,
        })
    }
}

impl Writer {
    /// Close the session now, once the writes in flight are answered; the
    /// next write opens another. A session the cluster already ended is
    /// closed too.
    ///
    /// Cancel-safe: once the session is taken, its close runs in a task of
    /// its own, so a caller that stops waiting (a timeout) does not leave
    /// the session to expire.
    pub(crate) async fn close(&self) -> Result<(), Error> {
        let all = u32::try_from(MAX_IN_FLIGHT).unwrap_or(u32::MAX);
        let _quiet = self
            .in_flight
            .acquire_many(all)
            .await
            .map_err(|_| Error::Protocol("the client's write limiter was closed".into()))?;
        let Some(session) = self.current.lock().await.take() else {
            return Ok(());
        };
        session.keep_alive.abort();
        let router = Arc::clone(&self.router);
        let close = close_command(&session);
        let sent = tokio::spawn(async move { router.send(false, close).await })
            .await
            .map_err(|e| Error::Protocol(format!("closing the write session failed: {e}")))?;
        match sent? {
            Ok(_) | Err(CommandError::SessionEnded { .. }) => Ok(()),
            Err(e) => Err(Error::Refused(e)),
        }
    }
}

/// The command closing `session`.
fn close_command(session: &WriterSession) -> Operation {
    Operation::Write(Command::Lock(LockCommand::CloseSession {
        session: session.id,
        secret: session.secret,
    }))
}

impl Drop for Writer {
    fn drop(&mut self) {
        let Some(session) = self.current.get_mut().take() else {
            return;
        };
        session.keep_alive.abort();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let router = Arc::clone(&self.router);
        let close = close_command(&session);
        runtime.spawn(async move {
            let closed = router.send(false, close).await;
            tracing::debug!(
                session = session.id.0,
                ?closed,
                "closed the client's write session"
            );
        });
    }
}

/// Keep the writer's session alive every TTL/3 until the cluster says it
/// ended; after a keep-alive that failed, try again a second later (if the
/// session expires meanwhile, the next write opens another).
async fn renew(router: Arc<Router>, id: SessionId, secret: SessionSecret, ended: Arc<AtomicBool>) {
    let interval = WRITER_SESSION_TTL / 3;
    let mut wait = interval;
    loop {
        tokio::time::sleep(wait).await;
        match keep_alive(&router, id, secret, interval, || {}).await {
            Ok(Ok(_)) => wait = interval,
            Ok(Err(
                e @ (CommandError::SessionEnded { .. } | CommandError::UnknownSession { .. }),
            )) => {
                tracing::debug!(session = id.0, %e, "the client's write session ended");
                ended.store(true, Ordering::SeqCst);
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(session = id.0, %e, "a keep-alive of the write session was refused");
                wait = RENEW_RETRY;
            }
            Err(e) => {
                tracing::debug!(session = id.0, %e, "a keep-alive of the write session failed");
                wait = RENEW_RETRY;
            }
        }
    }
}

/// The pause before a keep-alive is tried again after one failed.
const RENEW_RETRY: Duration = Duration::from_secs(1);
