//! [`Endpoint`]: how one attempt of a request reaches one remote replica.
//!
//! The API rooms above ([`crate::kv`], [`crate::lock`]) build an
//! [`Operation`] and hand it to the router; the router picks a target and
//! calls [`crate::router::Target::send`], which runs the operation on the
//! in-process replica or gives it to the target's [`Endpoint`] here. Nothing
//! in this module knows what an operation means: it converts it to its
//! typed `latchkey.v1` request ([`latchkey_proto::wire`]), sends it, and
//! converts the typed reply back.
//!
//! Every request goes on the replica's call stream
//! ([`crate::call_stream::CallStream`], one long-lived `Pipeline.Calls`
//! stream), except:
//! - with [`crate::ClientOptions::call_stream`] off, every request is its
//!   own unary RPC (`Kv.Put`, `Lock.Acquire`, ...);
//! - a session keep-alive never waits behind a busy stream (the replica
//!   stops reading a stream's frames while 4,096 of its calls run, and the
//!   lease may run out meanwhile): with
//!   [`crate::call_stream::KEEP_ALIVE_BUSY_CALLS`] or more calls of the
//!   stream waiting for replies, it goes as its own unary `Lock.KeepAlive`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use latchkey_core::CommandResult;
use latchkey_proto::v1::{
    call::Request as Req, call_reply::Reply as Rep, kv_client::KvClient, lock_client::LockClient,
};
use latchkey_proto::{wire, Operation, MAX_MESSAGE_BYTES};
use tonic::transport::Channel;

use crate::call_stream::CallStream;
use crate::router::{classify_status, Attempt};

/// What one attempt answered.
pub(crate) type Answer = Result<CommandResult, Attempt>;

/// Counters of the requests a client sent over gRPC and what carried them
/// (summed over every endpoint), see [`crate::Client::transport_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Requests sent on call streams.
    pub stream_calls: u64,
    /// Frames that carried them: a frame carries every request at hand when
    /// it was sent.
    pub stream_frames: u64,
    /// Requests sent as their own unary RPC.
    pub unary_calls: u64,
}

impl TransportStats {
    pub(crate) fn add(&mut self, other: TransportStats) {
        self.stream_calls += other.stream_calls;
        self.stream_frames += other.stream_frames;
        self.unary_calls += other.unary_calls;
    }
}

/// One remote replica: its channel and, unless turned off, its call stream.
pub(crate) struct Endpoint {
    channel: Channel,
    stream: Option<CallStream>,
    stream_calls: AtomicU64,
    frames: Arc<AtomicU64>,
    unary_calls: AtomicU64,
}

impl Endpoint {
    pub(crate) fn new(channel: Channel, call_stream: bool) -> Endpoint {
        let frames = Arc::new(AtomicU64::new(0));
        Endpoint {
            stream: call_stream.then(|| CallStream::new(channel.clone(), Arc::clone(&frames))),
            channel,
            stream_calls: AtomicU64::new(0),
            frames,
            unary_calls: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> TransportStats {
        TransportStats {
            stream_calls: self.stream_calls.load(Ordering::Relaxed),
            stream_frames: self.frames.load(Ordering::Relaxed),
            unary_calls: self.unary_calls.load(Ordering::Relaxed),
        }
    }

    /// Send `op` and answer what the replica answered; `budget` is the
    /// caller's attempt budget (the caller bounds its own wait).
    pub(crate) async fn send(&self, op: &Operation, budget: Duration) -> Answer {
        let request = wire::request_to_wire(op).map_err(Attempt::Refused)?;
        if let Some(stream) = &self.stream {
            let keep_alive = matches!(request, Req::KeepAlive(_));
            if !(keep_alive && stream.busy()) {
                self.stream_calls.fetch_add(1, Ordering::Relaxed);
                return stream.send(request, budget).await;
            }
        }
        self.unary_calls.fetch_add(1, Ordering::Relaxed);
        match unary(&self.channel, request).await {
            Ok(reply) => decode(reply),
            Err(status) => Err(classify_status(&status)),
        }
    }
}

/// A typed reply as an attempt's answer.
pub(crate) fn decode(reply: Rep) -> Answer {
    wire::reply_from_wire(reply).map_err(Attempt::Refused)
}

/// `request` as its own unary RPC.
async fn unary(channel: &Channel, request: Req) -> Result<Rep, tonic::Status> {
    let mut kv = KvClient::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut lock = LockClient::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    Ok(match request {
        Req::Get(r) => Rep::Get(kv.get(r).await?.into_inner()),
        Req::MultiGet(r) => Rep::MultiGet(kv.multi_get(r).await?.into_inner()),
        Req::Scan(r) => Rep::Scan(kv.scan(r).await?.into_inner()),
        Req::Put(r) => Rep::Put(kv.put(r).await?.into_inner()),
        Req::PutIfAbsent(r) => Rep::PutIfAbsent(kv.put_if_absent(r).await?.into_inner()),
        Req::CompareAndPut(r) => Rep::CompareAndPut(kv.compare_and_put(r).await?.into_inner()),
        Req::GetAndPut(r) => Rep::GetAndPut(kv.get_and_put(r).await?.into_inner()),
        Req::Delete(r) => Rep::Delete(kv.delete(r).await?.into_inner()),
        Req::DeleteRange(r) => Rep::DeleteRange(kv.delete_range(r).await?.into_inner()),
        Req::Batch(r) => Rep::Batch(kv.batch(r).await?.into_inner()),
        Req::NextSequence(r) => Rep::NextSequence(kv.next_sequence(r).await?.into_inner()),
        Req::OpenSession(r) => Rep::OpenSession(lock.open_session(r).await?.into_inner()),
        Req::KeepAlive(r) => Rep::KeepAlive(lock.keep_alive(r).await?.into_inner()),
        Req::CloseSession(r) => Rep::CloseSession(lock.close_session(r).await?.into_inner()),
        Req::GetSession(r) => Rep::GetSession(lock.get_session(r).await?.into_inner()),
        Req::Acquire(r) => Rep::Acquire(lock.acquire(r).await?.into_inner()),
        Req::Release(r) => Rep::Release(lock.release(r).await?.into_inner()),
        Req::CancelWait(r) => Rep::CancelWait(lock.cancel_wait(r).await?.into_inner()),
        Req::FencedWrite(r) => Rep::FencedWrite(lock.fenced_write(r).await?.into_inner()),
        Req::CheckSequencer(r) => Rep::CheckSequencer(lock.check_sequencer(r).await?.into_inner()),
        Req::ListLocks(r) => Rep::ListLocks(lock.list_locks(r).await?.into_inner()),
    })
}
