//! [`Coalescer`]: packing a client's concurrent requests to one replica into
//! one RPC.
//!
//! Per-request gRPC handling (HTTP/2 stream, headers, tasks) was most of the
//! CPU a put or a get cost on both the client and the leader. Each endpoint
//! therefore has two lanes, one for writes (`Kv.WriteMany`) and one for reads
//! (`Kv.ReadMany`), each with at most `max_batch_in_flight` calls out at a
//! time:
//!
//! - a request that finds a free call slot is sent at once, as a plain unary
//!   `Write`/`Read` — there is no timer and no waiting for company, so a lone
//!   caller sees exactly the latency it had before packing existed;
//! - a request that finds every slot busy joins the lane's queue, and the
//!   next call to finish sends the whole queue (up to `max_batch_items`
//!   items and [`BATCH_BYTES`]) as one batch call.
//!
//! Each item's `Reply` is then turned into the same `Result<_, Attempt>`
//! that a unary call would have produced, and the router's per-call retry
//! loop handles it as before; a failure of the batch call itself is reported
//! to every item exactly as that failure of a unary call would be (see
//! [`classify_status`]). So the retry rules hold per item: a KV write that
//! may have been sent is never resent, lock commands are retried (they are
//! deduplicated by request id), reads may be retried.
//!
//! A replica that predates the batch calls answers them `UNIMPLEMENTED`
//! without running anything; the coalescer then sends that batch's items,
//! and everything after, as unary calls.
//!
//! The lanes are the fallback path: requests first go on the replica's
//! call stream ([`CallStream`], one long-lived `Kv.Calls` stream that
//! carries every request at once, with no call slots), and take the lanes
//! only while the replica has no call stream or when
//! [`crate::ClientOptions::call_stream`] is off.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::join_all;
use latchkey_core::CommandResult;
use latchkey_proto::v1::{
    AcquireRequest, KeepAliveRequest, ReadBatch, ReadRequest, Replies, WriteBatch, WriteRequest,
};
use latchkey_proto::MAX_BATCH_ITEMS;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use crate::call_stream::CallStream;
use crate::kv::{decode_reply, kv_client};
use crate::lock::lock_client;
use crate::router::{classify_status, Attempt};

/// Most request bytes the client packs into one batch call (a single item
/// above it is still sent, alone); far below the 64 MiB message limit.
pub(crate) const BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Counters of the requests sent to the cluster and the calls that carried
/// them (summed over every endpoint), see [`crate::Client::packing_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackingStats {
    /// Write attempts sent over gRPC.
    pub writes: u64,
    /// gRPC calls that carried them (`Write` or `WriteMany`).
    pub write_calls: u64,
    /// Read attempts sent over gRPC.
    pub reads: u64,
    /// gRPC calls that carried them (`Read` or `ReadMany`).
    pub read_calls: u64,
    /// Frames sent on call streams (`Kv.Calls`); a frame carries every
    /// request (write, read, acquire or keep-alive) at hand when it was
    /// sent. Requests
    /// sent this way count in `writes` and `reads` but in no `*_calls`.
    pub stream_frames: u64,
}

impl PackingStats {
    pub(crate) fn add(&mut self, other: PackingStats) {
        self.writes += other.writes;
        self.write_calls += other.write_calls;
        self.reads += other.reads;
        self.read_calls += other.read_calls;
        self.stream_frames += other.stream_frames;
    }
}

/// One request, encoded as its unary call would carry it.
pub(crate) enum Item {
    Write(WriteRequest),
    Read(ReadRequest),
    /// Never packed into a lane's batch: without a call stream it is sent
    /// as its own `Lock.Acquire` call.
    Acquire(AcquireRequest),
    /// Likewise: without a call stream (or to a replica whose stream does
    /// not know keep-alives), its own `Lock.KeepAlive` call.
    KeepAlive(KeepAliveRequest),
}

impl Item {
    fn lane(&self) -> Option<LaneKind> {
        match self {
            Item::Write(_) => Some(LaneKind::Write),
            Item::Read(_) => Some(LaneKind::Read),
            Item::Acquire(_) | Item::KeepAlive(_) => None,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Item::Write(w) => w.command.len(),
            Item::Read(r) => r.query.len(),
            Item::Acquire(a) => a.command.len(),
            Item::KeepAlive(_) => 8,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LaneKind {
    Write,
    Read,
}

pub(crate) type Answer = Result<CommandResult, Attempt>;

/// A request waiting for a call slot.
struct Queued {
    item: Item,
    /// When its caller's attempt ends.
    deadline: Instant,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct LaneState {
    /// Calls out now (unary or batch).
    in_flight: usize,
    /// Requests waiting for the next call to finish. Non-empty only while
    /// every slot is taken.
    queue: VecDeque<Queued>,
}

#[derive(Default)]
struct Lane {
    state: Mutex<LaneState>,
    items: AtomicU64,
    calls: AtomicU64,
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, LaneState> {
        // Every update under this lock is a push, a pop or a counter step;
        // a panic cannot leave it half-done, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The request packer of one endpoint (see the module docs).
pub(crate) struct Coalescer {
    channel: Channel,
    /// `None`: call streams are off (options), or packing is.
    stream: Option<CallStream>,
    frames: Arc<AtomicU64>,
    writes: Lane,
    reads: Lane,
    max_in_flight: usize,
    max_items: usize,
    /// The replica answered a batch call `UNIMPLEMENTED`: send unary only.
    unary_only: AtomicBool,
}

/// What a new request does, decided under the lane's lock.
enum Next {
    /// Every slot is busy: it was queued.
    Wait,
    /// A slot was free and nothing queued: send it alone, now.
    Alone(Slot, Item),
    /// A slot was free and requests were queued: send them all, now.
    Carry(Slot, Vec<Queued>),
}

/// A taken call slot of a lane; dropping it hands the slot to the queue.
struct Slot {
    coalescer: Arc<Coalescer>,
    lane: LaneKind,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.coalescer.release(self.lane);
    }
}

impl Coalescer {
    /// A packer for `channel` with at most `max_in_flight` calls per lane
    /// (0: never pack, one unary call per request, no call stream) and at
    /// most `max_items` items per batch call; requests go on the call
    /// stream first if `call_stream`.
    pub(crate) fn new(
        channel: Channel,
        call_stream: bool,
        max_in_flight: usize,
        max_items: usize,
    ) -> Coalescer {
        let frames = Arc::new(AtomicU64::new(0));
        Coalescer {
            stream: (call_stream && max_in_flight > 0)
                .then(|| CallStream::new(channel.clone(), Arc::clone(&frames))),
            frames,
            channel,
            writes: Lane::default(),
            reads: Lane::default(),
            max_in_flight,
            max_items: max_items.clamp(1, MAX_BATCH_ITEMS),
            unary_only: AtomicBool::new(false),
        }
    }

    fn lane(&self, kind: LaneKind) -> &Lane {
        match kind {
            LaneKind::Write => &self.writes,
            LaneKind::Read => &self.reads,
        }
    }

    pub(crate) fn stats(&self) -> PackingStats {
        PackingStats {
            writes: self.writes.items.load(Ordering::Relaxed),
            write_calls: self.writes.calls.load(Ordering::Relaxed),
            reads: self.reads.items.load(Ordering::Relaxed),
            read_calls: self.reads.calls.load(Ordering::Relaxed),
            stream_frames: self.frames.load(Ordering::Relaxed),
        }
    }

    /// Send `item` (on the call stream; without one, alone at once if a
    /// call slot is free, else with the next batch) and answer what its own
    /// unary call would have answered. `budget` is the caller's attempt
    /// budget; the caller bounds its own wait, this only bounds the batch
    /// call that carries the item.
    pub(crate) async fn send(self: &Arc<Self>, item: Item, budget: Duration) -> Answer {
        let item = match &self.stream {
            Some(stream) => {
                let kind = item.lane();
                match stream.send(item, budget).await {
                    Ok(answer) => {
                        if let Some(kind) = kind {
                            self.lane(kind).items.fetch_add(1, Ordering::Relaxed);
                        }
                        return answer;
                    }
                    // The replica has no call stream.
                    Err(item) => item,
                }
            }
            None => item,
        };
        let Some(kind) = item.lane() else {
            return self.unary(item).await;
        };
        let lane = self.lane(kind);
        if self.max_in_flight == 0 {
            lane.items.fetch_add(1, Ordering::Relaxed);
            lane.calls.fetch_add(1, Ordering::Relaxed);
            return self.unary(item).await;
        }
        let deadline = Instant::now() + budget;
        let (answer, rx) = oneshot::channel();
        let queued = Queued {
            item,
            deadline,
            answer,
        };
        // Decide under the lock, act after it (the guard must not live
        // across an await).
        let next = {
            let mut st = lane.lock();
            if st.in_flight >= self.max_in_flight {
                st.queue.push_back(queued);
                Next::Wait
            } else {
                st.in_flight += 1;
                let slot = Slot {
                    coalescer: self.clone(),
                    lane: kind,
                };
                if st.queue.is_empty() {
                    Next::Alone(slot, queued.item)
                } else {
                    // Not expected (the queue is taken whenever a slot
                    // frees), but never leave requests behind a free slot.
                    st.queue.push_back(queued);
                    Next::Carry(slot, self.take_batch(&mut st))
                }
            }
        };
        match next {
            Next::Wait => receive(rx).await,
            Next::Alone(slot, item) => {
                // The unary call, in the caller's task, as without packing.
                // Dropping the caller's future frees the slot.
                lane.items.fetch_add(1, Ordering::Relaxed);
                lane.calls.fetch_add(1, Ordering::Relaxed);
                let answer = self.unary(item).await;
                drop(slot);
                answer
            }
            Next::Carry(slot, batch) => {
                tokio::spawn(self.clone().carry(slot, batch));
                receive(rx).await
            }
        }
    }

    /// Take the next batch off the queue: the oldest requests whose callers
    /// still wait, up to the item and byte caps (at least one).
    fn take_batch(&self, st: &mut LaneState) -> Vec<Queued> {
        let mut batch: Vec<Queued> = Vec::new();
        let mut bytes = 0usize;
        while batch.len() < self.max_items {
            let Some(next) = st.queue.front() else { break };
            if next.answer.is_closed() {
                // Its caller gave up before it was sent: never send it.
                st.queue.pop_front();
                continue;
            }
            let size = next.item.bytes();
            if !batch.is_empty() && bytes + size > BATCH_BYTES {
                break;
            }
            bytes += size;
            if let Some(q) = st.queue.pop_front() {
                batch.push(q);
            }
        }
        batch
    }

    /// A call of `lane` ended: send what queued meanwhile with this slot,
    /// or free it.
    fn release(self: &Arc<Self>, kind: LaneKind) {
        let mut st = self.lane(kind).lock();
        let batch = self.take_batch(&mut st);
        if batch.is_empty() {
            st.in_flight = st.in_flight.saturating_sub(1);
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // The slot stays taken: it moves to the new call.
                let slot = Slot {
                    coalescer: self.clone(),
                    lane: kind,
                };
                drop(st);
                runtime.spawn(self.clone().carry(slot, batch));
            }
            Err(_) => {
                // Dropped outside the runtime (shutdown): nothing can be sent.
                st.in_flight = st.in_flight.saturating_sub(1);
                drop(st);
                for q in batch {
                    let _ = q.answer.send(Err(Attempt::NotSent(
                        "the client's runtime is shutting down".into(),
                    )));
                }
            }
        }
    }

    /// Send `batch` as one call holding `slot`, and answer every item.
    async fn carry(self: Arc<Self>, slot: Slot, batch: Vec<Queued>) {
        self.lane(slot.lane)
            .items
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let deadline = batch
            .iter()
            .map(|q| q.deadline)
            .max()
            .unwrap_or_else(Instant::now);
        let budget = deadline.saturating_duration_since(Instant::now());
        let (items, answers): (Vec<Item>, Vec<oneshot::Sender<Answer>>) =
            batch.into_iter().map(|q| (q.item, q.answer)).unzip();
        let results = match tokio::time::timeout(budget, self.call(slot.lane, items)).await {
            Ok(results) => results,
            Err(_) => {
                let timed_out = Attempt::Sent(format!("attempt timed out after {budget:?}"));
                vec![Err(timed_out); answers.len()]
            }
        };
        for (answer, result) in answers.into_iter().zip(results) {
            // The caller may have stopped waiting (its own deadline).
            let _ = answer.send(result);
        }
        drop(slot);
    }

    /// One call carrying `items` (all of `lane`), or one unary call per
    /// item for a single item or a replica without batch calls; one answer
    /// per item, in order.
    async fn call(&self, lane: LaneKind, items: Vec<Item>) -> Vec<Answer> {
        let n = items.len();
        let calls = &self.lane(lane).calls;
        if n == 1 || self.unary_only.load(Ordering::Relaxed) {
            calls.fetch_add(n as u64, Ordering::Relaxed);
            return join_all(items.into_iter().map(|item| self.unary(item))).await;
        }
        calls.fetch_add(1, Ordering::Relaxed);
        let mut writes = Vec::new();
        let mut reads = Vec::new();
        for item in items {
            match item {
                Item::Write(w) => writes.push(w),
                Item::Read(r) => reads.push(r),
                // Never queued in a lane (see `send`).
                Item::Acquire(_) | Item::KeepAlive(_) => {}
            }
        }
        let mut client = kv_client(self.channel.clone());
        let (result, unsent) = if reads.is_empty() {
            let r = client
                .write_many(WriteBatch {
                    items: writes.clone(),
                })
                .await;
            let unsent = writes.into_iter().map(Item::Write).collect::<Vec<_>>();
            (r, unsent)
        } else {
            let r = client
                .read_many(ReadBatch {
                    items: reads.clone(),
                })
                .await;
            let unsent = reads.into_iter().map(Item::Read).collect::<Vec<_>>();
            (r, unsent)
        };
        match result {
            Ok(replies) => answers(replies.into_inner(), n),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                // The replica does not know the batch call and ran nothing.
                tracing::debug!("replica has no batch calls; sending unary calls from now on");
                self.unary_only.store(true, Ordering::Relaxed);
                calls.fetch_add(n as u64, Ordering::Relaxed);
                join_all(unsent.into_iter().map(|item| self.unary(item))).await
            }
            Err(status) => vec![Err(classify_status(&status)); n],
        }
    }

    /// The unary call of one item.
    async fn unary(&self, item: Item) -> Answer {
        let reply = match item {
            Item::Write(w) => kv_client(self.channel.clone()).write(w).await,
            Item::Read(r) => kv_client(self.channel.clone()).read(r).await,
            Item::Acquire(a) => lock_client(self.channel.clone()).acquire(a).await,
            Item::KeepAlive(k) => lock_client(self.channel.clone()).keep_alive(k).await,
        };
        match reply {
            Ok(reply) => decode_reply(reply.into_inner()),
            Err(status) => Err(classify_status(&status)),
        }
    }
}

/// Per-item answers of a batch reply of `n` items.
fn answers(replies: Replies, n: usize) -> Vec<Answer> {
    if replies.replies.len() != n {
        let e = Attempt::Protocol(format!(
            "a batch of {n} requests got {} replies",
            replies.replies.len()
        ));
        return vec![Err(e); n];
    }
    replies.replies.into_iter().map(decode_reply).collect()
}

async fn receive(rx: oneshot::Receiver<Answer>) -> Answer {
    match rx.await {
        Ok(answer) => answer,
        // The call carrying it was dropped (runtime shutting down): it may
        // have been sent.
        Err(_) => Err(Attempt::Sent(
            "the call carrying this request was dropped".into(),
        )),
    }
}
