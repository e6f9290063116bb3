//! Watching keys: [`Watch`], a stream of every change to one key, a range
//! or a prefix, that reconnects and resumes by itself.
//!
//! A watch goes to any replica (the in-process one first, then the
//! endpoints in turn): each serves watches from its own applied state. When
//! the connection breaks, the replica stops or leadership moves, the stream
//! opens the watch again at the next replica from the revision after the
//! last one it delivered, so the caller sees every change exactly once, in
//! revision order, without doing anything. A watch whose caller reads too
//! slowly is ended by its replica (`TooSlow`) and resumed the same way, and
//! one whose replica sends nothing, not even a progress notice, for three
//! progress intervals (a paused or stuck replica) is resumed at the next.
//!
//! A watch whose caller stays away (takes a message and does not poll
//! again) for [`held::UNREAD_LIMIT`] has its stream to the replica closed,
//! so that what the replica sent it stops holding the connection's HTTP/2
//! window, which the client's other watches at that replica share; it is
//! opened again from the next revision when the caller polls (see
//! [`held`]). If the cluster's history moved past that revision
//! meanwhile, the stream ends with [`Error::Compacted`].
//!
//! The stream ends only with an error that resuming cannot cure:
//! [`Error::Compacted`] (the start revision is older than the history the
//! cluster keeps: read again and watch from the read's revision plus one),
//! [`Error::FutureRevision`] for a start revision given by the caller, a
//! refusal by access control, or an invalid request. While no replica can be
//! reached it yields [`Error::Unavailable`] once per request timeout
//! ([`ClientOptions::request_timeout`](crate::ClientOptions)) and goes on
//! trying; drop the stream to stop. Polled outside a tokio runtime, it
//! yields [`Error::NoRuntime`] (at each poll).
//!
//! ```no_run
//! # async fn demo(client: latchkey_client::Client) -> Result<(), latchkey_client::Error> {
//! use futures::StreamExt;
//! use latchkey_client::{Selection, WatchMessage};
//!
//! // List, then watch from the revision the list saw: nothing is missed
//! // and nothing repeated.
//! let page = client.scan(latchkey_client::ScanRange::prefix("config/", 0)).await?;
//! let mut changes = client
//!     .watch(Selection::prefix("config/"))
//!     .from_revision(page.revision + 1);
//! while let Some(message) = changes.next().await {
//!     if let WatchMessage::Changes { revision, changes, .. } = message? {
//!         for change in changes {
//!             println!("{revision}: {:?} -> {:?}", change.key, change.current);
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use latchkey_core::watch::Selection;
use latchkey_proto::wire::{WatchError, WatchMessage, WatchSpec};
use latchkey_proto::{ReplicaFailure, WatchStream};

use crate::error::Error;
use crate::kv::Client;
use crate::router::Router;

mod held;

use held::{Closed, Held, Polled, FIRST_REPLY_LIMIT};

impl Client {
    /// Watch `keys` from the next revision on. Adjust with
    /// [`Watch::from_revision`], [`Watch::with_prev_value`] and
    /// [`Watch::progress_every`]; poll it as a [`Stream`].
    pub fn watch(&self, keys: Selection) -> Watch {
        Watch {
            router: self.shared_router(),
            spec: WatchSpec::new(keys),
            running: None,
        }
    }
}

/// A watch: a [`Stream`] of [`WatchMessage`]s (see the module docs for
/// what it promises). Nothing is sent until it is first polled, which must
/// be in a tokio runtime (outside one it yields [`Error::NoRuntime`]).
pub struct Watch {
    router: Arc<Router>,
    spec: WatchSpec,
    running: Option<(Running, Arc<Held>)>,
}

/// A watch's stream once polled.
type Running = Pin<Box<dyn Stream<Item = Result<WatchMessage, Error>> + Send>>;

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("spec", &self.spec)
            .field("running", &self.running.is_some())
            .finish()
    }
}

impl Watch {
    /// Start at revision `revision` (the changes it made are the first
    /// sent), instead of the next one.
    pub fn from_revision(mut self, revision: u64) -> Self {
        self.spec.start_revision = Some(revision);
        self
    }

    /// Send each changed key's previous value and revisions too.
    pub fn with_prev_value(mut self) -> Self {
        self.spec.prev_value = true;
        self
    }

    /// Have the replica send a progress notice after `every` without a
    /// change (100 ms to 60 s; default 1 s).
    pub fn progress_every(mut self, every: Duration) -> Self {
        self.spec.progress = every;
        self
    }
}

impl Stream for Watch {
    type Item = Result<WatchMessage, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.running.is_none() {
            let Some(held) = Held::start(self.spec.progress) else {
                return Poll::Ready(Some(Err(Error::NoRuntime)));
            };
            let follow = Follow {
                router: Arc::clone(&self.router),
                spec: self.spec.clone(),
                current: Arc::clone(&held),
                resumed: false,
                target: 0,
                failures: 0,
                failing_since: None,
                done: false,
            };
            self.running = Some((Box::pin(futures::stream::unfold(follow, step)), held));
        }
        let Some((running, held)) = self.running.as_mut() else {
            return Poll::Ready(None);
        };
        held.caller_waits();
        let next = running.as_mut().poll_next(cx);
        if next.is_ready() {
            held.caller_took();
        }
        next
    }
}

/// What a broken watch does next.
enum Next {
    /// Open it again (elsewhere) from where it was.
    Retry(String),
    /// Open it again from this revision.
    ResumeFrom(u64),
    /// Give the caller this error and end.
    End(Error),
}

/// What to do after `e`: `resumed` once a message came; `tries` openings
/// failed in a row so far, of `targets` places to try.
fn classify(e: WatchError, resumed: bool, tries: u32, targets: usize) -> Next {
    let tries = tries as usize;
    match e {
        WatchError::Compacted { requested, oldest } => Next::End(Error::Compacted {
            requested,
            oldest_revision: oldest,
        }),
        // A replica behind the one that sent the last change (or the one a
        // list read at): another one will have it. Only when every replica
        // has said so is it the caller's mistake.
        WatchError::FutureRevision { .. } if resumed || tries < targets => {
            Next::Retry(e.to_string())
        }
        WatchError::FutureRevision { requested, next } => {
            Next::End(Error::FutureRevision { requested, next })
        }
        WatchError::TooSlow { resume_from } => Next::ResumeFrom(resume_from),
        WatchError::TooManyWatches { .. } => Next::Retry(e.to_string()),
        WatchError::Refused(refused) => Next::End(refused.into()),
        WatchError::Replica(ReplicaFailure::InvalidArgument(why)) => {
            Next::End(Error::InvalidArgument(why))
        }
        WatchError::Replica(f) => Next::Retry(f.to_string()),
    }
}

/// A watch as it follows the cluster.
struct Follow {
    router: Arc<Router>,
    spec: WatchSpec,
    /// The open stream, if any.
    current: Arc<Held>,
    /// A message was delivered: `spec.start_revision` is where it resumes.
    resumed: bool,
    /// Which target the next opening goes to (in turn, one on after each
    /// failure; the same one after a stream closed while the caller was
    /// away).
    target: usize,
    /// Failed openings in a row.
    failures: u32,
    /// When the current run of failures began.
    failing_since: Option<Instant>,
    done: bool,
}

impl Follow {
    /// Note a failure; the error to yield when no replica could be reached
    /// for a whole request timeout.
    async fn failed(&mut self, why: String) -> Option<Error> {
        self.current.close();
        let options = self.router.options();
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        let backoff = options
            .initial_backoff
            .saturating_mul(1 << self.failures.min(16))
            .min(options.max_backoff);
        self.failures = self.failures.saturating_add(1);
        self.target = self.target.wrapping_add(1);
        tokio::time::sleep(backoff).await;
        if since.elapsed() >= options.request_timeout {
            self.failing_since = None;
            return Some(Error::Unavailable {
                attempts: self.failures,
                elapsed: since.elapsed(),
                last: why,
            });
        }
        None
    }

    /// Act on `next`; what to yield, if anything.
    async fn after(&mut self, next: Next) -> Option<Result<WatchMessage, Error>> {
        match next {
            Next::End(e) => {
                self.done = true;
                Some(Err(e))
            }
            Next::ResumeFrom(revision) => {
                self.spec.start_revision = Some(revision);
                self.current.close();
                None
            }
            Next::Retry(why) => self.failed(why).await.map(Err),
        }
    }

    /// Open the watch at the current target.
    async fn open(&mut self) -> Result<WatchStream, WatchError> {
        let targets = self.router.watch_targets();
        if targets.is_empty() {
            return Err(WatchError::Replica(ReplicaFailure::Unavailable(
                "no replica to watch at".into(),
            )));
        }
        let target = &targets[self.target % targets.len()];
        target.watch(&self.spec).await
    }
}

async fn step(mut f: Follow) -> Option<(Result<WatchMessage, Error>, Follow)> {
    if f.done {
        return None;
    }
    loop {
        let polled: Option<Polled> = futures::future::poll_fn(|cx| f.current.poll_next(cx)).await;
        let next = match polled {
            None => match f.current.take_closed() {
                Closed::ReplicaSilent => Next::Retry(format!(
                    "the replica sent nothing, not even a progress notice, for {} progress \
                     intervals",
                    held::SILENT_PROGRESSES
                )),
                // Not opened yet, or closed by the watch or while the
                // caller was away: open it (again) from where it was.
                Closed::CallerAway | Closed::ByWatch => {
                    match tokio::time::timeout(FIRST_REPLY_LIMIT, f.open()).await {
                        Ok(Ok(stream)) => {
                            f.current.open(stream);
                            continue;
                        }
                        Ok(Err(e)) => {
                            classify(e, f.resumed, f.failures, f.router.watch_targets().len())
                        }
                        Err(_) => Next::Retry(format!(
                            "the replica did not answer the watch within {FIRST_REPLY_LIMIT:?}"
                        )),
                    }
                }
            },
            Some(Some(Ok(message))) => {
                let revision = match &message {
                    WatchMessage::Changes { revision, .. }
                    | WatchMessage::Progress { revision, .. } => *revision,
                };
                // Never backwards, and a revision at the end of the range
                // cannot be resumed after.
                let Some(after) = revision.checked_add(1) else {
                    f.done = true;
                    let e = Error::Protocol(format!("a watch sent revision {revision}"));
                    return Some((Err(e), f));
                };
                f.spec.start_revision = Some(after.max(f.spec.start_revision.unwrap_or(0)));
                f.resumed = true;
                f.failures = 0;
                f.failing_since = None;
                return Some((Ok(message), f));
            }
            Some(Some(Err(e))) => {
                classify(e, f.resumed, f.failures, f.router.watch_targets().len())
            }
            Some(None) => Next::Retry("the replica ended the watch".into()),
        };
        if let Some(end) = f.after(next).await {
            return Some((end, f));
        }
    }
}
