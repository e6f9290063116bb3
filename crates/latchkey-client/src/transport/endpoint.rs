//! [`Endpoint`]: how one attempt of a request reaches one remote replica,
//! and [`channel`], how a client dials one.
//!
//! Nothing here knows what an operation means: an endpoint converts it to
//! its typed `latchkey.v1` request ([`latchkey_proto::wire`]), sends it, and
//! converts the typed reply back into an [`Answer`]. Every request goes on
//! the replica's call stream ([`CallStream`], one long-lived
//! `Pipeline.Calls` stream), except:
//! - with [`ClientOptions::call_stream`] off, every request is its own
//!   unary RPC (`Kv.Put`, `Lock.Acquire`, ...);
//! - a session keep-alive never waits behind a busy stream (the replica
//!   stops reading a stream's frames while 4,096 of its calls run, and the
//!   lease may run out meanwhile): with
//!   [`KEEP_ALIVE_BUSY_CALLS`](super::call_stream::KEEP_ALIVE_BUSY_CALLS)
//!   or more calls of the stream waiting for replies, it goes as its own
//!   unary `Lock.KeepAlive`.
//!
//! Watches go over a connection of their own to the replica, opened when
//! the first one starts. HTTP/2 shares one flow-control window among the
//! streams of a connection, and a stream's received bytes hold their part
//! of it until the caller reads them: a few watches whose caller stopped
//! reading (a stuck consumer, a slow configuration reload) would otherwise
//! take the whole window and hold up every reply on the connection,
//! session keep-alives included, until the session is lost. On their own
//! connection, unread watches can hold up only the client's other watches
//! at that replica, and only for a while: a watch whose caller takes
//! nothing closes its stream after `crate::watch`'s unread limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use latchkey_proto::v1::watch_client::WatchClient;
use latchkey_proto::v1::{
    call::Request as Req, call_reply::Reply as Rep, kv_client::KvClient, lock_client::LockClient,
};
use latchkey_proto::wire::{WatchError, WatchSpec};
use latchkey_proto::{wire, Operation, ReplicaFailure, WatchStream, MAX_MESSAGE_BYTES};
use tonic::transport::Channel;

use super::attempt::{classify_status, decode, Answer, Attempt};
use super::call_stream::CallStream;
use super::credentials::{as_user, Credentials};
use crate::error::Error;
use crate::options::ClientOptions;

/// Parse `host:port` (an optional `http://` or `https://` prefix is
/// accepted) into a lazy channel with `options`' connect timeout and TLS
/// (see [`latchkey_proto::channel`]).
pub fn channel(addr: &str, options: &ClientOptions) -> Result<Channel, Error> {
    latchkey_proto::channel(addr, options.connect_timeout, options.tls.as_ref()).map_err(
        |e| match e {
            latchkey_proto::ChannelError::BadEndpoint { endpoint, reason } => {
                Error::BadEndpoint { endpoint, reason }
            }
            latchkey_proto::ChannelError::NoRuntime => Error::NoRuntime,
            e @ latchkey_proto::ChannelError::Tls { .. } => Error::InvalidArgument(e.to_string()),
        },
    )
}

/// Counters of the requests a client sent over gRPC and what carried them
/// (summed over every endpoint), see [`Client::transport_stats`](crate::Client::transport_stats).
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

/// One remote replica: its channel and, unless turned off, its call
/// stream; and the channel its watches go over.
pub(crate) struct Endpoint {
    channel: Channel,
    watch_channel: Channel,
    user: Option<Credentials>,
    stream: Option<CallStream>,
    stream_calls: AtomicU64,
    frames: Arc<AtomicU64>,
    unary_calls: AtomicU64,
}

impl Endpoint {
    /// Calls go over `channel`, watches over `watch_channel` (a channel
    /// of its own: see the module docs).
    pub(crate) fn new(
        channel: Channel,
        watch_channel: Channel,
        call_stream: bool,
        user: Option<Credentials>,
    ) -> Endpoint {
        let frames = Arc::new(AtomicU64::new(0));
        Endpoint {
            stream: call_stream
                .then(|| CallStream::new(channel.clone(), Arc::clone(&frames), user.clone())),
            channel,
            watch_channel,
            user,
            stream_calls: AtomicU64::new(0),
            frames,
            unary_calls: AtomicU64::new(0),
        }
    }

    /// Open a watch at this replica: its messages, ended by an error. A
    /// transport failure (the replica unreachable or gone mid-stream) ends
    /// it as `Unavailable`.
    pub(crate) async fn watch(&self, spec: &WatchSpec) -> Result<WatchStream, WatchError> {
        let mut client = WatchClient::new(self.watch_channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let request = as_user(&self.user, wire::watch_request_to_wire(spec));
        let replies = client
            .watch(request)
            .await
            .map_err(|status| transport_failure(&status))?
            .into_inner();
        Ok(Box::pin(replies.map(|reply| match reply {
            Ok(reply) => wire::watch_reply_from_wire(reply),
            Err(status) => Err(transport_failure(&status)),
        })))
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
        match unary(&self.channel, &self.user, request).await {
            Ok(reply) => decode(reply),
            Err(status) => Err(classify_status(&status)),
        }
    }
}

/// A watch that failed in transport: resumable elsewhere, unless the
/// replica refused the call itself (its credentials, or a replica without
/// the `Watch` service), which no other replica will answer differently.
fn transport_failure(status: &tonic::Status) -> WatchError {
    use tonic::Code;
    let why = latchkey_proto::error_chain(status);
    match status.code() {
        Code::Unauthenticated | Code::PermissionDenied | Code::Unimplemented => {
            WatchError::Replica(ReplicaFailure::InvalidArgument(format!(
                "the replica refused the watch: {why}"
            )))
        }
        _ => WatchError::Replica(ReplicaFailure::Unavailable(format!(
            "the watch's connection failed: {why}"
        ))),
    }
}

/// `request` as its own unary RPC.
async fn unary(
    channel: &Channel,
    user: &Option<Credentials>,
    request: Req,
) -> Result<Rep, tonic::Status> {
    let mut kv = KvClient::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut lock = LockClient::new(channel.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    Ok(match request {
        Req::Get(r) => Rep::Get(kv.get(as_user(user, r)).await?.into_inner()),
        Req::MultiGet(r) => Rep::MultiGet(kv.multi_get(as_user(user, r)).await?.into_inner()),
        Req::Scan(r) => Rep::Scan(kv.scan(as_user(user, r)).await?.into_inner()),
        Req::Put(r) => Rep::Put(kv.put(as_user(user, r)).await?.into_inner()),
        Req::PutIfAbsent(r) => {
            Rep::PutIfAbsent(kv.put_if_absent(as_user(user, r)).await?.into_inner())
        }
        Req::CompareAndPut(r) => {
            Rep::CompareAndPut(kv.compare_and_put(as_user(user, r)).await?.into_inner())
        }
        Req::GetAndPut(r) => Rep::GetAndPut(kv.get_and_put(as_user(user, r)).await?.into_inner()),
        Req::Delete(r) => Rep::Delete(kv.delete(as_user(user, r)).await?.into_inner()),
        Req::DeleteRange(r) => {
            Rep::DeleteRange(kv.delete_range(as_user(user, r)).await?.into_inner())
        }
        Req::Batch(r) => Rep::Batch(kv.batch(as_user(user, r)).await?.into_inner()),
        Req::NextSequence(r) => {
            Rep::NextSequence(kv.next_sequence(as_user(user, r)).await?.into_inner())
        }
        Req::OpenSession(r) => {
            Rep::OpenSession(lock.open_session(as_user(user, r)).await?.into_inner())
        }
        Req::KeepAlive(r) => Rep::KeepAlive(lock.keep_alive(as_user(user, r)).await?.into_inner()),
        Req::EndSession(r) => {
            Rep::EndSession(lock.end_session(as_user(user, r)).await?.into_inner())
        }
        Req::Proclaim(r) => Rep::Proclaim(lock.proclaim(as_user(user, r)).await?.into_inner()),
        Req::AcquireAll(r) => {
            Rep::AcquireAll(lock.acquire_all(as_user(user, r)).await?.into_inner())
        }
        Req::ReleaseAll(r) => {
            Rep::ReleaseAll(lock.release_all(as_user(user, r)).await?.into_inner())
        }
        Req::CloseSession(r) => {
            Rep::CloseSession(lock.close_session(as_user(user, r)).await?.into_inner())
        }
        Req::GetSession(r) => {
            Rep::GetSession(lock.get_session(as_user(user, r)).await?.into_inner())
        }
        Req::Acquire(r) => Rep::Acquire(lock.acquire(as_user(user, r)).await?.into_inner()),
        Req::Release(r) => Rep::Release(lock.release(as_user(user, r)).await?.into_inner()),
        Req::CancelWait(r) => {
            Rep::CancelWait(lock.cancel_wait(as_user(user, r)).await?.into_inner())
        }
        Req::FencedWrite(r) => {
            Rep::FencedWrite(lock.fenced_write(as_user(user, r)).await?.into_inner())
        }
        Req::CheckSequencer(r) => {
            Rep::CheckSequencer(lock.check_sequencer(as_user(user, r)).await?.into_inner())
        }
        Req::ListLocks(r) => Rep::ListLocks(lock.list_locks(as_user(user, r)).await?.into_inner()),
        Req::ForceRelease(r) => {
            Rep::ForceRelease(lock.force_release(as_user(user, r)).await?.into_inner())
        }
        Req::ListSessions(r) => {
            Rep::ListSessions(lock.list_sessions(as_user(user, r)).await?.into_inner())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_outside_a_runtime_is_an_error_not_a_panic() {
        assert!(matches!(
            channel("127.0.0.1:7101", &ClientOptions::default()),
            Err(Error::NoRuntime)
        ));
    }

    #[tokio::test]
    async fn endpoints_are_validated() {
        let o = ClientOptions::default();
        assert!(matches!(channel("", &o), Err(Error::BadEndpoint { .. })));
        assert!(matches!(
            channel("localhost", &o),
            Err(Error::BadEndpoint { .. })
        ));
        assert!(matches!(
            channel("localhost:99999", &o),
            Err(Error::BadEndpoint { .. })
        ));
    }
}
