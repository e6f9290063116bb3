//! A leader's replication to one follower as a pipeline: openraft's
//! `stream_append` carried on one `AppendEntriesStream`, each request sent
//! as soon as openraft makes it, without waiting for the replies to the
//! ones before it.
//!
//! openraft's replication task produces an AppendEntries whenever entries
//! were submitted to the leader's log (or the commit index moved), and
//! reads the replies in order. Sent one at a time (openraft's default), a
//! new entry waits for the follower's reply to the previous request: its
//! fsync and a round trip, or the round trip of a request that only carried
//! the commit index. Here each request goes out the moment it exists, up to
//! [`MAX_IN_FLIGHT`] unanswered, and the replies are paired with the
//! requests in order (one stream, answered in order by the follower, so
//! the n-th reply answers the n-th request). openraft's heartbeats use the
//! same call with one request each, and so does a single AppendEntries
//! (`network.rs`).
//!
//! Everything runs in the task that reads the replies (openraft's): no task
//! of its own, no hand-off per request. The stream comes from the peer's
//! pool of idle streams (or is opened), and goes back to it when openraft's
//! input ended and every request was answered.
//!
//! What ends a pipeline (openraft then starts a new one from what the
//! follower acknowledged): the input ends, a reply is not `Success`, a
//! reply does not come within the call's time (`RPCOption::hard_ttl`,
//! counted from its request's sending or the reply before it, whichever is
//! later, so a request queued behind others is not charged for their
//! syncs), the stream fails, or a request was cut short by
//! [`split_oversized`] (its reply acknowledges the prefix; nothing is sent
//! after it, since the follower lacks what follows).
//!
//! What is in flight is bounded twice: [`MAX_IN_FLIGHT`] requests and
//! [`MAX_IN_FLIGHT_BYTES`] of encoded requests (a request is always sent
//! when nothing else is unanswered), since a stream's requests wait in this
//! process's memory, not in HTTP/2's window.
//!
//! The transport (addressing, the reversion guard, errors, the pool) is the
//! caller's, behind [`Lane`], so this file knows only the pipeline.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use latchkey_core::codec;
use latchkey_proto::v1::RaftMessage;
use latchkey_storage::types::{LogId, Vote};
use latchkey_storage::TypeConfig;
use openraft::error::{NetworkError, RPCError};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult};
use prost::bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tonic::Streaming;

/// Requests sent and not yet answered, at most, on one pipeline (the
/// follower takes up to 64 into its core at a time, `append_stream.rs`).
pub(crate) const MAX_IN_FLIGHT: usize = 32;

/// Encoded requests sent and not yet answered, at most, on one pipeline.
pub(crate) const MAX_IN_FLIGHT_BYTES: usize = 32 * 1024 * 1024;

/// Above this encoded size an AppendEntries with several entries is split:
/// the longest prefix within it (at least one entry) is sent, and openraft
/// is told only that prefix was acknowledged, so it sends the rest next.
pub(crate) const SPLIT_ABOVE_BYTES: usize = 16 * 1024 * 1024;

/// An open `AppendEntriesStream`: its sending half and its replies.
pub(crate) struct AppendStream {
    pub requests: mpsc::UnboundedSender<RaftMessage>,
    pub replies: Streaming<RaftMessage>,
}

/// What the pipeline needs from the transport to one peer.
pub(crate) trait Lane: Send + Sync + 'static {
    /// A request message carrying `payload`, addressed to the peer.
    fn address(&self, payload: Bytes) -> RaftMessage;

    /// The peer's reply to `sent`, decoded and checked (the reversion
    /// guard); an error ends the pipeline.
    // The error type is openraft's.
    #[allow(clippy::result_large_err)]
    fn settle(
        &self,
        sent: &Sent,
        reply: &[u8],
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>>;

    /// A failed stream as openraft should see it.
    fn stream_error(&self, status: &tonic::Status) -> RPCError<TypeConfig>;

    /// The error for a stream that closed or timed out (`why`): openraft
    /// tries again at once.
    fn broken(&self, why: &str) -> RPCError<TypeConfig>;

    /// The error for a reply no follower sends (`why`): openraft backs off.
    fn misbehaved(&self, why: &str) -> RPCError<TypeConfig>;

    /// A stream whose requests were all answered, for later calls.
    fn give_back(&self, stream: AppendStream);
}

/// A request on its way: what its reply is checked and reported against.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    /// The leader vote it was sent under.
    pub vote: Vote,
    /// The log id its entries follow.
    pub prev: Option<LogId>,
    /// The last log id it carries (`prev` when it carries none).
    pub last: Option<LogId>,
    /// The log ids of its entries, in order (consecutive indexes, as a
    /// request's entries are).
    pub carried: Vec<LogId>,
    /// Entries were left off it ([`split_oversized`]).
    pub split: bool,
    /// When it was sent.
    pub at: Instant,
    /// Its encoded size.
    pub bytes: usize,
}

impl Sent {
    /// The request `rpc` as it goes out now.
    pub(crate) fn of(rpc: &AppendEntriesRequest<TypeConfig>, split: bool) -> Self {
        Sent {
            vote: rpc.vote,
            prev: rpc.prev_log_id,
            last: rpc.entries.last().map(|e| e.log_id).or(rpc.prev_log_id),
            carried: rpc.entries.iter().map(|e| e.log_id).collect(),
            split,
            at: Instant::now(),
            bytes: 0,
        }
    }

    /// Whether `upto` can be a partial acknowledgement of this request:
    /// the log id it follows (nothing of it taken) or one of its entries'.
    /// An id merely between them in order (another leader's entry at an
    /// index it carries) is none of these.
    pub(crate) fn covers(&self, upto: Option<LogId>) -> bool {
        if upto == self.prev {
            return true;
        }
        let (Some(id), Some(first)) = (upto, self.carried.first()) else {
            return false;
        };
        let at = id
            .index
            .checked_sub(first.index)
            .and_then(|i| usize::try_from(i).ok());
        at.and_then(|i| self.carried.get(i)) == Some(&id)
    }
}

/// One result of a pipeline, as openraft reads it.
pub(crate) type Reply = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// Run openraft's request stream `input` over `stream`, pipelined; the
/// returned stream yields one result per request, in order (see the module
/// doc for what ends it).
pub(crate) fn stream_append<L, S>(
    lane: Arc<L>,
    stream: AppendStream,
    input: S,
    ttl: Duration,
) -> Pipeline<L, S>
where
    L: Lane,
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    Pipeline {
        lane,
        input: Some(input),
        stream: Some(stream),
        sent: VecDeque::new(),
        in_flight_bytes: 0,
        ttl,
        last_reply: Instant::now(),
        due: None,
        ended: false,
        closed: false,
    }
}

/// A running pipeline (see [`stream_append`]).
pub(crate) struct Pipeline<L, S> {
    lane: Arc<L>,
    /// openraft's requests; `None` once they ended (or after a split).
    input: Option<S>,
    /// `None` once given back or the pipeline ended.
    stream: Option<AppendStream>,
    /// The requests sent and not yet answered, oldest first.
    sent: VecDeque<Sent>,
    /// Their encoded bytes.
    in_flight_bytes: usize,
    ttl: Duration,
    /// When the last reply came (or the pipeline started).
    last_reply: Instant,
    /// When the oldest unanswered request's reply is due.
    due: Option<Pin<Box<Sleep>>>,
    ended: bool,
    /// The stream closed (the peer ended it, or its sending side went)
    /// with requests unanswered.
    closed: bool,
}

impl<L, S> Pipeline<L, S>
where
    L: Lane,
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    /// Send every request openraft has made, within [`MAX_IN_FLIGHT`] and
    /// [`MAX_IN_FLIGHT_BYTES`]; an error ends the pipeline.
    fn send_ready(&mut self, cx: &mut Context<'_>) -> Result<(), RPCError<TypeConfig>> {
        while self.sent.is_empty()
            || (self.sent.len() < MAX_IN_FLIGHT && self.in_flight_bytes < MAX_IN_FLIGHT_BYTES)
        {
            let Some(input) = self.input.as_mut() else {
                return Ok(());
            };
            let mut rpc = match input.poll_next_unpin(cx) {
                Poll::Ready(Some(rpc)) => rpc,
                Poll::Ready(None) => {
                    self.input = None;
                    return Ok(());
                }
                Poll::Pending => return Ok(()),
            };
            let split = split_oversized(&mut rpc.entries);
            let payload: Bytes = codec::encode(&rpc)
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?
                .into();
            if split {
                self.input = None;
            }
            let sent = Sent {
                bytes: payload.len(),
                ..Sent::of(&rpc, split)
            };
            self.in_flight_bytes += sent.bytes;
            self.sent.push_back(sent);
            let message = self.lane.address(payload);
            let gone = match &self.stream {
                Some(stream) => stream.requests.send(message).is_err(),
                None => true,
            };
            if gone {
                return Err(self.closed_error());
            }
        }
        Ok(())
    }

    /// The reply to the oldest request, if it came.
    fn poll_reply(&mut self, cx: &mut Context<'_>) -> Poll<Reply> {
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(Err(self.closed_error()));
        };
        let message = match stream.replies.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(message))) => message,
            Poll::Ready(Some(Err(status))) => {
                return Poll::Ready(Err(self.lane.stream_error(&status)))
            }
            Poll::Ready(None) => return Poll::Ready(Err(self.closed_error())),
            Poll::Pending => {
                let Some(oldest) = self.sent.front() else {
                    return Poll::Pending;
                };
                let deadline = oldest.at.max(self.last_reply) + self.ttl;
                let due = self
                    .due
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if due.as_mut().poll(cx).is_ready() {
                    let why = format!("append-entries reply not within {:?}", self.ttl);
                    return Poll::Ready(Err(self.lane.broken(&why)));
                }
                return Poll::Pending;
            }
        };
        self.due = None;
        self.last_reply = Instant::now();
        let Some(sent) = self.sent.pop_front() else {
            return Poll::Ready(Err(self.lane.misbehaved("a reply to no request")));
        };
        self.in_flight_bytes -= sent.bytes;
        let response = self.lane.settle(&sent, &message.payload)?;
        Poll::Ready(match (response, sent.prev) {
            // openraft reads a conflict at the log's start as a broken
            // invariant (it would panic): no follower conflicts there.
            (AppendEntriesResponse::Conflict, None) => Err(self
                .lane
                .misbehaved("the peer answered Conflict to entries from the log's start")),
            (response, prev) => {
                // After a partial acknowledgement the follower lacks what
                // the requests after it build on: openraft goes on from it.
                if sent.split || matches!(response, AppendEntriesResponse::PartialSuccess(_)) {
                    self.end();
                }
                Ok(response.into_stream_result(prev, sent.last))
            }
        })
    }
}

impl<L, S> Stream for Pipeline<L, S>
where
    L: Lane,
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    type Item = Reply;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Reply>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if let Err(e) = this.send_ready(cx) {
            this.end();
            return Poll::Ready(Some(Err(e)));
        }
        if this.sent.is_empty() {
            if this.input.is_some() {
                return Poll::Pending; // waiting for openraft's next request
            }
            // Everything answered: the stream can serve another call.
            this.ended = true;
            if let Some(stream) = this.stream.take() {
                this.lane.give_back(stream);
            }
            return Poll::Ready(None);
        }
        match this.poll_reply(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Ok(result))) => Poll::Ready(Some(Ok(Ok(result)))),
            Poll::Ready(other) => {
                this.end();
                Poll::Ready(Some(other))
            }
        }
    }
}

impl<L: Lane, S> Pipeline<L, S> {
    /// Whether the pipeline ended because its stream closed with requests
    /// unanswered (not a refusal, a bad reply or a timeout): on a stream
    /// taken from the pool, the sign of a connection that died while it
    /// was idle.
    pub(crate) fn closed(&self) -> bool {
        self.closed
    }

    /// The error for a stream found closed; remembered for [`Self::closed`].
    fn closed_error(&mut self) -> RPCError<TypeConfig> {
        self.closed = true;
        self.lane.broken("append-entries stream closed")
    }
}

impl<L, S> Pipeline<L, S> {
    /// End the pipeline; its stream, with replies perhaps outstanding, is
    /// dropped, never reused.
    fn end(&mut self) {
        self.ended = true;
        self.stream = None;
        self.input = None;
    }
}

/// Keep the longest prefix of `entries` whose payload fits in
/// [`SPLIT_ABOVE_BYTES`] (at least one entry); true if entries were dropped.
pub(crate) fn split_oversized(entries: &mut Vec<latchkey_storage::types::Entry>) -> bool {
    if entries.len() < 2 {
        return false;
    }
    let mut size = 0usize;
    let mut keep = entries.len();
    for (i, entry) in entries.iter().enumerate() {
        size = size.saturating_add(match &entry.payload {
            openraft::EntryPayload::Normal(r) => r.command.payload_len(),
            _ => 64,
        });
        if size > SPLIT_ABOVE_BYTES {
            keep = i.max(1);
            break;
        }
    }
    let split = keep < entries.len();
    entries.truncate(keep);
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An AppendEntries whose entries together exceed the limit keeps the
    /// longest prefix within it (never less than one entry); one that fits,
    /// or holds a single entry, is left whole.
    #[test]
    fn oversized_appends_keep_the_longest_prefix_that_fits() {
        let entry = |index: u64, bytes: usize| latchkey_storage::types::Entry {
            log_id: latchkey_storage::types::log_id(1, 1, index),
            payload: openraft::EntryPayload::Normal(latchkey_core::Request {
                now: 0,
                command: latchkey_core::Command::Put {
                    key: Vec::new(),
                    value: vec![0; bytes],
                },
            }),
        };
        let mib = 1024 * 1024;
        let mut big: Vec<_> = (1..=5).map(|i| entry(i, 6 * mib)).collect();
        assert!(split_oversized(&mut big));
        assert_eq!(
            big.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            [1, 2]
        );
        let mut huge = vec![entry(1, 20 * mib), entry(2, 1)];
        assert!(split_oversized(&mut huge));
        assert_eq!(huge.len(), 1, "the first entry goes even above the limit");
        let mut fits: Vec<_> = (1..=3).map(|i| entry(i, mib)).collect();
        assert!(!split_oversized(&mut fits));
        assert_eq!(fits.len(), 3);
        let mut one = vec![entry(1, 20 * mib)];
        assert!(!split_oversized(&mut one));
        assert_eq!(one.len(), 1);
    }
}
