//! The follower's side of an `AppendEntriesStream`: the leader's requests,
//! each checked as it arrives and handed to openraft's core at once, in the
//! stream's order, without waiting for the ones before it to be written;
//! the answers go back in the same order.
//!
//! A leader sends replication on such a stream without waiting for replies
//! (`crate::append_pipeline`), and so do its heartbeats (one request each,
//! on pooled streams); both are served here the same way. The replies are
//! openraft's `AppendEntriesResponse` results, as a unary AppendEntries
//! answers.
//!
//! What ends a stream: the leader closes it or it breaks (the requests
//! already taken are still answered); a request fails its check (its
//! refusal follows the replies to the requests before it); the node stops.
//! A conflict or a higher vote is answered and the stream goes on (the
//! leader ends its pipeline there and sends from the conflict on another).
//!
//! What is taken in and not yet answered is bounded: [`READ_AHEAD`]
//! requests and [`READ_AHEAD_BYTES`] of their messages (a request is always
//! taken when nothing else is in flight); beyond that the stream's messages
//! wait in HTTP/2 flow control.
//!
//! The checks that compare a request with this replica's state (its vote,
//! what it committed) read that state when the request arrives, which may
//! be before the requests ahead of it are applied: that state only moves
//! forward, so a check can be less strict than it would be a moment later,
//! never stricter.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::FuturesOrdered;
use futures::Stream;
use latchkey_core::codec;
use latchkey_proto::v1::RaftMessage;
use latchkey_storage::TypeConfig;
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use tokio::sync::watch;
use tokio::task::coop::unconstrained;
use tonic::{Status, Streaming};

use crate::replica::Replica;

/// Requests taken into openraft and not yet answered, at most, per stream.
const READ_AHEAD: usize = 64;

/// Bytes of the messages of the requests taken in and not yet answered, at
/// most, per stream.
const READ_AHEAD_BYTES: usize = 64 * 1024 * 1024;

/// The replies of a streaming RPC.
pub(crate) type ReplyStream =
    Pin<Box<dyn Stream<Item = Result<RaftMessage, Status>> + Send + 'static>>;

type Answer = Pin<
    Box<
        dyn Future<Output = Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>>
            + Send,
    >,
>;

/// Serve one `AppendEntriesStream`: `check` turns each message into
/// openraft's request or refuses it; the stream ends when `stopping`
/// becomes true or its sender is dropped.
///
/// Everything runs in the task that polls the reply stream (no task of its
/// own, no extra hand-off per request): each request's `append_entries`
/// call is started when its message is read, and the calls are polled in
/// the order they were started, their answers sent in that order.
///
/// **Why the requests reach openraft's core in the stream's order.** A call
/// puts its request on the core's channel the first time it is polled,
/// unless that send has to wait, and FuturesOrdered polls a call pushed
/// later after it for the first time. A send waits only (a) when the
/// channel is full (65,536 places: openraft's `api_channel_size`), and the
/// channel then admits waiting senders first come first served, woken in
/// that order, which is the order FuturesOrdered polls them in; or (b) when
/// tokio's cooperative budget for the task is spent, after which a later
/// call could send first; every call therefore runs `unconstrained`, which
/// turns (b) off for it.
pub(crate) fn serve<F>(
    replica: Arc<Replica>,
    incoming: Streaming<RaftMessage>,
    stopping: watch::Receiver<bool>,
    check: F,
) -> ReplyStream
where
    F: Fn(&RaftMessage) -> Result<AppendEntriesRequest<TypeConfig>, Status>
        + Send
        + Unpin
        + 'static,
{
    let mut stopping = stopping;
    Box::pin(Serving {
        replica,
        incoming,
        reading: true,
        refused: None,
        answers: FuturesOrdered::new(),
        sizes: VecDeque::new(),
        in_flight_bytes: 0,
        stopped: Box::pin(async move {
            // Ends the stream whether the flag was set or its sender is gone.
            let _ = stopping.wait_for(|stop| *stop).await;
        }),
        ended: false,
        check,
    })
}

/// One stream being served.
struct Serving<F> {
    replica: Arc<Replica>,
    incoming: Streaming<RaftMessage>,
    /// More requests may come (the leader has not closed the stream, and
    /// none was refused).
    reading: bool,
    /// The refusal to send once the requests before it are answered.
    refused: Option<Status>,
    answers: FuturesOrdered<Answer>,
    /// The message sizes of the requests in `answers`, oldest first.
    sizes: VecDeque<usize>,
    in_flight_bytes: usize,
    stopped: Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
    check: F,
}

impl<F> Serving<F>
where
    F: Fn(&RaftMessage) -> Result<AppendEntriesRequest<TypeConfig>, Status>,
{
    /// Take in every request that has arrived, within [`READ_AHEAD`] and
    /// [`READ_AHEAD_BYTES`].
    fn read(&mut self, cx: &mut Context<'_>) {
        while self.reading
            && (self.answers.is_empty()
                || (self.answers.len() < READ_AHEAD && self.in_flight_bytes < READ_AHEAD_BYTES))
        {
            let message = match Pin::new(&mut self.incoming).poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => message,
                Poll::Ready(Some(Err(status))) => {
                    tracing::debug!(%status, "append-entries stream from the leader ended");
                    self.reading = false;
                    return;
                }
                Poll::Ready(None) => {
                    self.reading = false;
                    return;
                }
                Poll::Pending => return,
            };
            match (self.check)(&message) {
                Ok(rpc) => {
                    let replica = Arc::clone(&self.replica);
                    let size = message.payload.len();
                    self.sizes.push_back(size);
                    self.in_flight_bytes += size;
                    self.answers.push_back(Box::pin(unconstrained(async move {
                        let result = replica.raft().append_entries(rpc).await;
                        if matches!(&result, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_)))
                        {
                            replica.view().heard_from_leader();
                        }
                        result
                    })));
                }
                Err(status) => {
                    self.refused = Some(status);
                    self.reading = false;
                }
            }
        }
    }
}

impl<F> Stream for Serving<F>
where
    F: Fn(&RaftMessage) -> Result<AppendEntriesRequest<TypeConfig>, Status> + Unpin,
{
    type Item = Result<RaftMessage, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended || this.stopped.as_mut().poll(cx).is_ready() {
            this.ended = true;
            return Poll::Ready(None);
        }
        this.read(cx);
        match Pin::new(&mut this.answers).poll_next(cx) {
            Poll::Ready(Some(result)) => {
                if let Some(size) = this.sizes.pop_front() {
                    this.in_flight_bytes -= size;
                }
                let reply = codec::encode(&result)
                    .map(|payload| RaftMessage {
                        payload: payload.into(),
                        ..RaftMessage::default()
                    })
                    .map_err(|e| Status::internal(e.to_string()));
                Poll::Ready(Some(reply))
            }
            // Nothing in flight: wait for requests, or end (with the
            // refusal, if one ended the reading).
            Poll::Ready(None) if this.reading => Poll::Pending,
            Poll::Ready(None) => {
                this.ended = true;
                Poll::Ready(this.refused.take().map(Err))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
