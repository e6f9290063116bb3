//! The replica's side of `Pipeline.Calls`: many client calls on one
//! long-lived stream, each run by [`answer`] exactly as its unary RPC runs
//! it, answered by id with the same typed reply. A call without a request
//! (or with one this replica does not know, which decodes as none) is
//! answered with an INVALID_ARGUMENT `error` alone, having run nothing.
//!
//! [`CallStream`] is the response stream. It reads the client's frames and
//! starts every call at once (so concurrent writes reach the write queue
//! together and are packed there, and linearizable reads share leadership
//! rounds), runs them all inside the stream (no task per call), and sends
//! whatever replies are ready as one frame. While [`MAX_RUNNING_CALLS`]
//! calls of the stream run, it stops reading frames, so HTTP/2 flow control
//! holds the client back instead of memory growing here. Acquires that wait
//! for their grant do not count: a waiting acquire is bounded by the lock
//! service's own limits, and counting them could hold the release that
//! would grant them behind a full stream for up to an acquire's hold time.
//!
//! A frame that cannot be decoded ends the stream: the calls already started
//! are answered, then the stream ends with `INVALID_ARGUMENT` (the client
//! treats calls it sent after that frame as "may have been executed", as for
//! any broken stream; none of them was).
//!
//! When the replica stops (shut down, or failed), the stream reads no more
//! frames, answers the calls it started (for at most [`DRAIN_FOR`]), and
//! ends with `UNAVAILABLE` carrying the [`STOPPED_AFTER_ANSWERING`] trailer:
//! the client then knows that a call without a reply was never read, so
//! never executed, and sends it elsewhere instead of reporting its outcome
//! unknown. Calls still running when the drain time is up are dropped, and
//! the stream ends without the trailer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use latchkey_proto::v1::{
    call::Request as Req, call_reply::Reply as Rep, Call, CallFrame, CallReplies, CallReply,
};
use latchkey_proto::STOPPED_AFTER_ANSWERING;
use latchkey_proto::{wire, ReplicaFailure, Rpc, MAX_FRAME_CALLS, MAX_MESSAGE_BYTES};
use prost::Message;
use tokio::sync::watch;
use tonic::{Status, Streaming};

use crate::answer::answer;
use crate::auth::Caller;
use crate::replica::Replica;

/// Room for the replies of one frame below the message limit, keeping a
/// margin for the framing of `CallReplies` itself.
const REPLIES_BUDGET: usize = MAX_MESSAGE_BYTES - 64 * 1024;

/// Calls of one stream running at once before the replica stops reading
/// its frames.
pub(crate) const MAX_RUNNING_CALLS: usize = 4096;

/// Longest a stopping replica keeps a stream open to answer the calls it
/// started.
pub(crate) const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// A finished call: its reply, and the RPC it answers (`None` for a call
/// that could not be run at all).
struct Answered {
    id: u64,
    rpc: Option<Rpc>,
    reply: Rep,
}

type Running = Pin<Box<dyn Future<Output = Answered> + Send>>;

/// The replies of one `Pipeline.Calls` stream (see the module docs).
pub struct CallStream {
    replica: Arc<Replica>,
    /// Who opened the stream (its metadata named the user): every call on
    /// it runs as that caller.
    caller: Arc<Caller>,
    /// `None` once the client ended its side (or it broke).
    incoming: Option<Streaming<CallFrame>>,
    running: FuturesUnordered<Running>,
    /// How many of `running` are acquires.
    acquires: usize,
    /// Resolves when the node stops.
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// A ready reply that did not fit in the last frame.
    held: Option<CallReply>,
    /// Why the client's side broke, sent once every started call is answered.
    broken: Option<Status>,
    /// Set when the replica began to stop: the end of the drain time.
    draining: Option<Pin<Box<tokio::time::Sleep>>>,
    ended: bool,
}

impl CallStream {
    pub(crate) fn new(
        replica: Arc<Replica>,
        caller: Caller,
        incoming: Streaming<CallFrame>,
        mut stopping: watch::Receiver<bool>,
    ) -> CallStream {
        CallStream {
            replica,
            caller: Arc::new(caller),
            incoming: Some(incoming),
            running: FuturesUnordered::new(),
            acquires: 0,
            stopping: Box::pin(async move {
                // Ends whether the flag was set or its sender is gone.
                let _ = stopping.wait_for(|stop| *stop).await;
            }),
            held: None,
            broken: None,
            draining: None,
            ended: false,
        }
    }

    /// Start every call of `frame`; a frame above [`MAX_FRAME_CALLS`] runs
    /// none of them.
    fn start(&mut self, frame: CallFrame) {
        let n = frame.calls.len();
        for call in frame.calls {
            if n > MAX_FRAME_CALLS {
                let refused = ReplicaFailure::InvalidArgument(format!(
                    "a frame of {n} calls, the limit is {MAX_FRAME_CALLS}; nothing was executed"
                ));
                self.running.push(answered_now(call.id, refused));
            } else {
                if matches!(call.request, Some(Req::Acquire(_))) {
                    self.acquires += 1;
                }
                self.running.push(run(
                    Arc::clone(&self.replica),
                    Arc::clone(&self.caller),
                    call,
                ));
            }
        }
    }

    /// Take a finished call's reply, replaced if it alone cannot fit in a
    /// frame: by an unknown outcome for a write (it was executed), by
    /// unavailable for a read.
    fn finish(&mut self, done: Answered) -> CallReply {
        if done.rpc == Some(Rpc::Acquire) {
            self.acquires = self.acquires.saturating_sub(1);
        }
        let mut reply = done.reply;
        if reply.encoded_len() + 32 > REPLIES_BUDGET {
            let why = "the reply does not fit in a message; ask for less at a time".to_string();
            reply = match done.rpc {
                Some(rpc) if rpc.is_write() => {
                    wire::error_reply(rpc, ReplicaFailure::UnknownOutcome(why).into())
                }
                Some(rpc) => wire::error_reply(rpc, ReplicaFailure::Unavailable(why).into()),
                None => Rep::Error(ReplicaFailure::Unavailable(why).into()),
            };
        }
        CallReply {
            id: done.id,
            reply: Some(reply),
        }
    }
}

/// One call, run as its unary call would run.
fn run(replica: Arc<Replica>, caller: Arc<Caller>, call: Call) -> Running {
    Box::pin(async move {
        let Call { id, request } = call;
        let Some(request) = request else {
            let refused = ReplicaFailure::InvalidArgument(
                "a call without a request (or with one this replica does not know); \
                 nothing was executed"
                    .into(),
            );
            return Answered {
                id,
                rpc: None,
                reply: Rep::Error(refused.into()),
            };
        };
        let (rpc, reply) = answer(&replica, &caller, request).await;
        Answered {
            id,
            rpc: Some(rpc),
            reply,
        }
    })
}

fn answered_now(id: u64, failure: ReplicaFailure) -> Running {
    futures::future::ready(Answered {
        id,
        rpc: None,
        reply: Rep::Error(failure.into()),
    })
    .boxed()
}

impl Stream for CallStream {
    type Item = Result<CallReplies, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if this.draining.is_none() && this.stopping.as_mut().poll(cx).is_ready() {
            // Read nothing more: what was not read is not executed.
            this.incoming = None;
            this.draining = Some(Box::pin(tokio::time::sleep(DRAIN_FOR)));
        }
        if let Some(deadline) = this.draining.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                // Calls still running are dropped, as a unary call's would
                // be when the connection closes: the client treats them so
                // (no trailer: their outcome is unknown).
                this.ended = true;
                return Poll::Ready(Some(Err(Status::unavailable(
                    "the replica stopped before it could answer every call it read",
                ))));
            }
        }
        while this.running.len().saturating_sub(this.acquires) < MAX_RUNNING_CALLS {
            let Some(incoming) = this.incoming.as_mut() else {
                break;
            };
            match incoming.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(frame))) => this.start(frame),
                Poll::Ready(Some(Err(status))) => {
                    tracing::debug!(%status, "a client's call stream broke");
                    this.incoming = None;
                    this.broken = Some(refusal(status));
                }
                Poll::Ready(None) => this.incoming = None,
                Poll::Pending => break,
            }
        }
        let mut replies = Vec::new();
        let mut bytes = 0usize;
        if let Some(held) = this.held.take() {
            bytes += held.encoded_len() + 11;
            replies.push(held);
        }
        while let Poll::Ready(Some(done)) = this.running.poll_next_unpin(cx) {
            let reply = this.finish(done);
            let size = reply.encoded_len() + 11;
            if !replies.is_empty() && bytes + size > REPLIES_BUDGET {
                this.held = Some(reply);
                break;
            }
            bytes += size;
            replies.push(reply);
        }
        if !replies.is_empty() {
            return Poll::Ready(Some(Ok(CallReplies { replies })));
        }
        if this.incoming.is_none() && this.running.is_empty() {
            this.ended = true;
            if this.draining.is_some() && this.held.is_none() {
                return Poll::Ready(Some(Err(stopped_after_answering())));
            }
            return Poll::Ready(this.broken.take().map(Err));
        }
        Poll::Pending
    }
}

/// How a stopping replica ends a stream once it answered every call it read.
fn stopped_after_answering() -> Status {
    let mut status = Status::unavailable(
        "the replica is stopping: every call it read was answered; calls without a reply \
         were not read and not executed",
    );
    status.metadata_mut().insert(
        STOPPED_AFTER_ANSWERING,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    status
}

/// What to end the stream with when reading the client's frames failed:
/// tonic reports an undecodable message as `INTERNAL`, but the fault is the
/// client's input.
fn refusal(status: Status) -> Status {
    if status.code() == tonic::Code::Internal {
        Status::invalid_argument(format!(
            "a call frame could not be decoded ({}); calls in it and after it were not executed",
            status.message()
        ))
    } else {
        status
    }
}
