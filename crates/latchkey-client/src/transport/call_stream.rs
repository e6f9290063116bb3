//! [`CallStream`]: a client's requests to one replica on one long-lived
//! `Pipeline.Calls` stream.
//!
//! A unary gRPC call costs a new HTTP/2 stream: its HEADERS and DATA go out
//! in two writes with a task hand-off between them, and the replica wakes
//! twice (profiled in `docs/PERFORMANCE.md`, change 9). Here every request is a `Call` with an id on one stream per
//! replica: it is handed to the stream at once (never waiting for another
//! call to finish), the stream's sender writes whatever calls are at hand
//! as one frame, and the replica answers each call by id as soon as it is
//! done, with whatever replies are ready in one frame.
//!
//! Retry rules are those of a unary call, per request:
//! - the stream cannot be opened (connect refused, no such replica, a
//!   replica without the `Pipeline` service) or is not open within
//!   [`OPEN_TIMEOUT`] (or half the caller's budget): the request was not
//!   sent ([`Attempt::NotSent`]), since no call is handed to a stream before
//!   the replica accepted it;
//! - the stream breaks or ends while a request waits for its reply: it may
//!   have been executed ([`Attempt::Sent`]), so a KV write ends
//!   `UnknownOutcome` and is never resent; unless the replica ended it with
//!   the `STOPPED_AFTER_ANSWERING` trailer (it was stopping and answered
//!   every call it read): then an unanswered request was never executed and
//!   is refused as unavailable, safe to send elsewhere.
//!
//! The stream ends when its [`CallStream`] is dropped (the client and its
//! clones are gone) and the replica has answered every call in flight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use futures::Stream;
use latchkey_proto::v1::{
    call::Request as Req, pipeline_client::PipelineClient, Call, CallFrame, CallReplies,
};
use latchkey_proto::{
    ReplicaFailure, MAX_FRAME_CALLS, MAX_MESSAGE_BYTES, MAX_REQUEST_BYTES, STOPPED_AFTER_ANSWERING,
};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tonic::Streaming;

use super::attempt::{classify_status, decode, Answer, Attempt};
use super::credentials::{as_user, Credentials};

/// Most bytes the client puts in one frame: what a replica accepts
/// ([`MAX_REQUEST_BYTES`]). Every call the client sends passed
/// `validate_command`/`validate_query`, so it alone fits.
pub(crate) const FRAME_BYTES: usize = MAX_REQUEST_BYTES;

/// Calls waiting for their replies on a stream from which a keep-alive is
/// sent as its own unary call instead (an HTTP/2 stream of its own, not
/// queued behind them). Waiting acquires count too, though the replica
/// does not count them: that only sends a keep-alive as a unary call.
pub(crate) const KEEP_ALIVE_BUSY_CALLS: usize = 1024;

/// Longest wait for a replica to accept a new stream (less if half the
/// caller's budget is less): a paused or unreachable replica then costs the
/// request a retry elsewhere, not an unknown outcome.
pub(crate) const OPEN_TIMEOUT: Duration = Duration::from_secs(1);

/// The call stream of one replica, opened on first use and again after it
/// broke.
pub(crate) struct CallStream {
    channel: Channel,
    user: Option<Credentials>,
    current: Mutex<Option<Arc<Open>>>,
    /// Held while a stream is being opened, so concurrent requests share
    /// one open.
    opening: tokio::sync::Mutex<()>,
    frames: Arc<AtomicU64>,
}

/// One open stream: where calls go, and who waits for which reply.
struct Open {
    calls: mpsc::UnboundedSender<Call>,
    next_id: AtomicU64,
    waiting: Arc<Waiting>,
}

/// The callers waiting for replies, shared with the task reading them.
#[derive(Default)]
struct Waiting(Mutex<WaitingState>);

#[derive(Default)]
struct WaitingState {
    answers: HashMap<u64, oneshot::Sender<Answer>>,
    /// Why the stream ended, once it has: no call can be added then.
    ended: Option<String>,
}

impl Waiting {
    fn lock(&self) -> MutexGuard<'_, WaitingState> {
        // Every update under this lock is an insert, a remove or setting
        // `ended`: a panic cannot leave it half-done.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_ended(&self) -> bool {
        self.lock().ended.is_some()
    }

    /// The stream ended: every caller still waiting gets `Sent` (its call
    /// may have been executed) unless `unread` (the replica said it answered
    /// every call it read: the rest were not executed, and are refused as
    /// unavailable, safe to send elsewhere). No call is added after this.
    fn end(&self, why: String, unread: bool) {
        let answers = {
            let mut st = self.lock();
            st.ended = Some(why.clone());
            std::mem::take(&mut st.answers)
        };
        for (_, answer) in answers {
            let ended = if unread {
                Attempt::Refused(ReplicaFailure::Unavailable(why.clone()))
            } else {
                Attempt::Sent(why.clone())
            };
            let _ = answer.send(Err(ended));
        }
    }
}

/// Removes a caller's entry when it stops waiting (answered or not).
struct Forget<'a> {
    waiting: &'a Waiting,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.waiting.lock().answers.remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only plain stores happen under these locks.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CallStream {
    pub(crate) fn new(
        channel: Channel,
        frames: Arc<AtomicU64>,
        user: Option<Credentials>,
    ) -> CallStream {
        CallStream {
            channel,
            user,
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            frames,
        }
    }

    /// Send `request` on the stream and answer what the replica answered.
    /// `budget` is the caller's attempt budget.
    pub(crate) async fn send(&self, request: Req, budget: Duration) -> Answer {
        let open = match self.open(budget).await {
            Ok(open) => open,
            Err(Err(status)) => return Err(classify_status(&status)),
            Err(Ok(why)) => return Err(Attempt::NotSent(why)),
        };
        let id = open.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, rx) = oneshot::channel();
        {
            let mut st = open.waiting.lock();
            if let Some(why) = &st.ended {
                // Ended between the open and now; nothing was sent.
                return Err(Attempt::NotSent(why.clone()));
            }
            st.answers.insert(id, answer);
        }
        let _forget = Forget {
            waiting: &open.waiting,
            id,
        };
        let call = Call {
            id,
            request: Some(request),
        };
        if open.calls.send(call).is_err() {
            // The stream's sender is gone: the call never left this process.
            return Err(Attempt::NotSent("the call stream was closed".into()));
        }
        match rx.await {
            Ok(answer) => answer,
            Err(_) => Err(Attempt::Sent(
                "the call stream ended before the reply".into(),
            )),
        }
    }

    /// Whether the open stream has [`KEEP_ALIVE_BUSY_CALLS`] or more calls
    /// waiting for replies.
    pub(crate) fn busy(&self) -> bool {
        self.usable()
            .is_some_and(|open| open.waiting.lock().answers.len() >= KEEP_ALIVE_BUSY_CALLS)
    }

    /// The open stream, or a new one if there is none or it ended.
    /// Fails with the reason (`Ok`), or with the replica's refusal to open
    /// one (`Err`: wrong credentials, which no retry mends).
    async fn open(&self, budget: Duration) -> Result<Arc<Open>, Result<String, tonic::Status>> {
        if let Some(open) = self.usable() {
            return Ok(open);
        }
        let limit = (budget / 2).min(OPEN_TIMEOUT);
        let Ok(_opening) = tokio::time::timeout(limit, self.opening.lock()).await else {
            return Err(Ok(format!("the call stream was not open within {limit:?}")));
        };
        // Whoever held the lock may have opened one, or found none.
        if let Some(open) = self.usable() {
            return Ok(open);
        }
        let (calls, outgoing) = mpsc::unbounded_channel();
        let frames = Arc::clone(&self.frames);
        let opened = tokio::time::timeout(
            limit,
            PipelineClient::new(self.channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)
                .calls(as_user(&self.user, frames_of(outgoing, frames))),
        )
        .await;
        let Ok(response) = opened else {
            return Err(Ok(format!(
                "the replica did not accept a call stream within {limit:?}"
            )));
        };
        match response {
            Ok(response) => {
                let waiting = Arc::new(Waiting::default());
                tokio::spawn(read_replies(Arc::clone(&waiting), response.into_inner()));
                let open = Arc::new(Open {
                    calls,
                    next_id: AtomicU64::new(0),
                    waiting,
                });
                *lock(&self.current) = Some(Arc::clone(&open));
                Ok(open)
            }
            Err(status) if status.code() == tonic::Code::Unauthenticated => Err(Err(status)),
            Err(status) => Err(Ok(format!(
                "cannot open the call stream: {}: {}",
                status.code(),
                status.message()
            ))),
        }
    }

    fn usable(&self) -> Option<Arc<Open>> {
        let current = lock(&self.current);
        current
            .as_ref()
            .filter(|open| !open.waiting.is_ended())
            .cloned()
    }
}

/// The request side of a stream: each frame takes every call queued at the
/// moment (up to [`MAX_FRAME_CALLS`] calls and about [`FRAME_BYTES`]).
fn frames_of(
    mut outgoing: mpsc::UnboundedReceiver<Call>,
    frames: Arc<AtomicU64>,
) -> impl Stream<Item = CallFrame> + Send + 'static {
    // A call that would have pushed the last frame over the size limit: it
    // opens the next one.
    let mut held: Option<Call> = None;
    futures::stream::poll_fn(move |cx| {
        let first = match held.take() {
            Some(call) => call,
            None => match outgoing.poll_recv(cx) {
                Poll::Ready(Some(call)) => call,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            },
        };
        let mut bytes = frame_bytes(&first);
        let mut calls = vec![first];
        while calls.len() < MAX_FRAME_CALLS {
            let Ok(call) = outgoing.try_recv() else {
                break;
            };
            let size = frame_bytes(&call);
            if bytes + size > FRAME_BYTES {
                held = Some(call);
                break;
            }
            bytes += size;
            calls.push(call);
        }
        frames.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(Some(CallFrame { calls }))
    })
}

/// What `call` adds to a frame's encoded size (the call, its tag and its
/// length prefix).
fn frame_bytes(call: &Call) -> usize {
    let len = call.encoded_len();
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

/// Hand each reply to its caller until the stream ends, then end every
/// call still waiting.
async fn read_replies(waiting: Arc<Waiting>, mut replies: Streaming<CallReplies>) {
    let (why, unread) = loop {
        match replies.message().await {
            Ok(Some(frame)) => {
                for r in frame.replies {
                    let answer = waiting.lock().answers.remove(&r.id);
                    // A caller that stopped waiting has no entry.
                    if let Some(answer) = answer {
                        let result = match r.reply {
                            Some(reply) => decode(reply),
                            None => Err(Attempt::Protocol("a call reply without a body".into())),
                        };
                        let _ = answer.send(result);
                    }
                }
            }
            Ok(None) => break ("the replica ended the call stream".to_string(), false),
            Err(status)
                if status.code() == tonic::Code::Unavailable
                    && status.metadata().contains_key(STOPPED_AFTER_ANSWERING) =>
            {
                break (
                    format!(
                        "the replica stopped (the call was not executed): {}",
                        status.message()
                    ),
                    true,
                )
            }
            Err(status) => {
                break (
                    format!("the call stream broke: {}", status.message()),
                    false,
                )
            }
        }
    };
    tracing::debug!(%why, "call stream ended");
    waiting.end(why, unread);
}
